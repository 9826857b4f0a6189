"""Every format definition checks itself: samples, one kind per sample, wrappers, frames, detection."""

from __future__ import annotations

import functools
from pathlib import Path

import polars as pl
import pytest
import regex

from forensics.errors import FormatDefinitionError
from forensics.ingest import detect_format
from parsers.engine import Carry, Engine, load_frames, load_wrappers
from parsers.spec import ALIASES, format_names, grammar, load_formats

FORMATS = load_formats()
GRAMMAR = grammar()
ENGINE = Engine(GRAMMAR)
FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "logs"

# fixture name prefix -> the format most of its lines belong to
EXPECTED_FORMAT = {
    "era1-json": "llama-2023",
    "era2-logtee": "llama-2023",
    "era3-": "llama-records",
    "era4-": "llama-common",
    "era5-": "llama-common",
}


def _samples() -> list[tuple[str, str, str]]:
    return [(f.name, k.name, s) for f in FORMATS.values() for k in f.kinds for s in k.samples]


def _classify(engine: Engine, lines: list[str]) -> pl.DataFrame:
    return engine.classify(pl.Series(lines, dtype=pl.String), 1, Carry()).events


@pytest.mark.parametrize(("fmt", "kind", "sample"), _samples(), ids=lambda v: str(v)[:40])
def test_each_sample_is_its_own_kind_among_every_format(fmt: str, kind: str, sample: str) -> None:
    """A sample, read with every format's kinds at once (as a log is read), is recognised as its own kind."""
    res = ENGINE.classify(pl.Series([sample], dtype=pl.String), 1, Carry())
    k = GRAMMAR.kind(kind)
    if k.skip:
        assert res.skipped.get(kind, 0) == 1 and res.events.height == 0
    else:
        assert res.events["kind"].to_list() == [kind]


OWN = [s for s in _samples() if not FORMATS[s[0]].shared]
SHARED = [s for s in _samples() if FORMATS[s[0]].shared]
FORCEABLE = [name for name, f in FORMATS.items() if not f.shared]


@functools.cache
def _forced(fmt: str) -> Engine:
    return Engine(grammar(fmt))


def _forced_kinds(fmt: str, sample: str) -> list[str]:
    return _forced(fmt).classify(pl.Series([sample], dtype=pl.String), 1, Carry()).events["kind"].to_list()


@pytest.mark.parametrize(("fmt", "kind", "sample"), OWN, ids=lambda v: str(v)[:40])
def test_each_sample_is_its_own_kind_when_its_format_is_forced(fmt: str, kind: str, sample: str) -> None:
    assert _forced_kinds(fmt, sample) == ([] if _forced(fmt).fmt.kind(kind).skip else [kind])


@pytest.mark.parametrize(("fmt", "kind", "sample"), SHARED, ids=lambda v: str(v)[:40])
def test_a_shared_sample_is_its_own_kind_whichever_format_is_forced(fmt: str, kind: str, sample: str) -> None:
    """A shared format (crashes, library lines) has no forced grammar of its own: it is part of every other."""
    want = [] if GRAMMAR.kind(kind).skip else [kind]
    assert {forced: _forced_kinds(forced, sample) for forced in FORCEABLE} == dict.fromkeys(FORCEABLE, want)


def test_specific_kinds_are_disjoint() -> None:
    """No sample of a specific (non-catch-all) kind matches another specific kind of the same frame: so the
    kinds can be tried in any order (the engine tries the frequent ones first)."""
    framer = ENGINE.framer
    specific = [k for k in GRAMMAR.kinds if not k.fallback]
    clashes = []
    for kind in specific:
        for sample in kind.samples:
            text, _, _ = ENGINE.unwrap(pl.Series([sample], dtype=pl.String))
            fr = framer(text)
            body, record = fr.body[0], bool(fr.record[0])
            for other in specific:
                if (other.name != kind.name and (other.frame == "record") == record and regex.search(other.regex, body)
                        and not (other.exclude and regex.search(other.exclude, body))):
                    clashes.append((kind.name, other.name, sample[:80]))
    assert clashes == []


def test_skipped_kinds_hide_no_fact() -> None:
    assert [k.name for k in GRAMMAR.kinds if k.skip and set(k.fields) - {"slot", "task"}] == []


def test_a_format_file_with_a_skipped_kind_that_captures_a_fact_is_refused(tmp_path: Path) -> None:
    from parsers.spec import load_format

    bad = tmp_path / "bad.toml"
    bad.write_text("[format]\nname = 'bad'\n[[kind]]\nname = 'x'\nregex = '^n = (?P<tokens>\\d+)$'\n"
                   "skip = true\nsamples = ['n = 1']\n")
    with pytest.raises(FormatDefinitionError, match="skipped but captures fields"):
        load_format(bad)


@pytest.mark.parametrize("name", [w.name for w in load_wrappers().prefixes])
def test_wrapper_samples_are_unwrapped(name: str) -> None:
    w = next(w for w in load_wrappers().prefixes if w.name == name)
    for sample in w.samples:
        text, _, seen = ENGINE.unwrap(pl.Series([sample], dtype=pl.String))
        assert name in seen, sample
        assert len(text[0]) < len(sample)


def test_json_wrapper_samples_are_unwrapped() -> None:
    for jw in load_wrappers().json:
        for sample in jw.samples:
            text, _, seen = ENGINE.unwrap(pl.Series([sample], dtype=pl.String))
            assert jw.name in seen
            assert not text[0].lstrip().startswith("{"), text[0]


@pytest.mark.parametrize("name", [k.name for k in load_frames().kv])
def test_record_frame_samples_are_records(name: str) -> None:
    kv = next(k for k in load_frames().kv if k.name == name)
    fr = ENGINE.framer(pl.Series(list(kv.samples), dtype=pl.String))
    assert fr.record.all()


def test_json_records_read_the_same_whatever_their_shape() -> None:
    """Key order, extra keys, thread ids in decimal or hex, `msg` or `message`, numbers as strings and a line
    cut short after the keys that matter: the same kind and the same fields."""
    lines = [
        '{"tid":"140196735963136","timestamp":1715170012,"level":"INFO","function":"update_slots","line":1781,'
        '"msg":"slot released","id_slot":2,"id_task":7,"n_past":987,"truncated":false}',
        '{"function":"update_slots","id_slot":2,"id_task":7,"level":"INFO","line":1781,"msg":"slot released",'
        '"n_past":987,"tid":"0x176287000","timestamp":1715170012,"truncated":false}',
        '{"timestamp":1715170012,"level":"INFO","function":"update_slots","message":"slot released","slot_id":"2",'
        '"task_id":"7","n_past":"987","truncated":"false","extra":{"a":[1,2]}}',
        '{"id_slot":2,"id_task":7,"msg":"slot released","n_past":987,"timestamp":1715170012,"truncated":false,"n_ca',
    ]
    ev = _classify(ENGINE, lines)
    assert ev.select("kind", "slot", "task", "n_past", "truncated").rows() == [("rec_release", 2, 7, 987, False)] * 4
    assert ev["epoch"].to_list() == ["1715170012"] * 4


@pytest.mark.parametrize("fmt", [*format_names(), *ALIASES])
def test_every_format_can_be_forced(fmt: str) -> None:
    assert grammar(fmt).kinds


def test_an_unknown_format_is_a_clear_error() -> None:
    with pytest.raises(FormatDefinitionError, match="unknown format 'nope'"):
        grammar("nope")


@pytest.mark.parametrize("path", sorted(FIXTURES.glob("*.log")), ids=lambda p: p.stem)
def test_fixture_format_is_detected(path: Path) -> None:
    expected = next((v for k, v in EXPECTED_FORMAT.items() if path.stem.startswith(k)), "llama-common")
    assert detect_format(path) == expected


def test_a_preamble_of_other_text_does_not_hide_the_log(tmp_path: Path) -> None:
    log = tmp_path / "pasted.log"
    prose = [f"user@host:~$ ./llama-server -m model.gguf --port {8000 + i}  # attempt {i}" for i in range(5000)]
    log.write_text("\n".join([*prose, "slot launch_slot_: id  0 | task 0 | processing task"]) + "\n")
    assert detect_format(log) is None  # past the head: the first 4000 lines are all that is read
    log.write_text("\n".join([*prose[:3000], "slot launch_slot_: id  0 | task 0 | processing task"]) + "\n")
    assert detect_format(log) == "llama-common"


def test_prose_alone_is_not_a_log(tmp_path: Path) -> None:
    f = tmp_path / "notes.txt"
    f.write_text("Note: the server crashed again.\nError: see above\nfoo: bar\n")
    assert detect_format(f) is None


def test_a_harness_note_of_command_lines_is_not_a_log(tmp_path: Path) -> None:
    """A run folder's cmdlines.txt (copied from a real recording): `main: <command line>` matches the catch-all
    of a server's `main:` lines, which is not evidence of a log by itself."""
    f = tmp_path / "cmdlines.txt"
    f.write_text("main: bin-b11434/llama-server -m models/tiny.gguf -c 2048 -np 4 -t 1 --metrics --host 127.0.0.1 "
                 "--port 19421 > main.log 2>&1\nclient: python3 harness.py --np 4 --timeout 300\n")
    assert detect_format(f) is None
    f.write_text(f.read_text() + "main: server is listening on http://127.0.0.1:19421 - starting the main loop\n"
                 "slot launch_slot_: id  0 | task 0 | processing task\n")
    assert detect_format(f) == "llama-common"


@pytest.mark.parametrize("path", sorted(FIXTURES.glob("*.log")), ids=lambda p: p.name)
def test_kind_order_does_not_change_the_result(path: Path) -> None:
    """Trying the frequent kinds first (as ingest does once it has seen a chunk) classifies every line the same
    way as trying them in file order: the speed-up relies on specific kinds being disjoint."""
    lines = pl.Series(path.read_text(encoding="utf-8", errors="replace").splitlines(), dtype=pl.String)
    eng = Engine(GRAMMAR)
    in_file_order = eng.classify(lines, 1, Carry())
    specific = [i for i, k in enumerate(GRAMMAR.kinds) if not k.fallback]
    rest = tuple(i for i in range(len(GRAMMAR.kinds)) if i not in specific)
    for order in ((*reversed(specific), *rest), None):
        if order is None:
            eng.learn(in_file_order)
        res = eng.classify(lines, 1, Carry(), order)
        assert res.events.equals(in_file_order.events)
        assert res.unparsed.equals(in_file_order.unparsed)
        assert (res.parsed, dict(res.skipped)) == (in_file_order.parsed, dict(in_file_order.skipped))


def test_no_first_pass_kind_matches_a_wrapped_line() -> None:
    """Lines are first read as they are, with the kinds that cannot match a line still wearing a wrapper (the
    others are `loose`); a wrapped line must be left for the second pass, which keeps what the wrapper says.
    Every wrapper sample, and every specific kind's sample behind every prefix wrapper, goes to the second pass."""
    wrappers = load_wrappers().prefixes
    prefixes = [w.samples[0][: len(w.samples[0]) - len(ENGINE.unwrap(pl.Series([w.samples[0]]))[0][0])]
                for w in wrappers if "(?P<inner>" not in w.regex]
    plain = [i for i in range(len(GRAMMAR.kinds)) if ENGINE._plain[i]]
    taken = []
    for i in plain:
        for w in wrappers:
            taken += [(GRAMMAR.kinds[i].name, s) for s in w.samples if regex.search(ENGINE._fast[i], s)]
        for sample in GRAMMAR.kinds[i].samples:
            taken += [(GRAMMAR.kinds[i].name, p) for p in prefixes if regex.search(ENGINE._fast[i], p + sample)]
    assert taken == []
