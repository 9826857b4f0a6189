"""The package as a user gets it: build the wheel, install it into a clean virtualenv, use it from outside the
checkout, uninstall it, and check that nothing of it is left behind.  CI runs it (``.ci/run``); so can you:

    python -m tools.wheel_check [--keep] [--work DIR]

Steps, each one line on stdout (a failure is one line on stderr and exit 1):

1. ``pip wheel`` builds the wheel from the checkout (in pip's build isolation, so with the setuptools that
   ``[build-system]`` asks for).
2. A new virtualenv, without the system's packages, gets the wheel and its dependencies.
3. From a folder outside the checkout, with a home folder of its own (so the user's cache folder is a fresh one)
   and a ``parsers/`` folder of the user's own in it: ``forensics --help``, ``python -m forensics --version``,
   ``forensics generate`` (a run with a dead slot), ``forensics ingest``, one finding (``forensics deadslots``)
   and ``forensics report``.  The formats cache must land in the user's cache folder, the user's ``parsers/``
   must never run, and the installed package must be exactly the files its RECORD lists.
4. ``pip uninstall`` removes it: nothing of it (no ``forensics/``, ``parsers/``, ``llama_forensics-*``, no
   ``bin/forensics``) and no file the commands wrote may be left in the virtualenv.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OURS = ("forensics", "parsers", "llama_forensics")


class CheckFailed(Exception):
    """One step did not do what it should."""


def _run(cmd: list[str], *, cwd: Path, env: dict[str, str] | None = None, ok: tuple[int, ...] = (0,),
         timeout: float = 1800) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode not in ok:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        raise CheckFailed(f"`{' '.join(cmd[-4:])}` exited {proc.returncode}: " + " | ".join(tail))
    return proc


def _files(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file() or p.is_symlink()}


def _site_packages(venv: Path) -> Path:
    found = sorted(venv.glob("lib/python*/site-packages")) or sorted(venv.glob("Lib/site-packages"))
    if not found:
        raise CheckFailed(f"no site-packages in {venv}")
    return found[0]


def _bin(venv: Path, name: str) -> Path:
    return venv / ("Scripts" if os.name == "nt" else "bin") / name


def build_wheel(work: Path) -> Path:
    dist = work / "dist"
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(ROOT)], cwd=work)
    wheels = sorted(dist.glob("llama_forensics-*.whl"))
    if len(wheels) != 1:
        raise CheckFailed(f"expected one wheel in {dist}, found {[w.name for w in wheels]}")
    return wheels[0]


def install(work: Path, wheel: Path) -> Path:
    venv = work / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], cwd=work)
    _run([str(_bin(venv, "python")), "-m", "pip", "install", "-q", str(wheel)], cwd=work)
    return venv


def _record(site: Path) -> set[str]:
    """The files the installed distribution's RECORD lists (paths relative to site-packages)."""
    (record,) = site.glob("llama_forensics-*.dist-info/RECORD")
    listed = {line.rsplit(",", 2)[0] for line in record.read_text(encoding="utf-8").splitlines() if line}
    return {p for p in listed if not p.startswith("..")}  # the console script lives outside site-packages


def _user_folder(work: Path) -> tuple[Path, dict[str, str]]:
    """A working folder outside the checkout, a fresh home, and a ``parsers/`` folder of the user's own."""
    user = work / "user"
    (user / "parsers").mkdir(parents=True)
    for name in ("__init__", "errors", "spec"):
        (user / "parsers" / f"{name}.py").write_text("raise SystemExit('the user parsers/ folder ran')\n")
    keep = ("PATH", "LANG", "LC_ALL", "TMPDIR", "SYSTEMROOT", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    env.update(HOME=str(work / "home"), TZ="UTC", FORENSICS_STORE=str(user / "store"))
    return user, env


def use(venv: Path, work: Path) -> list[str]:
    """Run the installed command from outside the checkout; returns what each step said."""
    user, env = _user_folder(work)
    fx = [str(_bin(venv, "forensics"))]
    said = []
    help_text = _run([*fx, "--help"], cwd=user, env=env).stdout
    if "forensics ingest" not in help_text:
        raise CheckFailed("`forensics --help` does not list the commands")
    said.append("--help lists the commands")
    version = _run([str(_bin(venv, "python")), "-m", "forensics", "--version"], cwd=user, env=env).stdout.strip()
    said.append(f"python -m forensics --version: {version} (the user's parsers/ folder did not run)")
    _run([*fx, "generate", "sim", "--scenario", "deadslot"], cwd=user, env=env)
    ingest = _run([*fx, "ingest", "sim/logs"], cwd=user, env=env).stderr.strip().splitlines()[-1]
    said.append(f"ingest: {ingest}")
    dead = _run([*fx, "deadslots", "--format", "csv"], cwd=user, env=env).stdout.strip().splitlines()
    if len(dead) != 2 or not dead[1].startswith("run-deadslot,main,1,"):
        raise CheckFailed(f"deadslots should list the generated dead slot, said: {dead}")
    said.append(f"deadslots: {dead[1]}")
    _run([*fx, "report", "-o", "report.html"], cwd=user, env=env)
    size = (user / "report.html").stat().st_size
    if size < 10_000:
        raise CheckFailed(f"report.html is only {size} bytes")
    said.append(f"report: report.html, {size:,} bytes")
    caches = sorted((work / "home" / ".cache" / "llama-forensics").glob("formats-*.pickle")) \
        if sys.platform not in ("win32", "darwin") else []
    if sys.platform not in ("win32", "darwin") and len(caches) != 1:
        raise CheckFailed(f"expected the formats cache in the user's cache folder, found {caches}")
    said.append(f"formats cache: {caches[0].relative_to(work) if caches else 'the platform cache folder'}")
    return said


def uninstall(venv: Path, before: set[str]) -> None:
    site = _site_packages(venv)
    _run([str(_bin(venv, "python")), "-m", "pip", "uninstall", "-y", "-q", "llama-forensics"], cwd=venv)
    left = sorted(p for p in _files(site) if p.split("/")[0].split("-")[0] in OURS)
    if left:
        raise CheckFailed(f"pip uninstall left {len(left)} file(s) of ours in site-packages: {left[:5]}")
    if _bin(venv, "forensics").exists():
        raise CheckFailed("pip uninstall left bin/forensics")
    extra = sorted(_files(venv) - before)
    if extra:
        raise CheckFailed(f"running the commands left {len(extra)} file(s) in the virtualenv: {extra[:5]}")


def check(work: Path) -> list[str]:
    said = []
    t0 = time.monotonic()
    wheel = build_wheel(work)
    said.append(f"built {wheel.name} ({wheel.stat().st_size:,} bytes)")
    venv = install(work, wheel)
    site = _site_packages(venv)
    ours = {p for p in _files(site) if p.split("/")[0].split("-")[0] in OURS}
    record = _record(site)
    if ours != record:
        raise CheckFailed(f"installed files differ from the wheel's RECORD: {sorted(ours ^ record)[:5]}")
    if "LICENSE" not in {Path(p).name for p in record} or not any(p.endswith(".toml") for p in record):
        raise CheckFailed("the wheel lacks its LICENSE or its format files")
    said.append(f"installed into a clean virtualenv: {len(ours)} files, as the RECORD lists")
    # the virtualenv as it must be once the package is uninstalled: everything but the package's own files
    before = _files(venv) - {str(site.relative_to(venv) / p) for p in ours} - {
        str(_bin(venv, "forensics").relative_to(venv))}
    said += use(venv, work)
    installed_now = {p for p in _files(site) if p.split("/")[0].split("-")[0] in OURS}
    if installed_now != ours:
        raise CheckFailed(f"the commands wrote into the installed package: {sorted(installed_now - ours)[:5]}")
    uninstall(venv, before)
    said.append(f"uninstalled: nothing of it left in the virtualenv ({time.monotonic() - t0:.0f} s in all)")
    return said


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, help="work in this folder (default: a new temporary one)")
    ap.add_argument("--keep", action="store_true", help="keep the work folder (the wheel, the venv, the store)")
    args = ap.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="forensics-wheel-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        for line in check(work.resolve()):
            print(f"wheel check: {line}", flush=True)
    except (CheckFailed, subprocess.TimeoutExpired) as exc:
        print(f"wheel check: FAILED: {exc}", file=sys.stderr)
        return 1
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
