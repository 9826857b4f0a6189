"""The verdict on a run: what went wrong and what to change, in a few sentences written from the findings.

Each sentence is a ``Fact`` built from one finding (``forensics.findings`` and the replay ``items`` table) and
nothing else, with the evidence to read (``path:line`` ranges) and its numbers as fields, so that the CLI,
the report, the demo and ``--format json`` say the same thing.  A healthy run gets one line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import polars as pl
import regex

from forensics import findings, metrics
from forensics import runs as runs_mod
from forensics.metrics import Comparable
from forensics.store import Store, fetch_pl


@dataclass
class Fact:
    kind: str  # dead_slot, crash, runaway, prompt_over_context, missing, failed, cap, healthy
    sentence: str
    evidence: list[str] = field(default_factory=list)  # "path:first-last" of the lines that show it
    fields: dict[str, Any] = field(default_factory=dict)


@dataclass
class RunVerdict:
    run: str
    requests: int
    facts: list[Fact]

    @property
    def healthy(self) -> bool:
        return all(f.kind == "healthy" for f in self.facts)

    def paragraph(self, *, evidence: bool = True) -> str:
        """The run's verdict as text: ``run: sentence [where] sentence ...``."""
        return f"{self.run}: " + " ".join(f.sentence + (short_evidence(f.evidence) if evidence else "") for f in self.facts)

    def as_dict(self) -> dict[str, Any]:
        return {"run": self.run, "requests": self.requests, "healthy": self.healthy,
                "facts": [{"kind": f.kind, "sentence": f.sentence, "evidence": f.evidence, **f.fields}
                          for f in self.facts]}


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


def _span(lo: Any, hi: Any, unit: str = "") -> str:
    if lo is None:
        return "?"
    return f"{lo}{unit}" if lo == hi else f"{lo}–{hi}{unit}"


def _names(values: list[Any], limit: int = 6) -> str:
    vals = [str(v) for v in dict.fromkeys(values) if v is not None]
    return ", ".join(vals[:limit]) + (f" and {len(vals) - limit} more" if len(vals) > limit else "")


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _when(text: Any) -> str:
    """A finding's time as a reader wants it: the clock time of an ISO timestamp, else as given."""
    s = str(text)
    if len(s) >= 19 and s[10] == "T":
        return f"at {s[11:19]}"
    if s.startswith("line "):
        return f"at {s}"
    if s.endswith("s") and s[:-1].replace(".", "", 1).isdigit():  # the server's own clock (seconds since start)
        return f"{float(s[:-1]):.1f} s after the server started"
    return f"at {s}" if not s.startswith("seq") else f"at request {s.removeprefix('seq ')} on the slot"


class _Locations:
    """Where each request's lines are: path and line range, from the requests table."""

    def __init__(self, store: Store, runs: list[str]) -> None:
        con = store.connect(tables=["requests"])
        try:
            self.df = fetch_pl(con, "SELECT run, instance, slot, task, path, line_first, line_last, gen_tokens, "
                                    "stop_reason FROM requests WHERE list_contains($runs, run)", {"runs": runs})
        finally:
            con.close()

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


def _dead_slots(run: str, dead: findings.DeadSlotReport, items: pl.DataFrame, loc: _Locations) -> list[Fact]:
    out = []
    for s in dead.slots.filter(pl.col("run") == run).iter_rows(named=True):
        seq = dead.sequence.filter((pl.col("run") == run) & (pl.col("instance") == s["instance"])
                                   & (pl.col("slot") == s["slot"]))
        after = seq.filter(pl.col("seq") >= s["seq"])
        bad = after.filter(pl.col("abnormal"))
        first = after.row(0, named=True)
        on = f" on {first['item']}/{first['stage']}" if first.get("item") is not None else ""
        detail = _detail(bad, seq.filter(~pl.col("abnormal")))
        lost = _lost(run, after, items)
        tail = f", {_plural(len(lost), 'item')} lost ({_names(lost)})" if lost else ""
        rec = "recovered" if s["recovered"] else "never recovered"
        sentence = (f"Slot {s['slot']} of `{s['instance']}` died {_when(s['dead_from'])}{on} and {rec}: "
                    f"{_symptoms(bad)}{detail}{tail}.")
        out.append(Fact("dead_slot", sentence, loc.of(bad.with_columns(pl.lit(run).alias("run"))),
                        {"instance": s["instance"], "slot": s["slot"], "dead_from": s["dead_from"],
                         "requests_affected": bad.height, "items_lost": lost, "recovered": s["recovered"]}))
    return out


# What each reason a request was abnormal (deadslots.sql's `why`) looks like to a reader, most telling first.
SYMPTOMS = (("context", "ran to the context"), ("runaway", "ran away"), ("few_tokens", "gave next to no output"),
            ("same_error", "failed the same way"), ("slow", "ran abnormally slowly"), ("long", "ran abnormally long"))


def _symptoms(bad: pl.DataFrame) -> str:
    """``12 requests ran to the context``, or for a mix ``5 requests went wrong (1 ran away, 4 gave next to no
    output)``: each abnormal request counted once, under its most telling reason."""
    counts: dict[str, int] = {}
    for why in bad["why"].fill_null("").to_list():
        label = next((text for key, text in SYMPTOMS if key in why), "was abnormal")
        counts[label] = counts.get(label, 0) + 1
    if len(counts) == 1:
        return f"{_plural(bad.height, 'request')} {next(iter(counts))}"
    mix = ", ".join(f"{n} {label}" for label, n in counts.items())
    return f"{_plural(bad.height, 'request')} went wrong: {mix}"


def _detail(bad: pl.DataFrame, normal: pl.DataFrame) -> str:
    """The numbers that show it: seconds when the requests were slow, generated tokens otherwise."""
    slow = all(w and ("slow" in w or "long" in w) and "runaway" not in w for w in bad["why"].fill_null("").to_list())
    col, unit = ("seconds", " s") if slow else ("gen_tokens", " tokens")
    got, usual = bad[col].drop_nulls(), normal[col].drop_nulls()
    if not got.len() or not usual.len():
        return ""
    fmt = (lambda v: f"{v:.1f}") if slow else (lambda v: str(v))
    return f" ({_span(fmt(got.min()), fmt(got.max()))}{unit} vs {_span(fmt(usual.min()), fmt(usual.max()))} normal)"


def _lost(run: str, rows: pl.DataFrame, items: pl.DataFrame) -> list[str]:
    if items.height == 0 or "item" not in rows.columns:
        return []
    lost = set(items.filter(pl.col("run") == run)["item"].to_list())
    return [it for it in rows["item"].to_list() if it in lost]


def _runaways(run: str, runaways: pl.DataFrame, dead_keys: set[tuple[Any, ...]], loc: _Locations) -> list[Fact]:
    mine = runaways.filter(pl.col("run") == run)
    if dead_keys:  # a dead slot's long requests are told by the dead-slot sentence, not again as runaways
        told = pl.DataFrame(list(dead_keys), schema={"instance": mine.schema["instance"], "slot": mine.schema["slot"],
                                                     "task": mine.schema["task"]}, orient="row")
        mine = mine.join(told, on=["instance", "slot", "task"], how="anti", nulls_equal=True)
    if mine.height == 0:
        return []
    toks, normal = mine["gen_tokens"], mine["normal_tokens"]
    why = "ran to the context" if mine["why"].str.contains("context").any() else "ran far longer than normal"
    sentence = (f"{_plural(mine.height, 'output')} {why} ({_span(toks.min(), toks.max())} tokens where normal "
                f"responses stay under {normal.max()}).")
    return [Fact("runaway", sentence, loc.of(mine), {"runaways": mine.height, "tokens_min": toks.min(),
                                                      "tokens_max": toks.max()})]


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
    return next((advice for rx, advice in CRASH_ADVICE if regex.search(rx, message or "")), "")


def _crashes(run: str, errors: pl.DataFrame) -> list[Fact]:
    out = []
    for r in errors.filter((pl.col("run") == run) & (pl.col("kind") == "crash")).iter_rows(named=True):
        flight = f" with {r['in_flight']} in flight" if r["in_flight"] else ""
        advice = crash_advice(r["example"])
        out.append(Fact("crash", f"The server crashed {_when(r['first'])}{flight}: {r['example'][:160]}."
                        + (f" {advice}" if advice else ""),
                        r["evidence"].split(", ") if r["evidence"] else [],
                        {"crashes": r["count"], **({"advice": advice} if advice else {})}))
    return out


def _over(run: str, over: pl.DataFrame) -> list[Fact]:
    mine = over.filter(pl.col("run") == run)
    if mine.height == 0:
        return []
    sentence = (f"{_plural(mine.height, 'prompt')} did not fit the slot's context "
                f"({_span(mine['prompt_tokens'].min(), mine['prompt_tokens'].max())} tokens for "
                f"{_span(mine['ctx_slot'].min(), mine['ctx_slot'].max())}): shorten "
                f"{'it' if mine.height == 1 else 'them'} or raise -c.")
    return [Fact("prompt_over_context", sentence, mine["evidence"].to_list(), {"prompts": mine.height})]


def _missing(run: str, items: pl.DataFrame, told: set[str]) -> list[Fact]:
    mine = items.filter(pl.col("run") == run)
    rest = [it for it in dict.fromkeys(mine["item"].to_list()) if it not in told]
    if not rest:
        return []
    sentence = f"{_plural(len(rest), 'item')} did not finish ({_names(rest)}): see `forensics missing {run}`."
    return [Fact("missing", sentence, [], {"items_missing": rest})]


def _cap(cap: dict[str, Any] | None, stoppable: int) -> list[Fact]:
    if cap is None or cap["cap"] is None or not cap["runaways"]:
        return []
    set_ = "An output cap was in force" if cap["capped"] else "No output cap was set"
    touched = "touched no normal response" if not cap["normal_cut"] else \
        f"cut {_plural(cap['normal_cut'], 'normal response')}"
    n = cap["runaways_stopped"]
    which = ("the runaway" if n == 1 else "both runaways" if n == 2 else f"all {n} runaways") if n == stoppable \
        else f"{n} of the {stoppable} runaways"
    sentence = f"{set_}; a cap of {cap['cap']} would have stopped {which} and {touched}."
    return [Fact("cap", sentence, [], {k: cap[k] for k in ("cap", "capped", "runaways_stopped", "normal_cut")})]


@dataclass
class _Findings:
    """Every finding of the runs, each split by run once: a run with no finding costs a few lookups."""

    dead: findings.DeadSlotReport
    runaways: dict[str, pl.DataFrame]
    over: dict[str, pl.DataFrame]
    errors: dict[str, pl.DataFrame]
    items: pl.DataFrame
    items_by_run: dict[str, pl.DataFrame]
    caps: dict[str, dict[str, Any]]
    ends: dict[str, dict[str, Any]]
    loc: _Locations
    counts: dict[str, int]
    slots: dict[str, int]
    failed: dict[str, int]


def _by_run(df: pl.DataFrame) -> dict[str, pl.DataFrame]:
    return {k[0]: v for k, v in df.partition_by("run", as_dict=True).items()} if df.height else {}


def _gather(store: Store, runs: str | list[str] | None, names: list[str]) -> _Findings:
    with findings.shared_session(store, names):  # the request relation and the runaways built once
        return _gather_shared(store, runs, names)


def _gather_shared(store: Store, runs: str | list[str] | None, names: list[str]) -> _Findings:
    loc = _Locations(store, names)
    per_run = loc.df.group_by("run").agg(pl.len().alias("n"), pl.struct("instance", "slot").n_unique().alias("slots"),
                                         (pl.col("stop_reason") == "error").sum().alias("failed"))
    items = findings.missing_items(store, names)
    return _Findings(
        dead=findings.dead_slot_report(store, runs),  # type: ignore[arg-type]
        runaways=_by_run(findings.find_runaways(store, runs)),  # type: ignore[arg-type]
        over=_by_run(findings.find_prompt_over_context(store, runs)),  # type: ignore[arg-type]
        errors=_by_run(findings.error_groups(store, names)),  # type: ignore[arg-type]
        items=items, items_by_run=_by_run(items),
        caps={r["run"]: r for r in findings.caps_by_run(store, runs).iter_rows(named=True)},
        ends=_run_ends(store, names), loc=loc,
        counts=dict(per_run.select("run", "n").iter_rows()), slots=dict(per_run.select("run", "slots").iter_rows()),
        failed=dict(per_run.select("run", "failed").iter_rows()))


def verdict(store: Store, runs: str | list[str] | None = None) -> list[RunVerdict]:
    """One verdict per run (all runs when none are given), from the findings."""
    names = runs_mod.resolve(store, runs).runs
    f = _gather(store, runs, names)
    dead_runs = set(f.dead.slots["run"].to_list())
    empty = pl.DataFrame()
    out = []
    for run in names:
        facts = _dead_slots(run, f.dead, f.items, f.loc) if run in dead_runs else []
        facts += _crashes(run, f.errors[run]) if run in f.errors else []
        if run in f.runaways:
            dead_keys = {(r["instance"], r["slot"], r["task"]) for r in f.dead.sequence.filter(
                (pl.col("run") == run) & pl.col("abnormal")).iter_rows(named=True)} if run in dead_runs else set()
            facts += _runaways(run, f.runaways[run], dead_keys, f.loc)
        facts += _over(run, f.over[run]) if run in f.over else []
        told = {it for fact in facts for it in fact.fields.get("items_lost", [])}
        facts += _missing(run, f.items_by_run.get(run, empty), told) if run in f.items_by_run else []
        if f.failed.get(run) and not any(fact.kind in ("dead_slot", "crash") for fact in facts):
            facts.append(Fact("failed", f"{_plural(f.failed[run], 'request')} failed: see `forensics errors {run}`.",
                              [], {"failed": f.failed[run]}))
        stoppable = f.runaways[run].height if run in f.runaways else 0
        facts += _cap(f.caps.get(run), stoppable) + _ended(f.ends.get(run))
        if not facts or all(fact.kind == "cap" for fact in facts):
            facts = [_healthy(f.counts.get(run, 0), f.slots.get(run, 0))]
        out.append(RunVerdict(run, f.counts.get(run, 0), facts))
    return out


def _ended(end: dict[str, Any] | None) -> list[Fact]:
    """How the run ended, when its harness says it did not complete (killed by a watchdog, crashed)."""
    if end is None or end["ended_how"] in (None, "completed", "unknown"):
        return []
    detail = f": {end['ended_detail']}" if end["ended_detail"] else ""
    return [Fact("ended", f"The run did not complete ({end['ended_how']}{detail}).", [],
                 {"ended_how": end["ended_how"], "ended_detail": end["ended_detail"]})]


def _run_ends(store: Store, runs: list[str]) -> dict[str, dict[str, Any]]:
    con = store.connect(tables=["runs"])
    try:
        df = fetch_pl(con, "SELECT run, any_value(ended_how) AS ended_how, any_value(ended_detail) AS ended_detail "
                           "FROM runs WHERE list_contains($runs, run) GROUP BY run", {"runs": runs})
    finally:
        con.close()
    return {r["run"]: r for r in df.iter_rows(named=True)}


def _healthy(n: int, slots: int) -> Fact:
    where = f" on {_plural(slots, 'slot')}" if slots else ""
    text = f"{_plural(n, 'request')}{where}, nothing abnormal found." if n else \
        "no server requests in the store for this run (replay records only)."
    return Fact("healthy", text, [], {"requests": n})


BROKEN_KINDS = ("dead_slot", "crash", "ended")  # facts that make a run measure a broken server


def comparable_healthy_runs(store: Store, runs: list[str], known: list[RunVerdict] | None = None) -> Comparable:
    """The runs a throughput comparison for ``runs`` may pool (``metrics.comparable_runs``: the runs named, or
    one run's sweep), less those that measured a broken server (a dead slot, a crash, a run that did not
    complete), each left out with its verdict's sentences.  ``known``: verdicts already computed."""
    have = {v.run: v for v in known or []}
    pool = metrics.comparable_runs(store, runs).runs
    todo = [r for r in pool if r not in have]
    have.update({v.run: v for v in (verdict(store, todo) if todo else [])})
    broken = {r: "; ".join(f.sentence for f in v.facts if f.kind in BROKEN_KINDS) for r, v in have.items()
              if any(f.kind in BROKEN_KINDS for f in v.facts)}
    return metrics.comparable_runs(store, runs, broken=broken)
