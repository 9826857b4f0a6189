"""The base of the project's one error hierarchy, and the errors the parsers raise.

The parsers depend on nothing of ``forensics``, so the base lives here; ``forensics.errors`` re-exports these
classes (the same classes, so ``except forensics.errors.InputError`` catches the reader's) and adds the rest.
The CLI turns any of them into a one-line message on stderr and an exit code in one place
(``forensics.cli.ForensicsGroup``).  Every message names what went wrong, where (file and line when known) and
the next step to take.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """Documented exit codes of the ``forensics`` command."""

    OK = 0
    FINDINGS = 1  # a --fail-on gate tripped, or a smoke budget failed
    USAGE = 2  # bad options or bad input
    INTERNAL = 3  # a bug: an unexpected error (one line asking for a bug report; --debug shows the traceback)
    INTERRUPTED = 130  # Ctrl-C (128 + SIGINT, as shells report it), or watch told to stop twice


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


BUG_HINT = "this is a bug in forensics: please report it with the command you ran; --debug shows the traceback"


class InternalError(ForensicsError):
    """An unexpected error (a bug), carried as one line: either an exception that escaped (then also its
    ``__cause__``), or the text of a broken invariant that the code checks itself (never an ``assert``, which
    ``python -O`` drops)."""

    exit_code = ExitCode.INTERNAL

    def __init__(self, exc: BaseException | str, *, path: str | None = None, line: int | None = None) -> None:
        if isinstance(exc, str):
            detail = f": {exc.strip()[:300]}"
        else:
            text = str(exc).strip().splitlines()
            detail = f"{type(exc).__name__}: {text[0][:300]}" if text else type(exc).__name__
            detail = f": {detail}"
        super().__init__(f"internal error{detail}", path=path, line=line, hint=BUG_HINT)
