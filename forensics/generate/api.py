"""``generate``: simulate a scenario and write its server logs, replay records and ground truth.

Layout under ``out_dir``::

    logs/<run_id>/<server>.log       a server launched for one run (its folder names the run)
    logs/<server>.log                a server shared by several runs
    logs/<run_id>/manifest.json      run manifest (canonical replay record layout)
    logs/<run_id>/attempts.jsonl     one line per HTTP request the harness made
    truth/requests.jsonl             ground truth: one line per request a slot served
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, BinaryIO

import polars as pl
import regex

from forensics.errors import InputError
from forensics.generate import writers as W
from forensics.generate.model import Scenario
from forensics.generate.simulate import SimResult, Simulator

TRUTH_COLUMNS = [
    "run", "instance", "path", "slot", "task", "seq", "item", "stage", "attempt", "prompt_tokens", "prompt_eval_tokens",
    "cached_tokens", "gen_tokens", "prompt_ms", "gen_ms", "total_ms", "n_past_end", "n_ctx_slot", "stop_reason",
    "truncated", "context_shift", "http_status", "error", "complete", "elapsed_start_s", "elapsed_end_s", "t_start",
    "t_end", "runaway", "dead_slot", "context_error", "http_error", "cancelled", "timeout", "killed", "parse_error",
]


@dataclass
class GeneratedRun:
    out_dir: Path
    logs: list[Path]
    manifests: list[Path]
    attempts: list[Path]
    truth_path: Path
    truth: pl.DataFrame  # first block only in size mode (the file holds everything)
    requests: int
    bytes_written: int
    fmt: str
    wrapper: str
    extra: dict[str, Any] = field(default_factory=dict)


def parse_size(text: str) -> int:
    m = regex.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?\s*", text.upper())
    if not m:
        raise InputError(f"cannot read size {text!r}", hint="write e.g. 50MB, 1GB or 1.5G")
    mult = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}[m.group(2)]
    return int(float(m.group(1)) * mult)


def _layout(sc: Scenario, tiling: bool) -> dict[str, str]:
    users: dict[str, list[str]] = {}
    for run in sc.runs:
        for s in run.servers:
            users.setdefault(s, []).append(run.run_id)
    return {s.name: (f"{users[s.name][0]}/{s.name}.log" if len(users.get(s.name, [])) == 1 and not tiling else f"{s.name}.log")
            for s in sc.servers}


def _request_frame(sim: SimResult, sc: Scenario, paths: dict[str, str], era: W.Era) -> pl.DataFrame:
    recs = []
    for r in sim.requests:
        srv = sim.servers[r.server]
        l0 = srv.launch_us
        t_launch, t_pdone, t_end = r.times()
        cancel_t = r.cancel_t
        timed = r.cancel_kind is None and r.error_kind is None
        recs.append({
            "server": r.server, "run": r.run, "item": r.item, "stage": r.stage, "attempt": r.attempt,
            "slot": r.slot, "task": r.task, "seq": r.seq, "t_launch": t_launch - l0, "t_pdone": t_pdone - l0,
            "t_end": t_end - l0, "cancel_t": None if cancel_t is None else cancel_t - l0,
            "t_gend": (cancel_t if cancel_t is not None else t_end) - l0,
            "t_resp": t_end - l0 + 700, "prompt": r.prompt, "prompt_logged": r.prompt_logged, "cached": r.cached,
            "eval": r.prompt_logged - r.cached, "gen": r.gen, "stop_reason": r.stop_reason, "truncated": r.truncated,
            "n_past_end": r.n_past_end, "prev_n_past": r.prev_n_past,
            "t_last_prev": -1 if r.t_last_prev < 0 else r.t_last_prev - l0, "idle_after": r.idle_after,
            "graphs_reused": r.graphs_reused, "error_kind": r.error_kind, "error": r.error,
            "http_status": r.http_status, "n_ctx_slot": srv.spec.n_ctx_slot, "n_ctx_train": srv.spec.n_ctx_train,
            "input_truncated": r.input_truncated, "ctx_train_limited": r.ctx_train_limited,
            "shift_j": [s[0] for s in r.shifts], "shift_left": [s[1] for s in r.shifts],
            "shift_disc": [s[2] for s in r.shifts], "n_shifts": len(r.shifts), "timed": timed,
            "timed_prompt": r.error_kind != "context" and r.t_pdone is not None and r.prompt_logged - r.cached > 0,
            "runaway": r.runaway, "dead_slot": r.dead_mode is not None, "context_error": r.context_error,
            "cancel_kind": r.cancel_kind, "parse_error": r.parse_error, "path": paths[r.server],
        })
    schema: dict[str, pl.DataType | type[pl.DataType]] = {"shift_j": pl.List(pl.Int64), "shift_left": pl.List(pl.Int64), "shift_disc": pl.List(pl.Int64),
              "cancel_t": pl.Int64, "error_kind": pl.String, "error": pl.String, "http_status": pl.Int64,
              "cancel_kind": pl.String}
    df = pl.DataFrame(recs, schema_overrides=schema, infer_schema_length=None)
    if df.is_empty():
        return df
    df = df.with_columns(pl.col("http_status").fill_null(200), pl.col("error_kind").fill_null(""))
    return df.sort(["server", "t_launch", "slot"]).with_columns(pl.int_range(pl.len()).over("server").alias("ridx"),
                                                               pl.lit(era.http_path).alias("http_path"))


def _truth(df: pl.DataFrame, sc: Scenario) -> pl.DataFrame:
    launch = {s.name: sc.started_at + timedelta(seconds=s.launch_s) for s in sc.servers}
    C = pl.col
    pc = (C("t_pdone") - C("t_launch")) // 10
    gc = (C("t_gend") - C("t_pdone")) // 10
    l0 = C("server").replace_strict({k: v for k, v in launch.items()}, return_dtype=pl.Datetime("us", "UTC"))
    return df.select(
        C("run"), C("server").alias("instance"), C("path"), C("slot"), C("task"), C("seq"), C("item"), C("stage"),
        C("attempt"), C("prompt").alias("prompt_tokens"),  # as requested (the new prompt line), before truncation
        pl.when(C("error_kind") == "context").then(None).otherwise(C("eval")).alias("prompt_eval_tokens"),
        pl.when(C("error_kind") == "context").then(None).otherwise(C("cached")).alias("cached_tokens"),
        C("gen").alias("gen_tokens"),
        pl.when(C("timed")).then((pc / 100).round(2)).alias("prompt_ms"),
        pl.when(C("timed")).then((gc / 100).round(2)).alias("gen_ms"),
        pl.when(C("timed")).then(((pc + gc) / 100).round(2)).alias("total_ms"), C("n_past_end"), C("n_ctx_slot"),
        C("stop_reason"), C("truncated"), (C("n_shifts") > 0).alias("context_shift"), C("http_status"), C("error"),
        pl.lit(True).alias("complete"), (C("t_launch") / 1e6).alias("elapsed_start_s"),
        (C("t_end") / 1e6).alias("elapsed_end_s"),
        (l0 + pl.duration(microseconds=C("t_launch"))).alias("t_start"),
        (l0 + pl.duration(microseconds=C("t_end"))).alias("t_end"),
        C("runaway"), C("dead_slot"), C("context_error"), (C("http_status") >= 500).alias("http_error"),
        C("cancel_kind").is_not_null().alias("cancelled"),
        (C("cancel_kind") == "timeout").fill_null(False).alias("timeout"),
        (C("cancel_kind") == "killed").fill_null(False).alias("killed"), C("parse_error"),
    )


def _iso(sc: Scenario, t_us: int | None) -> str | None:
    if t_us is None:
        return None
    return (sc.started_at + timedelta(microseconds=t_us)).isoformat(timespec="microseconds")


def _write_records(sim: SimResult, sc: Scenario, logs_dir: Path, paths: dict[str, str], run_suffix: str,
                   t_shift: int) -> tuple[list[Path], list[Path]]:
    manifests, attempt_files = [], []
    by_run: dict[str, list[dict[str, Any]]] = {}
    for a in sim.attempts:
        by_run.setdefault(a["run_id"], []).append(a)
    for info in sim.runs:
        run = info["run"]
        rid = run.run_id + run_suffix
        d = logs_dir / rid
        d.mkdir(parents=True, exist_ok=True)
        servers = []
        for name in run.servers:
            spec = sc.server(name)
            rel = os.path.relpath(logs_dir / paths[name], d)
            servers.append({"name": name, "host": spec.host, "port": spec.port, "log_file": Path(rel).as_posix(),
                            "launched_at": _iso(sc, int(spec.launch_s * 1e6))})
        manifest = {
            "run_id": rid, "started_at": _iso(sc, info["t_start"] + t_shift), "ended_at": _iso(sc, info["t_end"] + t_shift),
            "concurrency": run.concurrency, "model": Path(sc.server(run.servers[0]).model).stem, "servers": servers,
            "items": list(run.items), "stages": list(run.stages),
            "budgets": {"max_request_s": run.timeout_s, **({"max_run_s": run.faults.watchdog_s} if run.faults.watchdog_s else {})},
            "config": {"max_tokens": run.max_tokens, "max_attempts": run.max_attempts, "np": sc.server(run.servers[0]).np,
                       **run.config},
            "ended": {"how": info["ended_how"], "detail": info["ended_detail"], "after_s": round(info["after_s"], 3)},
        }
        mp = d / "manifest.json"
        mp.write_text(json.dumps(manifest, indent=2) + "\n")
        manifests.append(mp)
        lines = []
        for a in by_run.get(run.run_id, []):
            rec = {"run_id": rid, "item": a["item"], "stage": a["stage"], "attempt": a["attempt"], "server": a["server"],
                   "started_at": _iso(sc, a["t_send"] + t_shift), "ended_at": _iso(sc, a["t_end"] + t_shift),
                   "http_status": a["http_status"], "error": a["error"], "outcome": a["outcome"],
                   "id_slot": a["id_slot"], "tokens_evaluated": a["tokens_evaluated"],
                   "tokens_predicted": a["tokens_predicted"], "stop_type": a["stop_type"], "truncated": a["truncated"],
                   "timings": None if a["prompt_n"] is None else {
                       "prompt_n": a["prompt_n"], "prompt_ms": round(a["prompt_ms"], 3),
                       "predicted_n": a["predicted_n"], "predicted_ms": round(a["predicted_ms"], 3)},
                   "output_chars": a["output_chars"], "max_tokens": a["max_tokens"]}
            lines.append(json.dumps(rec))
        ap = d / "attempts.jsonl"
        ap.write_text("\n".join(lines) + ("\n" if lines else ""))
        attempt_files.append(ap)
    return manifests, attempt_files


def _server_info(spec: Any) -> dict[str, object]:
    return {"host": spec.host, "port": spec.port, "np": spec.np, "n_ctx_slot": spec.n_ctx_slot, "model": spec.model,
            "n_ctx": spec.total_ctx, "n_ctx_train": spec.n_ctx_train}


@dataclass(frozen=True)
class Repeat:
    """Repeat the scenario's runs (shifted in time, renamed ``<run>-NNNN``) until at least ``requests`` slot
    requests or ``size`` log bytes are written.  ``first_tile`` > 0 writes the continuation of such a repeated
    log (no startup banner): its bytes appended to the log written with the same seed show the server kept
    running (used to benchmark appended tails)."""
    requests: int | None = None
    size: int | str | None = None
    first_tile: int = 0

    @property
    def tiling(self) -> bool:
        return self.requests is not None or self.size is not None

    @property
    def size_bytes(self) -> int | None:
        return parse_size(self.size) if isinstance(self.size, str) else self.size


@dataclass
class _Tiling:
    """Tile ``j`` is the scenario again, ``j * span`` µs later, with tasks, sequences and graph counters moved on
    so the repeated log reads as one server that kept running."""
    on: bool
    span: int
    task_off: dict[str, int]
    graphs_off: dict[str, int]
    seq_off: pl.DataFrame

    def suffix(self, j: int) -> str:
        return f"-{j:04d}" if self.on else ""


def _tiling(sim: SimResult, df: pl.DataFrame, on: bool) -> _Tiling:
    span = (max((r["t_end"] for r in sim.runs), default=0) + 60_000_000) if on else 0
    seq_off = (df.group_by(["server", "slot"]).agg(pl.col("seq").max().alias("nseq")) if not df.is_empty()
               else pl.DataFrame(schema={"server": pl.String, "slot": pl.Int64, "nseq": pl.Int64}))
    return _Tiling(on=on, span=span, task_off={n: s.next_task + 100 for n, s in sim.servers.items()},
                   graphs_off={n: max(int(s.steps) - s.rebuilds, 0) for n, s in sim.servers.items()}, seq_off=seq_off)


def _shift(df: pl.DataFrame, i: int, tiling: _Tiling) -> pl.DataFrame:
    suffix = tiling.suffix(i)
    if i == 0:
        return df.with_columns(pl.col("run") + suffix) if suffix else df
    C = pl.col
    sh = i * tiling.span
    tcols = ["t_launch", "t_pdone", "t_end", "cancel_t", "t_gend", "t_resp"]
    out = df.join(tiling.seq_off, on=["server", "slot"], how="left").with_columns(
        *[(C(c) + sh) for c in tcols],
        pl.when(C("t_last_prev") >= 0).then(C("t_last_prev") + sh).otherwise(-1).alias("t_last_prev"),
        (C("task") + i * C("server").replace_strict(tiling.task_off, return_dtype=pl.Int64)).alias("task"),
        (C("seq") + i * C("nseq")).alias("seq"),
        (C("graphs_reused") + i * C("server").replace_strict(tiling.graphs_off, return_dtype=pl.Int64))
        .alias("graphs_reused"),
        (C("run") + suffix).alias("run"),
    ).drop("nseq")
    return out


def _era(fmt: str, wrapper: str) -> W.Era:
    if fmt not in W.ERAS:
        raise InputError(f"unknown log format {fmt!r}", hint=f"choose one of {', '.join(W.ERAS)}")
    if wrapper not in W.WRAPPERS:
        raise InputError(f"unknown wrapper {wrapper!r}", hint=f"choose one of {', '.join(W.WRAPPERS)}")
    era = W.ERAS[fmt]
    if wrapper == "router" and not era.prefix:
        raise InputError(f"router mode did not exist in the {fmt} build", hint="use --format era5 or era4-prefix")
    if wrapper == "ansi" and not era.prefix:
        raise InputError(f"the ansi wrapper needs a format with a log prefix, not {fmt}", hint="use --format era5")
    return era


@dataclass
class _Plan:
    """Everything fixed before the first byte is written: the simulation, its request frame, the layout."""
    scenario: Scenario
    sim: SimResult
    df: pl.DataFrame
    era: W.Era
    fmt: str
    wrapper: str
    paths: dict[str, str]
    logs_dir: Path
    tiling: _Tiling
    extras: dict[str, pl.DataFrame]
    pids: dict[str, int]

    def host(self, spec: Any) -> W.LogHost:
        return W.LogHost(launched_at=self.scenario.started_at + timedelta(seconds=spec.launch_s),
                         hostname=self.scenario.hostname, pid=self.pids[spec.name], port=spec.port)


@dataclass
class _Sink:
    """The open log files and the ground truth file, and what has been written to them."""
    handles: dict[str, BinaryIO]
    truth: BinaryIO
    written: dict[str, int]
    manifests: list[Path] = field(default_factory=list)
    attempts: list[Path] = field(default_factory=list)

    def close(self) -> None:
        for h in self.handles.values():
            h.close()
        self.truth.close()


def _plan(scenario: Scenario, logs_dir: Path, era: W.Era, wrapper: str, seed: int, tiling: bool) -> _Plan:
    builds = {s.name: (s.build or era.build) for s in scenario.servers}
    sim = Simulator(scenario, builds, seed).simulate()
    paths = _layout(scenario, tiling)
    df = _request_frame(sim, scenario, paths, era)
    extras = {n: pl.DataFrame(e, schema={"t": pl.Int64, "kind": pl.String, "task": pl.Int64, "status": pl.Int64})
              for n, e in sim.extras.items()}
    pids = {s.name: 2000 + 1000 * k + (seed % 997) for k, s in enumerate(scenario.servers)}
    return _Plan(scenario=scenario, sim=sim, df=df, era=era, fmt=era.name, wrapper=wrapper, paths=paths,
                 logs_dir=logs_dir, tiling=_tiling(sim, df, tiling), extras=extras, pids=pids)


def _open(plan: _Plan, truth_path: Path) -> _Sink:
    handles: dict[str, BinaryIO] = {}
    for spec in plan.scenario.servers:
        p = plan.logs_dir / plan.paths[spec.name]
        p.parent.mkdir(parents=True, exist_ok=True)
        handles[spec.name] = p.open("wb")
    return _Sink(handles=handles, truth=truth_path.open("wb"), written=dict.fromkeys(handles, 0))


def generate(scenario: Scenario, out_dir: str | Path, *, fmt: str = "era5", wrapper: str | None = None, seed: int = 0,
             repeat: Repeat | None = None) -> GeneratedRun:
    """Simulate ``scenario`` and write its logs, replay records and ground truth under ``out_dir``.

    ``repeat`` writes the scenario's runs again and again (see ``Repeat``) until a request count or a log size
    is reached.  Same seed, same arguments → byte-identical files.
    """
    wrapper = wrapper or "none"
    repeat = repeat or Repeat()
    era = _era(fmt, wrapper)
    size_b = repeat.size_bytes
    out = Path(out_dir)
    logs_dir = out / "logs"
    truth_dir = out / "truth"
    logs_dir.mkdir(parents=True, exist_ok=True)
    truth_dir.mkdir(parents=True, exist_ok=True)
    plan = _plan(scenario, logs_dir, era, wrapper, seed, repeat.tiling)
    truth_path = truth_dir / "requests.jsonl"
    sink = _open(plan, truth_path)
    first_truth = _truth(plan.df, scenario) if not plan.df.is_empty() else pl.DataFrame()
    try:
        if repeat.first_tile == 0:
            _write_banners(plan, sink)
        i, n_req = _write_all_tiles(plan, sink, repeat.first_tile, repeat.requests, size_b)
    finally:
        sink.close()
    return GeneratedRun(out_dir=out, logs=[logs_dir / plan.paths[s.name] for s in scenario.servers],
                        manifests=sink.manifests, attempts=sink.attempts, truth_path=truth_path, truth=first_truth,
                        requests=n_req, bytes_written=sum(sink.written.values()), fmt=fmt, wrapper=wrapper,
                        extra={"tiles_end": i, "requests_per_tile": len(plan.df)})


def _write_banners(plan: _Plan, sink: _Sink) -> None:
    for spec in plan.scenario.servers:
        info = _server_info(spec)
        b = W.banner(plan.fmt, info)
        bl = pl.DataFrame({"t": [x[0] for x in b], "k": list(range(-len(b) - 1000, -1000)), "lvl": [x[1] for x in b],
                           "body": [x[2] for x in b], "raw": [x[3] for x in b]},
                          schema={"t": pl.Int64, "k": pl.Int64, "lvl": pl.String, "body": pl.String, "raw": pl.Boolean})
        host = plan.host(spec)
        frames = [W.finish_lines(bl, plan.era, plan.wrapper, host)]
        if plan.wrapper == "router":
            frames.append(_router(pl.DataFrame(schema={"t_launch": pl.Int64, "ridx": pl.Int64}), info, plan.era,
                                  host, head=True))
        sink.written[spec.name] += W.write_lines([_sort(frames)], sink.handles[spec.name])


def _write_all_tiles(plan: _Plan, sink: _Sink, first_tile: int, requests: int | None,
                     size_b: int | None) -> tuple[int, int]:
    """Write tiles in growing batches until the target is met; returns (next tile, requests written)."""
    per_tile = max(len(plan.df), 1)
    i = first_tile
    n_req = 0
    batch_tiles = 1
    while True:
        tiles = list(range(i, i + batch_tiles))
        _write_tiles(plan, sink, tiles)
        n_req += per_tile * len(tiles)
        i += len(tiles)
        total = sum(sink.written.values())
        if not plan.tiling.on or plan.df.is_empty():
            break
        if requests is not None and n_req >= requests:
            break
        if size_b is not None and total >= size_b:
            break
        # grow batches so each formatting call handles about 64 MB
        per = total / max(i - first_tile, 1)
        left = math.inf if size_b is None else (size_b - total) / per
        if requests is not None:
            left = min(left, (requests - n_req) / per_tile)
        batch_tiles = int(max(1, min(math.ceil(left), max(1, (64 << 20) // max(per, 1)))))
    return i, n_req


def _tile_block(plan: _Plan, spec: Any, tiles: list[int]) -> tuple[pl.DataFrame, pl.DataFrame]:
    """One server's requests and extra events for ``tiles``, shifted and numbered as one stretch of log."""
    name, tiling = spec.name, plan.tiling
    part = plan.df.filter(pl.col("server") == name)
    ex = plan.extras[name]
    chunks, exs = [], []
    for j in tiles:
        chunks.append(_shift(part, j, tiling))
        exs.append(ex.with_columns(pl.col("t") + j * tiling.span - int(spec.launch_s * 1e6),
                                   pl.col("task") + j * tiling.task_off[name]))
    blk = pl.concat(chunks) if chunks else part
    blk = blk.with_columns(pl.int_range(pl.len()).alias("ridx"), pl.lit(0).alias("clock0").cast(pl.Int64))
    blk = blk.with_columns((pl.col("ridx") * 0 + 912_000_000_000 + 7919 * plan.pids[name]).alias("clock0"))
    exb = pl.concat(exs).with_columns(pl.int_range(pl.len()).alias("eidx"))
    return blk, exb


def _write_tiles(plan: _Plan, sink: _Sink, tiles: list[int]) -> None:
    for spec in plan.scenario.servers:
        name = spec.name
        blk, exb = _tile_block(plan, spec, tiles)
        lines = [x for x in W.request_lines(plan.fmt, blk, spec.n_batch) if not x.is_empty()]
        lines += [x for x in W.extra_lines(plan.fmt, exb, plan.era.http_path) if not x.is_empty()]
        host = plan.host(spec)
        frames = [W.finish_lines(pl.concat(lines) if lines else W.empty_lines(), plan.era, plan.wrapper, host)]
        if plan.wrapper == "router":
            frames.append(_router(blk, _server_info(spec), plan.era, host, head=False))
        sink.written[name] += W.write_lines([_sort(frames)], sink.handles[name])
        if not blk.is_empty():
            sink.truth.write(_ndjson(_truth(blk, plan.scenario)))
    for j in tiles:
        m, a = _write_records(plan.sim, plan.scenario, plan.logs_dir, plan.paths, plan.tiling.suffix(j),
                              j * plan.tiling.span)
        sink.manifests += m
        sink.attempts += a


def _ndjson(df: pl.DataFrame) -> bytes:
    import io

    buf = io.BytesIO()
    df.with_columns(pl.col("t_start").dt.strftime("%Y-%m-%dT%H:%M:%S%.6f+00:00"),
                    pl.col("t_end").dt.strftime("%Y-%m-%dT%H:%M:%S%.6f+00:00")).write_ndjson(buf)
    return buf.getvalue()


def _sort(frames: list[pl.DataFrame]) -> pl.DataFrame:
    return pl.concat(frames).sort(["t", "k"])


ROUTER_SPAWN_US = 20_110_580


def _router(blk: pl.DataFrame, info: dict[str, object], era: W.Era, host: W.LogHost, head: bool) -> pl.DataFrame:
    r = W.router_lines(blk, info, ROUTER_SPAWN_US)
    r = r.filter(pl.col("k") < -1) if head else r.filter(pl.col("k") >= -1)
    return W.finish_lines(r, era, "none", replace(host, ts_shift_us=ROUTER_SPAWN_US))


def with_build(scenario: Scenario, build: int) -> Scenario:
    return replace(scenario, servers=tuple(replace(s, build=build) for s in scenario.servers))


__all__ = ["TRUTH_COLUMNS", "GeneratedRun", "Repeat", "datetime", "generate", "parse_size", "with_build"]
