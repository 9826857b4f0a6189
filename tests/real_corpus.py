"""The real-log corpus in ``fixtures/real``: load each log's sidecar and check it is well formed.

Run as ``python -m tests.real_corpus [SIDECAR.toml ...]`` to check sidecars while writing them.
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
SOURCE_KEYS = {"repo", "kind", "number", "url", "date", "author_turn", "build", "fork", "era", "wrapper", "trimmed",
               "path", "commit", "notes"}
FILE_KEYS = {"instances", "restarts", "crashes", "requests", "not_server", "cut_lines", "format", "notes"}
REQUEST_KEYS = {"instance", "port", "slot", "task", "order", "prompt_tokens", "cached_tokens", "gen_tokens",
                "stop_reason", "truncated", "http_status", "n_ctx_slot", "complete", "notes"}
FACT_KEYS = REQUEST_KEYS - {"instance", "port", "slot", "task", "order", "notes"}
STOP_REASONS = {"eos", "limit", "word", "context", "cancelled", "error", "unknown"}
FORKS = {"upstream", "ollama", "ik_llama.cpp", "llamafile", "koboldcpp", "localai", "llama-swap", "other"}


@dataclass
class Sidecar:
    log: Path
    source: dict[str, Any]
    file: dict[str, Any]
    requests: list[dict[str, Any]] = field(default_factory=list)

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
        per_file = sum(1 for k in ("instances", "restarts", "crashes", "requests") if k in self.file)
        return per_file + sum(1 for r in self.requests for k in r if k in FACT_KEYS)


def load(toml_path: Path) -> Sidecar:
    data = tomllib.loads(toml_path.read_text(encoding="utf-8"))
    return Sidecar(toml_path.with_suffix(".log"), data.get("source", {}), data.get("file", {}),
                   list(data.get("request", [])))


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
    n = sc.line_count()
    for lo_hi in [*sc.file.get("not_server", []), *([c, c] for c in sc.file.get("cut_lines", []))]:
        lo, hi = lo_hi
        if not 1 <= lo <= hi <= n:
            out.append(f"line range {lo_hi} is outside the log's {n} lines")
    if isinstance(sc.file.get("requests"), int) and sc.file["requests"] != len(sc.requests):
        out.append(f"[file] requests = {sc.file['requests']} but {len(sc.requests)} [[request]] tables")
    for i, r in enumerate(sc.requests, 1):
        out += [f"request {i}: unknown key {k!r}" for k in r if k not in REQUEST_KEYS]
        if "stop_reason" in r and r["stop_reason"] not in STOP_REASONS:
            out.append(f"request {i}: stop_reason {r['stop_reason']!r} is not one of {sorted(STOP_REASONS)}")
        if not ("slot" in r and "task" in r) and "order" not in r:
            out.append(f"request {i}: needs slot and task, or order")
    return out


def corpus() -> list[Sidecar]:
    return [load(p) for p in sorted(CORPUS.glob("*.toml"))]


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
    """The store's tables a score reads, each read once for the whole corpus."""
    from forensics.store import Store

    store = Store(store_dir)
    return {name: store.table(name) for name in ("files", "unparsed", "requests", "instances")}


def score_all(sidecars: list[Sidecar], store_dir: Path) -> list[Score]:
    loaded = tables(store_dir)
    return [score(sc, loaded) for sc in sidecars]


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
    inst = t["instances"].filter(pl.col("run") == sc.name)
    got_file = {"instances": inst.height, "requests": reqs.height,
                "restarts": int(inst.filter(pl.col("instance").str.contains("#")).height),
                "crashes": int(inst["crashed"].sum()) if "crashed" in inst.columns else 0}
    for key in ("instances", "restarts", "crashes", "requests"):
        if key in sc.file:
            if got_file[key] == sc.file[key]:
                out.right += 1
            else:
                out.wrong.append(f"file {key}: expected {sc.file[key]}, got {got_file[key]}")
    order = _instance_order(inst)
    for exp in sc.requests:
        ident = {k: exp[k] for k in ("instance", "port", "slot", "task", "order") if k in exp}
        row = _find(sc, exp, reqs, order)
        for key in FACT_KEYS:
            if key not in exp:
                continue
            got = None if row is None else row.get(key)
            if row is not None and got == exp[key]:
                out.right += 1
            else:
                out.wrong.append(f"request {ident} {key}: expected {exp[key]!r}, got "
                                 f"{'no such request' if row is None else repr(got)}")
    return out


def measure(fmt: str | None = None) -> list[Score]:
    import tempfile

    sidecars = corpus()
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


def main(argv: list[str]) -> int:
    if argv[:1] == ["write"]:  # regenerate docs/formats.md's coverage and fixtures/real/README.md's source table
        sidecars = corpus()
        FORMATS_PAGE.write_text(updated(FORMATS_PAGE.read_text(encoding="utf-8"), "coverage",
                                  coverage_markdown(sidecars, measure())), encoding="utf-8")
        index = CORPUS / "README.md"
        index.write_text(updated(index.read_text(encoding="utf-8"), "provenance", provenance_markdown(sidecars)),
                         encoding="utf-8")
        return 0
    if argv[:1] == ["measure"]:
        scores = measure(argv[1] if len(argv) > 1 else None)
        for s in scores:
            for w in s.wrong:
                print(f"{s.name}: {w}")
            if s.unparsed_server:
                print(f"{s.name}: unparsed server lines {s.unparsed_server}")
        print(summary_line(scores))
        return 0
    paths = [Path(a) for a in argv] or sorted(CORPUS.glob("*.toml"))
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
