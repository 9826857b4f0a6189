"""``forensics generate``: write a simulated scenario (server logs, replay records, ground truth)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from forensics.commands import options as cli_mod


@dataclass(frozen=True)
class GenerateArgs:
    """``forensics generate``'s options: the log's format and wrapper, how much to write, the seed."""

    fmt: str
    wrapper: str
    n_requests: int | None
    size: str | None
    seed: int


def _choices(name: str) -> Callable[[], list[str]]:
    """The names in ``forensics.generate.<name>``, read when `generate` needs them (the generator loads polars)."""
    def load() -> list[str]:
        import forensics.generate as gen

        names = list(getattr(gen, name))
        return sorted(names) if name == "SCENARIOS" else names
    return load


def register(cli: click.Group) -> None:
    @cli.command("generate", epilog="""\b
Examples:
  forensics generate sim/                          the demo scenario's logs, records and ground truth
  forensics generate big/ --size 1GB --format era4   a large log for benchmarks
""")
    @click.argument("out_dir", type=click.Path(path_type=Path))
    @click.option("--scenario", type=cli_mod.LazyChoice(_choices("SCENARIOS")), default="demo", show_default=True,
                  help="Preset scenario to simulate.")
    @click.option("--format", "fmt", type=cli_mod.LazyChoice(_choices("FORMATS")), default="era5", show_default=True,
                  help="llama-server log generation to write.")
    @click.option("--wrapper", type=cli_mod.LazyChoice(_choices("WRAPPERS")), default="none", show_default=True,
                  help="Wrapper around each line (journald, docker, ansi colours, router [port] tags).")
    @click.option("--requests", "n_requests", type=click.IntRange(min=1), default=None,
                  help="Repeat the scenario's runs until at least N slot requests are written.")
    @click.option("--size", default=None, help="Repeat the scenario's runs until the logs reach this size (e.g. 2GB).")
    @click.option("--seed", type=int, default=0, show_default=True, help="Random seed (same seed, same bytes).")
    def generate_cmd(out_dir: Path, scenario: str, **opts: Any) -> None:
        """Simulate llama-server instances serving a replay harness and write their logs.

        \b
        OUT_DIR/logs/...              server logs, run manifests and attempts (ingest this folder)
        OUT_DIR/truth/requests.jsonl  ground truth: one line per request a slot served
        """
        from forensics.generate import SCENARIOS, Repeat, generate, parse_size

        a = cli_mod.typed_options(GenerateArgs, opts)
        fmt, wrapper, n_requests, size, seed = a.fmt, a.wrapper, a.n_requests, a.size, a.seed
        if n_requests is not None and size is not None:
            raise click.UsageError("give --requests or --size, not both")
        size_b = parse_size(size) if size is not None else None
        res = generate(SCENARIOS[scenario](), out_dir, fmt=fmt, wrapper=wrapper, seed=seed,
                       repeat=Repeat(requests=n_requests, size=size_b))
        for p in res.logs:
            click.echo(f"log: {p} ({p.stat().st_size:,} bytes)", err=True)
        click.echo(f"records: {len(res.manifests)} run manifests, {len(res.attempts)} attempt files under "
                   f"{out_dir / 'logs'}", err=True)
        click.echo(f"wrote {res.requests:,} slot requests, {res.bytes_written:,} log bytes ({fmt}, wrapper {wrapper})",
                   err=True)
        click.echo(f"ground truth: {res.truth_path}", err=True)
