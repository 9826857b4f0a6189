"""Duplicate files: the same content twice in one run is read once.

A server started with ``--log-file server.log`` and ``2> server.stderr.log`` writes every line twice; a
records file gets copied next to itself.  Two files of one run are duplicates when their (decompressed)
contents are equal or one is a prefix of the other (a copy taken while the log was still being written).
The longer one is read; of two equal ones the one already in the store, else the first by path.

Only files whose first bytes agree are compared further, and the comparison stops at the first
difference, so files that differ cost one small read each.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

HEAD = 4096
CHUNK = 1 << 20


@dataclass(frozen=True)
class Candidate:
    path: Path
    run: str
    stored: bool = False  # already in the store (kept over an equal newcomer)


@dataclass(frozen=True)
class Duplicate:
    path: Path
    of: Path  # the file whose content it repeats
    equal: bool  # same content (else a prefix of it)

    def describe(self) -> str:
        return f"duplicate of {self.of} ({'same content' if self.equal else 'its beginning'}): not read again"


def find(cands: list[Candidate]) -> list[Duplicate]:
    """The duplicates among ``cands`` (each pointing at the file that is read instead)."""
    by_run: dict[str, list[tuple[bytes, Candidate]]] = {}
    for c in cands:
        head = _head(c.path)
        if head:  # an empty file repeats nothing
            by_run.setdefault(c.run, []).append((head, c))
    out: dict[Path, Duplicate] = {}
    for group in by_run.values():
        group.sort(key=lambda hc: hc[0])
        for i, (head_i, ci) in enumerate(group):
            for head_j, cj in group[i + 1:]:
                if not head_j.startswith(head_i):
                    break  # sorted: no later head starts with this one either
                _pair(ci, cj, out)
    return [_final(d, out) for d in out.values()]


def _pair(a: Candidate, b: Candidate, out: dict[Path, Duplicate]) -> None:
    relation = _compare(a.path, b.path)
    if relation == "equal":
        keep, drop = sorted((a, b), key=lambda c: (not c.stored, str(c.path)))
        out.setdefault(drop.path, Duplicate(drop.path, keep.path, True))
    elif relation == "a<b":
        out.setdefault(a.path, Duplicate(a.path, b.path, False))
    elif relation == "b<a":
        out.setdefault(b.path, Duplicate(b.path, a.path, False))


def _final(d: Duplicate, out: dict[Path, Duplicate]) -> Duplicate:
    """Point a duplicate at the file that is read in the end (a in b, b in c: a is a duplicate of c)."""
    seen = {d.path}
    of = d.of
    while of in out and out[of].of not in seen:
        seen.add(of)
        of = out[of].of
    return Duplicate(d.path, of, d.equal)


def _head(path: Path) -> bytes:
    from parsers.reader import open_binary

    try:
        with open_binary(path) as fh:
            return _read(fh, HEAD)
    except OSError:
        return b""


def _read(fh: object, n: int) -> bytes:
    """Up to ``n`` bytes (a decompressing reader may return fewer per call)."""
    parts, got = [], 0
    while got < n:
        b = fh.read(n - got)  # type: ignore[attr-defined]
        if not b:
            break
        parts.append(b)
        got += len(b)
    return b"".join(parts)


def _compare(a: Path, b: Path) -> str:
    """``equal``, ``a<b`` (a's content is a prefix of b's), ``b<a`` or ``differ``."""
    from parsers.reader import open_binary

    try:
        with open_binary(a) as fa, open_binary(b) as fb:
            while True:
                ca, cb = _read(fa, CHUNK), _read(fb, CHUNK)
                n = min(len(ca), len(cb))
                if ca[:n] != cb[:n]:
                    return "differ"
                if len(ca) == len(cb) == 0:
                    return "equal"
                if len(ca) < len(cb):
                    return "a<b" if not _read(fa, 1) else "differ"
                if len(cb) < len(ca):
                    return "b<a" if not _read(fb, 1) else "differ"
    except OSError:
        return "differ"
