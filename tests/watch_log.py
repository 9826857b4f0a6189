"""Lines of a llama-server log (2026 build, `--log-prefix --log-timestamps`), written the way the real server in
fixtures/server-runs/real-2026 writes them, for tests and the benchmark that append to a log while `watch`
follows it.  The banner and the normal requests are that log's own lines; other requests use its line shapes
with other numbers, and the crash is a real crash line (fixtures/real/crash-llamacpp-19169.log)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REAL = ROOT / "fixtures" / "server-runs" / "real-2026" / "server.log"
CRASH = "D:\\a\\llama.cpp\\llama.cpp\\ggml\\src\\ggml-cuda\\fattn.cu:469: fatal error"


def real_lines() -> list[str]:
    return REAL.read_text(encoding="utf-8").splitlines(keepends=True)


def banner() -> list[str]:
    """The real server's start: up to `listening on` (8 lines)."""
    lines = real_lines()
    end = next(i for i, line in enumerate(lines) if "listening on" in line)
    return lines[: end + 1]


def normal_requests() -> list[str]:
    """The real log's 48 requests (its lines after the banner, without the final `cleaning up`)."""
    lines = real_lines()
    start = len(banner())
    return [line for line in lines[start:] if "cleaning up" not in line]


def ts(seconds: float) -> str:
    us = round(seconds * 1e6)
    m, rest = divmod(us, 60_000_000)
    s, rest = divmod(rest, 1_000_000)
    ms, u = divmod(rest, 1000)
    return f"{m}.{s:02d}.{ms:03d}.{u:03d}"


def start(slot: int, task: int, at: float) -> list[str]:
    return [f"{ts(at)} I slot get_availabl: id  {slot} | task -1 | selected slot by LRU, t_last = -1\n",
            f"{ts(at + 0.0001)} I slot launch_slot_: id  {slot} | task {task} | processing task, is_child = 0\n"]


def progress(slot: int, task: int, at: float, n: int) -> list[str]:
    return [f"{ts(at)} I slot print_timing: id  {slot} | task {task} | n_decoded = {n:>6}, tg =  66.10 t/s\n"]


def end(slot: int, task: int, at: float, prompt: int, gen: int, ms_per_token: float = 15.0) -> list[str]:
    """Timings and release of a request that ends at ``at``."""
    p_ms, g_ms = prompt * 2.6, gen * ms_per_token
    head = f"{ts(at)} I slot print_timing: id  {slot} | task {task} |"
    return [
        f"{head} prompt eval time = {p_ms:10.2f} ms / {prompt:5d} tokens ({p_ms / prompt:8.2f} ms per token, "
        f"{1000 * prompt / p_ms:8.2f} tokens per second)\n",
        f"{head}        eval time = {g_ms:10.2f} ms / {gen:5d} tokens ({g_ms / gen:8.2f} ms per token, "
        f"{1000 * gen / g_ms:8.2f} tokens per second)\n",
        f"{head}       total time = {p_ms + g_ms:10.2f} ms / {prompt + gen:5d} tokens\n",
        f"{head}    graphs reused = {gen - 3:10d}\n",
        f"{ts(at + 0.0001)} I slot      release: id  {slot} | task {task} | stop processing: "
        f"n_tokens = {prompt + gen - 1}, truncated = 0\n",
    ]


def request(slot: int, task: int, at: float, prompt: int, gen: int, ms_per_token: float = 15.0) -> list[str]:
    took = (prompt * 2.6 + gen * ms_per_token) / 1000.0
    return start(slot, task, at) + end(slot, task, at + took, prompt, gen, ms_per_token)


def crash(at: float) -> list[str]:
    """A CUDA kernel's fatal error (the real line), as the process dies: no prefix, no time."""
    return [f"{ts(at)} I slot launch_slot_: id  0 | task 900 | processing task, is_child = 0\n", CRASH + "\n"]
