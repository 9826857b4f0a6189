"""One error hierarchy for the whole project.

The library raises these; the CLI turns them into a one-line message on stderr and an exit code in
one place (``forensics.cli.ForensicsGroup``).  Every message names what went wrong, where (file and line when
known) and the next step to take.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

# The base and the parsers' errors live in parsers.errors (the parsers import nothing of forensics); these are
# the same classes, re-exported, so every caller keeps importing them from here.
from parsers.errors import (
    BUG_HINT,
    ExitCode,
    ForensicsError,
    FormatDefinitionError,
    InputError,
    InternalError,
)

__all__ = [
    "BUG_HINT",
    "ExitCode",
    "ForensicsError",
    "FormatDefinitionError",
    "InputError",
    "InternalError",
    "MappingError",
    "NotFoundError",
    "QueryError",
    "RecordError",
    "StoreError",
    "UnknownFormatError",
    "bug_boundary",
]


class UnknownFormatError(InputError):
    """No known log or record format matches the file's content."""


class RecordError(InputError):
    """A replay record (manifest or attempt) is invalid."""


class MappingError(InputError):
    """A harness mapping file is invalid or names a field that does not exist."""


class StoreError(ForensicsError):
    """The store is missing, locked, or inconsistent."""


class QueryError(ForensicsError):
    """A query failed or was given bad parameters."""


class NotFoundError(ForensicsError):
    """A run, instance or other named thing does not exist in the store."""


@contextlib.contextmanager
def bug_boundary(*, path: str | None = None, line: int | None = None,
                 passthrough: tuple[type[BaseException], ...] = ()) -> Iterator[None]:
    """Turn any unexpected exception raised inside into an ``InternalError`` (exit 3): the one place that
    catches every exception.  ``ForensicsError`` and the ``passthrough`` types go through unchanged."""
    through: tuple[type[BaseException], ...] = (ForensicsError, *passthrough)
    try:
        yield
    except through:
        raise
    except Exception as exc:
        raise InternalError(exc, path=path, line=line) from exc
