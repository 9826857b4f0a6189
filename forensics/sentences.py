"""The words of the verdict: each finding's sentence about one run, written from that finding's rows and nothing
else.

A sentence function takes the finding's rows of one run and the ``RunContext`` (the run's other findings, where
its requests' lines are, the instances' names, what earlier sentences already told) and returns ``Fact`` s: the
sentence, the evidence (``path:first-last``) and its numbers as fields.  The registry (``forensics.registry``)
names each finding's sentence function; the verdict calls them in the registry's order.

Library only: no click, no altair.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from forensics.lazy import lazy_import
from forensics.timefmt import seconds, spoken

if TYPE_CHECKING:
    import polars as pl
else:  # loaded on first use: the CLI imports this module to build its commands (forensics.lazy)
    pl = lazy_import("polars")

# What a fact is to the reader: a finding makes the run unhealthy; advice (the cap) and notes are said but do
# not.  Notes come after everything else.
FINDING, ADVICE, NOTE = "finding", "advice", "note"


@dataclass
class Fact:
    kind: str  # the finding's name (dead_slot, crash, runaway, ...), healthy, cost or note kinds
    sentence: str
    evidence: list[str] = field(default_factory=list)  # "path:first-last" of the lines that show it
    fields: dict[str, Any] = field(default_factory=dict)
    severity: str = FINDING


def short_evidence(evidence: list[str], limit: int = 3) -> str:
    """``[main.log:75-493, 495-603, backup.log:7-49, +2]``: the file named once, its line ranges after it."""
    if not evidence:
        return ""
    out, last = [], None
    for spot in evidence[:limit]:
        path, _, lines = spot.rpartition(":")
        name = path.replace("\\", "/").rsplit("/", 1)[-1]
        out.append(f"{name}:{lines}" if name != last else lines)
        last = name
    more = f", +{len(evidence) - limit}" if len(evidence) > limit else ""
    return f" [{', '.join(out)}{more}]"


def span(lo: Any, hi: Any, unit: str = "") -> str:
    if lo is None:
        return "?"
    return f"{lo}{unit}" if lo == hi else f"{lo}–{hi}{unit}"


def names(values: list[Any], limit: int = 6) -> str:
    vals = [str(v) for v in dict.fromkeys(values) if v is not None]
    return ", ".join(vals[:limit]) + (f" and {len(vals) - limit} more" if len(vals) > limit else "")


def plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def count(n: int) -> str:
    return f"{n:,}"


class Locations:
    """Where each request's lines are: path and line range, from the requests table."""

    def __init__(self, df: pl.DataFrame) -> None:
        self.df = df
        self._by_run: dict[str, pl.DataFrame] | None = None

    def of(self, keys: pl.DataFrame) -> list[str]:
        """``path:first-last`` of each request in ``keys`` (run, instance, slot, task), in their order."""
        if keys.height == 0:
            return []
        if self._by_run is None:  # joined against their own run's requests only: a store holds many runs
            self._by_run = {k[0]: v for k, v in self.df.partition_by("run", as_dict=True).items()}
        runs = [r for r in keys["run"].unique().to_list() if r in self._by_run]
        mine = pl.concat([self._by_run[r] for r in runs]) if runs else self.df.clear()
        got = keys.select("run", "instance", "slot", "task").join(
            mine, on=["run", "instance", "slot", "task"], how="left", maintain_order="left")
        return [f"{p}:{a}-{b}" if a != b else f"{p}:{a}"
                for p, a, b in got.select("path", "line_first", "line_last").iter_rows() if p is not None]


@dataclass
class RunContext:
    """What a sentence function knows about its run besides its own finding's rows."""

    run: str
    rows: Callable[[str], pl.DataFrame]  # another finding's rows of this run
    loc: Locations
    instance_names: dict[str, str]  # instance -> the name sentences give it
    stats: dict[str, Any]  # requests and slots of the run (run_stats.sql)
    servers: set[str] = field(default_factory=set)  # the names of the instances that served requests
    told: set[tuple[Any, ...]] = field(default_factory=set)  # (instance, slot, task) an earlier sentence told
    told_items: set[str] = field(default_factory=set)  # items an earlier sentence named as lost
    told_attempts: set[tuple[Any, ...]] = field(default_factory=set)  # (item, stage, attempt) an earlier one told
    facts: list[Fact] = field(default_factory=list)  # the run's facts so far

    def name(self, instance: Any) -> str:
        return self.instance_names.get(str(instance), str(instance))

    def server(self, instance: Any) -> str:
        """How a sentence names the server of ``instance``: "The server" when the run had one, else its name."""
        if len(self.servers | {self.name(instance)}) <= 1:
            return "The server"
        return f"`{self.name(instance)}`"

    def has(self, *kinds: str) -> bool:
        return any(f.kind in kinds for f in self.facts)

    def untold(self, rows: pl.DataFrame) -> pl.DataFrame:
        """``rows`` (with instance, slot, task) less the requests an earlier sentence told."""
        if not self.told or rows.height == 0:
            return rows
        told = pl.DataFrame(list(self.told), schema={"instance": rows.schema["instance"], "slot": rows.schema["slot"],
                                                     "task": rows.schema["task"]}, orient="row")
        return rows.join(told, on=["instance", "slot", "task"], how="anti", nulls_equal=True)

    def tell(self, rows: pl.DataFrame) -> None:
        self.told.update(rows.select("instance", "slot", "task").iter_rows())


# ---------------------------------------------------------------------------------------- dead slots
# What each reason a request was abnormal (deadslots.sql's `why`) looks like to a reader, most telling first.
SYMPTOMS = (("context", "ran to the context"), ("runaway", "ran away"), ("few_tokens", "gave next to no output"),
            ("same_error", "failed the same way"), ("slow", "ran abnormally slowly"), ("long", "ran abnormally long"))


def symptoms(bad: pl.DataFrame) -> str:
    """``12 requests ran to the context``, or for a mix ``5 requests went wrong (1 ran away, 4 gave next to no
    output)``: each abnormal request counted once, under its most telling reason."""
    counts: dict[str, int] = {}
    for why in bad["why"].fill_null("").to_list():
        label = next((text for key, text in SYMPTOMS if key in why), "was abnormal")
        counts[label] = counts.get(label, 0) + 1
    if len(counts) == 1:
        return f"{plural(bad.height, 'request')} {next(iter(counts))}"
    mix = ", ".join(f"{n} {label}" for label, n in counts.items())
    return f"{plural(bad.height, 'request')} went wrong: {mix}"


def _detail(bad: pl.DataFrame, normal: pl.DataFrame) -> str:
    """The numbers that show it: seconds when the requests were slow, generated tokens otherwise."""
    slow = all(w and ("slow" in w or "long" in w) and "runaway" not in w for w in bad["why"].fill_null("").to_list())
    col, unit = ("seconds", " s") if slow else ("gen_tokens", " tokens")
    got, usual = bad[col].drop_nulls(), normal[col].drop_nulls()
    if not got.len() or not usual.len():
        return ""
    fmt = (lambda v: f"{v:.1f}") if slow else (lambda v: str(v))
    return f" ({span(fmt(got.min()), fmt(got.max()))}{unit} vs {span(fmt(usual.min()), fmt(usual.max()))} normal)"


def dead_slot(rows: pl.DataFrame, ctx: RunContext) -> list[Fact]:
    """``Slot 2 of `main` died at 10:50:19 on NVDA/score and never recovered: 4 requests ran abnormally slowly
    (32.0–115.4 s vs 14.8–65.1 normal), 1 item lost (CRM).``"""
    out = []
    seq_all = ctx.rows("dead_slot_sequence")
    lost_items = set(ctx.rows("missing")["item"].to_list())
    for s in rows.iter_rows(named=True):
        seq = seq_all.filter((pl.col("instance") == s["instance"]) & (pl.col("slot") == s["slot"]))
        after = seq.filter(pl.col("seq") >= s["seq"])
        bad = after.filter(pl.col("abnormal"))
        first = after.row(0, named=True)
        on = f" on {first['item']}/{first['stage']}" if first.get("item") is not None else ""
        lost = list(dict.fromkeys(it for it in after["item"].to_list() if it in lost_items)) \
            if "item" in after.columns else []
        tail = f", {plural(len(lost), 'item')} lost ({names(lost)})" if lost else ""
        rec = "recovered" if s["recovered"] else "never recovered"
        when = spoken(s["dead_from"]) if s["dead_from"] else spoken(_stamp_of_row(first, s["line"]))
        sentence = (f"Slot {s['slot']} of `{ctx.name(s['instance'])}` died {when}{on} and {rec}: "
                    f"{symptoms(bad)}{_detail(bad, seq.filter(~pl.col('abnormal') & ~pl.col('unknown')))}{tail}.")
        ctx.tell(bad)
        ctx.told_items.update(lost)
        out.append(Fact("dead_slot", sentence, ctx.loc.of(bad.with_columns(pl.lit(ctx.run).alias("run"))),
                        {"instance": s["instance"], "slot": s["slot"], "dead_from": s["dead_from"],
                         "requests_affected": bad.height, "items_lost": lost,
                         "recovered": s["recovered"]}))
    return out


# ---------------------------------------------------------------------------------------- crashes
# What to change after a crash, by what the crash line says (first match wins; a crash none matches gets none).
CRASH_ADVICE: list[tuple[str, str]] = [
    (r"(?i)out of memory|\bOOM\b|failed to allocate|cudaMalloc failed|OutOfDeviceMemory|insufficient memory",
     "The GPU ran out of memory: lower -c, -np or -ub, offload fewer layers (-ngl), or use a smaller quant."),
    (r"GGML_ASSERT|[Aa]ssertion .* failed",
     "A failed assert is a bug or an unsupported setting in this build: update llama.cpp, or report it upstream "
     "with the build and these lines."),
    (r"(?i)segmentation fault|SIGSEGV|SIGABRT|terminate called",
     "The process died on a signal: update llama.cpp, or report it upstream with the build and these lines."),
]


def crash_advice(message: str) -> str:
    import regex

    return next((advice for rx, advice in CRASH_ADVICE if regex.search(rx, message or "")), "")


def crash(rows: pl.DataFrame, ctx: RunContext) -> list[Fact]:
    """A crash at start-up or while serving, with its advice; an abort in the shutdown path with nothing in
    flight is one note (not a failure of the run, no advice)."""
    out = []
    for r in rows.iter_rows(named=True):
        ev = [f"{r['path']}:{r['line_no']}" + (f"-{r['line_last']}" if r["line_last"] != r["line_no"] else "")]
        who = ctx.server(r["instance"])
        message = str(r["message"])[:160]
        if r["phase"] == "shutdown":
            begun = f" while shutting down (`{str(r['shutdown_message']).strip()[:60]}` at line " \
                    f"{r['shutdown_line']})" if r["shutdown_message"] else " as it exited, idle"
            out.append(Fact("crash", f"Note: {who[0].lower() + who[1:]} aborted{begun} with nothing in flight "
                            f"({message}): the run was not affected.", ev,
                            {"phase": "shutdown", "crashes": 0}, NOTE))
            continue
        advice = crash_advice(message)
        when = "failed to start" if r["phase"] == "startup" else "crashed"
        flight = f" with {r['in_flight']} in flight" if r["in_flight"] else ""
        at = spoken(_stamp(r))
        out.append(Fact("crash", f"{who} {when} {at}{flight}: {message}." + (f" {advice}" if advice else ""),
                        ev, {"phase": r["phase"], "crashes": 1, **({"advice": advice} if advice else {})}))
    return out


def _stamp_of_row(r: dict[str, Any], line: Any) -> str:
    """A request's start as a sentence places it: its wall clock, else its server's own seconds, else its line."""
    from forensics.timefmt import stamp

    return stamp(r.get("t_start"), r.get("elapsed_start_s"), f"line {line}")


def _stamp(r: dict[str, Any]) -> str:
    from forensics.timefmt import stamp

    return stamp(r.get("ts"), r.get("elapsed_s"), f"line {r['line_no']}")


# ---------------------------------------------------------------------------------------- runaways, prompts
def runaway(rows: pl.DataFrame, ctx: RunContext) -> list[Fact]:
    """``2 outputs ran far longer than normal (2135–5677 tokens where normal responses stay under 287).``, with what
    stopped them (the client giving up, the server shutting down, the training context) and why they did not stop
    at the slot's context (context shift).  A dead slot's runaways are told by the dead-slot sentence, not again."""
    if rows.height == 0:
        return []
    mine = ctx.untold(rows)
    if mine.height == 0:
        return []
    toks, normal = mine["gen_tokens"], mine["normal_tokens"]
    shifted = "context_shift" in mine.columns and bool(mine["context_shift"].fill_null(False).any())
    why = ("ran on through context shifts" if shifted else
           "ran to the context" if mine["why"].str.contains("context").any() else "ran far longer than normal")
    ended = mine["error"].drop_nulls().unique().to_list() if "error" in mine.columns else []
    failed = f", and the server ended {'it' if mine.height == 1 else 'them'} with an error ({ended[0]})" \
        if ended else ""
    stopped = _stopped(mine) if not ended else ""
    shift = (" The server shifts the context instead of stopping an output that fills it (`--context-shift`): "
             "only an output cap (n_predict / max_tokens) ends such a request.") if shifted else ""
    sentence = (f"{plural(mine.height, 'output')} {why} ({span(toks.min(), toks.max())} tokens where normal "
                f"responses stay under {cast(int, normal.max())}){failed}{stopped}.{shift}")
    ctx.tell(mine)
    return [Fact("runaway", sentence, ctx.loc.of(mine), {"runaways": mine.height, "tokens_min": toks.min(),
                                                          "tokens_max": toks.max(), "context_shift": shifted})]


STOPPED_BY = {"client": "the client gave up", "shutdown": "the server shut down", "n_ctx_train":
              "the server stopped it at the model's training context", "context": "the slot's context was full",
              "cap": "its cap"}


def _stopped(rows: pl.DataFrame) -> str:
    """``: 2 ran until the client gave up, 1 until the server shut down`` (what ended the runaways)."""
    if "stop_cause" not in rows.columns:
        return ""
    counts = rows["stop_cause"].fill_null("unknown").value_counts(sort=True).rows()
    said = [(STOPPED_BY[c], n) for c, n in counts if c in STOPPED_BY and c != "context"]
    if not said:
        return ""
    if len(said) == 1 and said[0][1] == rows.height:
        return f", until {said[0][0]}"
    return ": " + ", ".join(f"{n} until {what}" for what, n in said)


def prompt_over_context(rows: pl.DataFrame, ctx: RunContext) -> list[Fact]:
    """Prompts the server refused for their length, and prompts it cut to fit (a warning, not a refusal): two
    sentences, each saying what happened, never "did not fit" for a prompt that was shorter than the context."""
    mine = ctx.untold(rows) if rows.height else rows
    out: list[Fact] = []
    if mine.height == 0:
        return out
    for how, text in (("rejected", "{n} longer than the slot's context ({p} tokens for {c}): the server refused "
                                   "{them}; shorten {them} or raise -c."),
                      ("truncated", "{n} longer than the slot's context and the server cut {them} to fit ({p} "
                                    "tokens kept of {c}, a warning, not an error): the output{s} read a cut prompt; "
                                    "shorten {them} or raise -c."),
                      ("filled", "{n} filled the slot's context before the output grew ({p} tokens for {c}): "
                                 "shorten {them} or raise -c.")):
        part = mine.filter(pl.col("how").str.contains(how))
        mine = mine.filter(~pl.col("how").str.contains(how))
        if part.height == 0:
            continue
        one = part.height == 1
        sentence = text.format(n=f"{plural(part.height, 'prompt')} {'was' if one else 'were'}"
                               if how != "filled" else plural(part.height, "prompt"),
                               p=span(part["prompt_tokens"].min(), part["prompt_tokens"].max()),
                               c=span(part["ctx_slot"].min(), part["ctx_slot"].max()),
                               them="it" if one else "them", s="" if one else "s")
        ctx.tell(part)
        out.append(Fact("prompt_over_context", sentence[0].upper() + sentence[1:], part["evidence"].to_list(),
                        {"prompts": part.height, "how": how}))
    return out


# ---------------------------------------------------------------------------------------- items, requests
def missing(rows: pl.DataFrame, ctx: RunContext) -> list[Fact]:
    if rows.height == 0:
        return []
    rest = [it for it in dict.fromkeys(rows["item"].to_list()) if it not in ctx.told_items]
    if not rest:
        return []
    sentence = f"{plural(len(rest), 'item')} did not finish ({names(rest)}): see `forensics missing {ctx.run}`."
    return [Fact("missing", sentence, [], {"items_missing": rest})]


def failed(rows: pl.DataFrame, ctx: RunContext) -> list[Fact]:
    """The failed requests no other sentence told (a dead slot's, a runaway's, a client timeout's), by what failed
    them: ``4 requests failed with HTTP 500 before reaching a slot (Failed to parse messages: ...); 2 with HTTP
    400 (...)``."""
    if rows.height == 0:
        return []
    if ctx.told_attempts:  # an attempt an earlier sentence told (a client timeout, a failover)
        told = pl.DataFrame(list(ctx.told_attempts), schema={"item": pl.String, "stage": pl.String,
                                                             "attempt": pl.Int64}, orient="row")
        rows = rows.join(told, on=["item", "stage", "attempt"], how="anti", nulls_equal=True)
    mine = pl.concat([ctx.untold(rows.filter(pl.col("task").is_not_null())), rows.filter(pl.col("task").is_null())],
                     how="vertical_relaxed")
    if mine.height == 0:
        return []
    parts = []
    groups = mine.with_columns(pl.col("http_status").cast(pl.String).alias("_status"))
    for (status, reason, before), g in groups.group_by(["_status", "reason", "before_slot"], maintain_order=True):
        how = f"with HTTP {status}" if status else _REASONS.get(str(reason), f"({reason})")
        where = " before reaching a slot" if before and status else ""
        parts.append(f"{g.height} {how}{where}{_messages(g)}")
    head = f"{plural(mine.height, 'request')} failed"
    sentence = f"{head} {parts[0].split(' ', 1)[1]}" if len(parts) == 1 else f"{head}: " + "; ".join(parts)
    ctx.tell(mine.filter(pl.col("task").is_not_null()))
    return [Fact("failed", sentence + f": see `forensics errors {ctx.run}`.", [e for e in mine["evidence"].to_list()
                                                                              if e][:20],
                 {"failed": mine.height, "by_status": {str(k): int(v) for k, v in
                                                       mine["http_status"].value_counts().iter_rows()}})]


def _messages(rows: pl.DataFrame, limit: int = 2) -> str:
    """`` (first message; second message; +3 more)``: the distinct errors of ``rows``, each cut at 70 characters."""
    said = [str(m).splitlines()[0][:70] for m in dict.fromkeys(rows["error"].drop_nulls().to_list())]
    if not said:
        return ""
    more = f"; +{len(said) - limit} more" if len(said) > limit else ""
    return " (" + "; ".join(said[:limit]) + more + ")"


_REASONS = {"timeout": "because the client timed out", "parse_error": "with output that did not parse",
            "client": "because the client gave up", "failed": "on the client's side", "error": "with a server error",
            "cancelled": "because they were cancelled", "shutdown": "because the server shut down"}


def cap(rows: pl.DataFrame, ctx: RunContext) -> list[Fact]:
    if rows.height == 0:
        return []
    c = rows.row(0, named=True)
    stoppable = ctx.rows("runaway").height
    if c["cap"] is None or not c["runaways"]:
        return []
    n_capped, n_all = c.get("capped_requests") or 0, c.get("requests") or 0
    set_ = ("An output cap was in force" if c["capped"] else
            f"The runaways had no output cap (the harness capped {n_capped} of the run's {n_all} requests)"
            if n_capped else "No output cap was set")
    touched = "touched no normal response" if not c["normal_cut"] else \
        f"cut {plural(c['normal_cut'], 'normal response')}"
    n = c["runaways_stopped"]
    which = ("the runaway" if n == 1 else "both runaways" if n == 2 else f"all {n} runaways") if n == stoppable \
        else f"{n} of the {stoppable} runaways"
    sentence = f"{set_}; a cap of {c['cap']} would have stopped {which} and {touched}."
    return [Fact("cap", sentence, [], {k: c[k] for k in ("cap", "capped", "runaways_stopped", "normal_cut")},
                 ADVICE)]


def ended(rows: pl.DataFrame, ctx: RunContext) -> list[Fact]:
    """How the run ended, when its harness says it did not complete (killed by a watchdog, crashed)."""
    out = []
    for end in rows.iter_rows(named=True):
        detail = f": {end['ended_detail']}" if end["ended_detail"] else ""
        out.append(Fact("ended", f"The run did not complete ({end['ended_how']}{detail}).", [],
                        {"ended_how": end["ended_how"], "ended_detail": end["ended_detail"]}))
    return out


# ---------------------------------------------------------------------------------------- stalls, failovers
def kv_stall(rows: pl.DataFrame, ctx: RunContext) -> list[Fact]:
    """``The KV cache of the server ran out of room: 3,416 lines of `failed to find free space in the KV cache` in 9
    stretches with nothing released (the longest 256 lines, 41.0 s from 02:07:02), while up to 4 requests were in
    flight: ...``: one sentence per instance."""
    out = []
    for (instance,), g in rows.group_by(["instance"], maintain_order=True):
        longest = g.sort("lines", descending=True, maintain_order=True).row(0, named=True)
        first = stamp_of(longest["first_ts"], longest["first_elapsed_s"], longest["line_no"])
        took = _seconds_between(longest)
        where = f"{seconds(took)} from {spoken(first).removeprefix('at ')}" if took else \
            f"from {spoken(first).removeprefix('at ')}"
        stretches = f"in {g.height} stretches with nothing released (the longest {count(longest['lines'])} lines, " \
            f"{where})" if g.height > 1 else f"with nothing released ({where})"
        n_req = cast(int, g["requests"].max())  # an integer count of a non-empty group
        failed = int(g["failed"].sum())
        during = f", while {'up to ' if g.height > 1 else ''}{plural(n_req, 'request')} " \
                 f"{'was' if n_req == 1 else 'were'} in flight" + (f" ({failed} failed)" if failed else "") \
            if n_req else ""
        words = str(longest["message"]).split(",")[0].strip()[:80]
        who = ctx.server(instance).replace("The server", "the server")
        sentence = (f"The KV cache of {who} ran out of room: {count(int(g['lines'].sum()))} lines of `{words}` "
                    f"{stretches}{during}: the server stalled retrying smaller batches; raise -c, lower -np, or cap "
                    f"the outputs.")
        out.append(Fact("kv_stall", sentence, g["evidence"].to_list(),
                        {"instance": instance, "lines": int(g["lines"].sum()), "stretches": g.height,
                         "requests": n_req, "seconds": took}))
    return out


def stamp_of(ts: Any, elapsed: Any, line: Any) -> str:
    from forensics.timefmt import stamp

    return stamp(ts, elapsed, f"line {line}")


def _seconds_between(r: dict[str, Any]) -> float | None:
    if r.get("first_ts") is not None and r.get("last_ts") is not None:
        return round((r["last_ts"] - r["first_ts"]).total_seconds(), 1)
    if r.get("first_elapsed_s") is not None and r.get("last_elapsed_s") is not None:
        return round(r["last_elapsed_s"] - r["first_elapsed_s"], 1)
    return None


def _between(r: dict[str, Any]) -> str:
    secs = _seconds_between(r)
    return f" ({seconds(secs)})" if secs else ""


def failover(rows: pl.DataFrame, ctx: RunContext) -> list[Fact]:
    """``The client timed out 12 times on `main` (after 30.0–30.2 s, 6 min 01 s in all): GOOG/analyze, ... failed
    over to `backup`; the other 4 were retried on `main`. Attempts finished ok: main 44, backup 4.``"""
    if rows.height == 0:
        return []
    parts = []
    for (server,), g in rows.group_by(["server"], maintain_order=True):
        how = " and ".join(_outcome(o, n) for o, n in g["outcome"].fill_null("failed").value_counts(sort=True).rows())
        waited = g["waited_s"].drop_nulls()
        total = f", {seconds(float(waited.sum()))} in all" if waited.len() > 1 else ""
        lo, hi = cast(float, waited.min()), cast(float, waited.max())  # seconds, a Float64 column
        after = f" (after {span(f'{lo:.1f}', f'{hi:.1f}')} s{total})" if waited.len() else ""
        over = g.filter(pl.col("failed_over"))
        moves = [f"{names(sorted({f'{i}/{st}' for i, st in part.select('item', 'stage').iter_rows()}), limit=4)} "
                 f"failed over to `{dst}`" for (dst,), part in over.group_by(["next_server"], maintain_order=True)]
        rest = g.height - over.height
        retried = f"the other {rest} {'was' if rest == 1 else 'were'} retried on `{server}`" if rest and moves else ""
        parts.append(f"{how} on `{server}`{after}" + (": " + "; ".join([*moves, retried][: len(moves) + bool(retried)])
                                                        if moves else ""))
    first = rows.row(0, named=True)
    served = f" Attempts finished ok: {first['served']}." if first["served"] else ""
    sentence = f"The client {'; '.join(parts)}.{served}"
    over = rows.filter(pl.col("failed_over"))
    ctx.told_attempts.update(rows.select("item", "stage", "attempt").iter_rows())
    return [Fact("failover", sentence, [e for e in rows["evidence"].to_list() if e][:20],
                 {"failovers": over.height, "timeouts": int((rows["outcome"] == "timeout").sum()),
                  "waited_s": round(float(rows["waited_s"].drop_nulls().sum()), 1), "served": first["served"]})]


def _outcome(outcome: str, n: int) -> str:
    word = {"timeout": "timed out", "failed": "failed", "cancelled": "cancelled", "parse_error": "got unparsable "
            "output"}.get(outcome, outcome)
    return f"{word} {'once' if n == 1 else 'twice' if n == 2 else f'{n} times'}"


# ---------------------------------------------------------------------------------------- cost
def cost(rows: pl.DataFrame, ctx: RunContext) -> list[Fact]:
    """What the findings cost the run: the time lost against what its requests needed, the items and stages
    lost, the tokens spent on runaways (said only when something went wrong)."""
    if not any(f.severity == FINDING for f in ctx.facts):
        return []
    parts: list[str] = []
    fields: dict[str, Any] = {}
    if rows.height:
        r = rows.row(0, named=True)
        run_s, need_s = r["run_s"], r["needed_s"]
        if run_s and need_s and run_s - need_s > max(1.0, 0.05 * need_s):
            parts.append(f"the run took {seconds(run_s)} where its requests needed about {seconds(need_s)} at "
                         f"normal speed ({seconds(run_s - need_s)} lost)")
            fields |= {"run_s": run_s, "needed_s": need_s, "lost_s": round(run_s - need_s, 1)}
    gone = ctx.rows("missing")
    if gone.height:
        n_items = gone["item"].n_unique()
        stages = f" ({gone.height} item-stages)" if gone.height != n_items else ""
        parts.append(f"{plural(n_items, 'item')} lost{stages}")
        fields |= {"items_lost": n_items, "stages_lost": gone.height}
    ran = ctx.rows("runaway")
    if ran.height:
        tokens = int(ran["gen_tokens"].fill_null(0).sum())
        parts.append(f"{count(tokens)} tokens spent on {plural(ran.height, 'runaway')}")
        fields |= {"runaway_tokens": tokens}
    if not parts:
        return []
    return [Fact("cost", "Cost: " + "; ".join(parts) + ".", [], fields, ADVICE)]


def healthy(stats: dict[str, Any]) -> Fact:
    n, slots = stats.get("requests", 0), stats.get("slots", 0)
    where = f" on {plural(slots, 'slot')}" if slots else ""
    text = f"{plural(n, 'request')}{where}, nothing abnormal found." if n else \
        "no server requests in the store for this run (replay records only)."
    return Fact("healthy", text, [], {"requests": n})


__all__ = ["ADVICE", "FINDING", "NOTE", "Fact", "Locations", "RunContext", "count", "names", "plural", "seconds",
           "short_evidence", "span"]
