"""The vectorised line engine: strip wrappers and prefixes, classify lines by kind, type the fields.

Everything here works on whole chunks (polars string columns): a literal prefilter per kind narrows the
rows, then the kind's regex extracts its named groups on that subset only.  No Python loop runs per line.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from functools import cache

import numpy as np
import polars as pl

from parsers.spec import FORMATS_DIR, Format, _read_toml, load_fields, load_formats

DTYPES = {"int": pl.Int64, "float": pl.Float64, "str": pl.String, "bool": pl.Boolean}
BLANK = "blank"
CONTINUATION = "continuation"


@dataclass(frozen=True)
class Wrapper:
    name: str
    regex: str
    time: str | None
    samples: tuple[str, ...]


@dataclass(frozen=True)
class JsonWrapper:
    name: str
    detect: str
    exclude: str
    text: tuple[str, ...]
    time: tuple[str, ...]
    level: tuple[str, ...]
    samples: tuple[str, ...]


@dataclass(frozen=True)
class Wrappers:
    strip: dict[str, str]
    prefixes: tuple[Wrapper, ...]
    json: tuple[JsonWrapper, ...]


@cache
def load_wrappers() -> Wrappers:
    data = _read_toml(FORMATS_DIR / "wrappers.toml")
    prefixes = tuple(
        Wrapper(w["name"], w["regex"], w.get("time"), tuple(w.get("samples", ()))) for w in data.get("wrapper", [])
    )
    for w in prefixes:
        re.compile(w.regex)
    jw = tuple(
        JsonWrapper(j["name"], j["detect"], j.get("exclude", "$^"), tuple(j["text"]), tuple(j.get("time", ())),
                    tuple(j.get("level", ())), tuple(j.get("samples", ())))
        for j in data.get("json_wrapper", [])
    )
    return Wrappers(dict(data.get("strip", {})), prefixes, jw)


@cache
def kind_dtype() -> pl.Enum:
    """The ``kind`` column's type: an enum of every kind of every format (compared as integers, not text)."""
    return pl.Enum(sorted({k.name for f in load_formats().values() for k in f.kinds}))


@dataclass
class Carry:
    """State carried from one chunk to the next within a file."""

    last_kind: str | None = None  # last recognised kind (for continuation lines)


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


def _prefix_extract(text: pl.Series, regex: str) -> tuple[pl.DataFrame, pl.Series]:
    """Match ``regex`` (anchored at ^) at the start of each value; return its groups and the remainder."""
    body = regex[1:] if regex.startswith("^") else regex
    ext = text.str.extract_groups(f"^(?P<__all>{body})")
    df = ext.struct.unnest()
    length = df["__all"].str.len_chars().fill_null(0)
    rest = text.str.slice(length)
    return df.drop("__all"), rest


def _json_alternatives(raw: pl.Series, paths: str) -> pl.Series:
    """Value at the first of ``a|b|...`` JSON paths present (era 3 spells keys two ways: slot_id/id_slot)."""
    out = pl.Series([None] * len(raw), dtype=pl.String)
    for path in paths.split("|"):
        out = out.fill_null(raw.str.json_path_match(path.strip()))
    return out


def _kv_alternatives(tail: pl.Series, keys: str) -> pl.Series:
    """Value of the first of ``a|b|...`` keys present in a ``key=value`` tail (quotes removed)."""
    out = pl.Series([None] * len(tail), dtype=pl.String)
    for key in keys.split("|"):
        val = tail.str.extract(rf"(?:^| ){re.escape(key.strip())}=(\"(?:[^\"\\]|\\.)*\"|\S+)", 1)
        out = out.fill_null(val.str.strip_prefix('"').str.strip_suffix('"'))
    return out


def elapsed_seconds(s: pl.Series) -> pl.Series:
    """`M.SS.mmm.uuu` (minutes not capped; the other parts always 2, 3 and 3 digits) to seconds.

    Without its dots the value is the integer M SS mmm uuu: microseconds plus minutes times 1e8.
    """
    v = s.str.replace_all(".", "", literal=True).cast(pl.Int64, strict=False)
    return ((v // 100_000_000) * 60 + (v % 100_000_000) / 1e6).alias("elapsed_s")


class Engine:
    """Classifies the lines of one format."""

    def __init__(self, fmt: Format, wrappers: Wrappers | None = None) -> None:
        self.fmt = fmt
        self.wrappers = wrappers or load_wrappers()
        self.fields = load_fields()
        self.kinds = fmt.kinds
        self.kind_index = {k.name: i for i, k in enumerate(self.kinds)}
        # `\d` means any Unicode digit to the regex engine; log numbers are ASCII, and [0-9] is faster.
        self._fast = ["(?P<__k>)" + k.regex.replace(r"\d", "[0-9]") for k in self.kinds]
        # Kinds are tried in file order, each on the rows no earlier kind claimed.  Non-fallback kinds match
        # disjoint sets of lines (tests/test_formats.py checks it on every sample), so the ones no fallback
        # precedes may be tried first without changing the result: the kinds frequent in an earlier chunk go
        # first (see ``learn``), which leaves few rows for the many rare kinds to scan.
        first_fallback = next((i for i, k in enumerate(self.kinds) if k.fallback), len(self.kinds))
        self._hoistable = [i < first_fallback for i in range(len(self.kinds))]
        self.order: tuple[int, ...] = tuple(range(len(self.kinds)))
        fields_seen: dict[str, None] = {}
        for k in self.kinds:
            fields_seen.update(dict.fromkeys(k.fields))
        self._field_rank = {f: i for i, f in enumerate(fields_seen)}
        heads = [w.regex.removeprefix("^") for w in self.wrappers.prefixes]
        heads += [j.detect.removeprefix("^") for j in self.wrappers.json]
        heads = [re.sub(r"\(\?P<\w+>", "(?:", h) for h in heads]  # names would clash across wrappers
        self._any_wrapper = "^(?:" + "|".join(f"(?:{h})" for h in heads) + ")"

    # ------------------------------------------------------------------ wrappers
    def unwrap(self, raw: pl.Series) -> tuple[pl.Series, pl.DataFrame, set[str]]:
        """Remove ANSI codes and wrappers; return the remaining text and the wrapper fields."""
        text = raw
        seen: set[str] = set()
        n = len(text)
        cols: dict[str, pl.Series] = {}
        if text.str.contains("\x1b", literal=True).any():
            for name, pattern in self.wrappers.strip.items():
                text = text.str.replace_all(pattern, "")
                seen.add(name)
        # One scan tells whether any wrapper starts any line; most logs have none.  (Wrappers nest from the
        # outside in, so when no line starts with any of them, no inner one can apply either.)
        if not text.str.contains(self._any_wrapper).any():
            return text, pl.DataFrame(), seen
        for jw in self.wrappers.json:
            cand = text.str.contains(jw.detect) & ~text.str.contains(jw.exclude)
            if not cand.any():
                continue
            seen.add(jw.name)
            inner = pl.Series([None] * n, dtype=pl.String)
            for key in jw.text:
                inner = inner.fill_null(text.str.json_path_match(f"$.{key}"))
            tval = pl.Series([None] * n, dtype=pl.String)
            for key in jw.time:
                tval = tval.fill_null(text.str.json_path_match(f"$.{key}"))
            lval = pl.Series([None] * n, dtype=pl.String)
            for key in jw.level:
                lval = lval.fill_null(text.str.json_path_match(f"$.{key}"))
            ok = cand & inner.is_not_null()
            text = pl.select(pl.when(ok).then(inner.str.strip_suffix("\n").str.strip_suffix("\r"))
                             .otherwise(text)).to_series()
            cols["json_time"] = pl.select(pl.when(ok).then(tval)).to_series()
            cols["json_level"] = pl.select(pl.when(ok).then(lval)).to_series()
        for w in self.wrappers.prefixes:
            if not text.str.contains(w.regex).any():
                continue
            seen.add(w.name)
            groups, rest = _prefix_extract(text, w.regex)
            text = rest
            for g in groups.columns:
                col = groups[g]
                if g == "abs_ts":
                    col = pl.select(pl.when(col.is_not_null()).then(pl.lit(w.time) + pl.lit("|") + col)).to_series()
                    g = "abs_raw"
                if g in cols:
                    cols[g] = cols[g].fill_null(col)
                else:
                    cols[g] = col
        return text, pl.DataFrame({k: v.rename(k) for k, v in cols.items()}) if cols else pl.DataFrame(), seen

    # ------------------------------------------------------------------ classification
    def learn(self, res: ChunkResult) -> None:
        """Try the kinds that were frequent in ``res`` first from now on.

        Called by whoever reads the results in file order, so the order each chunk is classified with does
        not depend on which worker thread finished first.
        """
        counts, n = res.kind_counts, res.total
        if counts is None or not n:
            return
        hot = sorted((i for i in range(len(self.kinds)) if self._hoistable[i] and counts[i] * 50 >= n),
                     key=lambda i: -counts[i])
        self.order = (*hot, *(i for i in range(len(self.kinds)) if i not in hot))

    def classify(self, raw: pl.Series, first_line_no: int, carry: Carry,
                 order: tuple[int, ...] | None = None) -> ChunkResult:
        """Classify one chunk's lines; ``order`` is the order to try the kinds in (default: ``self.order``)."""
        n = len(raw)
        line_no = pl.Series("line_no", np.arange(first_line_no, first_line_no + n, dtype=np.int64))
        text, wcols, seen = self.unwrap(raw)
        text = text.str.strip_prefix("\r")
        blank = text.str.strip_chars().str.len_bytes() == 0
        fmt = self.fmt

        # Per-format record framing: elapsed/level prefix (text), JSON records, or key=value records.
        frame: dict[str, pl.Series] = {}
        is_record = pl.Series([False] * n)
        if fmt.family == "text":
            groups, body = _prefix_extract(text, fmt.prefix) if fmt.prefix else (pl.DataFrame(), text)
            for g in groups.columns:
                frame[g] = groups[g]
        elif fmt.family == "json":
            body = text
            is_record = text.str.starts_with("{") & text.str.contains(r'"(?:msg|message)"\s*:')
            msg = text.str.json_path_match(f"$.{fmt.message or 'msg'}")
            body = pl.select(pl.when(is_record).then(msg).otherwise(text)).to_series()
            if fmt.level_field:
                frame["level"] = pl.select(pl.when(is_record).then(text.str.json_path_match(f"$.{fmt.level_field}"))).to_series()
            if fmt.time_field:
                frame["epoch"] = pl.select(pl.when(is_record).then(text.str.json_path_match(f"$.{fmt.time_field}"))).to_series()
        else:  # kv
            rec = text.str.extract_groups(fmt.record or "").struct.unnest()
            is_record = rec["msg"].is_not_null()
            body = pl.select(pl.when(is_record).then(rec["msg"]).otherwise(text)).to_series()
            for g in rec.columns:
                if g not in {"msg", "tail"}:
                    frame[g] = rec[g]
            frame["__tail"] = rec["tail"] if "tail" in rec.columns else pl.Series([None] * n, dtype=pl.String)

        if fmt.family == "text" and fmt.prefix:
            # a prefix with nothing after it (`0.00.000.448 I `: an empty log record) is a blank line too
            blank = blank | (body.str.strip_chars().str.len_bytes() == 0)
        claimed = blank.to_numpy().copy()
        kind_of = np.full(n, -1, dtype=np.int32)
        pieces: list[pl.DataFrame] = []
        rec_np = is_record.to_numpy()
        # Prefilters scan only the rows no kind has claimed yet; the remaining set is re-gathered when it
        # has shrunk by half, so the frequent kinds (first in the file) leave little for the rest to scan.
        rem_idx = np.flatnonzero(~claimed)
        rem_body = body.gather(rem_idx) if len(rem_idx) < n else body
        for ki in order if order is not None else self.order:
            kind = self.kinds[ki]
            on_record = bool(kind.json_fields or kind.kv_fields) or kind.name.startswith("rec_")
            live = ~claimed[rem_idx]
            if not live.any():
                break
            if live.sum() * 2 < len(rem_idx):
                rem_idx = rem_idx[live]
                rem_body = body.gather(rem_idx)
                live = np.ones(len(rem_idx), dtype=bool)
            mask = live
            if fmt.family != "text":
                mask = mask & (rec_np[rem_idx] if on_record else ~rec_np[rem_idx])
            if not mask.any():
                continue
            if kind.prefilter:
                mask = mask & rem_body.str.contains(kind.prefilter, literal=True).to_numpy()
                if not mask.any():
                    continue
            idx = rem_idx[mask]
            sub = rem_body.filter(pl.Series(mask))
            ext = sub.str.extract_groups(self._fast[ki]).struct.unnest()
            hit = ext["__k"].is_not_null().to_numpy()
            if not hit.any():
                continue
            hit_idx = idx[hit]
            claimed[hit_idx] = True
            kind_of[hit_idx] = ki
            if kind.skip:
                continue
            part = ext.filter(pl.Series(hit)).drop("__k")
            part = part.with_columns(pl.Series("__row", hit_idx))
            if kind.json_fields:
                raw_sub = text.gather(hit_idx)
                part = part.with_columns(
                    [_json_alternatives(raw_sub, path).alias(f) for f, path in kind.json_fields if f not in part.columns]
                )
            if kind.kv_fields:
                tail = frame["__tail"].gather(hit_idx)
                part = part.with_columns(
                    [_kv_alternatives(tail, key).alias(f) for f, key in kind.kv_fields if f not in part.columns]
                )
            part = part.with_columns(pl.lit(kind.name, dtype=kind_dtype()).alias("kind"))
            pieces.append(self._type(part))

        # Continuations: unrecognised lines after a multiline record belong to it (integer kind codes).
        unclaimed = ~claimed
        skipped: Counter = Counter()
        skipped[BLANK] = int(blank.sum())
        carry_code = self.kind_index.get(carry.last_kind, -1) if carry.last_kind is not None else -1
        codes = np.concatenate([[carry_code], kind_of])
        pos = np.where(codes >= 0, np.arange(n + 1), 0)
        np.maximum.accumulate(pos, out=pos)
        ff = codes[pos][:-1]  # the latest recognised kind before each line (or the carried one)
        ff = np.where((pos[:-1] == 0) & (codes[0] < 0), -1, ff)
        is_multi = np.array([k.multiline for k in self.kinds] + [False])
        is_skip = np.array([k.skip for k in self.kinds] + [False])
        cont = unclaimed & is_multi[ff]
        cont_skip = cont & is_skip[ff]
        for code, count in zip(*np.unique(ff[cont_skip], return_counts=True), strict=True):
            skipped[self.kinds[code].name] += int(count)
        cont_parsed = int(cont.sum() - cont_skip.sum())
        unparsed_mask = unclaimed & ~cont
        counts = np.bincount(kind_of[kind_of >= 0], minlength=len(self.kinds))
        for ki, kind in enumerate(self.kinds):
            if kind.skip and counts[ki]:
                skipped[kind.name] += int(counts[ki])
        last_rec = np.flatnonzero(kind_of >= 0)
        if len(last_rec):
            carry.last_kind = self.kinds[kind_of[last_rec[-1]]].name
        first_rec = int(last_rec[0]) if len(last_rec) else n
        lead = int(unparsed_mask[:first_rec].sum())
        events = pl.concat(pieces, how="diagonal_relaxed") if pieces else pl.DataFrame({"__row": pl.Series([], dtype=pl.Int64)})
        if events.height:
            # the same columns in the same order whatever order the kinds were tried in
            events = events.select(sorted(events.columns, key=lambda c: (self._field_rank.get(c, 1 << 20), c)))
            events = events.sort("__row")
        rows = events["__row"].to_numpy() if events.height else np.array([], dtype=np.int64)
        base = {"line_no": line_no.gather(rows)}
        for name, series in frame.items():
            if name.startswith("__"):
                continue
            base[name] = series.gather(rows)
        for name in wcols.columns:
            base[name] = wcols[name].gather(rows)
        base_df = pl.DataFrame(base)
        if events.height:
            # a wrapper group and a kind field of the same name (syslog `host` vs the listen line's `host`):
            # the line's own field wins, the wrapper's value fills the lines that have none
            both = [c for c in base_df.columns if c in events.columns and c != "__row"]
            events = events.with_columns([pl.coalesce(pl.col(c), base_df[c].cast(events[c].dtype, strict=False))
                                          for c in both])
            base_df = base_df.drop(both)
        events = pl.concat([base_df, events.drop("__row")], how="horizontal") if events.height else base_df.with_columns(
            pl.lit(None, dtype=kind_dtype()).alias("kind"))
        if "elapsed" in events.columns:
            events = events.with_columns(elapsed_seconds(events["elapsed"])).drop("elapsed")
        unp_idx = np.flatnonzero(unparsed_mask)
        unparsed = pl.DataFrame({"line_no": line_no.gather(unp_idx), "text": raw.gather(unp_idx)})
        # parsed = recognised non-skip records + continuation lines of non-skip records
        recognised_nonskip = int(counts[~is_skip[:-1]].sum())
        parsed = recognised_nonskip + cont_parsed
        total_skipped = sum(skipped.values())
        assert parsed + total_skipped + len(unp_idx) == n, (parsed, total_skipped, len(unp_idx), n)
        return ChunkResult(events=events, unparsed=unparsed, skipped=skipped, parsed=parsed, total=n,
                           wrappers_seen=seen, lead=lead, kind_counts=counts,
                           last_kind=carry.last_kind if len(last_rec) else None)

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
        exprs = []
        for col in part.columns:
            if col in {"__row", "kind"}:
                continue
            spec = self.fields.get(col)
            if spec is None:
                continue
            if spec.type == "bool":
                exprs.append(pl.col(col).str.to_lowercase().is_in(["1", "true"]).alias(col))
            elif spec.type == "str":
                exprs.append(pl.col(col).cast(pl.String))
            else:
                exprs.append(pl.col(col).str.strip_chars().cast(DTYPES[spec.type], strict=False))
        return part.with_columns(exprs) if exprs else part
