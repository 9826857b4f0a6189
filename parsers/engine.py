"""The vectorised line engine: strip wrappers, frame records, classify lines by kind, type the fields.

Everything here works on whole chunks (polars string columns): a literal prefilter per kind narrows the
rows, then the kind's regex extracts its named groups on that subset only.  No Python loop runs per line.
A line goes through three steps: its wrappers are removed (wrappers.toml), it is framed as a JSON or
key=value record or as text with an optional elapsed/level prefix (frames.toml), and the first kind
whose regex matches its body (text) or message (record) claims it (the format files).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import regex

from parsers.errors import FormatDefinitionError, InternalError
from parsers.spec import (
    FORMATS_DIR,
    ROLES,
    Format,
    Kind,
    _read_toml,
    grammar,
    is_users,
    load_fields,
    load_formats,
    user_dirs,
)

SMALL_INPUT = 4096  # rows: at most this many, _match gates each kind's prefilter on the joined text

DTYPES = {"int": pl.Int64, "float": pl.Float64, "str": pl.String, "bool": pl.Boolean}
BLANK = "blank"
CONTINUATION = "continuation"
_STR = r'"(?:[^"\\]|\\.)*"'


@dataclass(frozen=True)
class Wrapper:
    name: str
    regex: str
    time: str | None
    samples: tuple[str, ...]
    times: int = 1  # how often it may apply to one line (stacked timestamps)


@dataclass(frozen=True)
class JsonWrapper:
    name: str
    detect: str
    exclude: str
    text: tuple[str, ...]
    time: tuple[str, ...]
    level: tuple[str, ...]
    samples: tuple[str, ...]
    elapsed_us: tuple[str, ...] = ()  # keys holding microseconds since the process started (--log-jsonl's time)


@dataclass(frozen=True)
class Wrappers:
    strip: dict[str, tuple[str, str, str]]  # name -> (regex, replacement, a literal every line it changes holds)
    prefixes: tuple[Wrapper, ...]
    json: tuple[JsonWrapper, ...]


@dataclass(frozen=True)
class KvFrame:
    name: str
    prefilter: str
    regex: str
    time: str | None
    time_key: str | None
    samples: tuple[str, ...]


@dataclass(frozen=True)
class Frames:
    json_message: tuple[str, ...]
    json_level: tuple[str, ...]
    json_time: tuple[str, ...]
    kv: tuple[KvFrame, ...]
    text_prefix: str
    key_after: str = " "  # a line's dispatch key starts after the first of these (see Routes)
    key_width: int = 0  # and is this many characters (0: no dispatch)


@cache
def load_wrappers() -> Wrappers:
    data = _read_toml(FORMATS_DIR / "wrappers.toml")
    prefixes = tuple(
        Wrapper(w["name"], w["regex"], w.get("time"), tuple(w.get("samples", ())), int(w.get("times", 1)))
        for w in data.get("wrapper", [])
    )
    for w in prefixes:
        regex.compile(w.regex)
    jw = tuple(
        JsonWrapper(j["name"], j["detect"], j.get("exclude", "$^"), tuple(j["text"]), tuple(j.get("time", ())),
                    tuple(j.get("level", ())), tuple(j.get("samples", ())), tuple(j.get("elapsed_us", ())))
        for j in data.get("json_wrapper", [])
    )
    strip = {name: (v["regex"], v.get("replace", ""), v.get("prefilter", "")) for name, v in data.get("strip", {}).items()}
    return Wrappers(strip, prefixes, jw)


@cache
def load_frames() -> Frames:
    data = _read_toml(FORMATS_DIR / "frames.toml")
    js = data.get("json", {})
    kv = tuple(KvFrame(k["name"], k.get("prefilter", ""), k["regex"], k.get("time"), k.get("time_key"),
                       tuple(k.get("samples", ()))) for k in data.get("kv", []))
    for k in kv:
        regex.compile(k.regex)
    return Frames(tuple(js.get("message", ["msg"])), tuple(js.get("level", ())), tuple(js.get("time", ())), kv,
                  data.get("text", {}).get("prefix", ""), str(data.get("dispatch", {}).get("after", " ")),
                  int(data.get("dispatch", {}).get("width", 0)))


def kind_dtype() -> pl.Enum:
    """The ``kind`` column's type: an enum of every kind of every format (compared as integers, not text), the
    user's formats folders' included."""
    return _kind_dtype(user_dirs())


@cache
def _kind_dtype(dirs: tuple[Path, ...]) -> pl.Enum:
    return pl.Enum(sorted({k.name for f in load_formats().values() for k in f.kinds}))


_SAMPLES_CHECKED: set[tuple[Path, ...]] = set()


def check_user_samples() -> None:
    """Each sample line of the user's formats folders (``user_dirs``) reads as its own kind among every format, as
    tests/test_formats.py holds the built-in formats to: else one line naming the file, the kind and the sample.
    Once per process and set of folders."""
    dirs = user_dirs()
    if not dirs or dirs in _SAMPLES_CHECKED:
        return
    _SAMPLES_CHECKED.add(dirs)  # before the Engine below, which checks too
    try:
        engine = Engine(grammar())
        for fmt in (f for f in load_formats().values() if is_users(f)):
            for kind in fmt.kinds:
                for sample in kind.samples:
                    res = engine.classify(pl.Series([sample], dtype=pl.String), 1, Carry())
                    got = [n for n, c in res.skipped.items() if c and n == kind.name] or res.events["kind"].to_list()
                    if got != [kind.name]:
                        raise FormatDefinitionError(
                            f"kind {kind.name!r}: sample {sample[:120]!r} reads as "
                            f"{', '.join(map(str, got)) or 'no kind'}", path=fmt.source,
                            hint="fix the regex or the sample: a sample reads as its own kind among every format")
    except BaseException:
        _SAMPLES_CHECKED.discard(dirs)
        raise


@cache
def role_dtype() -> pl.Enum:
    return pl.Enum(sorted(ROLES))


@dataclass
class Carry:
    """State carried from one chunk to the next within a file."""

    last_kind: str | None = None  # last recognised kind (for continuation lines)


@dataclass(frozen=True)
class Routes:
    """Key-first dispatch: the kinds each line key has led to, most frequent first.

    A line's key is the ``width`` characters after its first ``after`` (frames.toml ``[dispatch]``: one literal
    find and one slice, ``Engine._keys``).  A line is tried with the kinds its key has led to before, on its own
    rows only; what they leave goes through every kind in order, and the kinds that claim it there teach the table
    (``Engine.learn``, in file order).  Specific kinds match disjoint lines (tests/test_formats.py), so the
    table changes how fast a line is classified, never its kind; catch-alls are never routed.
    """

    codes: dict[str, int] = field(default_factory=dict)  # key -> its row in ``kinds``
    kinds: tuple[tuple[int, ...], ...] = ()  # kind indices to try, most frequent first
    counts: dict[tuple[str, int], int] = field(default_factory=dict)  # (key, kind index) -> lines seen

    def taught(self, learnt: pl.DataFrame, limit: int = 4096) -> Routes:
        """The table with ``learnt`` (key, kind, n) added; at most ``limit`` keys (the first ones stay)."""
        counts = dict(self.counts)
        for key, ki, n in learnt.iter_rows():
            if (key, ki) in counts or len(counts) < limit:
                counts[(key, ki)] = counts.get((key, ki), 0) + n
        by_key: dict[str, list[tuple[int, int]]] = {}
        for (key, ki), n in counts.items():
            by_key.setdefault(key, []).append((-n, ki))
        keys = sorted(by_key)
        return Routes({k: i for i, k in enumerate(keys)}, tuple(tuple(ki for _, ki in sorted(by_key[k])) for k in keys),
                      counts)


@dataclass
class ChunkResult:
    events: pl.DataFrame  # one row per recognised, non-skipped record
    unparsed: pl.DataFrame  # line_no, text
    skipped: Counter = field(default_factory=Counter)
    parsed: int = 0
    total: int = 0
    wrappers_seen: set[str] = field(default_factory=set)
    lead: int = 0  # unrecognised lines before the chunk's first recognised one
    last_kind: str | None = None  # the chunk's last recognised kind
    kind_counts: np.ndarray | None = None  # lines recognised per kind (by index)
    learnt: pl.DataFrame | None = None  # (key, kind, n) of the lines the full kind order had to classify


@dataclass
class Framed:
    """A chunk's lines after unwrapping and framing."""

    body: pl.Series  # what kinds match: the record's message, or the text after its prefix
    record: np.ndarray  # True where the line is a JSON or key=value record
    tail: pl.Series  # a record's keys (the JSON object, or the key=value tail); null for text
    cols: dict[str, pl.Series]  # per-line columns the frame carries (level, elapsed, epoch, abs_raw, ...)
    blank: np.ndarray
    indented: np.ndarray  # the line began with white space: an unknown indented line continues the one before


def _prefix_extract(text: pl.Series, regex: str) -> tuple[pl.DataFrame, pl.Series]:
    """Match ``regex`` (anchored at ^) at the start of each value; return its groups and the remainder."""
    body = regex[1:] if regex.startswith("^") else regex
    ext = text.str.extract_groups(f"^(?P<__all>{body})")
    df = ext.struct.unnest()
    length = df["__all"].str.len_chars().fill_null(0)
    rest = text.str.slice(length)
    return df.drop("__all"), rest


def key_values(tail: pl.Series, keys: str) -> pl.Series:
    """The value of the first of ``a|b|...`` keys in a record's keys, as text (quotes removed): a JSON object
    (``"key": value``, any order, cut short or not) or a key=value tail (``key=value``)."""
    out = pl.Series([None] * len(tail), dtype=pl.String)
    for key in keys.split("|"):
        k = regex.escape(key.strip())
        val = tail.str.extract(rf'(?:"{k}"\s*:\s*|(?:^|[\s,{{]){k}=)({_STR}|\{{[^}}]*\}}|[^,}}\s]+)', 1)
        out = out.fill_null(val)
    return unquote(out)


def unquote(s: pl.Series) -> pl.Series:
    """A JSON string value without its quotes and with the common escapes undone (bare values unchanged)."""
    quoted = s.str.starts_with('"') & s.str.ends_with('"') & (s.str.len_chars() >= 2)
    inner = s.str.slice(1, s.str.len_chars() - 2)
    inner = inner.str.replace_all(r'\\"', '"').str.replace_all(r"\\n", "\n").str.replace_all(r"\\\\", "\\")
    return pl.select(pl.when(quoted).then(inner).otherwise(s)).to_series()


def literal_implied(pattern: str, literal: str) -> bool:
    """Every match of ``pattern`` contains ``literal``: it is part of a run of plain characters the pattern always
    matches (outside any optional part, repetition or alternative).  Conservative: False when in doubt."""
    import re._parser as sre_parse  # the standard library's parser: the kinds' regexes are valid Python too

    try:
        tree = sre_parse.parse(pattern)
    except (re.error, RecursionError, ValueError):
        return False
    runs: list[str] = []

    def walk(items: Any, run: list[str]) -> list[str]:
        for op, arg in items:
            if op is sre_parse.LITERAL:
                run.append(chr(arg))
            elif op is sre_parse.SUBPATTERN:  # a group that always matches: its characters continue the run
                run = walk(arg[-1], run)
            elif op is sre_parse.AT:  # ^ and $ match no character
                continue
            else:
                runs.append("".join(run))
                run = []
        return run

    runs.append("".join(walk(tree, [])))
    return any(literal in r for r in runs)


@cache
def ascii_digits(regex: str) -> str:
    """``regex`` with ``\\d`` (any Unicode digit) written as the ASCII digits: log numbers are ASCII, and the
    narrower class is faster (inside a class ``[\\d.]`` becomes ``[0-9.]``)."""
    out, i, in_class = [], 0, False
    while i < len(regex):
        ch = regex[i]
        if ch == "\\" and i + 1 < len(regex):
            pair = regex[i:i + 2]
            out.append(("0-9" if in_class else "[0-9]") if pair == "\\d" else pair)
            i += 2
            continue
        if ch == "[" and not in_class:
            in_class = True
            out.append(ch)
            if regex[i + 1:i + 2] == "^":
                out.append("^")
                i += 1
            if regex[i + 1:i + 2] == "]":  # a ] first in a class is a literal
                out.append("]")
                i += 1
        elif ch == "]" and in_class:
            in_class = False
            out.append(ch)
        else:
            out.append(ch)
        i += 1
    return "".join(out)


def elapsed_seconds(s: pl.Series) -> pl.Series:
    """`M.SS.mmm.uuu` (minutes not capped; the other parts always 2, 3 and 3 digits) to seconds.

    Without its dots the value is the integer M SS mmm uuu: microseconds plus minutes times 1e8.
    """
    v = s.str.replace_all(".", "", literal=True).cast(pl.Int64, strict=False)
    return ((v // 100_000_000) * 60 + (v % 100_000_000) / 1e6).alias("elapsed_s")


def _when(mask: pl.Series | np.ndarray, then: pl.Series | pl.Expr, otherwise: pl.Series | pl.Expr | None = None
          ) -> pl.Series:
    m = mask if isinstance(mask, pl.Series) else pl.Series(mask)
    expr = pl.when(m).then(then)
    return pl.select(expr.otherwise(otherwise) if otherwise is not None else expr).to_series()


class Unwrapper:
    """Removes wrappers (wrappers.toml) and keeps what they carry."""

    def __init__(self, wrappers: Wrappers) -> None:
        self.wrappers = wrappers
        heads = [w.regex.removeprefix("^") for w in wrappers.prefixes]
        heads += [j.detect.removeprefix("^") for j in wrappers.json]
        heads = [regex.sub(r"\(\?P<\w+>", "(?:", h) for h in heads]  # names would clash across wrappers
        self.any_wrapper = "^(?:" + "|".join(f"(?:{h})" for h in heads) + ")"

    def __call__(self, raw: pl.Series) -> tuple[pl.Series, dict[str, pl.Series], set[str]]:
        text, seen = self._strip(raw)
        cols: dict[str, pl.Series] = {}
        # One scan tells whether any wrapper starts any line; most logs have none.
        if not text.str.contains(self.any_wrapper).any():
            return text, cols, seen
        for _ in range(4):  # wrappers nest: apply the list again while any applies (each at most `times`)
            applied = False
            for w in self.wrappers.prefixes:
                if w.times <= sum(1 for s in seen if s == w.name) or not text.str.contains(w.regex).any():
                    continue
                text = self._apply(text, w, cols)
                seen.add(w.name)
                applied = True
            text, json_applied = self._json(text, cols, seen)
            if not (applied or json_applied):
                break
        return text, cols, seen

    def _strip(self, raw: pl.Series) -> tuple[pl.Series, set[str]]:
        seen: set[str] = set()
        text = raw
        for name, (pattern, replace, literal) in self.wrappers.strip.items():
            if literal and not text.str.contains(literal, literal=True).any():
                continue  # the cheap test first: most logs hold no ANSI code and no markdown
            if text.str.contains(pattern).any():
                text = text.str.replace_all(pattern, replace)
                seen.add(name)
        return text, seen

    @staticmethod
    def _apply(text: pl.Series, w: Wrapper, cols: dict[str, pl.Series]) -> pl.Series:
        groups, rest = _prefix_extract(text, w.regex)
        if "inner" in groups.columns:
            rest = _when(groups["inner"].is_not_null(), unquote('"' + groups["inner"] + '"'), rest)
            groups = groups.drop("inner")
        for g in groups.columns:
            col = groups[g]
            if g == "abs_ts":
                col = _when(col.is_not_null(), pl.lit(w.time) + pl.lit("|") + col)
                g = "abs_raw"
            # an inner wrapper's value is closer to the line than an outer one's: it wins
            cols[g] = col.fill_null(cols[g]) if g in cols else col
        return rest

    def _json(self, text: pl.Series, cols: dict[str, pl.Series], seen: set[str]) -> tuple[pl.Series, bool]:
        applied = False
        for jw in self.wrappers.json:
            cand = text.str.contains(jw.detect) & ~text.str.contains(jw.exclude)
            if not cand.any():
                continue
            inner = _first_key(text, jw.text)
            ok = cand & inner.is_not_null()
            if not ok.any():
                continue
            seen.add(jw.name)
            applied = True
            # each row fills its own lines: another row's values on other lines stay
            for col, keys in (("json_time", jw.time), ("json_level", jw.level), ("json_elapsed_us", jw.elapsed_us)):
                if keys:
                    cols[col] = _when(ok, _first_key(text, keys), cols.get(col))
            text = _when(ok, inner.str.strip_suffix("\n").str.strip_suffix("\r"), text)
        return text, applied


def _first_key(text: pl.Series, keys: tuple[str, ...]) -> pl.Series:
    out = pl.Series([None] * len(text), dtype=pl.String)
    for key in keys:
        out = out.fill_null(text.str.json_path_match(f"$.{key}"))
    return out


@dataclass
class _Claims:
    """Which rows of a pass are claimed, by which kind, and the claimed rows' typed fields (one frame a kind)."""

    claimed: np.ndarray
    kind_of: np.ndarray
    pieces: list[pl.DataFrame]


@dataclass
class _Segments:
    """Where each file's lines sit in a pass over several files' lines (one file: one segment)."""

    start: np.ndarray  # first row of each file
    length: np.ndarray
    first_line_no: np.ndarray  # line number of each file's first row
    is_start: np.ndarray  # per row: the first line of a file (nothing of the line before it carries over)

    @classmethod
    def of(cls, chunks: list[pl.Series], first_line_nos: list[int]) -> _Segments:
        length = np.array([len(c) for c in chunks], dtype=np.int64)
        start = np.concatenate([[0], np.cumsum(length)[:-1]]).astype(np.int64)
        is_start = np.zeros(int(length.sum()) + 1, dtype=bool)
        is_start[start] = True
        return cls(start, length, np.array(first_line_nos, dtype=np.int64), is_start)

    @property
    def count(self) -> int:
        return len(self.start)

    @property
    def end(self) -> np.ndarray:
        return self.start + self.length

    def split(self, rows: np.ndarray) -> list[tuple[int, np.ndarray]]:
        """``rows`` (sorted) by file: (file index, its rows), files without any left out."""
        cut = np.searchsorted(rows, self.start[1:])
        return [(i, part) for i, part in enumerate(np.split(rows, cut)) if len(part)]

    def pieces(self, pieces: list[pl.DataFrame]) -> list[list[pl.DataFrame]]:
        """The typed-field frames of each file's lines (one partition of each frame), their rows counted from the
        file's first line."""
        if self.count == 1:
            return [pieces]
        out: list[list[pl.DataFrame]] = [[] for _ in range(self.count)]
        for pc in pieces:
            file_of = np.searchsorted(self.start, pc["__row"].to_numpy(), side="right") - 1
            tagged = pc.with_columns(pl.Series("__file", file_of), (pl.col("__row") - self.start[file_of]))
            for (i,), part in tagged.partition_by("__file", as_dict=True, maintain_order=True).items():
                out[int(i)].append(part.drop("__file"))
        return out

    def cols(self, i: int, cols: dict[str, pl.Series], order: list[str]) -> dict[str, pl.Series]:
        """File ``i``'s slice of the per-line frame and wrapper columns that hold a value in that file, in the
        order its own lines gave them (``order``)."""
        if self.count == 1:
            return cols
        lo, n = int(self.start[i]), int(self.length[i])
        out = {}
        for name in order:
            if name not in cols:
                continue
            part = cols[name].slice(lo, n)
            if part.null_count() < n:
                out[name] = part
        return out


def _summed(learnt: list[pl.DataFrame]) -> pl.DataFrame | None:
    return pl.concat(learnt).group_by("key", "kind").agg(pl.col("len").sum()) if learnt else None


class _Lines:
    """What the chunk's lines turned out to be, beyond their kind: filled by the second pass."""

    def __init__(self, n: int) -> None:
        self.blank = np.zeros(n, dtype=bool)
        self.indented = np.zeros(n, dtype=bool)
        self.joined = np.zeros(n, dtype=bool)
        self.cols: dict[str, pl.Series] = {}  # per-line frame and wrapper columns (full length)
        self.seen: set[str] = set()
        self.learnt: list[pl.DataFrame] = []  # (key, kind, n) the full kind order had to find (Routes)
        self.order: dict[int, list[str]] = {}  # per file: its columns in the order classifying it alone gives


class Framer:
    """Frames lines as JSON records, key=value records or text (frames.toml)."""

    def __init__(self, frames: Frames) -> None:
        self.frames = frames
        keys = "|".join(regex.escape(k) for k in frames.json_message)
        self.json_msg_key = rf'"(?:{keys})"\s*:'
        self.json_msg = rf'"(?:{keys})"\s*:\s*({_STR})'

    def __call__(self, text: pl.Series) -> Framed:
        n = len(text)
        indented = text.str.contains(r"^[ \t]").fill_null(False).to_numpy()
        text = text.str.strip_chars()  # indentation, and trailing spaces a log store stripped or kept
        record = np.zeros(n, dtype=bool)
        body, tail = text, pl.Series([None] * n, dtype=pl.String)
        cols: dict[str, pl.Series] = {}
        is_json = (text.str.starts_with("{") & text.str.contains(self.json_msg_key)).to_numpy()
        if is_json.any():
            body, tail = self._json(text, is_json, body, tail, cols)
            record |= is_json
        for kv in self.frames.kv:
            body, tail, hit = self._kv(kv, text, record, body, tail, cols)
            record |= hit
        blank = (body.fill_null("").str.strip_chars().str.len_bytes() == 0).to_numpy() & ~record
        return Framed(body.fill_null(""), record, tail, cols, blank, indented)

    def _json(self, text: pl.Series, is_json: np.ndarray, body: pl.Series, tail: pl.Series,
              cols: dict[str, pl.Series]) -> tuple[pl.Series, pl.Series]:
        mask = pl.Series(is_json)
        msg = unquote(text.str.extract(self.json_msg, 1)).fill_null("")
        cols["level"] = _when(mask, _json_first(text, self.frames.json_level))
        cols["epoch"] = _when(mask, _json_first(text, self.frames.json_time))
        return _when(mask, msg, body), _when(mask, text, tail)

    def _kv(self, kv: KvFrame, text: pl.Series, record: np.ndarray, body: pl.Series, tail: pl.Series,
            cols: dict[str, pl.Series]) -> tuple[pl.Series, pl.Series, np.ndarray]:
        cand = ~record
        if kv.prefilter:
            cand &= text.str.contains(kv.prefilter, literal=True).to_numpy()
        if not cand.any():
            return body, tail, np.zeros(len(text), dtype=bool)
        groups = text.str.extract_groups(kv.regex).struct.unnest()
        hit = (groups["msg"].is_not_null().to_numpy() & cand)
        if not hit.any():
            return body, tail, hit
        mask = pl.Series(hit)
        t = groups["tail"].fill_null("") if "tail" in groups.columns else pl.Series([""] * len(text))
        cols["level"] = _when(mask, groups["level"], cols.get("level"))
        if kv.time_key:
            cols["epoch"] = _when(mask, key_values(t, kv.time_key), cols.get("epoch"))
        if kv.time and "abs_ts" in groups.columns:
            cols["frame_time"] = _when(mask, pl.lit(kv.time) + "|" + groups["abs_ts"], cols.get("frame_time"))
        return _when(mask, unquote(groups["msg"]), body), _when(mask, t, tail), hit


def _json_first(text: pl.Series, keys: tuple[str, ...]) -> pl.Series:
    out = pl.Series([None] * len(text), dtype=pl.String)
    for key in keys:
        out = out.fill_null(key_values(text, key))
    return out


class Engine:
    """Classifies the lines of a chunk with the kinds of one format (or of every format)."""

    def __init__(self, fmt: Format, wrappers: Wrappers | None = None) -> None:
        check_user_samples()
        self.fmt = fmt
        self.wrappers = wrappers or load_wrappers()
        self.unwrap = Unwrapper(self.wrappers)
        frames = load_frames()
        self.framer = Framer(frames)
        self.fields = load_fields()
        self.kinds = fmt.kinds
        self.kind_index = {k.name: i for i, k in enumerate(self.kinds)}
        # The elapsed/level prefix is matched by each text kind's own regex (one pass reads prefix and body).
        # `\d` means any Unicode digit to the regex engine; log numbers are ASCII, and [0-9] is faster.
        prefix = frames.text_prefix.removeprefix("^")
        self._fast = [ascii_digits("(?P<__k>)" + ("^" + prefix + k.regex[1:] if k.frame == "text" and not k.bare
                                                  else k.regex)) for k in self.kinds]
        # Kinds are tried in order, each on the rows no earlier kind claimed.  Specific kinds (all before the
        # catch-alls) match disjoint sets of lines (tests/test_formats.py checks it on every sample), so they
        # may be tried in any order without changing the result: the kinds frequent in an earlier chunk go
        # first (see ``learn``), which leaves few rows for the many rare kinds to scan.
        self._hoistable = [not k.fallback for k in self.kinds]
        self.order: tuple[int, ...] = tuple(range(len(self.kinds)))
        self._key = (frames.key_after, frames.key_width)
        # a prefilter the kind's regex spells out anyway need not be checked before the regex on a routed row
        # (worked out for a kind when it is first routed: reading every regex up front costs a short log's parse)
        self._needs_prefilter: list[bool | None] = [None] * len(self.kinds)
        self._routable = np.array([not k.fallback for k in self.kinds] + [False])
        self.routes = self._seed_routes()
        fields_seen: dict[str, None] = {"elapsed": None, "level": None}
        for k in self.kinds:
            fields_seen.update(dict.fromkeys(k.fields))
        self._field_rank: dict[str, int] = {f: i for i, f in enumerate(fields_seen)}
        self._is_multi = np.array([k.multiline for k in self.kinds] + [False])
        self._is_skip = np.array([k.skip for k in self.kinds] + [False])
        # the first pass reads lines as they are: kinds that could match a line with a wrapper still on it wait
        self._plain = np.array([k.frame == "text" and not k.fallback and not k.loose for k in self.kinds])

    def _keys(self, body: pl.Series) -> pl.Series:
        """Each line's dispatch key: the characters after the first space (a timestamp or level before it, or a
        frame word like `slot`, varies less than what follows).  Two literal column operations, no regex: a key
        only has to be the same for lines of the same shape."""
        after, width = self._key
        return body.str.slice(body.str.find(after, literal=True).fill_null(-len(after)) + len(after), width)

    def _seed_routes(self) -> Routes:
        """The routes the text kinds' own samples give, so that a file's first chunk is routed too."""
        rows = [(sample, ki) for ki, k in enumerate(self.kinds) if self._routable[ki] and k.frame == "text"
                for sample in k.samples]
        if not self._key[1] or not rows:
            return Routes()
        keys = self._keys(pl.Series([r[0] for r in rows], dtype=pl.String))
        seen = pl.DataFrame({"key": keys, "kind": pl.Series([r[1] for r in rows], dtype=pl.Int32)})
        return Routes().taught(seen.drop_nulls().group_by("key", "kind").len())

    # ------------------------------------------------------------------ classification
    def learn(self, res: ChunkResult) -> None:
        """Try the kinds that were frequent in ``res`` first from now on.

        Called by whoever reads the results in file order, so the order each chunk is classified with does
        not depend on which worker thread finished first.
        """
        if res.learnt is not None and res.learnt.height:
            self.routes = self.routes.taught(res.learnt)
        counts, n = res.kind_counts, res.total
        if counts is None or not n:
            return
        hot = sorted((i for i in range(len(self.kinds)) if self._hoistable[i] and counts[i] * 50 >= n),
                     key=lambda i: -counts[i])
        self.order = (*hot, *(i for i in range(len(self.kinds)) if i not in hot))

    def _column_rank(self, column: str) -> tuple[int, str]:
        """Events' columns in the order the kinds declare their fields, whatever order they were tried in."""
        return self._field_rank.get(column, 1 << 20), column

    def classify(self, raw: pl.Series, first_line_no: int, carry: Carry,
                 order: tuple[int, ...] | None = None) -> ChunkResult:
        """Classify one chunk's lines; ``order`` is the order to try the kinds in (default: ``self.order``).

        Two passes: the specific text kinds on the lines as they are (a plain log is done there), then the
        lines left are unwrapped, framed and tried with every kind.
        """
        return self.classify_many([raw], [first_line_no], [carry], order)[0]

    def classify_many(self, chunks: list[pl.Series], first_line_nos: list[int], carries: list[Carry],
                      order: tuple[int, ...] | None = None) -> list[ChunkResult]:
        """Classify the lines of several files (one chunk each) in one pass, so that a folder of small logs pays
        the column operations once, not once per file.  Each file's result is what ``classify`` gives it alone:
        a line's kind depends on the line only, and what depends on its neighbours (continuations, re-joined
        lines, wrappers) stops at the file's edges."""
        order = order if order is not None else self.order
        seg = _Segments.of(chunks, first_line_nos)
        raw = chunks[0] if len(chunks) == 1 else pl.concat(chunks)
        n = len(raw)
        plain = Framed(raw, np.zeros(n, dtype=bool), pl.Series([None] * n, dtype=pl.String), {},
                       np.zeros(n, dtype=bool), np.zeros(n, dtype=bool))
        lines = _Lines(n)
        kind_of, pieces = self._match(plain, tuple(i for i in order if self._plain[i]), lines.learnt)
        rest = np.flatnonzero(kind_of < 0)
        seen: list[set[str]] = [set() for _ in chunks]
        if len(rest):
            seen = self._second_pass(raw, rest, (order, seg), kind_of, pieces, lines)
        carry_codes = np.array([self.kind_index.get(c.last_kind, -1) if c.last_kind is not None else -1
                                for c in carries], dtype=np.int64)
        cont, cont_skip, ff = self._continuations(kind_of, lines, seg, carry_codes)
        by_file = seg.pieces(pieces)
        out = [self._result(i, seg, (kind_of, cont, cont_skip, ff), (raw, by_file[i], lines), carries[i])
               for i in range(len(chunks))]
        for res, names in zip(out, seen, strict=True):
            res.wrappers_seen = names
        out[0].learnt = _summed(lines.learnt)
        return out

    def _result(self, i: int, seg: _Segments, arrays: tuple[np.ndarray, ...], chunk: tuple[Any, ...],
                carry: Carry) -> ChunkResult:
        """File ``i``'s share of a pass over several files' lines."""
        kind_of, cont, cont_skip, ff = (a[seg.start[i]:seg.end[i]] for a in arrays)
        raw, pieces, lines = chunk
        lo, n = int(seg.start[i]), len(kind_of)
        blank = lines.blank[lo:lo + n]
        skipped: Counter = Counter()
        skipped[BLANK] = int(blank.sum())
        for code, count in zip(*np.unique(ff[cont_skip], return_counts=True), strict=True):
            skipped[self.kinds[code].name] += int(count)
        unparsed_mask = (kind_of < 0) & ~blank & ~cont
        counts = np.bincount(kind_of[kind_of >= 0], minlength=len(self.kinds))
        for ki, kind in enumerate(self.kinds):
            if kind.skip and counts[ki]:
                skipped[kind.name] += int(counts[ki])
        recognised = np.flatnonzero(kind_of >= 0)
        if len(recognised):
            carry.last_kind = self.kinds[kind_of[recognised[-1]]].name
        first_rec = int(recognised[0]) if len(recognised) else n
        line_no = pl.Series("line_no", np.arange(seg.first_line_no[i], seg.first_line_no[i] + n, dtype=np.int64))
        events = self._events(pieces, line_no, seg.cols(i, lines.cols, lines.order.get(i, [])))
        unp_idx = np.flatnonzero(unparsed_mask)
        unparsed = pl.DataFrame({"line_no": line_no.gather(unp_idx), "text": raw.gather(unp_idx + lo)})
        parsed = int(counts[~self._is_skip[:-1]].sum()) + int(cont.sum() - cont_skip.sum())
        if parsed + sum(skipped.values()) + len(unp_idx) != n:
            raise InternalError(f"line accounting: {parsed} parsed + {sum(skipped.values())} skipped + "
                                f"{len(unp_idx)} unparsed != {n} lines")
        return ChunkResult(events=events, unparsed=unparsed, skipped=skipped, parsed=parsed, total=n,
                           lead=int(unparsed_mask[:first_rec].sum()), kind_counts=counts,
                           last_kind=carry.last_kind if len(recognised) else None)

    def _second_pass(self, raw: pl.Series, rest: np.ndarray, how: tuple[tuple[int, ...], _Segments],
                     kind_of: np.ndarray, pieces: list[pl.DataFrame], lines: _Lines) -> list[set[str]]:
        """Unwrap, frame and classify the lines the first pass left (``rest``), into the chunk's arrays; returns
        the wrappers each file's lines had.  Wrappers are removed file by file (whether one applies depends on
        the file's other lines); framing and kinds look at one line at a time."""
        order, seg = how
        whole = len(rest) == len(raw)
        seen: list[set[str]] = [set() for _ in range(seg.count)]
        texts, wcols = [], []
        for i, rows in seg.split(rest):
            text, cols, seen[i] = self.unwrap(raw if whole and seg.count == 1 else raw.gather(rows))
            texts.append(text)
            wcols.append((i, rows, cols))
        fr = self.framer(texts[0] if len(texts) == 1 else pl.concat(texts))
        k2, p2 = self._match(fr, order, lines.learnt)
        adjacent = np.zeros(len(rest), dtype=bool)
        adjacent[:-1] = (rest[1:] == rest[:-1] + 1) & ~seg.is_start[rest[1:]]
        joined = self._reflow(fr, k2, p2, adjacent)
        kind_of[rest] = k2
        pieces += [pc if whole else pc.with_columns(pl.Series("__row", rest[pc["__row"].to_numpy()])) for pc in p2]
        lines.blank[rest], lines.indented[rest], lines.joined[rest] = fr.blank, fr.indented, joined
        n = len(raw)
        for name, col in fr.cols.items():
            if col is not None and col.null_count() < len(col):
                lines.cols[name] = col if whole else pl.Series(name, [None] * n, dtype=col.dtype).scatter(rest, col)
        framed = list(lines.cols)
        for i, rows, cols in wcols:
            lines.order[i] = list(dict.fromkeys([*framed, *cols]))  # a file's own column order (see _Segments.cols)
            for name, col in cols.items():
                if col is not None and col.null_count() < len(col):
                    full = lines.cols.get(name)
                    if full is None:
                        full = pl.Series(name, [None] * n, dtype=col.dtype)
                    lines.cols[name] = col if whole and seg.count == 1 else full.scatter(rows, col.cast(full.dtype))
        return seen

    def _match(self, fr: Framed, order: tuple[int, ...],
               learnt: list[pl.DataFrame] | None = None) -> tuple[np.ndarray, list[pl.DataFrame]]:
        """Classify the lines of ``fr`` with the kinds in ``order``: first each line with the kinds its key has led
        to (``Routes``), then what is left with every kind in order, each on the lines no earlier kind claimed.
        Returns each line's kind index (-1: none) and the typed fields of the claimed, non-skipped lines; the keys
        of the lines the full order classified go to ``learnt``."""
        n = len(fr.body)
        claimed = fr.blank.copy()
        kind_of = np.full(n, -1, dtype=np.int32)
        pieces: list[pl.DataFrame] = []
        out = _Claims(claimed, kind_of, pieces)
        keys = self._keys(fr.body) if self._key[1] and n else None
        routes = self.routes
        if keys is not None and routes.codes:
            self._route(fr, keys, order, routes, out)
        routed = kind_of >= 0
        self._cascade(fr, order, out)
        if learnt is not None and keys is not None:
            new = np.flatnonzero((kind_of >= 0) & ~routed & self._routable[kind_of])
            if len(new):
                pairs = pl.DataFrame({"key": keys.gather(new), "kind": kind_of[new]}).drop_nulls()
                learnt.append(pairs.group_by("key", "kind").len())
        return kind_of, pieces

    def _route(self, fr: Framed, keys: pl.Series, order: tuple[int, ...], routes: Routes, out: _Claims) -> None:
        """Each line with the kinds its key has led to, on the rows of that key only."""
        claimed = out.claimed
        allowed = np.zeros(len(self.kinds), dtype=bool)
        allowed[list(order)] = True
        code = keys.replace_strict(routes.codes, default=-1, return_dtype=pl.Int32).fill_null(-1).to_numpy()
        code = np.where(claimed, -1, code)
        sel = np.flatnonzero(code >= 0)
        if not len(sel):
            return
        rows_by_key = sel[np.argsort(code[sel], kind="stable")]
        for rows in np.split(rows_by_key, np.flatnonzero(np.diff(code[rows_by_key])) + 1):
            body = fr.body.gather(rows)
            cands = routes.kinds[code[rows[0]]]
            for ki in cands:
                if not allowed[ki]:
                    continue
                live = ~claimed[rows]
                if not live.any():
                    break
                kind = self.kinds[ki]
                live &= fr.record[rows] if kind.frame == "record" else ~fr.record[rows]
                if kind.prefilter and (len(cands) > 1 or self._prefilter_needed(ki)) and live.any():
                    live &= body.str.contains(kind.prefilter, literal=True).to_numpy()
                if live.any():
                    self._claim(ki, fr, rows[live], body.filter(pl.Series(live)), out)

    def _prefilter_needed(self, ki: int) -> bool:
        need = self._needs_prefilter[ki]
        if need is None:
            kind = self.kinds[ki]
            need = self._needs_prefilter[ki] = not literal_implied(kind.regex, kind.prefilter)
        return need

    def _claim(self, ki: int, fr: Framed, idx: np.ndarray, sub: pl.Series, out: _Claims) -> None:
        """Match kind ``ki``'s regex on the rows ``idx`` (their bodies ``sub``); the matching rows become its lines."""
        claimed, kind_of, pieces = out.claimed, out.kind_of, out.pieces
        kind = self.kinds[ki]
        ext = sub.str.extract_groups(self._fast[ki]).struct.unnest()
        hit = ext["__k"].is_not_null().to_numpy()
        if kind.exclude and hit.any():
            hit &= ~sub.str.contains(kind.exclude).to_numpy()
        if not hit.any():
            return
        hit_idx = idx[hit]
        claimed[hit_idx] = True
        kind_of[hit_idx] = ki
        if not kind.skip:  # (a precise prefilter leaves nothing to filter out)
            part = ext.drop("__k") if len(hit_idx) == len(idx) else ext.filter(pl.Series(hit)).drop("__k")
            pieces.append(self._piece(kind, part, hit_idx, fr))

    def _cascade(self, fr: Framed, order: tuple[int, ...], out: _Claims) -> None:
        """Every kind in ``order`` on the rows still unclaimed, the first that matches a row claims it."""
        claimed = out.claimed
        n = len(fr.body)
        if claimed.all():
            return
        # Prefilters scan only the rows no kind has claimed yet; the remaining set is re-gathered when it has
        # shrunk by half, so the frequent kinds (tried first) leave little for the rest to scan.
        rem_idx = np.flatnonzero(~claimed)
        rem_body = fr.body.gather(rem_idx) if len(rem_idx) < n else fr.body
        # A small input (a short log, a chunk's leftovers): one Python substring search over all its text rules
        # out most kinds before any per-kind column operation, whose fixed cost dominates on a few lines.
        blob = "\n".join(rem_body.drop_nulls().to_list()) if len(rem_idx) <= SMALL_INPUT else None
        for ki in order:
            live = ~claimed[rem_idx]
            if not live.any():
                break
            if live.sum() * 2 < len(rem_idx):
                rem_idx = rem_idx[live]
                rem_body = fr.body.gather(rem_idx)
                live = np.ones(len(rem_idx), dtype=bool)
            kind = self.kinds[ki]
            if blob is not None and kind.prefilter and kind.prefilter not in blob:
                continue
            mask = live & (fr.record[rem_idx] if kind.frame == "record" else ~fr.record[rem_idx])
            if kind.prefilter and mask.any():
                mask &= rem_body.str.contains(kind.prefilter, literal=True).to_numpy()
            if not mask.any():
                continue
            self._claim(ki, fr, rem_idx[mask], rem_body.filter(pl.Series(mask)), out)

    def _piece(self, kind: Kind, part: pl.DataFrame, rows: np.ndarray, fr: Framed) -> pl.DataFrame:
        part = part.with_columns(pl.Series("__row", rows))
        if kind.keys:
            tail = fr.tail.gather(rows)
            part = part.with_columns([key_values(tail, key).alias(f) for f, key in kind.keys if f not in part.columns])
        if kind.anywhere:  # fields in any order: each searched in the line on its own (only lines no format knows)
            body = fr.body.gather(rows)
            part = part.with_columns([body.str.extract(pattern, 1).alias(f) for f, pattern in kind.anywhere
                                      if f not in part.columns])
        part = part.with_columns(pl.lit(kind.name, dtype=kind_dtype()).alias("kind"),
                                 pl.lit(kind.role, dtype=role_dtype()).alias("role"))
        return self._type(part)

    def _reflow(self, fr: Framed, kind_of: np.ndarray, pieces: list[pl.DataFrame], adjacent: np.ndarray) -> np.ndarray:
        """Re-join lines that a paste or a terminal wrapped: a line only a catch-all (or nothing) took, followed by
        an unknown line, is tried once more joined with it; when a specific kind matches the two, the first line
        is that kind and the second its continuation.  Returns the mask of those second lines.  ``adjacent``: a
        row and the next one are consecutive lines of the file."""
        n = len(kind_of)
        joined = np.zeros(n, dtype=bool)
        if n < 2:
            return joined
        weak = np.array([k.fallback for k in self.kinds] + [True])[kind_of]  # -1 (no kind) indexes the last
        free = (kind_of < 0) & ~fr.blank & ~fr.record
        cand = np.flatnonzero(weak[:-1] & ~fr.blank[:-1] & ~fr.record[:-1] & free[1:] & adjacent[:-1])
        if not len(cand):
            return joined
        text = fr.body.gather(cand) + " " + fr.body.gather(cand + 1)
        mini = Framed(text, np.zeros(len(cand), dtype=bool), pl.Series([None] * len(cand), dtype=pl.String), {},
                      np.zeros(len(cand), dtype=bool), np.zeros(len(cand), dtype=bool))
        k2, p2 = self._match(mini, tuple(i for i in self.order if not self.kinds[i].fallback))
        hit = k2 >= 0
        if not hit.any():
            return joined
        rows = cand[hit]
        # the catch-all's rows for those lines go (a piece left with none goes too: no kind, no columns)
        pieces[:] = [left for left in (piece.filter(~pl.col("__row").is_in(rows)) for piece in pieces) if left.height]
        pieces += [piece.with_columns(pl.Series("__row", cand[piece["__row"].to_numpy()])) for piece in p2]
        kind_of[rows] = k2[hit]
        joined[rows + 1] = True
        return joined

    def _continuations(self, kind_of: np.ndarray, lines: _Lines, seg: _Segments,
                       carry_codes: np.ndarray) -> tuple[np.ndarray, ...]:
        """Unrecognised lines after a multi-line record (or indented, or the wrapped half of a re-joined line)
        belong to the record before them in their file (integer kind codes, no loop per line).  Returns the
        continuation mask, the mask of those that continue a skipped kind, and each line's latest kind before it
        (or its file's carried one; -1: none)."""
        n = len(kind_of)
        val = kind_of.astype(np.int64)
        starts = seg.start[seg.length > 0]
        val[starts] = np.where(kind_of[starts] >= 0, kind_of[starts], carry_codes[seg.length > 0])
        has = kind_of >= 0
        has[starts] = True
        pos = np.where(has, np.arange(n), 0)
        np.maximum.accumulate(pos, out=pos)
        ff = val[pos]  # at an unrecognised line: the latest recognised kind before it in its file, or the carry
        cont = (kind_of < 0) & ~lines.blank & (self._is_multi[ff] | (lines.indented & (ff >= 0)) | lines.joined)
        return cont, cont & self._is_skip[ff], ff

    def _events(self, pieces: list[pl.DataFrame], line_no: pl.Series, cols: dict[str, pl.Series]) -> pl.DataFrame:
        """One row per claimed line: line number, frame and wrapper columns, kind, typed fields."""
        events: pl.DataFrame = pl.concat(pieces, how="diagonal_relaxed") if pieces else pl.DataFrame(
            {"__row": pl.Series([], dtype=pl.Int64), "kind": pl.Series([], dtype=kind_dtype()),
             "role": pl.Series([], dtype=role_dtype())})
        # the same columns in the same order whatever order the kinds were tried in
        order = sorted(events.columns, key=self._column_rank)  # inferred apart from select's many argument types
        events = events.select(order)
        events = events.sort("__row")
        rows = events["__row"].to_numpy()
        base = {"line_no": line_no.gather(rows)}
        for name, series in cols.items():
            if not name.startswith("__"):
                base[name] = series.gather(rows)
        base_df = pl.DataFrame(base)
        # a wrapper group and a kind field of the same name (syslog `host` vs the listen line's `host`): the
        # line's own field wins, the wrapper's value fills the lines that have none
        both = [c for c in base_df.columns if c in events.columns and c != "__row"]
        if both:
            events = events.with_columns([pl.coalesce(pl.col(c), base_df[c].cast(events[c].dtype, strict=False))
                                          for c in both])
            base_df = base_df.drop(both)
        events = pl.concat([base_df, events.drop("__row")], how="horizontal")
        if "elapsed" in events.columns:
            events = events.with_columns(elapsed_seconds(events["elapsed"])).drop("elapsed")
        if "level" in events.columns and events["level"].null_count() == events.height:
            events = events.drop("level")
        if "frame_time" in events.columns:  # a key=value frame's own time (ollama), as a wrapper time
            raw = events["frame_time"]
            events = events.with_columns((pl.coalesce("abs_raw", raw) if "abs_raw" in events.columns else raw)
                                         .alias("abs_raw")).drop("frame_time")
        return events

    def join_chunks(self, res: ChunkResult, prev_last_kind: str | None) -> None:
        """Fix up a chunk classified without its predecessor's state (chunks run in parallel).

        Unrecognised lines at the start of the chunk continue the previous chunk's last record when
        that record is multi-line.
        """
        if not res.lead or prev_last_kind is None:
            return
        kind = self.fmt.kind(prev_last_kind)
        if not kind.multiline:
            return
        res.unparsed = res.unparsed.slice(res.lead)
        if kind.skip:
            res.skipped[kind.name] += res.lead
        else:
            res.parsed += res.lead
        res.lead = 0

    def _type(self, part: pl.DataFrame) -> pl.DataFrame:
        """Cast each field to its declared type: numbers first as they are (a regex group holds only the number),
        and only where that gave nothing, once more without surrounding spaces (a record's "12 " or " 12").
        Each column's second look runs only when some value needs it."""
        out = []
        for col in part.columns:
            spec = self.fields.get(col)
            if col in {"__row", "kind", "role"} or spec is None:
                continue
            c = part[col]
            if spec.type == "bool":
                out.append(c.str.strip_chars().str.to_lowercase().is_in(["1", "true"]))
            elif spec.type == "str":  # trailing spaces are a log store's, not the line's meaning
                spaced = c.str.ends_with(" ")
                if spaced.any():
                    out.append(_when(spaced, c.str.strip_chars_end(), c).alias(col))
            else:
                dtype = DTYPES[spec.type]
                typed = c.cast(dtype, strict=False)
                if typed.null_count() > c.null_count():
                    typed = typed.fill_null(c.str.strip_chars().cast(dtype, strict=False))
                out.append(typed)
        return part.with_columns(out) if out else part
