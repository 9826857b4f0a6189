"""Records read without ``--mapping``: a tool's report a shipped mapping recognises by content, and a harness's
per-request records that ``mapping init`` reads with certainty.

- **A shipped mapping's report.**  A shipped mapping may say how its tool's file is told by content
  (``[mapping] detect = { head = REGEX, has = ["dot.path", ...] }``): the regex on the file's first 64 KiB,
  then every path present in its first document.  GuideLLM's report, JSON or YAML, is so told.
- **A harness's records, proposed.**  A file that looks like per-request records (``recordlike``) is proposed
  a mapping (``mapping_init``); when the proposal is sure, it is read with it: the run id, item, stage and
  outcome placed from the records, nothing left undecided, and the check on the file read every record, none
  bad.  The proposal is kept in the store (``_mappings/``), the file's entry names it, and ingest says so in one
  line.  When it is not sure, the file is passed over with the hint to run ``mapping init``.
"""

from __future__ import annotations

import functools
import hashlib
import sys
from pathlib import Path
from typing import Any

import regex

from forensics.errors import ForensicsError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

HEAD = 65536
DATA_SUFFIXES = (".json", ".yaml", ".yml")
SURE = ("run_id", "item", "stage", "outcome")  # placed from the records, or the proposal is not sure
STORED = "_mappings"  # the store's folder of the proposals it read files with


@functools.cache
def _detectors() -> tuple[tuple[str, Any, tuple[str, ...]], ...]:
    """(mapping name, head regex, paths) of the shipped mappings that say how their file is told."""
    from forensics.replay.mapping import shipped_mappings

    out = []
    for name, src in sorted(shipped_mappings().items()):
        spec = tomllib.loads(src.read_text(encoding="utf-8")).get("mapping", {}).get("detect")
        if isinstance(spec, dict) and spec.get("head"):
            has = spec.get("has") or ()
            out.append((name, regex.compile(spec["head"]), tuple([has] if isinstance(has, str) else has)))
    return tuple(out)


def shipped_reader(path: Path) -> str | None:
    """The shipped mapping whose tool wrote ``path``, told by its content (None: none says so)."""
    name = path.name.lower().removesuffix(".gz").removesuffix(".zst")
    if not name.endswith(DATA_SUFFIXES):
        return None
    from forensics.replay.records import read_text

    try:
        head = read_text(path, HEAD)
    except ForensicsError:
        return None
    for mapping, head_re, paths in _detectors():
        if head_re.search(head) and _has(path, mapping, paths):
            return mapping
    return None


def _has(path: Path, mapping: str, paths: tuple[str, ...]) -> bool:
    from forensics.replay.mapping import _MISSING, get_path, load_mapping, read_data

    try:
        docs = read_data(load_mapping(mapping), path).docs
    except ForensicsError:
        return False
    return bool(docs) and all(get_path(docs[0], p) is not _MISSING for p in paths)


def proposed_reader(path: Path, store_root: Path) -> tuple[str | None, str]:
    """The stored proposal to read ``path`` with, when ``mapping init`` is sure of it (else None), and why it
    is not sure ("" when it is, or when the file does not look like records at all)."""
    from forensics.replay.mapping_init import propose
    from forensics.replay.recordlike import looks_like_records

    if not looks_like_records(path):
        return None, ""
    try:
        proposal = propose(path)
    except ForensicsError as exc:
        return None, exc.one_line()
    doubt = unsure(proposal)
    if doubt:
        return None, doubt
    folder = store_root / STORED
    folder.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256(proposal.text.encode()).hexdigest()[:12]
    kept = folder / f"{regex.sub(r'[^A-Za-z0-9_-]+', '-', path.stem)}-{digest}.toml"
    if not kept.exists():
        tmp = kept.with_suffix(".tmp")
        tmp.write_text(proposal.text, encoding="utf-8")
        tmp.replace(kept)
    return str(kept), ""


def unsure(proposal: Any) -> str:
    """Why ``proposal`` (a ``mapping_init.Proposal``) is not sure enough to read a file unasked ("" when it is)."""
    if proposal.choices:
        return f"undecided: {', '.join(c.canonical for c in proposal.choices)}"
    missing = [f for f in SURE if f not in proposal.placed]
    if missing:
        return f"no field of the records gives {', '.join(missing)}"
    if proposal.problems:
        return f"it rejects records of the file ({proposal.problems[0]})"
    if proposal.attempts != proposal.records:
        return f"it reads {proposal.attempts} of the file's {proposal.records} records"
    return ""
