"""One error hierarchy for the whole project.

The library raises these; the CLI turns them into a one-line message on stderr and an exit code in
one place (``forensics.cli.main``).  Every message names what went wrong, where (file and line when
known) and the next step to take.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from enum import IntEnum


class ExitCode(IntEnum):
    """Documented exit codes of the ``forensics`` command."""

    OK = 0
    FINDINGS = 1  # a --fail-on gate tripped, or a smoke budget failed
    USAGE = 2  # bad options or bad input
    INTERNAL = 3  # a bug: an unexpected error (one line asking for a bug report; --debug shows the traceback)


class ForensicsError(Exception):
    """Base class: a problem the user can act on."""

    exit_code: ExitCode = ExitCode.USAGE

    def __init__(self, message: str, *, path: str | None = None, line: int | None = None,
                 hint: str | None = None) -> None:
        self.message = message
        self.path = path
        self.line = line
        self.hint = hint
        super().__init__(self.one_line())

    def one_line(self) -> str:
        where = ""
        if self.path is not None:
            where = f"{self.path}:{self.line}: " if self.line is not None else f"{self.path}: "
        text = f"{where}{self.message}"
        if self.hint:
            text += f" ({self.hint})"
        return text


class FormatDefinitionError(ForensicsError):
    """A format definition file is invalid (bad regex, sample that does not match, ...)."""


class InputError(ForensicsError):
    """An input file cannot be read or is not something forensics understands."""


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


BUG_HINT = "this is a bug in forensics: please report it with the command you ran; --debug shows the traceback"


class InternalError(ForensicsError):
    """An unexpected error (a bug), carried as one line; the original exception is its ``__cause__``."""

    exit_code = ExitCode.INTERNAL

    def __init__(self, exc: BaseException, *, path: str | None = None, line: int | None = None) -> None:
        text = str(exc).strip().splitlines()
        detail = f": {text[0][:300]}" if text else ""
        super().__init__(f"internal error: {type(exc).__name__}{detail}", path=path, line=line, hint=BUG_HINT)


@contextlib.contextmanager
def bug_boundary(*, path: str | None = None, line: int | None = None,
                 passthrough: tuple[type[BaseException], ...] = ()) -> Iterator[None]:
    """Turn any unexpected exception raised inside into an ``InternalError`` (exit 3): the one place that
    catches every exception.  ``ForensicsError`` and the ``passthrough`` types go through unchanged."""
    try:
        yield
    except (ForensicsError, *passthrough):
        raise
    except Exception as exc:
        raise InternalError(exc, path=path, line=line) from exc
