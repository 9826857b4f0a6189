"""Writing a file the user named (a report, a chart): checked first, written whole or not at all.

The file is written under a temporary name beside the target, in the target's own folder, then renamed onto it:
nothing is ever written anywhere else, and an interrupted write leaves the target as it was.  A target that is
a folder, or that cannot be written, is one line of input error (exit 2) naming it, never a traceback.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

from forensics.errors import InputError


def checked_target(path: Path | str, what: str, example: str) -> Path:
    """``path`` as a file to write ``what`` to; an existing folder (or a path with no file name) is an error."""
    p = Path(path)
    if p.is_dir() or not p.name or p.name in (".", ".."):
        raise InputError(f"{p} is a folder, not a file to write the {what} to",
                         hint=f"name a file, e.g. {Path(p, example) if p.is_dir() else example}")
    return p


def write_whole(path: Path | str, data: str | bytes, what: str, example: str) -> Path:
    """Write ``data`` to ``path`` (text as UTF-8) through a temporary file in the same folder."""
    p = checked_target(path, what, example)
    tmp = p.with_name(f".{p.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(data, bytes):
            tmp.write_bytes(data)
        else:
            tmp.write_text(data, encoding="utf-8")
        os.replace(tmp, p)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise InputError(f"cannot write the {what} to {p}: {exc.strerror or exc}",
                         hint="choose a path in a folder you can write to") from None
    return p
