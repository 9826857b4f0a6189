"""Every format definition checks itself: samples, one kind per sample, wrappers, detection of the fixtures."""

from __future__ import annotations

import re
from pathlib import Path

import polars as pl
import pytest

from forensics.ingest import detect_format
from parsers.engine import Carry, Engine, load_wrappers
from parsers.spec import Format, Kind, load_formats

FORMATS = load_formats()
FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "logs"

# Known defects in format files, each a strict xfail so that a fix turns it red until the entry goes.
KNOWN: dict[tuple[str, str], str] = {}


def _known(request: pytest.FixtureRequest, key: tuple[str, str]) -> None:
    if key in KNOWN:
        request.applymarker(pytest.mark.xfail(reason=KNOWN[key], strict=True))


# fixture name prefix -> the format it must be detected as
EXPECTED_FORMAT = {
    "era1-json": "llama-2023-json",
    "era2-logtee": "llama-2023-json",
    "era3-json": "llama-2024-json",
    "era3-text": "llama-2024-text",
    "era4-": "llama-common",
    "era5-": "llama-common",
}


def _kind_samples() -> list[tuple[str, str, str]]:
    return [(f.name, k.name, s) for f in FORMATS.values() for k in f.kinds for s in k.samples]


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_every_kind_has_a_sample(fmt: str) -> None:
    missing = [k.name for k in FORMATS[fmt].kinds if not k.samples]
    assert missing == []


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_samples_classify_as_their_kind(fmt: str, request: pytest.FixtureRequest) -> None:
    """Each sample, run through the engine alone, is recognised as exactly the kind that carries it."""
    _known(request, ("classify", fmt))
    f = FORMATS[fmt]
    eng = Engine(f)
    wrong = []
    for kind in f.kinds:
        for sample in kind.samples:
            res = eng.classify(pl.Series([sample], dtype=pl.String), 1, Carry())
            if kind.skip:
                ok = res.skipped.get(kind.name, 0) == 1 and res.events.height == 0
            else:
                ok = res.events.height == 1 and res.events["kind"][0] == kind.name
            if not ok:
                got = res.events["kind"].to_list() if res.events.height else dict(res.skipped)
                wrong.append((kind.name, sample[:80], got))
    assert wrong == []


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_samples_match_no_other_specific_kind(fmt: str, request: pytest.FixtureRequest) -> None:
    """A sample of a non-fallback kind matches no other non-fallback kind of the same format."""
    _known(request, ("unique", fmt))
    f = FORMATS[fmt]
    eng = Engine(f)
    specific = [k for k in f.kinds if not k.fallback]
    clashes = []
    for kind in specific:
        for sample in kind.samples:
            body = _body(eng, sample)
            for other in specific:
                if other.name == kind.name or _on_record(f, other) != _on_record(f, kind):
                    continue
                if re.search(other.regex, body):
                    clashes.append((kind.name, other.name, sample[:80]))
    assert clashes == []


def _on_record(fmt: Format, kind: Kind) -> bool:
    return fmt.family != "text" and bool(kind.json_fields or kind.kv_fields or kind.name.startswith("rec_"))


def _body(eng: Engine, sample: str) -> str:
    """The text a kind's regex sees: the record message for JSON/kv records, else the unwrapped line."""
    f = eng.fmt
    text, _, _ = eng.unwrap(pl.Series([sample], dtype=pl.String))
    line = text[0]
    if f.family == "json" and line.startswith("{"):
        msg = pl.Series([line]).str.json_path_match(f"$.{f.message or 'msg'}")[0]
        return msg if msg is not None else line
    if f.family == "kv":
        m = re.match(f.record or "", line)
        return m.group("msg") if m else line
    if f.prefix:
        m = re.match(f.prefix, line)
        return line[m.end():] if m else line
    return line


@pytest.mark.parametrize("name", [w.name for w in load_wrappers().prefixes])
def test_wrapper_samples_are_unwrapped(name: str, request: pytest.FixtureRequest) -> None:
    _known(request, ("wrapper", name))
    wrappers = load_wrappers()
    eng = Engine(FORMATS["llama-common"], wrappers)
    w = next(w for w in wrappers.prefixes if w.name == name)
    for sample in w.samples:
        text, _, seen = eng.unwrap(pl.Series([sample], dtype=pl.String))
        assert name in seen, sample
        assert len(text[0]) < len(sample)


def test_json_wrapper_samples_are_unwrapped() -> None:
    wrappers = load_wrappers()
    eng = Engine(FORMATS["llama-common"], wrappers)
    for jw in wrappers.json:
        for sample in jw.samples:
            text, _, seen = eng.unwrap(pl.Series([sample], dtype=pl.String))
            assert jw.name in seen
            assert not text[0].lstrip().startswith("{"), text[0]


def _fixtures() -> list[Path]:
    return sorted(FIXTURES.glob("*.log"))


@pytest.mark.parametrize("path", _fixtures(), ids=lambda p: p.stem)
def test_fixture_format_is_detected(path: Path) -> None:
    expected = next((v for k, v in EXPECTED_FORMAT.items() if path.stem.startswith(k)), "llama-common")
    assert detect_format(path) == expected


@pytest.mark.parametrize("path", sorted(FIXTURES.glob("*.log")), ids=lambda p: p.name)
def test_kind_order_does_not_change_the_result(path: Path) -> None:
    """Trying the frequent kinds first (as ingest does once it has seen a chunk) classifies every line the same
    way as trying them in file order: the speed-up relies on non-fallback kinds being disjoint."""
    fmt = FORMATS[detect_format(path) or "llama-common"]
    lines = pl.Series(path.read_text(encoding="utf-8", errors="replace").splitlines(), dtype=pl.String)
    eng = Engine(fmt)
    in_file_order = eng.classify(lines, 1, Carry())
    reverse = tuple(reversed([i for i, k in enumerate(fmt.kinds) if not k.fallback and
                              i < next((j for j, x in enumerate(fmt.kinds) if x.fallback), len(fmt.kinds))]))
    rest = tuple(i for i in range(len(fmt.kinds)) if i not in reverse)
    for order in (reverse + rest, None):
        if order is None:
            eng.learn(in_file_order)
        res = eng.classify(lines, 1, Carry(), order)
        assert res.events.equals(in_file_order.events)
        assert res.unparsed.equals(in_file_order.unparsed)
        assert (res.parsed, dict(res.skipped)) == (in_file_order.parsed, dict(in_file_order.skipped))
