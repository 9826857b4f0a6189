"""Does a file look like a harness's per-request records?  Told from its head, cheaply, so that a file passed
over in a run folder can say that ``forensics mapping init`` proposes a mapping for it.

Records: JSON lines, a CSV header, or a JSON document holding a list of objects, whose fields include at least
two of the attempt schema's (by the names ``mapping init`` matches), one of them a request's own measure (a
time, a status, tokens, an error, an outcome).
"""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path
from typing import Any

from forensics.replay.init_fields import NAMES

HEAD = 65536
MEASURES = ("started_at", "ended_at", "latency_ms", "ttft_ms", "http_status", "error", "tokens_evaluated",
            "tokens_predicted", "stop_type")
WANTED = {re.sub(r"[-_\s]", "", n.lower()): c for c, names in NAMES.items() for n in names}


def looks_like_records(path: Path) -> list[str]:
    """The fields of ``path``'s records that name attempt fields (empty: not records by the look of it)."""
    try:
        with path.open("rb") as fh:
            head = fh.read(HEAD).decode("utf-8", errors="replace").lstrip("\ufeff \t\r\n")
    except OSError:
        return []
    keys = _keys(head, path.suffix.lower())
    hits = {k: WANTED[re.sub(r"[-_\s]", "", k.lower())] for k in keys if re.sub(r"[-_\s]", "", k.lower()) in WANTED}
    if len(hits) < 2 or not set(hits.values()) & set(MEASURES):
        return []
    return list(hits)


def _keys(head: str, suffix: str) -> list[str]:
    if head.startswith("{"):
        first = head.split("\n", 1)[0]
        try:
            obj: Any = json.loads(first)
        except json.JSONDecodeError:
            return _listed(head)
        return list(obj) if isinstance(obj, dict) else []
    if head.startswith("["):
        return _listed(head)
    if suffix in (".csv", ".jtl", ".tsv"):
        row = next(csv.reader(io.StringIO(head.split("\n", 1)[0])), [])
        return [c.strip() for c in row]
    return []


def _listed(head: str) -> list[str]:
    """The keys of the first object of a JSON list (the head may be cut: the first object alone is read)."""
    m = re.search(r"\{", head)
    if m is None:
        return []
    try:
        obj, _ = json.JSONDecoder().raw_decode(head, m.start())
    except json.JSONDecodeError:
        return []
    return list(obj) if isinstance(obj, dict) else []
