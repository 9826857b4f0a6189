"""The JSON Schemas of the format files, of fields.toml and of the mapping files: every shipped file passes its
schema, a file that breaks it is refused in one line naming the file, the kind or field and what to do, and the
schemas are published with the package (package data, docs/development.md)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jsonschema
import pytest

from forensics.errors import FormatDefinitionError
from parsers import spec
from tests.conftest import ROOT

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

KIND = "[[kind]]\nname = 'fork_line'\nprefilter = 'fork'\nregex = '^fork n = (?P<n_past>\\d+)$'\nsamples = ['fork n = 1']\n"
GOOD = "[format]\nname = 'myfork'\n" + KIND


def _refused(tmp_path: Path, text: str) -> str:
    path = tmp_path / "myfork.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(FormatDefinitionError) as exc:
        spec.load_format(path)
    return exc.value.one_line().replace(f"{path}: ", "FILE: ")


def test_every_shipped_format_file_passes_its_schema() -> None:
    for path in sorted(spec.FORMATS_DIR.glob("*.toml")):
        if path.name in ("frames.toml", "wrappers.toml"):
            continue
        data = tomllib.loads(path.read_text(encoding="utf-8"))
        spec.check_schema(data, path, "fields" if path.name == "fields.toml" else "format")


def test_the_schemas_are_valid_json_schemas_and_say_what_the_loader_knows() -> None:
    for name in ("format", "fields"):
        jsonschema.Draft202012Validator.check_schema(spec.schema(name))
    kind = spec.schema("format")["$defs"]["kind"]["properties"]
    # every attribute of a Kind that a file sets has its key in the schema, and nothing else does
    assert set(kind) == {f for f in spec.Kind.__dataclass_fields__ if f not in ("format", "fields")} | {"role"}
    assert "general" in spec.ROLES and "start" in spec.ROLES and {"int", "float", "str", "bool"} == spec.FIELD_TYPES


def test_a_good_file_loads(tmp_path: Path) -> None:
    path = tmp_path / "myfork.toml"
    path.write_text(GOOD, encoding="utf-8")
    fmt = spec.load_format(path)
    assert (fmt.name, [k.name for k in fmt.kinds], fmt.kinds[0].fields) == ("myfork", ["fork_line"], ("n_past",))


@pytest.mark.parametrize(("text", "line"), [
    ("[[kind]]\nname = 'x'\nregex = '^x$'\nsamples = ['x']\n",
     'FILE: missing [format] name (add [format] with name = "...")'),
    ("[format]\ntitle = 'no name'\n" + KIND, 'FILE: missing [format] name (add [format] with name = "...")'),
    ("[format]\nname = 'myfork'\n", "FILE: format declares no kinds (add [[kind]] tables (docs/development.md))"),
    (GOOD.replace("samples = ['fork n = 1']\n", ""),
     "FILE: kind 'fork_line' has no samples (every kind needs at least one sample line)"),
    (GOOD.replace("samples = ['fork n = 1']", "samples = []"),
     "FILE: kind 'fork_line' has no samples (every kind needs at least one sample line)"),
    (GOOD.replace("regex = '^fork n = (?P<n_past>\\d+)$'\n", ""), "FILE: kind 'fork_line' has no regex"),
    (GOOD + "role = 'begin'\n", "FILE: kind 'fork_line' has unknown role 'begin' (use one of "
     + ", ".join(sorted(spec.ROLES)) + ")"),
    (GOOD + "frame = 'json'\n", "FILE: kind 'fork_line' has unknown frame 'json' (use one of record, text)"),
    (GOOD + "multline = true\n", "FILE: kind 'fork_line' has unknown key 'multline' (keys: anywhere, bare, boundary, "
     "ends, evidence, exclude, fallback, frame, inherit, inherit_next, keys, loose, multiline, name, prefilter, regex, role, "
     "samples, skip, startup, weak)"),
    (GOOD + "skip = 'yes'\n", "FILE: kind 'fork_line' skip must be true or false, not 'yes'"),
    (GOOD + "[[kind]]\nname = 'second'\nregex = '^y$'\nsamples = 'y'\n",
     "FILE: kind 'second' samples must be a list, not 'y'"),
    ("[format]\nname = 'myfork'\nversion = 2\n" + KIND,
     "FILE: [format] has unknown key 'version' (keys: eras, includes, name, shared, title)"),
    (GOOD.replace("(?P<n_past>", "(?P<n_pasts>"),
     "FILE: kind 'fork_line' captures 'n_pasts', which fields.toml does not declare (declare the field with its type)"),
    (GOOD.replace("'^fork", "'fork"), "FILE: kind 'fork_line' regex is not anchored at the start (^)"),
])
def test_a_file_that_breaks_its_schema_is_refused_in_one_line(tmp_path: Path, text: str, line: str) -> None:
    assert _refused(tmp_path, text) == line


def test_a_fields_file_that_breaks_its_schema_is_refused_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "fields.toml"
    cases = {
        "[fields.draft_n]\ntype = 'integer'\n": "field 'draft_n' has type 'integer' (use one of bool, float, int, str)",
        "[fields.draft_n]\ndescription = 'drafted tokens'\n": "field 'draft_n' has no type",
        "[fields.draft_n]\ntype = 'int'\nunit = 'tokens'\n":
            "field 'draft_n' has unknown key 'unit' (keys: description, type)",
    }
    for text, line in cases.items():
        path.write_text(text, encoding="utf-8")
        with pytest.raises(FormatDefinitionError) as exc:
            spec.check_schema(tomllib.loads(text), path, "fields")
        assert exc.value.one_line() == f"{path}: {line}"


def test_the_schemas_are_published_with_the_package() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    data = project["tool"]["setuptools"]["package-data"]
    assert "schemas/*.json" in data["parsers"] and "schemas/*.json" in data["forensics"]
    published = sorted(p.relative_to(ROOT).as_posix() for p in [*ROOT.glob("parsers/schemas/*.json"),
                                                                *ROOT.glob("forensics/schemas/*.json")])
    assert published == ["forensics/schemas/attempt.schema.json", "forensics/schemas/manifest.schema.json",
                         "forensics/schemas/mapping.schema.json", "parsers/schemas/fields.schema.json",
                         "parsers/schemas/format.schema.json"]
    dev = (ROOT / "docs" / "development.md").read_text(encoding="utf-8")
    for path in published:
        assert f"`{path}`" in dev, path
        assert json.loads((ROOT / path).read_text(encoding="utf-8"))["$schema"].endswith("2020-12/schema")


def test_every_shipped_mapping_and_the_docs_syntax_example_pass_their_schema() -> None:
    from forensics.replay.records import schema_errors

    for path in sorted((ROOT / "forensics" / "mappings").glob("*.toml")):
        assert schema_errors("mapping", tomllib.loads(path.read_text(encoding="utf-8"))) == [], path.name
    syntax = (ROOT / "docs" / "replay.md").read_text(encoding="utf-8").split("### Syntax", 1)[1]
    example = tomllib.loads(syntax.split("```toml", 1)[1].split("```", 1)[0])
    assert schema_errors("mapping", example) == []
    jsonschema.Draft202012Validator.check_schema(json.loads(
        (ROOT / "forensics" / "schemas" / "mapping.schema.json").read_text(encoding="utf-8")))


ITEM = "[attempts.fields]\nitem = 'ticker'\n"
FIELD_SHAPE = "give path or sql, and optionally unit, scale, map, default, optional, take, when"


@pytest.mark.parametrize(("text", "line"), [
    ("[mapping]\nformat = 'xml'\n" + ITEM, "[mapping] format = 'xml' is not one of json, jsonl, csv, yaml, text"),
    ("[results]\nx = 1\n" + ITEM, "unknown section(s) results (sections are [mapping], [manifest] and [attempts])"),
    ("attempts = 3\n", "[attempts] must be a table (or [[attempts]] tables, each a table)"),
    ("[attempts]\nlayout = 'rows'\n" + ITEM,
     "[attempts] layout = 'rows' is not one of records, parallel_arrays, keyed_rows, events"),
    ("[attempts]\nfile = '*.csv'\n" + ITEM,
     "[attempts] unknown key(s) file (keys: path, layout, key, files, where, anchor, fields, set)"),
    ("[attempts]\nfiles = []\n" + ITEM, '[attempts] files must be a glob such as "*.csv" or a list of globs'),
    ("[attempts]\nwhere = 3\n" + ITEM, "[attempts] where must be a SQL expression string"),
    ("[attempts]\nanchor = 'start'\n" + ITEM, '[attempts] anchor: give "manifest" or { path = ..., unit = ... } (or a list)'),
    ("[attempts.fields]\nitem = 3\n", "[attempts.fields] item: expected a path string, a list of them, or a table"),
    ("[attempts.fields]\nitem = []\n", "[attempts.fields] item: give at least one path (or expression)"),
    ("[attempts.fields]\nitem = { path = 'a', sql = 'b' }\n", f"[attempts.fields] item: {FIELD_SHAPE}"),
    ("[attempts.fields]\nitem = { unit = 's' }\n", f"[attempts.fields] item: {FIELD_SHAPE}"),
    ("[attempts.fields]\nitem = { path = 'a', colour = 'b' }\n", f"[attempts.fields] item: {FIELD_SHAPE} (unknown: colour)"),
    ("[attempts.fields]\nitem = { path = 'a', take = 'median' }\n",
     "[attempts.fields] item: take = 'median' is not one of first, last, count, sum, min, max"),
    ("[attempts.fields]\nitem = { path = 'a', absent = ' ' }\n",
     "[attempts.fields] item: absent must be the sentence to say when a file lacks the field"),
    ("[attempts.fields]\nitem = { path = 'a', scale = 'x' }\n", "[attempts.fields] item: scale must be a number, not 'x'"),
    ("[manifest.fields]\nended = { how = 3 }\n",
     "[manifest.fields] ended.how: expected a path string, a list of them, or a table"),
    ("[[attempts]]\nfiles = '*.csv'\n[attempts.fields]\nitem = 'a'\n[[attempts]]\nlayout = 'x'\n",
     "[attempts 2] layout = 'x' is not one of records, parallel_arrays, keyed_rows, events"),
])
def test_a_mapping_that_breaks_its_schema_is_refused_in_one_line(tmp_path: Path, text: str, line: str) -> None:
    from forensics.errors import MappingError
    from forensics.replay.mapping import load_mapping

    path = tmp_path / "bench.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(MappingError) as exc:
        load_mapping(path)
    assert exc.value.one_line() == f"{path}: {line}"
