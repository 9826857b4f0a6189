"""Read log files in large chunks of whole lines, as Arrow/polars string columns.

Plain, ``.gz`` and ``.zst`` files are read in chunks of about ``chunk_bytes`` that always end on a
newline, so memory stays flat whatever the file size.  Invalid UTF-8 is kept with replacement
characters, never dropped.  A last line without a newline in a plain file is held back (a log still
being written): it is read by the next ingest once it is complete.  Compressed files are read to the
end, and a truncated compressed file yields what could be decoded plus a warning.
"""

from __future__ import annotations

import io
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import polars as pl

from parsers.errors import InputError

if TYPE_CHECKING:
    import pyarrow as pa

CHUNK_BYTES = 8 * 1024 * 1024
SMALL_BLOCK = 256 * 1024  # up to this many bytes, lines are split by Python (the same strings: see lines_of)
GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def compression_of(path: Path) -> str | None:
    with path.open("rb") as fh:
        head = fh.read(4)
    if head.startswith(GZIP_MAGIC):
        return "gzip"
    if head.startswith(ZSTD_MAGIC):
        return "zstd"
    if head[:2] in UTF16_BOMS:  # a log redirected by Windows PowerShell (`>`, Out-File): read as UTF-8
        return "utf-16"
    return None


UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")


class Utf16AsUtf8(io.RawIOBase):
    """A UTF-16 file (with its byte-order mark) read as UTF-8 bytes, so the rest of the reader sees what a
    log written on Linux holds; offsets count the UTF-8 bytes, as they count decompressed bytes."""

    def __init__(self, raw: io.BufferedReader) -> None:
        self.text = io.TextIOWrapper(raw, encoding="utf-16", errors="replace", newline="")
        self.buf = b""

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0:
            out, self.buf = self.buf + self.text.read().encode("utf-8"), b""
            return out
        while len(self.buf) < size:
            more = self.text.read(max(size // 2, 4096))
            if not more:
                break
            self.buf += more.encode("utf-8")
        out, self.buf = self.buf[:size], self.buf[size:]
        return out

    def close(self) -> None:
        self.text.close()
        super().close()


class Decompressing(io.RawIOBase):
    """Streaming decompression that keeps whatever a truncated or damaged stream still yields.

    ``truncated`` is set (with ``problem``) when the stream ends early or is damaged; reads then return the
    data decoded so far and, after it, end of file.
    """

    def __init__(self, raw: io.BufferedReader, kind: str) -> None:
        self.raw = raw
        self.kind = kind
        self.buf = bytearray()
        self.truncated = False
        self.problem = ""
        self._eof = False
        self._new()

    def _new(self) -> None:
        self.dec: Any  # zlib's or zstandard's decompressor: decompress(), unused_data, eof
        if self.kind == "gzip":
            self.dec = zlib.decompressobj(16 + zlib.MAX_WBITS)
        else:
            import zstandard

            self.dec = zstandard.ZstdDecompressor().decompressobj()

    def readable(self) -> bool:
        return True

    def _fill(self, want: int) -> None:
        while len(self.buf) < want and not self._eof:
            block = self.raw.read(1024 * 1024)
            if not block:
                self._eof = True
                if not getattr(self.dec, "eof", True):
                    self.truncated, self.problem = True, "compressed stream ends early"
                break
            try:
                while block:
                    out = self.dec.decompress(block)
                    self.buf += out
                    rest = self.dec.unused_data if getattr(self.dec, "eof", False) else b""
                    if rest:  # concatenated members / frames
                        self._new()
                    block = rest
            except _damaged() as exc:
                self.truncated, self.problem = True, f"compressed stream is damaged ({exc})"
                self._eof = True

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0:
            self._fill(1 << 62)
            out, self.buf = bytes(self.buf), bytearray()
            return out
        self._fill(size)
        out = bytes(self.buf[:size])
        del self.buf[:size]
        return out

    def close(self) -> None:
        self.raw.close()
        super().close()


def _damaged() -> tuple[type[Exception], ...]:
    """What a damaged gzip or zstd stream raises."""
    import zstandard

    return (zlib.error, zstandard.ZstdError)


def open_binary(path: Path) -> io.RawIOBase:
    """Open a file for reading bytes, decompressing gzip and zstd and transcoding UTF-16 by content."""
    kind = compression_of(path)
    if kind == "utf-16":
        return Utf16AsUtf8(path.open("rb"))
    if kind is not None:
        return Decompressing(path.open("rb"), kind)
    return path.open("rb")  # type: ignore[return-value]


def read_head(path: Path, n_bytes: int = 256 * 1024) -> bytes:
    with open_binary(path) as fh:
        return fh.read(n_bytes)


@dataclass
class Chunk:
    """A block of whole lines.  The string column is built on first use, so a worker thread can do it."""

    block: bytes  # whole lines, each ending in a newline
    n_lines: int
    first_line_no: int  # 1-based number of the first line
    first_offset: int  # byte offset of the first line in the (decompressed) stream
    end_offset: int  # byte offset just after the last line's newline
    _lines: pl.Series | None = None

    @property
    def lines(self) -> pl.Series:
        """The lines as strings, without their terminators (invalid UTF-8 replaced)."""
        if self._lines is None:
            self._lines = lines_of(self.block)
        return self._lines


@dataclass
class ReadState:
    warnings: list[str] = field(default_factory=list)
    end_offset: int = 0  # where the next read should start
    held_back_bytes: int = 0  # an incomplete last line not read yet
    line_no: int = 0  # lines read so far (from the start of the file)
    unterminated: bool = False  # the last line had no newline and was read all the same (``final``)


def _to_series(block: bytes, nl: np.ndarray) -> pl.Series:
    """Turn a block of whole lines (each ending in a newline) into a string series without their terminators.

    Each line becomes an Arrow string view into the block itself (its length, and its first bytes or its offset),
    built for every line at once with numpy, so no byte is copied: the newline, and a CR before it (CRLF), are
    simply outside the view.  Invalid UTF-8 is replaced (U+FFFD); a leading CR stays for the parser to see.
    """
    data = np.frombuffer(block, dtype=np.uint8)
    n = len(nl)
    starts = np.empty(n, dtype=np.int64)
    starts[:1] = 0
    starts[1:] = nl[:-1] + 1
    ends = nl - ((nl > starts) & (data[np.maximum(nl - 1, 0)] == 13))  # a CR before the newline is a terminator
    if len(block) >= 1 << 31 or ((data >= 0x80).any() and not _valid_utf8(block)):
        return _to_series_replacing(block)
    lens = (ends - starts).astype(np.int32)
    views = np.zeros((n, 4), dtype=np.int32)
    views[:, 0] = lens
    # a view holds a string of up to 12 bytes itself; a longer one holds its first 4 bytes and its offset
    padded = np.concatenate([data, np.zeros(12, dtype=np.uint8)])
    head = np.lib.stride_tricks.sliding_window_view(padded, 12)[starts]  # each line's first 12 bytes
    short = np.flatnonzero(lens < 12)
    head[short] *= np.arange(12) < lens[short, None]  # a short line's view is zero after its end
    views.view(np.uint8).reshape(n, 16)[:, 4:] = head
    long = lens > 12
    views[long, 2] = 0
    views[long, 3] = starts[long]
    import pyarrow as pa  # only for a large block: importing it costs 0.15 s

    arr = pa.Array.from_buffers(pa.string_view(), n, [None, pa.py_buffer(views), pa.py_buffer(block)])
    return pl.Series("line", cast(Any, _CArray(arr)), dtype=pl.String)  # an Arrow C array exporter, as polars reads


class _CArray:
    """An Arrow array handed to polars through the Arrow C data interface alone: given the pyarrow array itself,
    polars imports ``pyarrow.compute`` (0.06 s of every ingest) to look at its chunks; the data is the same."""

    def __init__(self, arr: pa.Array) -> None:
        self.arr = arr

    def __arrow_c_array__(self, requested_schema: object = None) -> object:
        return self.arr.__arrow_c_array__(requested_schema)


def lines_of(block: bytes) -> pl.Series:
    """The lines of a block that ends with a newline, cut as a chunk's are.  A small block (a short log, the
    tail a watch reads) is split by Python, which costs less than loading pyarrow for its string views."""
    if len(block) <= SMALL_BLOCK:
        return _to_series_replacing(block)
    return _to_series(block, np.flatnonzero(np.frombuffer(block, dtype=np.uint8) == 10))


def _valid_utf8(block: bytes) -> bool:
    """The whole block decodes: its newlines are characters of their own, so each line then decodes too (a
    character cut by a newline, or a line starting inside one, makes the block invalid)."""
    try:
        block.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _to_series_replacing(block: bytes) -> pl.Series:
    text = block.decode("utf-8", errors="replace")
    parts = text.split("\n")
    if parts and parts[-1] == "":
        parts.pop()
    return pl.Series("line", [p[:-1] if p.endswith("\r") else p for p in parts], dtype=pl.String)


def iter_chunks(path: Path, *, start_offset: int = 0, start_line_no: int = 0,
                chunk_bytes: int = CHUNK_BYTES, state: ReadState | None = None,
                final: bool | None = None) -> Iterator[Chunk]:
    """Yield chunks of whole lines from ``start_offset`` (a byte offset at a line start).

    ``final``: read an unterminated last line too (default: only for compressed files).
    """
    state = state if state is not None else ReadState()
    compressed = compression_of(path) is not None
    if final is None:
        final = compressed
    offset = start_offset
    line_no = start_line_no
    carry = b""
    try:
        fh = open_binary(path)
    except OSError as exc:
        raise InputError(f"cannot open: {exc.strerror or exc}", path=str(path),
                         hint="check the path and permissions") from exc
    with fh:
        if start_offset:
            if compressed:
                _skip(fh, start_offset)
            else:
                fh.seek(start_offset)
        eof = False
        while not eof:
            data = fh.read(chunk_bytes)
            if not data and getattr(fh, "truncated", False):
                state.warnings.append(f"{path}: {fh.problem}; kept the lines before it")  # type: ignore[attr-defined]
            if not data:
                eof = True
                block = carry
                carry = b""
                if block and final:
                    block += b"\n"
                    state.unterminated = True
                elif block:
                    state.held_back_bytes = len(block)
                    break
            else:
                block = carry + data
                cut = block.rfind(b"\n")
                if cut < 0:
                    carry = block
                    continue
                carry = block[cut + 1:]
                block = block[:cut + 1]
            if not block:
                continue
            n_lines = block.count(b"\n")
            chunk = Chunk(block=block, n_lines=n_lines, first_line_no=line_no + 1, first_offset=offset,
                          end_offset=offset + len(block))
            line_no += n_lines
            offset += len(block)
            state.end_offset = offset
            state.line_no = line_no
            yield chunk
    state.end_offset = offset
    state.line_no = line_no


def _skip(fh: io.RawIOBase, n: int) -> None:
    while n > 0:
        block = fh.read(min(n, 8 * 1024 * 1024))
        if not block:
            break
        n -= len(block)
