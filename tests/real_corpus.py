"""The real-log corpus in ``fixtures/real``: load each log's sidecar, check it is well formed, score the tool on it.

``python -m tests.real_corpus [SIDECAR.toml ...]`` checks sidecars while writing them (``fixtures/real`` and
``fixtures/real-holdout`` when none is named); ``measure [FORMAT] [--dir FOLDER]`` ingests a folder's logs and prints
every fact the tool gets wrong (the held-out folder only once, at the end of a round); ``write`` regenerates the docs'
tables.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

CORPUS = Path(__file__).resolve().parent.parent / "fixtures" / "real"
HOLDOUT = CORPUS.parent / "real-holdout"  # scored once, at the end of a round (see its README)
SOURCE_KEYS = {"repo", "kind", "number", "url", "date", "author_turn", "build", "fork", "era", "wrapper", "trimmed",
               "path", "commit", "notes"}
FILE_FACTS = ("instances", "restarts", "crashes", "requests", "errors")
FILE_KEYS = {*FILE_FACTS, "not_server", "cut_lines", "format", "notes"}
REQUEST_KEYS = {"instance", "port", "slot", "task", "order", "prompt_tokens", "cached_tokens", "gen_tokens",
                "stop_reason", "truncated", "http_status", "n_ctx_slot", "complete", "prompt_ms", "gen_ms",
                "n_predict", "error", "notes"}
FACT_KEYS = REQUEST_KEYS - {"instance", "port", "slot", "task", "order", "notes"}
INSTANCE_FACTS = ("n_slots", "n_ctx", "n_ctx_slot", "n_ctx_train", "build", "port")
FLOAT_FACTS = {"prompt_ms", "gen_ms"}  # compared to within FLOAT_TOLERANCE ms
FLOAT_TOLERANCE = 0.01
BOOL_FACTS = {"truncated", "complete", "error"}
ERROR_LEVELS = {"E", "ERR", "ERROR", "F", "FATAL", "CRIT", "CRITICAL"}
STOP_REASONS = {"eos", "limit", "word", "context", "cancelled", "error", "unknown"}
FORKS = {"upstream", "ollama", "ik_llama.cpp", "llamafile", "koboldcpp", "localai", "llama-swap", "other"}


@dataclass
class Sidecar:
    log: Path
    source: dict[str, Any]
    file: dict[str, Any]
    requests: list[dict[str, Any]] = field(default_factory=list)
    instances: list[dict[str, Any]] = field(default_factory=list)  # [[instance]] tables, in order of appearance

    @property
    def name(self) -> str:
        return self.log.stem

    def line_count(self) -> int:
        data = self.log.read_bytes()
        return data.count(b"\n") + (0 if data.endswith(b"\n") or not data else 1)

    def not_server_lines(self) -> set[int]:
        out: set[int] = set()
        for lo, hi in self.file.get("not_server", []):
            out.update(range(lo, hi + 1))
        return out

    def n_facts(self) -> int:
        per_file = sum(1 for k in FILE_FACTS if k in self.file)
        per_instance = sum(1 for i in self.instances for k in i if k in INSTANCE_FACTS)
        return per_file + per_instance + sum(1 for r in self.requests for k in r if k in FACT_KEYS)


def load(toml_path: Path) -> Sidecar:
    data = tomllib.loads(toml_path.read_text(encoding="utf-8"))
    return Sidecar(toml_path.with_suffix(".log"), data.get("source", {}), data.get("file", {}),
                   list(data.get("request", [])), list(data.get("instance", [])))


def _type_problems(where: str, table: dict[str, Any]) -> list[str]:
    """A fact of the wrong type (an int where a count is meant, a bool for a flag, a number for ms)."""
    out = []
    for key, value in table.items():
        if key in BOOL_FACTS and not isinstance(value, bool):
            out.append(f"{where}: {key} must be true or false")
        elif key in FLOAT_FACTS and (isinstance(value, bool) or not isinstance(value, (int, float))):
            out.append(f"{where}: {key} must be a number (ms)")
        elif key in {"n_predict", "http_status", "n_ctx_slot", "prompt_tokens", "cached_tokens", "gen_tokens",
                     *INSTANCE_FACTS} and (isinstance(value, bool) or not isinstance(value, int)):
            out.append(f"{where}: {key} must be an integer")
    return out


def _request_problems(sc: Sidecar) -> list[str]:
    out: list[str] = []
    for i, r in enumerate(sc.requests, 1):
        out += [f"request {i}: unknown key {k!r}" for k in r if k not in REQUEST_KEYS]
        if "stop_reason" in r and r["stop_reason"] not in STOP_REASONS:
            out.append(f"request {i}: stop_reason {r['stop_reason']!r} is not one of {sorted(STOP_REASONS)}")
        if not ("slot" in r and "task" in r) and "order" not in r:
            out.append(f"request {i}: needs slot and task, or order")
        out += _type_problems(f"request {i}", r)
    for i, inst in enumerate(sc.instances, 1):
        out += [f"instance {i}: unknown key {k!r}" for k in inst if k not in {*INSTANCE_FACTS, "notes"}]
        out += _type_problems(f"instance {i}", inst)
    if isinstance(sc.file.get("instances"), int) and len(sc.instances) > sc.file["instances"]:
        out.append(f"{len(sc.instances)} [[instance]] tables but [file] instances = {sc.file['instances']}")
    return out


def problems(sc: Sidecar) -> list[str]:
    """What is wrong with a sidecar (empty when it is well formed)."""
    out: list[str] = []
    if not sc.log.exists():
        return [f"{sc.log.name} is missing"]
    for key in ("repo", "url", "date", "fork", "era"):
        if key not in sc.source:
            out.append(f"[source] has no {key}")
    out += [f"[source] has unknown key {k!r}" for k in sc.source if k not in SOURCE_KEYS]
    out += [f"[file] has unknown key {k!r}" for k in sc.file if k not in FILE_KEYS]
    if sc.source.get("fork") not in FORKS:
        out.append(f"[source] fork {sc.source.get('fork')!r} is not one of {sorted(FORKS)}")
    for key in ("instances", "restarts", "crashes", "requests"):
        if not isinstance(sc.file.get(key), int):
            out.append(f"[file] {key} must be an integer")
    if "errors" in sc.file and (isinstance(sc.file["errors"], bool) or not isinstance(sc.file["errors"], int)):
        out.append("[file] errors must be an integer")
    n = sc.line_count()
    for lo_hi in [*sc.file.get("not_server", []), *([c, c] for c in sc.file.get("cut_lines", []))]:
        lo, hi = lo_hi
        if not 1 <= lo <= hi <= n:
            out.append(f"line range {lo_hi} is outside the log's {n} lines")
    if isinstance(sc.file.get("requests"), int) and sc.file["requests"] != len(sc.requests):
        out.append(f"[file] requests = {sc.file['requests']} but {len(sc.requests)} [[request]] tables")
    return out + _request_problems(sc)


def corpus(folder: Path = CORPUS) -> list[Sidecar]:
    return [load(p) for p in sorted(folder.glob("*.toml"))]


# ---------------------------------------------------------------------------------------- scoring
@dataclass
class Score:
    """What the tool got right on one corpus log."""

    name: str
    facts: int = 0
    right: int = 0
    wrong: list[str] = field(default_factory=list)
    refused: str = ""  # the error line when the file was not read
    server_lines: int = 0  # lines that are process output (not prose), blank lines excluded
    unparsed_server: list[int] = field(default_factory=list)  # server lines left unparsed (cut lines excluded)


def ingest_corpus(sidecars: list[Sidecar], workdir: Path, fmt: str | None = None) -> Path:
    """Ingest every log into one store, each under its own run (its name); returns the store's folder."""
    import shutil

    from forensics.ingest import FilesNotRead, IngestOptions, ingest

    logs = workdir / "logs"
    for sc in sidecars:
        (logs / sc.name).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(sc.log, logs / sc.name / sc.log.name)
    store = workdir / "store"
    try:
        ingest(store, [logs], IngestOptions(fmt=fmt, keep_going=True))
    except FilesNotRead as exc:  # a bug in one file: the others are in the store, the scores say which
        for line in exc.result.errors:
            print(line, file=sys.stderr)
    return store


def _instance_order(inst: Any) -> dict[str, int]:
    """Instance name -> its 1-based order of appearance in the file."""
    names = inst.sort("line_first")["instance"].to_list()
    return {n: i + 1 for i, n in enumerate(names)}


def _find(sc: Sidecar, exp: dict[str, Any], reqs: Any, order: dict[str, int]) -> dict[str, Any] | None:
    import polars as pl

    rows = reqs
    if "slot" in exp and "task" in exp:
        rows = rows.filter((pl.col("slot") == exp["slot"]) & (pl.col("task") == exp["task"]))
        if "port" in exp:
            rows = rows.filter(pl.col("instance").str.contains(f":{exp['port']}(?:#|$)"))
        if "instance" in exp:
            rows = rows.filter(pl.col("instance").replace_strict(order, default=0) == exp["instance"])
    else:
        rows = rows.sort("line_first").slice(exp["order"] - 1, 1)
    return rows.row(0, named=True) if rows.height == 1 else None


def tables(store_dir: Path) -> dict[str, Any]:
    """The store's tables a score reads, each read once for the whole corpus (events: only the lines that state an
    error or a crash)."""
    from forensics.store import Store

    store = Store(store_dir)
    out = {name: store.table(name) for name in ("files", "unparsed", "requests", "instances")}
    out["errors"] = error_lines(store.table("events"))
    return out


def error_lines(events: Any) -> Any:
    """(run, line_no) of every line the tool reads as stating an error or a crash: an error or crash role, or an
    error level; not backtrace frames, which are a crash's evidence rather than a statement of it (see the README's
    `errors` rule)."""
    import polars as pl

    if events.height == 0:
        return pl.DataFrame(schema={"run": pl.String, "line_no": pl.Int64})
    level = pl.col("level").cast(pl.String).str.to_uppercase().is_in(sorted(ERROR_LEVELS)) if "level" in \
        events.columns else pl.lit(False)
    stated = (pl.col("role").is_in(["error", "crash"]) & (pl.col("kind") != "backtrace_frame")) | level.fill_null(False)
    return events.filter(stated).select("run", "line_no").unique()


def score_all(sidecars: list[Sidecar], store_dir: Path) -> list[Score]:
    loaded = tables(store_dir)
    return [score(sc, loaded) for sc in sidecars]


def same(key: str, got: Any, expected: Any) -> bool:
    """A fact as the tool has it equals the one read by hand (ms to within FLOAT_TOLERANCE; `error` is whether the
    tool tied any error text to the request)."""
    if key == "error":
        return (got is not None and got is not False) == expected
    if key in FLOAT_FACTS:
        return got is not None and abs(float(got) - float(expected)) <= FLOAT_TOLERANCE + 1e-9
    return got == expected


def _score_facts(out: Score, label: str, expected: dict[str, Any], row: dict[str, Any] | None, keys: Any) -> None:
    for key in keys:
        if key not in expected:
            continue
        got = None if row is None else row.get(key)
        if row is not None and same(key, got, expected[key]):
            out.right += 1
        else:
            out.wrong.append(f"{label} {key}: expected {expected[key]!r}, got "
                             f"{'no such ' + label.split()[0] if row is None else repr(got)}")


def _file_facts(sc: Sidecar, t: dict[str, Any], inst: Any, reqs: Any) -> dict[str, int]:
    import polars as pl

    return {"instances": inst.height, "requests": reqs.height,
            "restarts": int(inst.filter(pl.col("instance").str.contains("#")).height),
            "crashes": int(inst["crashed"].sum()) if "crashed" in inst.columns else 0,
            "errors": t["errors"].filter(pl.col("run") == sc.name).height}


def score(sc: Sidecar, store: Path | dict[str, Any]) -> Score:
    """Compare the tool's tables for one corpus log (a store folder, or its ``tables``) with its sidecar's
    facts."""
    import polars as pl

    out = Score(sc.name, facts=sc.n_facts())
    t = tables(store) if isinstance(store, Path) else store
    files = t["files"].filter(pl.col("run") == sc.name)
    skip = sc.not_server_lines() | set(sc.file.get("cut_lines", []))
    lines = sc.log.read_text(encoding="utf-8", errors="replace").split("\n")
    blank = {i + 1 for i, t in enumerate(lines) if not t.strip()}
    out.server_lines = sc.line_count() - len((sc.not_server_lines() | blank) & set(range(1, sc.line_count() + 1)))
    if files.height == 0 or files["format"][0] in ("?", "empty"):
        out.refused = "not read"
        out.wrong = ["file not read"]
        return out
    unparsed = t["unparsed"].filter(pl.col("run") == sc.name)["line_no"].to_list()
    out.unparsed_server = sorted(n for n in unparsed if n not in skip and n not in blank)
    reqs = t["requests"].filter(pl.col("run") == sc.name)
    inst = t["instances"].filter(pl.col("run") == sc.name).sort("line_first")
    _score_facts(out, "file", sc.file, _file_facts(sc, t, inst, reqs), FILE_FACTS)
    for i, exp in enumerate(sc.instances):
        row = inst.row(i, named=True) if i < inst.height else None
        _score_facts(out, f"instance {i + 1}", exp, row, INSTANCE_FACTS)
    order = _instance_order(inst)
    for exp in sc.requests:
        ident = {k: exp[k] for k in ("instance", "port", "slot", "task", "order") if k in exp}
        _score_facts(out, f"request {ident}", exp, _find(sc, exp, reqs, order), sorted(FACT_KEYS))
    return out


def measure(fmt: str | None = None, folder: Path = CORPUS) -> list[Score]:
    import tempfile

    sidecars = corpus(folder)
    with tempfile.TemporaryDirectory() as d:
        return score_all(sidecars, ingest_corpus(sidecars, Path(d), fmt))


def summary_line(scores: list[Score]) -> str:
    facts = sum(s.facts for s in scores)
    right = sum(s.right for s in scores)
    server = sum(s.server_lines for s in scores)
    unparsed = sum(len(s.unparsed_server) for s in scores)
    refused = sum(bool(s.refused) for s in scores)
    return (f"{len(scores)} logs: {refused} refused, facts right {right}/{facts} ({100 * right / max(facts, 1):.1f} %), "
            f"unparsed server lines {unparsed}/{server} ({100 * unparsed / max(server, 1):.2f} %)")


# ---------------------------------------------------------------------------------------- documentation
FORMATS_PAGE = CORPUS.parent.parent / "docs" / "formats.md"  # its "Real logs" section holds the coverage
MARKS = {"coverage": ("<!-- real-logs:start -->", "<!-- real-logs:end -->"),
         "provenance": ("<!-- provenance:start -->", "<!-- provenance:end -->")}


def _wrappers(sc: Sidecar) -> str:
    w = sc.source.get("wrapper") or ["none"]
    return ", ".join(sorted(w if isinstance(w, list) else [w]))


def coverage_markdown(sidecars: list[Sidecar], scores: list[Score]) -> str:
    """docs/formats.md's section: what the corpus covers (era x fork x wrapper) and how the tool does on it."""
    rows: dict[tuple[int, str, str], list[int]] = {}
    for sc in sidecars:
        key = (int(sc.source["era"]), str(sc.source["fork"]), _wrappers(sc))
        rows.setdefault(key, [0, 0])
        rows[key][0] += 1
        rows[key][1] += sc.n_facts()
    out = ["| era | fork | wrappers | logs | facts |", "|---|---|---|---|---|"]
    out += [f"| {e} | {f} | {w} | {n} | {k} |" for (e, f, w), (n, k) in sorted(rows.items())]
    return "\n".join([f"Measured on the corpus: {summary_line(scores)}; internal errors: 0.", "", *out])


def provenance_markdown(sidecars: list[Sidecar]) -> str:
    out = ["| log | source | date | era | fork | wrappers | lines | facts |", "|---|---|---|---|---|---|---|---|"]
    for sc in sidecars:
        src = sc.source
        where = f"[{src['repo']}#{src['number']}]({src['url']})" if "number" in src else f"[{src['repo']}]({src['url']})"
        out.append(f"| `{sc.name}` | {where} | {src['date']} | {src['era']} | {src['fork']} | {_wrappers(sc)} | "
                   f"{sc.line_count()} | {sc.n_facts()} |")
    return "\n".join(out)


def updated(text: str, which: str, body: str) -> str:
    start, end = MARKS[which]
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{start}\n{body}\n{end}{tail}"


def write_docs() -> None:
    """Regenerate docs/formats.md's coverage (scores fixtures/real) and both folders' provenance tables (the
    held-out folder's without scoring it)."""
    sidecars = corpus()
    FORMATS_PAGE.write_text(updated(FORMATS_PAGE.read_text(encoding="utf-8"), "coverage",
                                    coverage_markdown(sidecars, measure())), encoding="utf-8")
    for folder in (CORPUS, HOLDOUT):
        index = folder / "README.md"
        if index.exists():
            text = index.read_text(encoding="utf-8")
            index.write_text(updated(text, "provenance", provenance_markdown(corpus(folder))), encoding="utf-8")


def measure_command(args: list[str]) -> int:
    """`measure [FORMAT] [--dir FOLDER]`: every wrong fact and unparsed server line, then the summary."""
    folder = CORPUS
    if "--dir" in args:
        at = args.index("--dir")
        if at + 1 >= len(args):
            print("measure: --dir needs a folder of logs with sidecars", file=sys.stderr)
            return 2
        folder = Path(args[at + 1])
        args = args[:at] + args[at + 2:]
    if not any(folder.glob("*.toml")):
        print(f"measure: {folder} holds no sidecars (<name>.toml next to <name>.log)", file=sys.stderr)
        return 2
    scores = measure(args[0] if args else None, folder)
    for s in scores:
        for w in s.wrong:
            print(f"{s.name}: {w}")
        if s.unparsed_server:
            print(f"{s.name}: unparsed server lines {s.unparsed_server}")
    print(summary_line(scores))
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["write"]:
        write_docs()
        return 0
    if argv[:1] == ["measure"]:
        return measure_command(argv[1:])
    paths = [Path(a) for a in argv] or sorted([*CORPUS.glob("*.toml"), *HOLDOUT.glob("*.toml")])
    bad = 0
    for p in paths:
        errs = problems(load(p))
        for e in errs:
            print(f"{p.name}: {e}")
        bad += bool(errs)
    print(f"{len(paths) - bad} of {len(paths)} sidecars well formed")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
