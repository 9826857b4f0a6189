"""A broken invariant in the library raises InternalError (exit 3, one line asking for a bug report), never an
``assert`` that ``python -O`` drops (ruff's S101 keeps asserts out of forensics/ and parsers/)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from forensics.errors import ExitCode, InternalError
from forensics.replay import intake, mapping
from forensics.spark import _to_polars


def test_a_mapped_record_file_without_its_mapping_is_a_bug_not_a_bad_file(tmp_path: Path) -> None:
    data = tmp_path / "results.json"
    data.write_text("{}")
    with pytest.raises(InternalError) as caught:  # not swallowed into the file's outcome as an input error
        intake._read_one(intake.RecordFile(data, "mapped"))
    assert caught.value.exit_code == ExitCode.INTERNAL
    assert caught.value.message == f"internal error: {data}: classified as a mapped record file without its mapping"


def test_an_anchor_that_is_neither_a_field_nor_the_manifest_is_a_bug(tmp_path: Path) -> None:
    section = mapping.Section(paths=("",), layout="records", fields=(), anchors=("neither",))
    with pytest.raises(InternalError, match="anchor 'neither' of the section at"):
        mapping._anchor_values(section, [mapping._Row(obj={}, index=0, source="x", line=None)], tmp_path, None)


class _ArrowOnly:
    """Stands in for a Spark frame: what _to_polars uses of one."""

    def __init__(self, arrow: pa.Array | pa.Table) -> None:
        self.arrow = arrow

    def toArrow(self) -> pa.Array | pa.Table:  # Spark's name for it
        return self.arrow


def test_a_spark_result_that_is_not_a_table_is_a_bug() -> None:
    assert _to_polars(_ArrowOnly(pa.table({"a": [1]}))).to_dicts() == [{"a": 1}]
    with pytest.raises(InternalError, match="read as Series, not a table"):
        _to_polars(_ArrowOnly(pa.array([1, 2])))
