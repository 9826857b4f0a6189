"""Words a harness invents for the schema's enumerated fields: a record is never lost for one of them.

Two fields of the record schema take a word from a fixed list: a manifest's ``ended.how`` (completed, killed,
crashed, unknown) and an attempt's ``outcome`` (ok, failed, parse_error, timeout, cancelled).  Harnesses write
other words there (``drained``, ``success``, ``server_shutdown``).  Rejecting the record for that would lose a
manifest's servers, items and stages, or an attempt, over one word, so before a record is validated:

- a word that surely means a listed one (another spelling or case: ``success`` is ``ok``, ``Timed-Out`` is
  ``timeout``) is read as that word;
- any other word is read as ``unknown`` (``ended.how``: the word is put before the detail) or ``failed``
  (``outcome``: the word is kept in ``error``).

Each word read so is said once per file and field, with how many records wrote it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

OUTCOMES = ("ok", "failed", "parse_error", "timeout", "cancelled")
ENDINGS = ("completed", "killed", "crashed", "unknown")
# other spellings that surely mean a listed word (compared lower case, with - and spaces as _)
OUTCOME_WORDS = {
    "ok": ("okay", "success", "succeeded", "successful", "completed", "complete", "done", "pass", "passed"),
    "failed": ("fail", "failure", "error", "errored", "exception", "rejected"),
    "parse_error": ("parse_failed", "parse_failure", "unparsed", "invalid_json", "json_error", "parsing_error"),
    "timeout": ("timed_out", "timedout", "time_out", "expired", "deadline_exceeded"),
    "cancelled": ("canceled", "cancel", "aborted", "abort", "interrupted"),
}
ENDING_WORDS = {
    "completed": ("complete", "done", "finished", "success", "succeeded", "ok"),
    "killed": ("kill", "sigkill", "sigterm", "terminated"),
    "crashed": ("crash", "died", "segfault", "segfaulted"),
}


def _key(word: str) -> str:
    return re.sub(r"[-\s]+", "_", word.strip().lower())


def _lookup(table: dict[str, tuple[str, ...]], listed: tuple[str, ...]) -> dict[str, str]:
    out = {w: w for w in listed}
    out.update({alias: w for w, aliases in table.items() for alias in aliases})
    return out


OUTCOME_OF = _lookup(OUTCOME_WORDS, OUTCOMES)
ENDING_OF = _lookup(ENDING_WORDS, ENDINGS)


@dataclass
class Words:
    """The words read for another, per (file, field, word): how many records wrote each and what it became."""

    seen: dict[tuple[str, str, str], list[Any]] = field(default_factory=dict)  # -> [read as, records]

    def _saw(self, path: str, fld: str, word: str, read_as: str) -> None:
        self.seen.setdefault((path, fld, word), [read_as, 0])[1] += 1

    def manifest(self, obj: Any, path: str) -> Any:
        """``obj`` with its ``ended.how`` read as a listed word (a copy when changed)."""
        ended = obj.get("ended") if isinstance(obj, dict) else None
        if not isinstance(ended, dict) or not isinstance(ended.get("how"), str) or ended["how"] in ENDINGS:
            return obj
        word = ended["how"]
        read_as = ENDING_OF.get(_key(word))
        new = {**ended, "how": read_as or "unknown"}
        if read_as is None:
            new["detail"] = f"{word}: {ended['detail']}" if ended.get("detail") else word
        self._saw(path, "ended.how", word, read_as or "")
        return {**obj, "ended": new}

    def attempt(self, obj: Any, path: str) -> Any:
        """``obj`` with its ``outcome`` read as a listed word (a copy when changed)."""
        if not isinstance(obj, dict) or not isinstance(obj.get("outcome"), str) or obj["outcome"] in OUTCOMES:
            return obj
        word = obj["outcome"]
        read_as = OUTCOME_OF.get(_key(word))
        new = {**obj, "outcome": read_as or "failed"}
        if read_as is None:
            said = obj.get("error")
            new["error"] = f"{said} (outcome {word!r})" if isinstance(said, str) and said else f"outcome {word!r}"
        self._saw(path, "outcome", word, read_as or "")
        return new

    def notes(self) -> list[str]:
        """One line per file, field and word."""
        lines = []
        for (path, fld, word), (read_as, n) in self.seen.items():
            records = f"{n} record{'s' if n > 1 else ''}"
            if read_as:
                lines.append(f"{path}: {fld} {word!r} read as {read_as!r} ({records})")
            elif fld == "ended.how":
                lines.append(f"{path}: {fld} {word!r} is not one of {', '.join(ENDINGS)}: read as 'unknown', the word "
                             f"kept in the detail ({records})")
            else:
                lines.append(f"{path}: {fld} {word!r} is not one of {', '.join(OUTCOMES)}: read as 'failed', the word "
                             f"kept in error ({records})")
        return lines
