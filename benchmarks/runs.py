"""A store of many runs: ingest of thousands of run folders, unchanged re-ingest, and every command's time.

    python benchmarks/runs.py [--runs 10000] [--requests 5000000] [--out benchmarks/out]

Builds ``--runs`` run folders the way a harness leaves them (``run-NNNNN/`` with the server's log, the
attempts records and the manifest), from a few generated runs (healthy, a dead slot, a runaway, errors) scaled
to ``--requests / --runs`` requests each: the logs are hard links to the templates (runs differ by folder, as
a daily run repeated for months would), the records are rewritten with the folder's run id.  Then measures, each
as its own subprocess: ``forensics ingest`` of the whole folder (wall and CPU seconds, MB/s, peak RSS; it
compacts the store's part files into packs when it is done), re-ingest of the unchanged folder, ingest of one
more run folder into the store and into an empty one (the join of one run must not cost a pass over the
store), and every command on the store (each ≤ 1.5 s is the target).  Prints a markdown table, also written to
OUT/results-runs.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sys
import time
from pathlib import Path

import duckdb
import pyarrow as pa

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.run import Measure, forensics_cmd, machine, run_measured, table  # noqa: E402
from forensics.generate import deadslot, errors, generate, healthy, runaway  # noqa: E402
from forensics.generate.model import Scenario  # noqa: E402
from forensics.generate.presets import tickers  # noqa: E402

TEMPLATES = (healthy, deadslot, runaway, errors)
RECORDS = ("attempts.jsonl", "manifest.json")


def _scaled(make: object, requests: int) -> Scenario:
    """A preset whose one run sends about ``requests`` requests (items × stages)."""
    sc: Scenario = make()  # type: ignore[operator]
    run = sc.runs[0]
    items = max(1, requests // max(1, len(run.stages)))
    faults = run.faults
    if faults.runaways:  # the runaways name items: keep them among the items
        names = tickers(items)
        faults = dataclasses.replace(faults, runaways=tuple((names[i % items], st) for i, (_, st)
                                                            in enumerate(faults.runaways)))
    return dataclasses.replace(sc, runs=(dataclasses.replace(run, items=tickers(items), faults=faults),))


def build_runs(out: Path, n_runs: int, requests: int, seed: int) -> tuple[Path, float]:
    """``out/runs/run-NNNNN/`` folders; returns the folder and its size in MB."""
    tmpl_dir, runs_dir = out / "templates", out / "runs"
    for d in (tmpl_dir, runs_dir):
        shutil.rmtree(d, ignore_errors=True)
    templates = []
    for i, make in enumerate(TEMPLATES):
        sc = _scaled(make, max(1, requests // n_runs))
        g = generate(sc, tmpl_dir / make.__name__, seed=seed + i)
        folder = g.logs[0].parent
        templates.append((folder, sc.runs[0].run_id))
    size = 0
    for k in range(n_runs):
        folder, run_id = templates[k % len(templates)]
        dest = runs_dir / f"run-{k:05d}"
        dest.mkdir(parents=True)
        for f in folder.iterdir():
            if f.name in RECORDS:  # the harness writes its own run id into its records
                (dest / f.name).write_text(f.read_text().replace(run_id, dest.name))
            else:
                os.link(f, dest / f.name)
            size += f.stat().st_size
    return runs_dir, size / 1e6


def clone_store(src: Path, dest: Path, copies: int) -> int:
    """A store of ``copies`` times the runs of ``src`` (compacted first): each run's rows again under
    ``<run>-cK``, written as packs the way ``forensics compact`` leaves them, with a manifest that lists every
    part and every log file as an ingest would.  Ingesting 10,000 runs takes most of an hour on two cores (see
    the docs); the queries only need the store's shape.  Returns the runs in the new store."""
    from forensics import schema
    from forensics.compact import compact
    from forensics.store import MANIFEST, Store, sql_string

    compact(Store(src))
    manifest = json.loads((src / MANIFEST).read_text())
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    suffixes = [""] + [f"-c{k}" for k in range(1, copies)]
    sfx = pa.table({"s": suffixes})
    new_packs: dict[str, list[dict]] = {}
    for name in schema.TABLES:
        for i, pk in enumerate(manifest.get("packs", {}).get(name, [])):
            out = dest / name / "packs" / f"pack-clone-{i:04d}.parquet"
            out.parent.mkdir(parents=True, exist_ok=True)
            con = duckdb.connect()
            con.register("sfx", sfx)
            pack = sql_string(str(src / pk["path"]))
            cols = [d[0] for d in con.execute(f"SELECT * FROM read_parquet({pack}) LIMIT 0").description]
            replay = ", (replay_run || s) AS replay_run" if "replay_run" in cols else ""
            con.execute(f"COPY (SELECT * REPLACE ((run || s) AS run, replace(_part, '/run=' || run || '/', "
                        f"'/run=' || run || s || '/') AS _part{replay}) FROM read_parquet({pack}), sfx "
                        f"ORDER BY run, _part) TO {sql_string(str(out))} "
                        "(FORMAT parquet, COMPRESSION zstd, ROW_GROUP_SIZE 100000)")
            con.close()
            parts = [_renamed(p, s) for p in pk["parts"] for s in suffixes]
            new_packs.setdefault(name, []).append({"path": str(out.relative_to(dest)), "parts": parts})
    manifest["derived"] = _cloned_derived(src, dest, manifest.get("derived"), sfx, suffixes)
    manifest["packs"] = new_packs
    manifest["parts"] = {t: [_renamed(p, s) for p in manifest["parts"].get(t, []) for s in suffixes]
                         for t in new_packs}
    files = Store(src).meta("files", {}) or {}  # kept in a file of its own (the store's detached meta)
    (dest / "_meta").mkdir(exist_ok=True)
    (dest / "_meta" / "files-clone.json").write_text(json.dumps(
        {fid + s: {**m, "run": f"{m.get('run')}{s}"} for fid, m in files.items() for s in suffixes}))
    manifest["meta"]["files"] = {"detached": "_meta/files-clone.json"}
    (dest / MANIFEST).write_text(json.dumps(manifest))
    return len({p.split("/")[1] for p in manifest["parts"].get("requests", [])})


def _cloned_derived(src: Path, dest: Path, entry: dict | None, sfx: pa.Table, suffixes: list[str]) -> dict | None:
    """The source's analysis (``forensics.derived``) for the cloned runs: each batch's files with every run again
    under each suffix, so the clone is analysed as the source is (deriving 10,000 runs again would take its own
    benchmark)."""
    from forensics.store import sql_string

    if not entry:
        return entry
    batches = []
    for b in entry.get("batches", []):
        tables = {}
        for name, rel in b["tables"].items():
            out = dest / "_derived" / b["id"] / f"{name}.parquet"
            out.parent.mkdir(parents=True, exist_ok=True)
            con = duckdb.connect()
            con.register("sfx", sfx)
            con.execute(f"COPY (SELECT * REPLACE ((run || s) AS run) FROM read_parquet({sql_string(str(src / rel))}), "
                        f"sfx ORDER BY run) TO {sql_string(str(out))} (FORMAT parquet, COMPRESSION zstd, "
                        "ROW_GROUP_SIZE 100000)")
            con.close()
            tables[name] = str(out.relative_to(dest))
        batches.append({**b, "runs": [r + s for r in b["runs"] for s in suffixes],
                        "dead": [r + s for r in b.get("dead", []) for s in suffixes], "tables": tables})
    return {**entry, "batches": batches, "stale": [r + s for r in entry.get("stale", []) for s in suffixes]}


def shown(m: Measure) -> Measure:
    """``m``, its row printed to stderr at once: a long benchmark that fails late keeps what it measured."""
    print(table([m]).splitlines()[-1], file=sys.stderr, flush=True)
    return m


def _renamed(rel: str, suffix: str) -> str:
    table, run_dir, rest = rel.split("/", 2)
    return f"{table}/{run_dir}{suffix}/{rest}"


def commands(store: Path, first_run: str) -> list[list[str]]:
    s = ["--store", str(store)]
    second = first_run.replace("run-00001", "run-00002")
    return [["runs", *s, "--format", "csv"], ["summary", *s], ["missing", first_run, *s, "--format", "csv"],
            ["deadslots", *s, "--format", "csv"], ["runaways", *s, "--format", "csv"], ["cap", *s],
            ["errors", *s, "--format", "csv"], ["throughput", *s, "--format", "csv"],
            ["throughput", "--by", "np", *s, "--format", "csv"], ["verdict", *s], ["verdict", first_run, *s],
            ["runaways", first_run, *s, "--format", "csv"], ["compare", first_run, second, *s],
            ["smoke", *s, "--max-p95", "10m", "--format", "csv"], ["check", *s],
            ["incidents", *s, "--format", "csv"], ["incidents", "--precursors", *s, "--format", "csv"]]


def bench_runs(out: Path, n_runs: int, requests: int, seed: int) -> list[Measure]:
    label = f"{n_runs:,} runs"
    t0 = time.perf_counter()
    runs_dir, mb = build_runs(out, n_runs + 1, requests * (n_runs + 1) // n_runs, seed)
    extra = out / "extra"  # one more run folder, ingested into the finished store at the end
    shutil.rmtree(extra, ignore_errors=True)
    extra.mkdir()
    shutil.move(str(runs_dir / f"run-{n_runs:05d}"), str(extra / f"run-{n_runs:05d}"))
    mb = mb * n_runs / (n_runs + 1)
    res = [shown(Measure(label, "build run folders (generator)", time.perf_counter() - t0, None, mb))]
    store = out / "store-runs"
    shutil.rmtree(store, ignore_errors=True)
    fx = forensics_cmd()
    grep = run_measured(["grep", "-rc", "print_timing", str(runs_dir)])
    res.append(shown(Measure(label, "grep -rc print_timing (floor)", grep.wall, None, mb, cpu_s=grep.cpu)))
    ingest = [*fx, "ingest", str(runs_dir), "--store", str(store)]
    r = run_measured(ingest)
    res.append(shown(Measure(label, "forensics ingest (and compaction)", r.wall, r.rss, mb,
                             r.err.strip().splitlines()[-1][:120] if r.rc == 0 else f"exit {r.rc}",
                             cpu_s=r.cpu, grep_s=grep.wall)))
    r = run_measured(ingest)
    res.append(shown(Measure(label, "re-ingest (unchanged)", r.wall, r.rss, None, f"exit {r.rc}", cpu_s=r.cpu)))
    res += one_more(label, store, extra / f"run-{n_runs:05d}")
    res += query_times(label, store, first_run="run-00001", same=f"run-{n_runs - len(TEMPLATES):05d}")
    return res


def one_more(label: str, store: Path, folder: Path) -> list[Measure]:
    """Ingest of one more run folder into (a copy of) the store, beside its ingest into an empty store: the
    join of one run costs what it costs alone, whatever else the store holds (target: about the same)."""
    fx = forensics_cmd()
    res = []
    for what, dest in (("into the store", store.with_name(store.name + "-plus1")),
                       ("into an empty store", store.with_name(store.name + "-alone"))):
        shutil.rmtree(dest, ignore_errors=True)
        if what == "into the store":
            shutil.copytree(store, dest)
        r = run_measured([*fx, "ingest", str(folder), "--store", str(dest)])
        res.append(shown(Measure(label, f"ingest one more run folder {what}", r.wall, r.rss, None, f"exit {r.rc}",
                                 cpu_s=r.cpu)))
        if what == "into an empty store":  # the one-run questions on a store of that run alone
            for cmd in one_run_commands(dest, folder.name):
                r = run_measured([*fx, *cmd])
                words = [c for c in cmd if not c.startswith("--") and c not in (str(dest), "csv")]
                res.append(shown(Measure("1 run (alone)", "forensics " + " ".join(words), r.wall, r.rss, None,
                                         f"exit {r.rc}", cpu_s=r.cpu)))
        shutil.rmtree(dest, ignore_errors=True)
    return res


def one_run_commands(store: Path, run: str) -> list[list[str]]:
    """Questions about one run: each costs on a store of thousands what it costs on that run's store alone
    (target: at most 1.2 times)."""
    s = ["--store", str(store)]
    return [["verdict", run, *s], ["runaways", run, *s, "--format", "csv"],
            ["missing", run, *s, "--format", "csv"], ["throughput", run, *s, "--format", "csv"]]


def query_times(label: str, store: Path, first_run: str, same: str) -> list[Measure]:
    """Every command on the store, then the one-run questions about ``same`` (a run built from the same
    template as the run ``one_more`` measured alone)."""
    fx = forensics_cmd()
    res = []
    n_req = run_measured([*fx, "sql", "select count(*) as n from requests", "--store", str(store), "--format", "csv"])
    for cmd in [*commands(store, first_run), *one_run_commands(store, same)]:
        r = run_measured([*fx, *cmd])
        words = [c for c in cmd if not c.startswith("--") and c not in (str(store), "csv")]
        res.append(shown(Measure(label, "forensics " + " ".join(words), r.wall, r.rss, None,
                                 f"exit {r.rc}" + (f": {r.err.strip()[:100]}" if r.rc > 1 else ""), cpu_s=r.cpu)))
    res[0].note += f"; {n_req.out.strip().splitlines()[-1]} requests in store"
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=10_000)
    ap.add_argument("--requests", type=int, default=5_000_000, help="requests over all runs")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "out")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--clone", type=int, default=1, help="also time the commands on a store of CLONE times the "
                    "ingested runs (each run's rows copied under another name)")
    ap.add_argument("--keep", action="store_true", help="keep the run folders and the store")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = bench_runs(args.out, args.runs, args.requests, args.seed)
    if args.clone > 1:
        n = clone_store(args.out / "store-runs", args.out / "store-clone", args.clone)
        rows += query_times(f"{n:,} runs (cloned)", args.out / "store-clone", first_run="run-00001-c1",
                            same=f"run-{args.runs - len(TEMPLATES):05d}-c1")
    if not args.keep:
        for d in ("templates", "runs", "extra", "store-runs", "store-clone"):
            shutil.rmtree(args.out / d, ignore_errors=True)
    text = f"Machine: {machine()}\n\n{table(rows)}\n"
    (args.out / "results-runs.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
