"""Turn classified events into instances and requests, chunk by chunk.

Instances: a new server process starts at a boundary line (build / verbosity banner) once the previous
one has done more than start up, or when elapsed time jumps back.  Router children ([port] prefix) are
separate instances, keyed by port.  Requests: one per (instance, slot, task), aggregated from the lines
of that task; partial aggregates from each chunk are merged at the end of the file, so memory holds one
small row per request, not every line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import cast

import numpy as np
import polars as pl

from parsers.spec import Format


@dataclass(frozen=True)
class Roles:
    """The kinds of a format by the role their lines play for a request (``role`` in the format files)."""

    fmt: Format

    def __call__(self, *roles: str) -> tuple[str, ...]:
        return self.fmt.with_role(*roles)

    def block_end(self) -> tuple[str, ...]:
        """The timing lines that say their request has ended: a block's total line, or a text block's
        generation line (printed with the block once the request ended; the text may cut the total after it).
        A prompt-eval line alone does not (2026 builds print it once the prompt is done), nor a record's
        generation line without the block's total record (a record is often pasted cut short)."""
        return tuple(k.name for k in self.fmt.kinds
                     if k.role == "timing_total" or (k.role == "timing_eval" and k.frame == "text"))


# Lines that open a request of their own with no slot or task logged (role synth_start: era 1's
# `llama_print_timings` block, one context, one request per block): slot 0, task = the line number (a join
# key only).

@dataclass
class KeyState:
    instance_no: int = 0
    active: bool = False  # the current instance served a request or ended: a banner line now starts the next
    prev_elapsed: float | None = None
    min_task: int | None = None  # the lowest task id the current instance started
    slot_start: dict[str, int] = field(default_factory=dict)  # the current instance's latest started task per slot
    slot_task: dict[str, int] = field(default_factory=dict)  # latest started task per slot (era 2 lines)
    hdr: dict[str, list[int]] = field(default_factory=dict)  # latest [slot, task] per inherit header kind
    running: dict[str, int] = field(default_factory=dict)  # latest task seen on each slot ("instance/slot")


@dataclass
class AssembleState:
    keys: dict[int, KeyState] = field(default_factory=dict)


@dataclass(frozen=True)
class _Segmenting:
    """One key's lines as the instance rule reads them (numpy arrays over the key's rows, in line order)."""

    bound: np.ndarray  # a start-up banner line (``boundary`` kinds)
    active: np.ndarray  # the process did more than start up: a request's line, an HTTP line, an end or a crash
    elapsed: np.ndarray | None  # the elapsed clock (NaN where the line has none)
    start_slot: np.ndarray  # the slot of a request's start line (NaN elsewhere)
    start_task: np.ndarray

    def rows(self, idx: np.ndarray) -> _Segmenting:
        """The same arrays at rows ``idx``."""
        return _Segmenting(self.bound[idx], self.active[idx], None if self.elapsed is None else self.elapsed[idx],
                           self.start_slot[idx], self.start_task[idx])


ERROR_LEVELS = ("E", "ERR", "ERROR", "F", "FATAL", "CRIT", "CRITICAL")


def derive_facts(ev: pl.DataFrame) -> pl.DataFrame:
    """The facts a person works out from a line's own fields, each worked out here only:

    * a progress line's ``n_decoded + n_remaining`` is the request's output cap (``n_remaining = -1``: no cap);
    * a metrics task's idle plus processing slots are the instance's slot count;
    * a line that states a failure in words (role ``failure``) is an error unless it carries a level, and then
      its level decides (the server's own judgement: era 5 prints ``W decode: failed to find a memory slot``).
    """
    out = []
    if {"gen_tokens", "n_remaining"} <= set(ev.columns):
        cap = pl.when(pl.col("n_remaining") == -1).then(-1).otherwise(pl.col("gen_tokens") + pl.col("n_remaining"))
        out.append((pl.coalesce("n_predict", cap) if "n_predict" in ev.columns else cap).alias("n_predict"))
    if {"n_idle_slots", "n_processing_slots"} <= set(ev.columns):
        busy = pl.col("n_idle_slots") + pl.col("n_processing_slots")
        out.append((pl.coalesce("n_slots", busy) if "n_slots" in ev.columns else busy).alias("n_slots"))
    if "role" in ev.columns:
        levels = [c for c in ("level", "json_level") if c in ev.columns]
        level = pl.coalesce(*levels).cast(pl.String).str.to_uppercase() if levels else pl.lit(None, dtype=pl.String)
        stated = (pl.col("role") == "failure") & (level.is_null() | level.is_in(ERROR_LEVELS))
        out.append(pl.when(stated).then(pl.lit("error").cast(ev.schema["role"])).otherwise(pl.col("role"))
                   .alias("role"))
    return ev.with_columns(out) if out else ev


def assign_instances(ev: pl.DataFrame, fmt: Format, state: AssembleState) -> pl.DataFrame:
    """Add ``ikey`` (router port or -1) and ``instance_no`` to the events of one chunk.

    The derived facts (``derive_facts``) are worked out first, so every event written has them.  A new server
    process (instance segment) starts at the first start-up banner line after the current one
    served a request or ended (a shutdown, a fatal argument error, a crash), where the elapsed clock starts
    again near zero, or where task ids come back (``_task_id_breaks``).  Lines before a process's first banner
    line (device probes, a download) are its own: nothing before the banner served a request.
    """
    if ev.height == 0:
        return ev.with_columns(pl.lit(-1, dtype=pl.Int64).alias("ikey"), pl.lit(1, dtype=pl.Int64).alias("instance_no"))
    ev = derive_facts(ev)
    if "router_port" in ev.columns:
        ikey = ev["router_port"].str.strip_chars().cast(pl.Int64, strict=False).fill_null(-1)
    else:
        ikey = pl.Series([-1] * ev.height, dtype=pl.Int64)
    if "diff_old" in ev.columns and "quote" in ev.columns:  # a diff of two logs: its `> ` side is the second log
        ikey = pl.select(pl.when(ev["quote"].is_not_null() & (ikey == -1)).then(-2).otherwise(ikey)).to_series()
    ev = ev.drop([c for c in ("quote", "diff_old") if c in ev.columns])  # only what the wrapper says of the line
    ev = ev.with_columns(_parallel_streams(ev, ikey).alias("ikey"))
    lines = _segmenting(ev, fmt)
    keys = ev["ikey"].to_numpy()
    inst = np.zeros(ev.height, dtype=np.int64)
    for key in np.unique(keys):
        st = state.keys.setdefault(int(key), KeyState())
        idx = np.flatnonzero(keys == key)
        mine = lines.rows(idx)
        brk = _process_breaks(mine, st)
        brk |= _task_id_breaks(mine, brk, st)
        if st.instance_no == 0:
            st.instance_no = 1
            brk[0] = False
        counts = st.instance_no + np.cumsum(brk)
        inst[idx] = counts
        st.instance_no = int(counts[-1])
        last = np.flatnonzero(brk)
        st.active = bool(mine.active[last[-1] if len(last) else 0:].any()) or (st.active and not len(last))
    return ev.with_columns(pl.Series("instance_no", inst))


def _task_goes_down(ev: pl.DataFrame, ikey: pl.Series) -> bool:
    """Whether any slot's task id ever goes down from one line to the next, or changes at a line that is not the new
    task's start (neither happens in one server's log without a restart): the cheap test before
    ``_parallel_streams`` looks closer."""
    lines = pl.DataFrame({"slot": ev["slot"], "task": ev["task"], "ikey": ikey, "_st": ev["role"] == "start"}).filter(
        (pl.col("ikey") == -1) & pl.col("slot").is_not_null() & (pl.col("task") >= 0))
    step = pl.col("task").diff().over("slot")
    return bool(lines.select(((step < 0) | ((step != 0) & ~pl.col("_st"))).any()).item())


def _running_before(lines: pl.DataFrame, per_task: pl.DataFrame) -> pl.DataFrame:
    """Tasks whose lines come on a slot after another task started there and before it was released, with no start
    of their own in the text: they were running already, beside it (``per_task`` with ``_from`` moved to just after
    that start, so their spans overlap)."""
    starts = lines.filter(pl.col("_st")).group_by("slot", "task").agg(pl.col("_i").min().alias("_s"))
    if starts.is_empty():
        return per_task
    rel = lines.filter(pl.col("_rel")).group_by("slot", "task").agg(pl.col("_i").min().alias("_r"))
    opened = starts.join(rel, on=["slot", "task"], how="left").rename({"task": "_a"}).sort("_s")
    loose = per_task.join(starts.select("slot", "task"), on=["slot", "task"], how="anti").sort("_from")
    hit = (loose.join_asof(opened, left_on="_from", right_on="_s", by="slot", strategy="backward",
                          check_sortedness=False)
           .filter(pl.col("_s").is_not_null() & (pl.col("_a") != pl.col("task"))
                   & (pl.col("_r").is_null() | (pl.col("_r") > pl.col("_from"))))
           .select("slot", "task", (pl.col("_s") + 0.5).alias("_moved")))
    if hit.is_empty():
        return per_task
    return (per_task.with_columns(pl.col("_from").cast(pl.Float64)).join(hit, on=["slot", "task"], how="left")
            .with_columns(pl.coalesce("_moved", "_from").alias("_from"), (pl.col("_moved").is_not_null()).alias("_was"))
            .drop("_moved"))


def _parallel_streams(ev: pl.DataFrame, ikey: pl.Series) -> pl.Series:
    """Two servers writing into one log with no tag to tell them apart (ollama 2026 copies each model's server
    into its own journal under one pid): a slot cannot run two tasks at once, so where two tasks' lines alternate
    on one slot (each comes back after the other, neither released in between), the tasks whose spans on the slot
    overlap belong to different servers.  The first server keeps its key; the tasks of the k-th get key -1 - k (instances of their own).  Only
    lines without a router tag, within one chunk."""
    if "slot" not in ev.columns or "task" not in ev.columns or not _task_goes_down(ev, ikey):
        return ikey
    lines = pl.DataFrame({"_i": np.arange(ev.height), "ikey": ikey, "slot": ev["slot"], "task": ev["task"],
                          "_rel": ev["role"] == "release", "_st": ev["role"] == "start"}).filter(
        (pl.col("ikey") == -1) & pl.col("slot").is_not_null() & (pl.col("task") >= 0))
    if lines.height < 4:
        return ikey
    # a task's lines after its own release are a later process's (a restart, a log pasted twice), not a parallel one
    lines = lines.filter(pl.col("_rel").cast(pl.Int8).cum_sum().shift(1, fill_value=0).over("slot", "task") == 0)
    runs = lines.with_columns((pl.col("task") != pl.col("task").shift(1).over("slot")).fill_null(True)
                              .cum_sum().over("slot").alias("_run"))
    per_task = runs.group_by("slot", "task").agg(pl.col("_run").n_unique().alias("_runs"), pl.col("_i").min()
                                                   .alias("_from"), pl.col("_i").max().alias("_to"))
    per_task = _running_before(lines, per_task)
    alternating = per_task.filter(pl.col("_runs") > 1).group_by("slot").len().filter(pl.col("len") > 1)["slot"]
    beside = per_task.filter(pl.col("_was"))["slot"] if "_was" in per_task.columns else alternating.head(0)
    mixed = pl.concat([alternating, beside.cast(alternating.dtype)]).unique(maintain_order=True)
    if mixed.is_empty():
        return ikey
    colours = []
    for slot in mixed.to_list():  # interval colouring of the few alternating slots' tasks
        ends: list[int] = []  # the last line of each stream's latest task on this slot
        for task, first, last in per_task.filter(pl.col("slot") == slot).sort("_from").select(
                "task", "_from", "_to").iter_rows():
            k = next((k for k, end in enumerate(ends) if end < first), len(ends))
            ends[k:k + 1] = [last]
            colours.append((slot, task, k))
    streams = pl.DataFrame(colours, schema={"slot": lines.schema["slot"], "task": lines.schema["task"],
                                            "_k": pl.Int64}, orient="row")
    moved = runs.join(streams.filter(pl.col("_k") > 0), on=["slot", "task"])
    return ikey.scatter(moved["_i"].to_numpy(), (-1 - moved["_k"]).to_numpy())


def _segmenting(ev: pl.DataFrame, fmt: Format) -> _Segmenting:
    kind = ev["kind"]
    startup = kind.is_in([k.name for k in fmt.kinds if k.startup]).to_numpy()
    ended = kind.is_in([k.name for k in fmt.kinds if k.ends] + list(fmt.with_role("crash"))).to_numpy()
    http = kind.is_in(list(fmt.with_role("http", "proxy_http"))).to_numpy()
    task = ev["task"].fill_null(-1).to_numpy() if "task" in ev.columns else np.full(ev.height, -1)
    slot = ev["slot"].cast(pl.Float64).fill_null(np.nan).to_numpy() if "slot" in ev.columns else np.full(ev.height, np.nan)
    is_start = kind.is_in(list(fmt.with_role("start"))).to_numpy() & (task >= 0) & ~np.isnan(slot)
    return _Segmenting(
        bound=kind.is_in([k.name for k in fmt.kinds if k.boundary]).to_numpy(),
        active=ended | http | ((task >= 0) & ~startup),
        elapsed=ev["elapsed_s"].cast(pl.Float64).fill_null(np.nan).to_numpy() if "elapsed_s" in ev.columns else None,
        start_slot=np.where(is_start, slot, np.nan),
        start_task=np.where(is_start, task, -1),
    )


def _process_breaks(lines: _Segmenting, st: KeyState) -> np.ndarray:
    """Where a new process starts within one key's lines: the elapsed clock starting again near zero (a log whose
    lines are out of order is not a restart), or the first banner line after the current process was active."""
    n = len(lines.bound)
    clock = np.zeros(n, dtype=bool)
    if lines.elapsed is not None:
        e = lines.elapsed
        prev_e = np.empty(n)
        prev_e[0] = st.prev_elapsed if st.prev_elapsed is not None else np.nan
        prev_e[1:] = e[:-1]
        prev_e = pd_ffill(prev_e)
        clock = (np.nan_to_num(e, nan=np.inf) < np.nan_to_num(prev_e, nan=-np.inf) - 1.0) & (np.nan_to_num(e, nan=np.inf) < 120)
        valid = e[~np.isnan(e)]
        if len(valid):
            st.prev_elapsed = float(valid[-1])
    brk = clock.copy()
    # the banner rule is sequential (activity counts from the latest start), but only banner lines are visited
    done = np.concatenate([[0], np.cumsum(lines.active)])  # done[i]: active lines before row i
    seg_from, was_active = 0, st.active
    for i in np.flatnonzero(lines.bound | clock):
        if clock[i] or was_active or done[i] > done[seg_from]:
            brk[i] = True
            seg_from, was_active = int(i), False
    return brk


def _task_id_breaks(lines: _Segmenting, brk: np.ndarray, st: KeyState) -> np.ndarray:
    """A process hands out task ids in increasing order and starts a task once, so a slot starting a task whose id
    is not above its previous task's and no higher than any this process started (ids back at 0, two logs pasted
    one after the other without a banner between) is a new process.  A task deferred behind a later one on its
    slot is not (its id is above the process's lowest)."""
    out = np.zeros(len(brk), dtype=bool)
    rows = np.flatnonzero(lines.start_task >= 0)
    if len(rows):
        seg = np.cumsum(brk)[rows]
        df = pl.DataFrame({"seg": seg, "slot": lines.start_slot[rows].astype(np.int64), "task": lines.start_task[rows]})
        carried = pl.DataFrame({"slot": [int(k) for k in st.slot_start], "_carried": list(st.slot_start.values())},
                               schema={"slot": pl.Int64, "_carried": pl.Int64})
        first = pl.col("seg") == 0
        df = df.with_row_index("_i").join(carried, on="slot", how="left").sort("_i").with_columns(
            pl.col("task").shift(1).over("seg", "slot").alias("_prev"),
            pl.col("task").cum_min().shift(1).over("seg").alias("_min"))
        low = st.min_task if st.min_task is not None else None
        df = df.with_columns(
            pl.when(first).then(pl.coalesce("_prev", "_carried")).otherwise("_prev").alias("_prev"),
            pl.when(first & pl.lit(low is not None)).then(pl.min_horizontal("_min", pl.lit(low))).otherwise("_min")
            .alias("_min"))
        back = df.select((pl.col("task") <= pl.col("_prev")) & (pl.col("task") <= pl.col("_min"))).to_series()
        out[rows[back.fill_null(False).to_numpy()]] = True
    _remember_starts(lines, brk | out, rows, st)
    return out


def _remember_starts(lines: _Segmenting, brk: np.ndarray, rows: np.ndarray, st: KeyState) -> None:
    """The latest started task per slot and the lowest started task id of the chunk's last process."""
    cut = np.flatnonzero(brk)
    if len(cut):
        st.slot_start, st.min_task = {}, None
        rows = rows[rows >= cut[-1]]
    if not len(rows):
        return
    slots, tasks = lines.start_slot[rows][::-1].astype(np.int64), lines.start_task[rows][::-1]
    _, latest = np.unique(slots, return_index=True)  # the first of each slot in reverse: its latest start
    st.slot_start.update({str(int(slots[i])): int(tasks[i]) for i in latest})
    low = int(tasks.min())
    st.min_task = low if st.min_task is None else min(st.min_task, low)


def pd_ffill(a: np.ndarray) -> np.ndarray:
    mask = np.isnan(a)
    if not mask.any():
        return a
    idx = np.where(~mask, np.arange(len(a)), 0)
    np.maximum.accumulate(idx, out=idx)
    out = a[idx]
    return out


def running_tasks(ev: pl.DataFrame, fmt: Format, state: AssembleState) -> pl.DataFrame:
    """Give a timing header that names no task (``task -1``, ik_llama.cpp) the task running on its slot: the
    task of the latest line on that slot that names one (this chunk's, else the one carried from before)."""
    if ev.height == 0 or "slot" not in ev.columns or "task" not in ev.columns:
        return ev
    keys = ["ikey", "instance_no", "slot"]
    named = pl.when(pl.col("task") >= 0).then(pl.col("task"))
    hdr = pl.col("kind").is_in(list(fmt.with_role("timing_header"))) & (pl.col("task") < 0)
    carried = pl.DataFrame(
        [{"ikey": k, "instance_no": int(key.split("/")[0]), "slot": int(key.split("/")[1]), "_carried": t}
         for k, st in state.keys.items() for key, t in st.running.items()],
        schema={"ikey": pl.Int64, "instance_no": pl.Int64, "slot": pl.Int64, "_carried": pl.Int64})
    out = ev
    if ev.select(hdr.any()).item():
        out = (ev.with_row_index("_i").join(carried, on=keys, how="left")
               .with_columns(pl.coalesce(named.forward_fill().over(keys, order_by="_i"), "_carried").alias("_run"))
               .sort("_i").with_columns(pl.when(hdr).then(pl.col("_run")).otherwise(pl.col("task")).alias("task"))
               .drop("_i", "_carried", "_run"))
    last = ev.filter((pl.col("task") >= 0) & pl.col("slot").is_not_null()).group_by(keys).agg(pl.col("task").last())
    for k, inst, slot, task in last.iter_rows():
        state.keys.setdefault(int(k), KeyState()).running[f"{inst}/{slot}"] = int(task)
    return out


@dataclass
class _LineArrays:
    """One chunk's kind, slot, task, line number and instance as numpy arrays; slot and task are float with NaN
    for missing so they can be filled in place."""
    kinds: np.ndarray
    slot: np.ndarray
    task: np.ndarray
    line: np.ndarray
    inst: np.ndarray


def inherit_slots(ev: pl.DataFrame, fmt: Format, state: AssembleState) -> pl.DataFrame:
    """Fill slot/task on lines that do not carry them.

    * ``inherit = X``: a line without a slot takes slot and task from the latest line of kind X (era-4
      timing block bodies); a line with a slot but no task takes the task of the latest X line of the
      same slot (era-2 ``slot N released``, ``slot N : kv cache rm``).
    * ``inherit_next = X``: a line without a slot takes slot and task from the next line of kind X
      (era-2 ``print_timings``, which precede their ``slot N released``).  Only within one chunk: a
      timing block whose release line falls in the next chunk keeps no slot (chunks are 32 MiB).
    * ``synth_start`` lines get slot 0 and their line number as task (era 1).
    * What is still without a slot after that: ``_orphan_blocks`` and ``_tie_untagged_errors``.
    """
    if ev.height == 0:
        return ev
    if "slot" not in ev.columns:
        ev = ev.with_columns(pl.lit(None, dtype=pl.Int64).alias("slot"))
    if "task" not in ev.columns:
        ev = ev.with_columns(pl.lit(None, dtype=pl.Int64).alias("task"))
    la = _inherit_declared(ev, fmt, state)
    errors = ev["kind"].is_in(list(fmt.with_role("error")))
    if errors.any():
        la = la if la is not None else _line_arrays(ev)
        _tie_untagged_errors(la, ev, fmt)
        _tie_slot_task_errors(la, ev, fmt)
    if la is None:
        return ev
    return ev.with_columns(
        pl.Series("slot", la.slot, dtype=pl.Float64).fill_nan(None).cast(pl.Int64),
        pl.Series("task", la.task, dtype=pl.Float64).fill_nan(None).cast(pl.Int64),
    )


def _inherit_declared(ev: pl.DataFrame, fmt: Format, state: AssembleState) -> _LineArrays | None:
    """The ``inherit`` / ``inherit_next`` / ``synth_start`` rules (None: no line needs or sets anything)."""
    inheritors = {k.name: k.inherit for k in fmt.kinds if k.inherit}
    next_inh = {k.name: k.inherit_next for k in fmt.kinds if k.inherit_next}
    if not inheritors and not next_inh:
        return None
    synth_kinds = list(fmt.with_role("synth_start"))
    takers_all = [*inheritors, *next_inh, *synth_kinds]
    missing = ev["kind"].is_in(takers_all) & (ev["slot"].is_null() | ev["task"].is_null())
    headers = {*inheritors.values(), *next_inh.values()}
    if not missing.any() and not ev["kind"].is_in(list(headers)).any():
        return None  # e.g. era 5: every line carries its slot and task, and no header state to carry
    la = _line_arrays(ev)
    synth = np.isin(la.kinds, synth_kinds) & np.isnan(la.slot)
    la.slot[synth] = 0
    la.task[synth] = la.line[synth]
    keys = ev["ikey"].to_numpy()
    present = set(ev["kind"].unique().cast(pl.String).to_list())
    for key in np.unique(keys):
        st = state.keys.setdefault(int(key), KeyState())
        idx = np.flatnonzero(keys == key)
        for header in sorted(set(inheritors.values())):
            takers = [k for k, h in inheritors.items() if h == header and k in present]
            if not takers and header not in present:
                continue  # (a header alone still sets the state a later chunk's lines take)
            _inherit_task_of_slot(la, idx, st, header, takers)
            _inherit_latest_header(la, idx, st, header, takers)
        for header in sorted(set(next_inh.values())):
            _inherit_next_header(la, idx, header, [k for k, h in next_inh.items() if h == header])
    if missing.any():
        _orphan_blocks(la, keys, fmt, [*inheritors, *next_inh])
    return la


def _groups(keys: np.ndarray, inst: np.ndarray) -> list[np.ndarray]:
    """The rows of each instance (router key and instance number), each in line order."""
    code = keys.astype(np.int64) * (1 << 32) + inst.astype(np.int64)
    return [np.flatnonzero(code == c) for c in np.unique(code)]


def _orphan_blocks(la: _LineArrays, keys: np.ndarray, fmt: Format, takers: list[str]) -> None:
    """Timing lines whose header the text does not have (an excerpt that starts inside a timing block, a user who
    pasted only the block).  A run of them directly followed by a release line is that task's (the block is
    printed just before its task's release); a run holding a timing or n_ctx_train cap line that no release
    follows is a request of its own, as in era 1: slot 0, the run's first line number as its task."""
    nan = np.flatnonzero(np.isnan(la.slot))
    if not len(nan) or not np.isin(la.kinds[nan], takers).any():
        return  # every line that takes its ids from another has them (the common case)
    prompt = np.isin(la.kinds, list(fmt.with_role("timing_prompt")))
    total = np.isin(la.kinds, list(fmt.with_role("timing_total")))
    ending = np.isin(la.kinds, list(fmt.with_role("timing_prompt", "timing_eval", "timing_total", "ctx_train_cap")))
    release = np.isin(la.kinds, list(fmt.with_role("release"))) & ~np.isnan(la.slot) & ~np.isnan(la.task)
    synth = np.isin(la.kinds, list(fmt.with_role("synth_start")))
    taker = np.isin(la.kinds, takers)
    for idx in _groups(keys, la.inst):
        o = taker[idx] & np.isnan(la.slot[idx])
        if not o.any():
            continue
        # a block begins at its prompt line, or after the line before it ended one (its total)
        begins = o & (~np.concatenate([[False], o[:-1]]) | prompt[idx] | np.concatenate([[False], total[idx][:-1]]))
        pos = np.flatnonzero(o)
        block = np.cumsum(begins)[pos] - 1  # the run each orphan row is in, from 0
        first = pos[np.flatnonzero(begins[pos])]
        last = pos[np.concatenate([np.flatnonzero(np.diff(block)), [len(pos) - 1]])]
        nxt = np.minimum(last + 1, len(idx) - 1)
        followed = (last + 1 < len(idx)) & release[idx[nxt]]
        holds = np.add.reduceat(ending[idx[pos]].astype(np.int64), np.flatnonzero(begins[pos])) > 0
        rows = idx[pos]
        to_release = followed[block]
        la.slot[rows[to_release]] = la.slot[idx[nxt[block[to_release]]]]
        la.task[rows[to_release]] = la.task[idx[nxt[block[to_release]]]]
        own = ~followed[block] & holds[block]
        la.slot[rows[own]] = 0
        la.task[rows[own]] = la.line[idx[first[block[own]]]]
        # a run that ends nothing, whose next request line opens a request of its own (a timing block with no
        # header, era 1 and koboldcpp), is that request's: its progress lines, printed before its timings
        at = np.where(~np.isnan(la.slot[idx]), np.arange(len(idx)), len(idx))
        nxt_req = np.minimum.accumulate(at[::-1])[::-1]
        ahead = nxt_req[np.minimum(last + 1, len(idx) - 1)]
        joins = ~followed & ~holds & (last + 1 < len(idx)) & (ahead < len(idx))
        joins &= synth[idx[np.minimum(ahead, len(idx) - 1)]]
        to_open = joins[block]
        la.slot[rows[to_open]] = la.slot[idx[ahead[block[to_open]]]]
        la.task[rows[to_open]] = la.task[idx[ahead[block[to_open]]]]


def _tie_slot_task_errors(la: _LineArrays, ev: pl.DataFrame, fmt: Format) -> None:
    """Where requests are keyed by their own id and carry no slot (llama-box's rid), an error that names a slot's
    task (``send_error: task 40 | ...``), which no line of the text otherwise names, belongs to the request in
    flight when exactly one is."""
    starts = np.isin(la.kinds, list(fmt.with_role("start"))) & np.isnan(la.slot) & ~np.isnan(la.task)
    if not starts.any():
        return
    ends = np.isin(la.kinds, list(fmt.with_role("release"))) & np.isnan(la.slot) & ~np.isnan(la.task)
    err = np.isin(la.kinds, list(fmt.with_role("error"))) & np.isnan(la.slot) & ~np.isnan(la.task)
    for idx in _groups(ev["ikey"].to_numpy(), la.inst):
        named = set(la.task[idx][~err[idx]].tolist())
        for j in np.flatnonzero(err[idx]):  # requests keyed by id are rare, their errors rarer
            if la.task[idx[j]] in named:
                continue
            before = idx[:j]
            open_ = set(la.task[before][starts[before]].tolist()) - set(la.task[before][ends[before]].tolist())
            if len(open_) == 1:
                la.task[idx[j]] = open_.pop()


def _tie_untagged_errors(la: _LineArrays, ev: pl.DataFrame, fmt: Format) -> None:
    """An error line that names no task (``got exception: {...500...}``), printed after a task's release or
    cancel and before any other task starts or ends, with the next HTTP line a failure (status >= 400), is that
    task's: nothing else can have failed (a tool-call parse failure after a normal release)."""
    err = np.isin(la.kinds, list(fmt.with_role("error"))) & np.isnan(la.task)
    end = np.isin(la.kinds, list(fmt.with_role("release", "cancel"))) & ~np.isnan(la.task)
    begin = np.isin(la.kinds, list(fmt.with_role("start")))
    http = np.isin(la.kinds, list(fmt.with_role("http")))
    status = ev["status"].cast(pl.Float64).fill_null(np.nan).to_numpy() if "status" in ev.columns else None
    if status is None or not http.any():
        return
    for idx in _groups(ev["ikey"].to_numpy(), la.inst):
        mark = end[idx] | begin[idx] | http[idx]
        if not (err[idx].any() and mark.any()):
            continue
        at = np.where(mark, np.arange(len(idx)), -1)
        prev = np.maximum.accumulate(at)  # the latest marker at or before each row
        nxt = np.where(mark, np.arange(len(idx)), len(idx))[::-1]
        nxt = np.minimum.accumulate(nxt)[::-1]  # the next marker at or after each row
        e = np.flatnonzero(err[idx])
        p, q = prev[e], nxt[e]
        ok = (p >= 0) & (q < len(idx))
        e, p, q = e[ok], p[ok], q[ok]
        tie = end[idx[p]] & http[idx[q]] & (status[idx[q]] >= 400)
        la.task[idx[e[tie]]] = la.task[idx[p[tie]]]


def _line_arrays(ev: pl.DataFrame) -> _LineArrays:
    return _LineArrays(
        kinds=ev["kind"].to_numpy(),
        slot=ev["slot"].cast(pl.Float64).fill_null(np.nan).to_numpy().copy(),
        task=ev["task"].cast(pl.Float64).fill_null(np.nan).to_numpy().copy(),
        line=ev["line_no"].to_numpy(),
        inst=ev["instance_no"].to_numpy() if "instance_no" in ev.columns else np.zeros(ev.height, dtype=np.int64),
    )


def _inherit_task_of_slot(la: _LineArrays, idx: np.ndarray, st: KeyState, header: str, takers: list[str]) -> None:
    """A taker with a slot but no task gets the task of the latest ``header`` line on that slot."""
    kinds, slot, task, line = la.kinds, la.slot, la.task, la.line
    is_hdr = kinds[idx] == header
    # loop over the rows that want a task or set one only
    wants = np.isin(kinds[idx], takers) & ~np.isnan(slot[idx]) & np.isnan(task[idx])
    full_hdr = is_hdr & ~np.isnan(slot[idx]) & ~np.isnan(task[idx])
    if wants.any():
        for j in idx[wants | full_hdr]:
            if kinds[j] == header and not np.isnan(slot[j]) and not np.isnan(task[j]):
                st.slot_task[str(int(slot[j]))] = int(task[j])
            elif kinds[j] in takers and not np.isnan(slot[j]) and np.isnan(task[j]):
                # a slot whose start line the log does not have (cut above): its line number is the
                # task, a join key only (as in era 1)
                task[j] = st.slot_task.setdefault(str(int(slot[j])), int(line[j]))
    elif full_hdr.any():  # nothing to fill here, but a later chunk's lines may need these slots' tasks
        hs, ht = slot[idx][full_hdr][::-1], task[idx][full_hdr][::-1]
        _, first = np.unique(hs, return_index=True)  # first in reverse: each slot's latest header
        for i in first:
            st.slot_task[str(int(hs[i]))] = int(ht[i])


def _inherit_latest_header(la: _LineArrays, idx: np.ndarray, st: KeyState, header: str, takers: list[str]) -> None:
    """A taker without a slot gets slot and task of the latest ``header`` line (carried over chunks in ``st``)."""
    kinds, slot, task = la.kinds, la.slot, la.task
    is_hdr = kinds[idx] == header
    hs = np.where(is_hdr, slot[idx], np.nan)
    ht = np.where(is_hdr, task[idx], np.nan)
    prev = st.hdr.get(header, [np.nan, np.nan])
    hs = np.concatenate([[prev[0]], hs])
    ht = np.concatenate([[prev[1]], ht])
    hs, ht = pd_ffill(hs)[1:], pd_ffill(ht)[1:]
    n = np.isin(kinds[idx], takers) & np.isnan(slot[idx])
    slot[idx[n]] = hs[n]
    task[idx[n]] = ht[n]
    if len(hs) and not np.isnan(hs[-1]) and not np.isnan(ht[-1]):
        st.hdr[header] = [int(hs[-1]), int(ht[-1])]


def _inherit_next_header(la: _LineArrays, idx: np.ndarray, header: str, takers: list[str]) -> None:
    """A taker without a slot gets slot and task of the next ``header`` line of the same instance."""
    kinds, slot, task, inst = la.kinds, la.slot, la.task, la.inst
    for inst_no in np.unique(inst[idx]):
        sub = idx[inst[idx] == inst_no]
        is_hdr = kinds[sub] == header
        hs = np.where(is_hdr, slot[sub], np.nan)[::-1]
        ht = np.where(is_hdr, task[sub], np.nan)[::-1]
        hs, ht = pd_ffill(hs)[::-1], pd_ffill(ht)[::-1]
        n = np.isin(kinds[sub], takers) & np.isnan(slot[sub])
        slot[sub[n]] = hs[n]
        task[sub[n]] = ht[n]


def waiting_tail(ev: pl.DataFrame, fmt: Format, state: AssembleState, limit: int = 5000) -> int | None:
    """Where the lines start that take their slot from a line not read yet, or None.

    ``inherit_next`` lines (era-2 ``print_timings``) take slot and task from the next line of their header
    kind; those after the last header of a batch have to wait for the next batch, unless an earlier line
    gives them their slot (their ``inherit`` header: era 1's timing block opener).  A tail longer than
    ``limit`` rows is not held back (a log that never writes the header would otherwise be held whole).
    """
    next_inh = {k.name: k.inherit_next for k in fmt.kinds if k.inherit_next}
    if not next_inh or ev.height == 0:
        return None
    kinds = ev["kind"]
    headers = kinds.is_in(list(set(next_inh.values()))).to_numpy()
    after = np.flatnonzero(headers)[-1] + 1 if headers.any() else 0
    slot = ev["slot"].is_null().to_numpy() if "slot" in ev.columns else np.ones(ev.height, dtype=bool)
    waiting = kinds.is_in(list(next_inh)).to_numpy() & slot
    for k in fmt.kinds:
        if k.inherit_next and k.inherit:
            earlier = np.cumsum((kinds == k.inherit).to_numpy()) > 0
            if any(k.inherit in st.hdr for st in state.keys.values()):
                earlier[:] = True
            waiting &= ~((kinds == k.name).to_numpy() & earlier)
    takers = np.flatnonzero(waiting)
    takers = takers[takers >= after]
    if len(takers) == 0 or ev.height - takers[0] > limit:
        return None
    return int(takers[0])


def _col(ev: pl.DataFrame, name: str, dtype: pl.DataType | type[pl.DataType]) -> pl.Expr:
    return pl.col(name) if name in ev.columns else pl.lit(None, dtype=dtype).alias(name)


def _first(kind: str | tuple[str, ...], col: str) -> pl.Expr:
    kinds = (kind,) if isinstance(kind, str) else kind
    return pl.col(col).filter(pl.col("kind").is_in(kinds)).drop_nulls().first()


# The event columns a chunk's requests are aggregated from (absent ones are added as nulls).
REQUEST_FIELDS: dict[str, pl.DataType | type[pl.DataType]] = {
    "slot": pl.Int64, "task": pl.Int64, "elapsed_s": pl.Float64, "abs_time": pl.Datetime("us", "UTC"),
    "prompt_tokens": pl.Int64, "p0": pl.Int64, "n_ctx_slot": pl.Int64, "ms": pl.Float64,
    "tokens": pl.Int64, "n_past": pl.Int64, "truncated": pl.Boolean, "n_predict": pl.Int64,
    "error": pl.String, "stop_type": pl.String, "gen_tokens": pl.Int64, "status": pl.Int64,
    "method": pl.String, "http_path": pl.String, "truncated_prompt_tokens": pl.Int64, "cached_tokens": pl.Int64,
    "n_ctx_train": pl.Int64, "prompt_eval_tokens": pl.Int64, "n_tokens_in_cache": pl.Int64,
    "prompt_ms": pl.Float64, "gen_ms": pl.Float64}


def partial_requests(ev: pl.DataFrame, fmt: Format) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Aggregate one chunk's events into partial request rows, and pick out its HTTP lines."""
    if ev.height == 0:
        return pl.DataFrame(), pl.DataFrame()
    ev = ev.with_columns([_col(ev, k, t).cast(t) for k, t in REQUEST_FIELDS.items()])
    role = Roles(fmt)
    http = ev.filter(pl.col("kind").is_in(role("http"))).select(
        "ikey", "instance_no", "line_no", "method", "http_path", "status", "elapsed_s", "abs_time")
    req = ev.filter(pl.col("task").is_not_null() & (pl.col("task") >= 0) & ~pl.col("kind").is_in(role("http")))
    if req.height == 0:
        return pl.DataFrame(), http
    # Task-only lines (errors, cancels) have no slot yet: key them by task, slot filled at the end.
    return _aggregate_requests(_mask_fields(req, role)), http


def _mask_fields(req: pl.DataFrame, role: Roles) -> pl.DataFrame:
    """Each field masked to the kinds of line that carry it (``_``-prefixed columns), so that a plain min/max
    per request reduces it (one value per request in practice): much cheaper than a filtered aggregation per
    group."""
    k = pl.col("kind")

    def only(kinds: tuple[str, ...], col: str | pl.Expr) -> pl.Expr:
        return pl.when(k.is_in(kinds)).then(pl.col(col) if isinstance(col, str) else col)

    general = role("general")  # the general rule's lines (general.toml): a line stating a generation time ended
    ended = k.is_in(general) & pl.col("gen_ms").is_not_null()
    return req.with_columns(
        only((*role("start"), *general), "line_no").alias("_start"),
        # where the request ended, for its HTTP line: its release, its timing block (printed once it ended; era 1
        # runs one request at a time, so its HTTP line may sit inside the block), a cancel or an error
        pl.coalesce(only((*role("release", "synth_start", "cancel", "error"), *role.block_end()), "line_no"),
                    pl.when(ended).then(pl.col("line_no"))).alias("_close"),
        only(role("prompt", "error", "ctx_train_cap", "general"), "prompt_tokens").alias("_pt"),
        only(role("prompt_alt"), "prompt_tokens").alias("_pt_alt"),
        only(role("kv_trim"), "p0").alias("_p0"),
        pl.col("n_ctx_slot").alias("_nctx"),  # every line that states it states the slot's context
        only(role("truncate"), "truncated_prompt_tokens").alias("_tpt"),
        pl.col("cached_tokens").alias("_cached"),  # every line that states it states the cache hit
        pl.coalesce(only(role("timing_prompt"), "ms"), only(general, "prompt_ms")).alias("_pms"),
        only(role("timing_prompt"), "tokens").alias("_ptok"),
        pl.col("prompt_eval_tokens").alias("_peval"),
        pl.coalesce(only(role("timing_eval"), "ms"), only(general, "gen_ms")).alias("_gms"),
        only(role("timing_eval"), "tokens").alias("_gtok"),
        only(role("timing_total"), "ms").alias("_tms"),
        # the tokens in the slot at release: n_past / n_tokens, era 2's `released (N tokens in cache)`
        only(role("release"), pl.coalesce("n_past", "n_tokens_in_cache")).alias("_npast"),
        only(role("release"), "truncated").cast(pl.Int8).alias("_trunc"),
        only(role("release"), "status").alias("_status"),  # a release that states its HTTP status (llama-box)
        only(role("error"), "error").alias("_err"),
        pl.col("gen_tokens").alias("_gprog"),  # a count so far or at the end: the largest is the latest
        k.is_in(role("context_shift")).alias("_shift"),
        k.is_in(role("cancel")).alias("_cancel"),
        k.is_in(role("ctx_train_cap")).alias("_cap"),
        k.is_in(role("release")).alias("_rel"),
        (k.is_in(role.block_end()) | ended).alias("_tim"),
        k.is_in(general).alias("_general"),
        k.is_in(role("synth_start")).alias("_synth"),
    )


def _aggregate_requests(req: pl.DataFrame) -> pl.DataFrame:
    """One partial row per (instance, slot, task) of the chunk from its masked lines."""
    return req.group_by(["ikey", "instance_no", "slot", "task"]).agg(
        pl.col("line_no").min().alias("line_first"),
        pl.col("line_no").max().alias("line_last"),
        pl.col("_start").min().alias("start_line"),
        pl.col("_close").min().alias("close_line"),
        pl.col("elapsed_s").min().alias("elapsed_start_s"),  # the clock only moves forward within a process
        pl.col("elapsed_s").max().alias("elapsed_end_s"),
        pl.col("abs_time").min().alias("t_start"),
        pl.col("abs_time").max().alias("t_end"),
        pl.col("_pt").max().alias("prompt_tokens"),
        pl.col("_pt_alt").max().alias("prompt_tokens_alt"),
        pl.col("_p0").min().alias("p0"),  # the first trim is the cached prefix; later ones are prompt chunks
        pl.col("_nctx").max().alias("n_ctx_slot"),
        pl.col("_tpt").max().alias("truncated_prompt_tokens"),
        pl.col("_cached").max().alias("cached_explicit"),
        pl.col("_pms").max().alias("prompt_ms"),
        pl.coalesce(pl.col("_ptok").max(), pl.col("_peval").max()).alias("prompt_eval_tokens"),
        pl.col("_gms").max().alias("gen_ms"),
        pl.col("_gtok").max().alias("gen_tokens"),
        pl.col("_tms").max().alias("total_ms"),
        pl.col("_npast").max().alias("n_past_end"),
        pl.col("_status").max().alias("own_status"),
        (pl.col("_trunc").max() > 0).alias("truncated"),
        pl.col("_shift").any().alias("context_shift"),
        pl.col("_cancel").any().alias("cancelled"),
        pl.col("_cap").any().alias("ctx_train_cap"),
        pl.col("n_predict").max().alias("n_predict"),
        pl.col("_err").drop_nulls().first().alias("error"),
        pl.col("stop_type").drop_nulls().last().alias("stop_type"),
        pl.col("_gprog").max().alias("gen_progress"),
        pl.col("_rel").any().alias("has_release"),
        pl.col("_tim").any().alias("has_timings"),
        pl.col("_synth").any().alias("synthetic"),
        pl.col("_general").any().alias("general_rule"),
    )


def merge_partials(parts: list[pl.DataFrame]) -> pl.DataFrame:
    parts = [p for p in parts if p.height]
    if not parts:
        return pl.DataFrame()
    df = pl.concat(parts, how="diagonal_relaxed").sort("line_first")
    keys = ["ikey", "instance_no", "slot", "task"]
    if df.select(pl.struct(keys).n_unique()).item() == df.height:
        return df
    aggs = []
    for c in df.columns:
        if c in keys:
            continue
        # the clock only moves forward within a process: a request's span is the min and max over its parts
        if c in {"line_first", "start_line", "close_line", "elapsed_start_s", "t_start"}:
            aggs.append(pl.col(c).min())
        elif c in {"line_last", "elapsed_end_s", "t_end", "gen_progress"}:
            aggs.append(pl.col(c).max())
        elif c in {"context_shift", "cancelled", "ctx_train_cap", "has_release", "has_timings", "synthetic",
                   "general_rule"}:
            aggs.append(pl.col(c).any())
        else:
            aggs.append(pl.col(c).drop_nulls().first())
    return df.group_by(keys, maintain_order=True).agg(aggs)


def match_http(req: pl.DataFrame, http: pl.DataFrame, close: pl.Expr | None = None) -> pl.DataFrame:
    """Tie each HTTP request line to the request that closed just before it (FIFO, per instance): adds
    ``http_status``, ``http_path`` and ``http_line`` (the line tied).

    ``close``: the line each request closed on (default: its close line, else its last line); requests where
    it is null take no HTTP line.

    Taken in line order per instance, a POST line goes to the earliest-closing request not yet tied, if that
    request closed at or before the line; otherwise it is tied to nothing.  With c_i the requests closed by
    the i-th line and m_i the lines tied so far, m_i = min(m_(i-1) + 1, c_i), which unrolls to
    m_i = i + min(0, min over j <= i of (c_j - j)): a cumulative minimum, so no loop runs per line.
    """
    req = req.with_columns(pl.lit(None, dtype=pl.Int64).alias("http_status"),
                           pl.lit(None, dtype=pl.String).alias("http_path"),
                           pl.lit(None, dtype=pl.Int64).alias("http_line"))
    if http.height == 0 or req.height == 0:
        return req
    http = http.filter(pl.col("method") == "POST").with_row_index("_hi")
    if http.height == 0:
        return req
    keys = ["ikey", "instance_no"]
    if close is None:
        close = pl.coalesce("close_line", "line_last")
    if "line_first" in req.columns:
        close = pl.lit(_in_flight_close(req, http, close))
    closes = (req.select(*keys, close.alias("_pos"))
              .with_row_index("_ri").filter(pl.col("_pos").is_not_null()).sort("_pos", "_ri")
              .with_columns(pl.int_range(1, pl.len() + 1, dtype=pl.Int64).over(keys).alias("_rank")))
    merged = pl.concat([
        closes.select(*keys, "_pos", pl.lit(0, dtype=pl.Int8).alias("_h"), pl.lit(None, dtype=pl.UInt32).alias("_hi")),
        http.select(*keys, pl.col("line_no").alias("_pos"), pl.lit(1, dtype=pl.Int8).alias("_h"), "_hi"),
    ], how="vertical_relaxed").sort(*keys, "_pos", "_h")  # a request closing on a line counts before it
    merged = merged.with_columns((1 - pl.col("_h").cast(pl.Int64)).cum_sum().over(keys).alias("_c"),
                                 pl.col("_h").cast(pl.Int64).cum_sum().over(keys).alias("_i"))
    lines = merged.filter(pl.col("_h") == 1)
    lines = lines.with_columns((pl.col("_c") - pl.col("_i")).cum_min().over(keys).alias("_d"))
    lines = lines.with_columns((pl.col("_i") + pl.min_horizontal(pl.col("_d"), pl.lit(0))).alias("_m"))
    lines = lines.with_columns(pl.col("_m").shift(1, fill_value=0).over(keys).alias("_prev"))
    tied = (lines.filter(pl.col("_m") > pl.col("_prev")).select(*keys, pl.col("_m").alias("_rank"), "_hi")
            .join(closes.select(*keys, "_rank", "_ri"), on=[*keys, "_rank"])
            .join(http.select("_hi", pl.col("status").cast(pl.Int64).alias("_st"), pl.col("http_path").alias("_hp"),
                              pl.col("line_no").cast(pl.Int64).alias("_hl")), on="_hi"))
    tied = tied.select("_ri", pl.col("_st").alias("http_status"), pl.col("_hp").cast(pl.String).alias("http_path"),
                       pl.col("_hl").alias("http_line"))
    return (req.drop("http_status", "http_path", "http_line").with_row_index("_ri")
            .join(tied, on="_ri", how="left", maintain_order="left").drop("_ri"))


def _in_flight_close(req: pl.DataFrame, http: pl.DataFrame, close: pl.Expr) -> pl.Series:
    """Each request's end for the FIFO rule: its close, or the first POST line printed while it was the only
    request of its instance in flight (begun at or before the line, not closed before it), if that comes first.
    A streamed response's line is written when the stream closes, which can be before the task's timings and
    release (even before its sampler is set up), with the status sent when the stream began; no other request
    can be answered then, and a request that closed earlier and still waits for its line still comes first in the
    queue.  Per instance, with the requests sorted by their first line: the requests in flight at a line are those
    begun by then less those closed before it, and when that is one, it is the one whose close is the largest of
    those begun (a running maximum): no pairing of lines with requests.  A slot's first request whose start the
    text does not show (an excerpt that begins inside it) was in flight when the text began."""
    keys = ["ikey", "instance_no"]
    began = pl.coalesce("start_line", "line_first")
    if "slot" in req.columns:
        first_on_slot = began.rank("ordinal").over([*keys, "slot"]) == 1
        began = pl.when(pl.col("start_line").is_null() & first_on_slot & pl.col("slot").is_not_null()).then(
            pl.lit(0, dtype=pl.Int64)).otherwise(began)
    spans = req.with_row_index("_ri").select(*keys, "_ri", began.alias("_from"), close.alias("_to"))
    eff = spans["_to"].cast(pl.Float64).fill_null(np.inf).to_numpy().copy()
    # (a failure status inside a task's span is the handler refusing some other request: --jinja missing, ...)
    posts = http.filter(pl.col("status").cast(pl.Int64) < 400).select(*keys, pl.col("line_no").cast(pl.Int64))
    lines_of = {k: g["line_no"].to_numpy() for k, g in posts.partition_by(keys, as_dict=True).items()}
    for key, sp in spans.filter(pl.col("_from").is_not_null()).partition_by(keys, as_dict=True).items():
        h = lines_of.get(key)
        if h is None or not len(h):
            continue
        sp = sp.sort("_from")
        f, t = sp["_from"].to_numpy(), sp["_to"].cast(pl.Float64).fill_null(np.inf).to_numpy()
        ri = sp["_ri"].to_numpy()
        top = np.maximum.accumulate(t)
        holder = np.maximum.accumulate(np.where(t == top, np.arange(len(t)), 0))  # who holds the running maximum
        begun = np.searchsorted(f, h, side="right")
        live = begun - np.searchsorted(np.sort(t), h, side="left")
        solo = (live == 1) & (begun > 0)
        who = ri[holder[begun[solo] - 1]]
        np.minimum.at(eff, who, h[solo].astype(np.float64))
    return pl.Series(eff).replace(np.inf, None).cast(pl.Int64)


def finish_requests(df: pl.DataFrame) -> pl.DataFrame:
    """Derived columns: prompt tokens, cache, stop reason, seq."""
    if df.height == 0:
        return df
    gen = pl.coalesce("gen_tokens", "gen_progress")
    df = df.with_columns(
        # an `input truncated` prompt is what the slot held and evaluated; the `new prompt` length before it
        # would count the dropped tokens as cached
        pl.coalesce(
            "truncated_prompt_tokens",
            "prompt_tokens",
            "prompt_tokens_alt",
            pl.col("cached_explicit") + pl.col("prompt_eval_tokens"),
            pl.col("p0") + pl.col("prompt_eval_tokens"),
            # n_past/n_tokens at release = prompt + gen - 1 unless a context shift dropped tokens; a truncated
            # release with no shift (context full, n_ctx_train cap) keeps every token, so it still holds
            pl.when(pl.col("n_past_end").is_not_null() & pl.col("gen_tokens").is_not_null() & pl.col("has_timings")
                    & ~pl.col("context_shift"))
            .then(pl.col("n_past_end") - pl.col("gen_tokens") + 1),
        ).alias("prompt_tokens"),
        gen.alias("gen_tokens"),
    )
    df = df.with_columns(
        pl.coalesce(
            "cached_explicit",
            pl.when(pl.col("prompt_tokens").is_not_null() & pl.col("prompt_eval_tokens").is_not_null())
            .then(pl.max_horizontal(pl.col("prompt_tokens") - pl.col("prompt_eval_tokens"), pl.lit(0))),
            "p0",
        ).alias("cached_tokens"),
        pl.when(pl.col("gen_ms") > 0).then(pl.col("gen_tokens") / pl.col("gen_ms") * 1000.0).alias("gen_tok_per_s"),
        # a request's end is logged by its release line or its timings (printed once it finished), or an error
        (pl.col("has_release") | pl.col("has_timings") | pl.col("error").is_not_null()).alias("complete"),
    )
    # reaching the slot's context stops generation only: a prompt that exactly fills the slot and generates
    # nothing (an embedding) ended normally
    generated = pl.coalesce("gen_tokens", pl.col("n_past_end") - pl.col("prompt_tokens")).fill_null(1) > 0
    at_ctx = (pl.col("n_ctx_slot").is_not_null() & pl.col("n_past_end").is_not_null()
              & (pl.col("n_past_end") >= pl.col("n_ctx_slot") - 1) & generated)
    stop = (
        pl.when(pl.col("error").is_not_null()).then(pl.lit("error"))
        .when(pl.col("cancelled")).then(pl.lit("cancelled"))
        .when(pl.col("stop_type").str.to_lowercase() == "eos").then(pl.lit("eos"))
        .when(pl.col("stop_type").str.to_lowercase().is_in(["limit", "time limit", "indentation limit"])).then(pl.lit("limit"))
        .when(pl.col("stop_type").str.to_lowercase() == "word").then(pl.lit("word"))
        .when(pl.col("stop_type").str.to_lowercase() == "context").then(pl.lit("context"))
        .when(pl.col("ctx_train_cap")).then(pl.lit("limit"))
        # the log does not show how a request ended that it does not show the end of
        .when(~pl.col("complete")).then(pl.lit("unknown"))
        # truncated = 1 also marks a prompt cut by `input truncated` (era 4): that is not generation reaching
        # the context, so it only counts with a context shift or a full slot
        .when((pl.col("truncated").fill_null(False) & pl.col("truncated_prompt_tokens").is_null())
              | pl.col("context_shift") | at_ctx | (pl.col("stop_type") == "context"))
        .then(pl.lit("context"))
        .when(pl.col("n_predict").is_not_null() & (pl.col("n_predict") > 0) & (pl.col("gen_tokens") >= pl.col("n_predict")))
        .then(pl.lit("limit"))
        .when(pl.col("http_status").fill_null(200) >= 400).then(pl.lit("error"))
        .when(pl.col("complete")).then(pl.lit("eos"))
        .otherwise(pl.lit("unknown"))
    )
    # era 2 releases carry no truncated flag: a context shift is the only sign
    df = df.with_columns(stop.alias("stop_reason"), pl.coalesce("truncated", "context_shift").fill_null(False)
                         .alias("truncated"), pl.col("truncated_prompt_tokens").is_not_null().alias("prompt_truncated"),
                         # which rule read it: a format's kinds, or the general rule for an unknown layout
                         pl.when(pl.col("general_rule").fill_null(False)).then(pl.lit("general"))
                         .otherwise(pl.lit("format")).alias("read_by"))
    df = df.sort("line_first").with_columns(
        pl.col("line_first").rank("ordinal").over(["ikey", "instance_no", "slot"]).cast(pl.Int64).alias("seq"))
    return df


def _syslog_times(val: pl.Series, reference: datetime, tz: str, reference_is_start: bool) -> pl.Series:
    """`Mon DD HH:MM:SS[.f]` (any locale's month name) in ``reference``'s year, moved a year where needed."""
    if len(val) == 0:
        return pl.Series([], dtype=pl.Datetime("us", "UTC"))
    month = syslog_month(val)
    rest = val.str.extract(r"^\S+\s+(\d{1,2} \d\d:\d\d:\d\d(?:\.\d+)?)", 1)
    text = pl.lit(str(reference.year)) + " " + month.cast(pl.String) + " " + rest
    dt = pl.select(text).to_series().str.to_datetime("%Y %m %d %H:%M:%S%.f", strict=False, time_unit="us") \
        .dt.replace_time_zone(tz, ambiguous="earliest", non_existent="null").dt.convert_time_zone("UTC")
    ref = pl.lit(reference).cast(pl.Datetime("us", "UTC"))
    day = pl.duration(days=1)
    moved = (pl.when(pl.lit(reference_is_start) & (pl.col("t") < ref - day)).then(pl.col("t").dt.offset_by("1y"))
             .when(~pl.lit(reference_is_start) & (pl.col("t") > ref + day)).then(pl.col("t").dt.offset_by("-1y"))
             .otherwise(pl.col("t")))
    return pl.DataFrame({"t": dt}).select(moved).to_series()


def epoch_to_dt(values: pl.Series) -> pl.Series:
    secs = values.cast(pl.Float64, strict=False)
    return (secs * 1_000_000).cast(pl.Int64, strict=False).cast(pl.Datetime("us")).dt.replace_time_zone("UTC")


# Month abbreviations of the locales journald and syslog print in (English, German, French, Spanish, Italian,
# Portuguese, Dutch, Swedish, Polish, Czech, ...): the first letters identify the month.
MONTHS = {
    1: ("jan", "ene", "gen", "sty", "led", "tam"), 2: ("feb", "fév", "fev", "lut", "úno", "hel"),
    3: ("mar", "mär", "mrz", "mrt", "bře", "maa"), 4: ("apr", "avr", "abr", "kwi", "dub", "huh"),
    5: ("may", "mai", "mag", "mei", "maj", "kvě", "tou"), 6: ("jun", "jui", "giu", "cze", "čvn", "kes"),
    7: ("jul", "juil", "lug", "lip", "čvc", "hei"), 8: ("aug", "aoû", "ago", "sie", "srp", "elo"),
    9: ("sep", "set", "wrz", "zář", "syy"), 10: ("oct", "okt", "ott", "out", "paź", "říj", "lok"),
    11: ("nov", "lis", "mrr"), 12: ("dec", "déc", "dez", "dic", "gru", "pro", "jou"),
}
_MONTH_PREFIXES = sorted(((pre, m) for m, pres in MONTHS.items() for pre in pres), key=lambda x: -len(x[0]))


def syslog_month(text: pl.Series) -> pl.Series:
    """The month number of a syslog/journald date's month name, in any of the common locales (null if unknown)."""
    name = text.str.extract(r"^([^\d\s.]+)", 1).str.to_lowercase()
    out = pl.Series([None] * len(text), dtype=pl.Int64)
    for pre, month in _MONTH_PREFIXES:
        out = out.fill_null(pl.select(pl.when(name.str.starts_with(pre)).then(pl.lit(month))).to_series())
    return out


def parse_abs_time(ev: pl.DataFrame, *, reference: datetime, tz: str = "UTC",
                   reference_is_start: bool = False) -> pl.DataFrame:
    """Build ``abs_time`` from whatever absolute time the lines carry (wrapper prefix, JSON epoch).

    Times written without a zone (syslog, ISO without offset) are read in ``tz`` (an IANA zone name); where the
    line's own record also states an epoch (``timestamp=``), the epoch wins: it names an instant, the stamp only
    a local time.  A syslog date has no year: it is the year of the times other lines of the chunk state (an
    epoch, a zoned ISO stamp) when there are any, else ``reference``'s (the file's modification time, or the
    server's start with ``reference_is_start``), one year less when that would put the line more than a day after
    the reference (a log that began in December), one year more when it would put it before the start.
    """
    own, ev = _record_times(ev)
    out = pl.Series("abs_time", [None] * ev.height, dtype=pl.Datetime("us", "UTC"))
    if "abs_raw" in ev.columns:
        raw = ev["abs_raw"]
        kind = raw.str.split_exact("|", 1).struct.field("field_0")
        val = raw.str.split_exact("|", 1).struct.field("field_1")
        iso = val.str.replace("][", "T", literal=True).str.replace(" ", "T").str.replace(",", ".").str.replace(
            r"Z$", "+00:00").str.replace(r" ?UTC$", "+00:00").str.replace(r"([+-]\d\d)(\d\d)$", "$1:$2")
        iso = iso.str.replace(r"(\.\d{6})\d+", "$1")
        zoned = iso.str.contains(r"[+-]\d\d:\d\d$")
        iso_z = iso.str.to_datetime("%Y-%m-%dT%H:%M:%S%.f%:z", strict=False, time_unit="us").dt.convert_time_zone("UTC")
        iso_n = iso.str.to_datetime("%Y-%m-%dT%H:%M:%S%.f", strict=False, time_unit="us") \
            .dt.replace_time_zone(tz, ambiguous="earliest", non_existent="null").dt.convert_time_zone("UTC")
        iso_dt = pl.select(pl.when(zoned).then(iso_z).otherwise(iso_n)).to_series()
        ep_dt = epoch_to_dt(val)
        stated = pl.concat([own, iso_z.filter(kind == "iso"), ep_dt.filter(kind == "epoch")]).drop_nulls()
        if len(stated):  # a year the text states beats the file's modification time
            reference, reference_is_start = cast(datetime, stated.max()), False  # a Datetime column
        sys_dt = _syslog_times(val.filter(kind == "syslog"), reference, tz, reference_is_start)
        sys_full = pl.Series([None] * ev.height, dtype=pl.Datetime("us", "UTC")).scatter(
            (kind == "syslog").arg_true(), sys_dt) if len(sys_dt) else pl.Series([None] * ev.height,
                                                                                  dtype=pl.Datetime("us", "UTC"))
        local = (kind == "syslog") | ((kind == "iso") & ~zoned)
        out = pl.select(
            pl.when(local & own.is_not_null()).then(own)
            .when(kind == "iso").then(iso_dt).when(kind == "syslog").then(sys_full).when(kind == "epoch").then(ep_dt)
        ).to_series().alias("abs_time")
    return ev.with_columns(out.fill_null(own).alias("abs_time"))


def _record_times(ev: pl.DataFrame) -> tuple[pl.Series, pl.DataFrame]:
    """The instant each line's own record states (a JSON or key=value epoch, a JSON-lines time), and the events
    with the elapsed clocks JSON lines carry filled in (``--log-jsonl``'s ``ts`` as M.SS.mmm.uuu, its ``time`` in
    microseconds since start)."""
    own = pl.Series("abs_time", [None] * ev.height, dtype=pl.Datetime("us", "UTC"))
    for col in ("epoch", "json_time"):
        if col in ev.columns:
            v = ev[col]
            num = v.cast(pl.Float64, strict=False)
            as_epoch = pl.select(pl.when(num > 1e14).then(num / 1e6).when(num > 1e11).then(num / 1e3)
                                 .when(num > 1e8).then(num)).to_series()
            iso_dt = v.str.replace(r"Z$", "+00:00").str.replace(r"(\.\d{6})\d+", "$1").str.to_datetime(
                "%Y-%m-%dT%H:%M:%S%.f%:z", strict=False, time_unit="us").dt.convert_time_zone("UTC")
            own = own.fill_null(epoch_to_dt(as_epoch)).fill_null(iso_dt)
            if col == "json_time":
                # `--log-jsonl` "ts" is the elapsed clock; the text format's own prefix group leaves an
                # all-null elapsed_s column behind, so fill rather than only create it
                el = v.str.extract(r"^(\d+\.\d{2}\.\d{3}\.\d{3})$")
                if el.is_not_null().any():
                    from parsers.engine import elapsed_seconds
                    secs = elapsed_seconds(el)
                    ev = ev.with_columns(pl.coalesce(pl.col("elapsed_s"), secs).alias("elapsed_s")
                                         if "elapsed_s" in ev.columns else secs)
    if "json_elapsed_us" in ev.columns:  # --log-jsonl's time: microseconds since the process started
        secs = (ev["json_elapsed_us"].cast(pl.Float64, strict=False) / 1e6).alias("elapsed_s")
        ev = ev.with_columns(pl.coalesce(pl.col("elapsed_s"), secs).alias("elapsed_s") if "elapsed_s" in ev.columns
                             else secs).drop("json_elapsed_us")
    return own, ev


HANDLER_ONLY_STATUS = (401, 403, 501, 503)  # answered by the HTTP handler, never by a slot (era 2 uses 404 for task errors)


class RequestBuilder:
    """Builds the requests of one file chunk by chunk, handing out each request once it is final.

    A request is final when a later task started on its slot, when its instance ended (restart), or at
    the end of the log (``finish``): never by distance, so a request of any length stays one row.  A
    final request that closed but has no HTTP line yet waits for one while its instance logs HTTP lines
    (the line is written after the response, so it can follow the next task's start), up to
    ``hold_lines`` lines; that bound only gives up on the HTTP status, it never splits a request.
    Only open requests and unmatched HTTP lines are kept between chunks, so memory does not grow with
    the file; the same state, saved in the store, lets an appended tail continue where parsing stopped.
    """

    def __init__(self, *, open_rows: pl.DataFrame | None = None, http: pl.DataFrame | None = None,
                 seq: dict[str, int] | None = None, http_last: dict[str, int] | None = None,
                 hold_lines: int = 5000) -> None:
        self.open = open_rows if open_rows is not None else pl.DataFrame()
        self.http = http if http is not None else pl.DataFrame()
        self.seq: dict[str, int] = dict(seq or {})
        self.http_last: dict[str, int] = dict(http_last or {})  # "ikey/instance" -> its latest POST line
        self.hold = hold_lines

    @staticmethod
    def _key(ikey: int, inst: int, slot: int) -> str:
        return f"{ikey}/{inst}/{slot}"

    def add(self, part: pl.DataFrame, http: pl.DataFrame, last_line: int) -> pl.DataFrame:
        rows = merge_partials([self.open, part])
        if http.height:
            self.http = pl.concat([self.http, http], how="diagonal_relaxed") if self.http.height else http
            posts = http.filter(pl.col("method") == "POST").group_by("ikey", "instance_no").agg(pl.col("line_no").max())
            for k, i, line in posts.iter_rows():
                self.http_last[f"{k}/{i}"] = max(int(line), self.http_last.get(f"{k}/{i}", 0))
        return self._emit(rows, last_line, final_all=False)

    def finish(self) -> pl.DataFrame:
        return self._emit(self.open, None, final_all=True)

    def peek(self) -> pl.DataFrame:
        """The requests still open, as rows, without closing them (the builder's state is unchanged)."""
        saved = (self.open, self.http, dict(self.seq), dict(self.http_last))
        try:
            return self.finish()
        finally:
            self.open, self.http, self.seq, self.http_last = saved

    def _emit(self, rows: pl.DataFrame, last_line: int | None, *, final_all: bool) -> pl.DataFrame:
        if rows.height == 0:
            self.open = rows
            if final_all:
                self.http = pl.DataFrame()
            return pl.DataFrame()
        slotted = rows.filter(pl.col("slot").is_not_null())
        loose = rows.filter(pl.col("slot").is_null())
        if loose.height:
            lookup = slotted.select("ikey", "instance_no", "task", pl.col("slot").alias("slot_found")).unique(
                ["ikey", "instance_no", "task"], keep="first")
            loose = loose.join(lookup, on=["ikey", "instance_no", "task"], how="left")
            found = loose.filter(pl.col("slot_found").is_not_null()).with_columns(
                pl.col("slot_found").alias("slot")).drop("slot_found")
            loose = loose.filter(pl.col("slot_found").is_null()).drop("slot_found")
            merged = merge_partials([slotted, found])
            slotted = merged if merged.width else slotted.head(0)
            # a request its log keys by its own id (llama-box's rid), opened by a start line with no slot
            own = loose.filter(pl.col("start_line").is_not_null())
            if own.height:
                slotted = pl.concat([slotted, own], how="diagonal_relaxed") if slotted.height else own
                loose = loose.filter(pl.col("start_line").is_null())
        # final: a later task started on the same slot, or a later instance on the same key (or the end); a request
        # with no slot once it closed (nothing of it follows its response line)
        began = pl.coalesce("start_line", "line_first")
        latest = slotted.group_by("ikey", "instance_no", "slot").agg(began.max().alias("_latest"))
        last_inst = slotted.group_by("ikey").agg(pl.col("instance_no").max().alias("_last_inst"))
        s = slotted.join(latest, on=["ikey", "instance_no", "slot"], how="left").join(last_inst, on="ikey", how="left")
        superseded = (pl.when(pl.col("slot").is_null()).then(pl.col("close_line").is_not_null())
                      .otherwise((began < pl.col("_latest")) | (pl.col("instance_no") < pl.col("_last_inst"))))
        s = s.with_columns((pl.lit(True) if final_all else superseded).alias("_final"), superseded.alias("_over"))
        s = s.drop("_latest", "_last_inst")
        # a request with no close line ended where its slot's next task began; one still running when the text
        # ends (or this chunk does) has not ended, so no HTTP line is its yet
        close = pl.coalesce("close_line", pl.when(pl.col("_over")).then(pl.col("line_last")))
        close = pl.when(pl.col("own_status").is_null()).then(close)  # a request that states its status takes no line
        matched = match_http(s.sort("line_first"), self._http_for_match(), close)
        matched = matched.with_columns(pl.coalesce("own_status", "http_status").alias("http_status"))
        if not final_all:
            matched = matched.with_columns((pl.col("_final") & ~self._awaits_http(close, last_line)).alias("_final"))
        final = matched.filter(pl.col("_final")).drop("_final", "_over")
        still = matched.filter(~pl.col("_final")).drop("_final", "_over", "http_status", "http_path", "http_line")
        self._consume_http(final, final_all, last_line)
        final = final.drop("http_line")
        if final_all:
            loose = loose.head(0)
        elif loose.height:  # errors with no slot (handler-level): kept a while in case the slot line is late
            loose = loose.filter(pl.col("line_first") >= (last_line or 0) - self.hold)
        self.open = pl.concat([still, loose], how="diagonal_relaxed") if loose.height else still
        if final.height == 0:
            return final
        done = finish_requests(final)
        counts = done.filter(pl.col("slot").is_not_null()).group_by("ikey", "instance_no", "slot").agg(pl.len().alias("_n"))
        if self.seq:
            keys = [k.split("/") for k in self.seq]
            prior = pl.DataFrame({"ikey": [int(k[0]) for k in keys], "instance_no": [int(k[1]) for k in keys],
                                  "slot": [int(k[2]) for k in keys], "_off": list(self.seq.values())},
                                 schema={"ikey": pl.Int64, "instance_no": pl.Int64, "slot": pl.Int64, "_off": pl.Int64})
            done = done.join(prior, on=["ikey", "instance_no", "slot"], how="left", maintain_order="left") \
                .with_columns((pl.col("seq") + pl.col("_off").fill_null(0)).alias("seq")).drop("_off")
        for k, i, sl, n in counts.iter_rows():
            key = self._key(k, i, sl)
            self.seq[key] = self.seq.get(key, 0) + int(n)
        return done

    def _awaits_http(self, close: pl.Expr, last_line: int | None) -> pl.Expr:
        """Closed, no HTTP line tied yet, in an instance that logs HTTP lines; given up after ``hold_lines``.

        A POST line printed after its close does not mean it has none: FIFO never skips a closed request, so
        such a line went to one that ranks before it (closed earlier, or whose in-flight close is earlier),
        which may still be open, and the request's own line is still to come."""
        if not self.http_last:
            return pl.lit(False)
        last = pl.DataFrame({"_k": list(self.http_last), "_h": list(self.http_last.values())},
                            schema={"_k": pl.String, "_h": pl.Int64})
        key = pl.col("ikey").cast(pl.String) + "/" + pl.col("instance_no").cast(pl.String)
        seen = key.replace_strict(last["_k"], last["_h"], default=None)
        return (close.is_not_null() & pl.col("http_status").is_null() & seen.is_not_null()
                & (close >= (last_line or 0) - self.hold))

    def _http_for_match(self) -> pl.DataFrame:
        if self.http.height == 0:
            return self.http
        return self.http.filter(~pl.col("status").is_in(HANDLER_ONLY_STATUS))

    def _consume_http(self, final: pl.DataFrame, final_all: bool, last_line: int | None) -> None:
        """Drop the HTTP lines tied to final requests, and old ones tied to nothing.

        A line tied to nothing (its request was rejected before any slot took it, or it is a GET) stays
        until it is old: it must not take the place of a tied one.
        """
        if self.http.height == 0:
            return
        if final_all:
            self.http = pl.DataFrame()
            return
        used = final["http_line"].drop_nulls()
        if len(used):
            self.http = self.http.filter(~pl.col("line_no").is_in(used.implode()))
        if last_line is not None:
            self.http = self.http.filter(pl.col("line_no") >= last_line - self.hold)
