"""``mapping init``: the outcome of an attempt, from every field of the sample that says a request failed.

A harness records failure in many places at once: an error text, an HTTP status, a success flag, a status
word (``succeeded``, ``errored``), a stop type (``abort``), a parse flag and a parse error (a truncated JSON
answer is an HTTP 200 that did not parse).  The proposal's outcome reads all of them, in this order, the first
that says the request failed deciding how:

1. a timeout flag -> ``timeout``;
2. an error text -> ``timeout`` / ``cancelled`` when it says so, else ``failed``;
3. a status word -> ``ok``, ``timeout``, ``cancelled`` or ``failed`` by what the word means;
4. an HTTP status of 400 or more -> ``failed``;
5. a success flag that is false -> ``failed``;
6. a stop type that is an error or an abort -> ``failed`` / ``cancelled``;
7. a parse flag that is false, or a parse error -> ``parse_error``;
8. else ``ok``.

A record of the sample with no status where the others have one, and nothing else saying it failed, could be
a request that got no response or one whose status was not written: the proposal asks which.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from forensics.replay.init_fields import NAMES, Choice, Sample, norm, q

TIMEOUT_FLAGS = ("timed_out", "timeout", "is_timeout")
SUCCESS_FLAGS = ("success", "succeeded", "is_success", "ok", "passed")
STATUS_WORDS = ("status", "state", "result_type", "type", "outcome")  # a word per request: succeeded, errored
PARSE_FLAGS = ("parsed", "parse_ok", "json_valid", "valid_json", "is_valid", "valid", "schema_valid")
PARSE_ERRORS = ("parse_error", "parse_err", "parsing_error", "validation_error", "json_error")
ERRORS = NAMES["error"] + ("error_code", "error_type")
OK_WORDS = {"ok", "success", "succeeded", "successful", "completed", "complete", "done", "pass", "passed",
            "finished"}
TIMEOUT_WORDS = {"timeout", "timed_out", "timedout", "expired"}
CANCEL_WORDS = {"cancelled", "canceled", "aborted", "abort", "incomplete", "interrupted"}
FAIL_WORDS = {"error", "errored", "failed", "failure", "fail", "exception", "rejected"}
STOP_FAIL = {"error": "failed", "abort": "cancelled", "aborted": "cancelled", "cancelled": "cancelled",
             "canceled": "cancelled", "timeout": "timeout"}
TIMEOUT_TEXT = "{e} ILIKE '%timeout%' OR {e} ILIKE '%timed out%' OR {e} ILIKE '%deadline%'"


@dataclass
class Outcome:
    """The outcome's TOML line (None: no field says anything), the fields it reads, guesses and choices."""

    line: str | None = None
    reads: list[str] = field(default_factory=list)
    guesses: list[str] = field(default_factory=list)
    choices: list[Choice] = field(default_factory=list)


def outcome(sample: Sample, placed: dict[str, str], pick: str | None = None) -> Outcome:
    """The outcome expression for the sample (see the module docstring); ``pick``: the user's reading of a
    record without a status ("failed" or "ok")."""
    out = Outcome()
    branches = [b for b in (_timeout_flag(sample, out), _errors(sample, out), _status_word(sample, out),
                            _http(sample, placed, out), _success(sample, out), _stop(sample, placed, out),
                            *_parse(sample, out)) if b]
    no_status = _no_status(sample, placed, out)
    null_branch = f"WHEN {q(placed['http_status'])} IS NULL THEN 'failed'" if no_status else ""
    lines = {"failed": _case([null_branch, *branches]), "ok": _case(branches)}
    if no_status and pick is None:
        out.choices.append(Choice("outcome", [(k, v or "") for k, v in lines.items()], no_status))
        return out
    out.line = lines["failed" if no_status and pick == "failed" else "ok"]
    return out


def _case(branches: list[str]) -> str | None:
    body = " ".join(b for b in branches if b)
    return f'outcome = {{ sql = "CASE {body} ELSE \'ok\' END" }}' if body else None


def _find(sample: Sample, names: tuple[str, ...], want: Any = None, *, silent: bool = False) -> list[str]:
    """Paths of the sample whose own name is one of ``names`` (shallowest first), holding some value (or none,
    with ``silent``: an error field that never fired) and, with ``want``, values that all pass it."""
    wanted = {re.sub(r"[-_\s]", "", n) for n in names}
    paths = [p for p in sample.columns if norm(p) in wanted and (silent or any(v is not None
                                                                              for v in sample.columns[p]))]
    if want is not None:
        paths = [p for p in paths if all(want(v) for v in sample.columns[p] if v is not None)]
    return sorted(paths, key=lambda p: (p.count("."), p))


def _boolish(v: Any) -> bool:
    return isinstance(v, bool) or (isinstance(v, str) and v.strip().lower() in ("true", "false")) or v in (0, 1)


def _falsy(path: str) -> str:
    return f"lower(CAST({q(path)} AS VARCHAR)) IN ('false', '0', 'no')"


def _text(path: str) -> str:
    return f"coalesce(CAST({q(path)} AS VARCHAR), '') NOT IN ('', '[]', '{{}}', 'null')"


def _timeout_flag(sample: Sample, out: Outcome) -> str:
    paths = _find(sample, TIMEOUT_FLAGS, _boolish)
    if not paths:
        return ""
    out.reads.append(paths[0])
    return f"WHEN lower(CAST({q(paths[0])} AS VARCHAR)) IN ('true', '1') THEN 'timeout'"


def _errors(sample: Sample, out: Outcome) -> str:
    """Every error field: the shallowest of each family (``error`` over ``error.message``)."""
    found = _find(sample, ERRORS, silent=True)
    paths = [p for p in found if not any(p.startswith(f"{o}.") for o in found)]
    if not paths:
        return ""
    out.reads.extend(paths)
    said = " OR ".join(_text(p) for p in paths)
    text = "concat_ws(' ', " + ", ".join(f"CAST({q(p)} AS VARCHAR)" for p in paths) + ")"
    return (f"WHEN {said} THEN CASE WHEN {TIMEOUT_TEXT.format(e=text)} THEN 'timeout' "
            f"WHEN {text} ILIKE '%cancel%' THEN 'cancelled' ELSE 'failed' END")


def _words(values: list[Any]) -> set[str]:
    return {str(v).strip().lower() for v in values if isinstance(v, str)}


def _status_word(sample: Sample, out: Outcome) -> str:
    """A field whose words say how each request ended (``succeeded``, ``errored``, ``expired``)."""
    for path in _find(sample, STATUS_WORDS, lambda v: isinstance(v, str) and not v.strip().isdigit()):
        words = _words(sample.columns[path])
        if not words & OK_WORDS or len(words) > 12:
            continue
        out.reads.append(path)
        unknown = words - OK_WORDS - TIMEOUT_WORDS - CANCEL_WORDS - FAIL_WORDS
        if unknown:
            out.guesses.append(f"outcome: {path} = {', '.join(sorted(unknown))} read as failed")
        cases = [(OK_WORDS, "ok"), (TIMEOUT_WORDS, "timeout"), (CANCEL_WORDS, "cancelled")]
        inner = " ".join(f"WHEN lower({q(path)}) IN ({_list(w & words or w)}) THEN '{o}'" for w, o in cases)
        return f"WHEN {q(path)} IS NOT NULL AND lower({q(path)}) NOT IN ({_list(OK_WORDS)}) THEN CASE {inner} " \
               "ELSE 'failed' END"
    return ""


def _list(words: set[str]) -> str:
    return ", ".join(f"'{w}'" for w in sorted(words))


def _http(sample: Sample, placed: dict[str, str], out: Outcome) -> str:
    path = placed.get("http_status")
    if path is None:
        return ""
    out.reads.append(path)
    return f"WHEN TRY_CAST({q(path)} AS INTEGER) >= 400 THEN 'failed'"


def _success(sample: Sample, out: Outcome) -> str:
    paths = _find(sample, SUCCESS_FLAGS, _boolish)
    if not paths:
        return ""
    out.reads.append(paths[0])
    return f"WHEN {_falsy(paths[0])} THEN 'failed'"


def _stop(sample: Sample, placed: dict[str, str], out: Outcome) -> str:
    path = placed.get("stop_type")
    if path is None:
        return ""
    out.reads.append(path)
    said = f"lower(CAST({q(path)} AS VARCHAR))"
    by: dict[str, list[str]] = {}
    for word, result in STOP_FAIL.items():
        by.setdefault(result, []).append(word)
    return " ".join(f"WHEN {said} IN ({_list(set(words))}) THEN '{result}'" for result, words in by.items())


def _parse(sample: Sample, out: Outcome) -> list[str]:
    flags = _find(sample, PARSE_FLAGS, _boolish)
    errors = _find(sample, PARSE_ERRORS)
    out.reads.extend(flags[:1] + errors[:1])
    return ([f"WHEN {_falsy(flags[0])} THEN 'parse_error'"] if flags else []) + \
        ([f"WHEN {_text(errors[0])} THEN 'parse_error'"] if errors else [])


def _no_status(sample: Sample, placed: dict[str, str], out: Outcome) -> str:
    """Why a record without a status is undecided, or "" when no such record is in the sample (or another
    field says it failed)."""
    path = placed.get("http_status")
    if path is None:
        return ""
    others = [p for p in out.reads if p not in (path, placed.get("stop_type"))]  # a stop type says how it ended
    rows = list(zip(*(sample.columns[p] for p in [path, *others]), strict=False))
    bare = [r for r in rows if r[0] in (None, "") and not any(_says_failed(v) for v in r[1:])]
    if not bare:
        return ""
    return (f"{len(bare)} of {len(rows)} records have no {path} and nothing else saying they failed: a request "
            "that got no response (failed), or one whose status was not written (ok)")


def _says_failed(v: Any) -> bool:
    if v is None or v == "" or v == [] or v == {}:
        return False
    if isinstance(v, bool):
        return not v
    return not (isinstance(v, str) and v.strip().lower() in OK_WORDS | {"true"})
