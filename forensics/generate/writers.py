"""Server-log writers: one llama-server generation each, vectorised with polars.

Input is one server's requests (one row per slot request, times in µs since the server started) and
its extra events.  Each writer produces rows ``(t, k, lvl, body, raw)``: ``t`` the time, ``k`` a
tie-breaker keeping the lines of one request in order, ``raw`` lines never get a prefix (era-4 timing
bodies).  ``render`` sorts them, adds the era's prefix and the wrapper, and writes the file in big
chunks.  Line shapes follow the log format catalog (§6, §7) and its samples.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import polars as pl

from forensics.errors import InputError

C = pl.col
S = pl.String


@dataclass(frozen=True)
class Era:
    name: str
    build: int
    commit: str
    prefix: bool  # M.SS.mmm.uuu L prefix on every line
    http_path: str


ERAS: dict[str, Era] = {
    "era5": Era("era5", 10587, "3f545becc", True, "/v1/chat/completions"),
    "era4": Era("era4", 4747, "c392e509", False, "/completion"),
    "era4-prefix": Era("era4-prefix", 7502, "e1f15b454", True, "/v1/chat/completions"),
}
WRAPPERS = ("none", "journald", "docker", "ansi", "router")


# -- formatting helpers (integer arithmetic, so the numbers are exact and deterministic) ------------------

def pad(e: pl.Expr, width: int) -> pl.Expr:
    return e.cast(S).str.pad_start(width)


def fixed(centi: pl.Expr, width: int) -> pl.Expr:
    """An integer count of hundredths as ``%{width}.2f``."""
    return pl.format("{}.{}", centi // 100, (centi % 100).cast(S).str.zfill(2)).str.pad_start(width)


def ratio(num: pl.Expr, den: pl.Expr, width: int, scale: int = 1) -> pl.Expr:
    """``scale * num / den`` hundredths as ``%{width}.2f`` (``inf``/``nan`` like printf when den is 0)."""
    centi = (2 * scale * num + den) // (2 * den)
    special = pl.when(num == 0).then(pl.lit("nan")).otherwise(pl.lit("inf")).str.pad_start(width)
    return pl.when(den == 0).then(special).otherwise(fixed(centi, width))


def micro6(num: pl.Expr, den: pl.Expr) -> pl.Expr:
    """``num / den`` (< 10) as ``%f`` (6 decimals)."""
    m = (2 * 1_000_000 * num + den) // (2 * den)
    return pl.format("{}.{}", m // 1_000_000, (m % 1_000_000).cast(S).str.zfill(6))


def dec(num: pl.Expr, den: pl.Expr, places: int) -> pl.Expr:
    f = 10**places
    m = (2 * f * num + den) // (2 * den)
    return pl.format("{}.{}", m // f, (m % f).cast(S).str.zfill(places))


def elapsed_ts(t: pl.Expr) -> pl.Expr:
    return pl.format("{}.{}.{}.{}", t // 60_000_000, ((t // 1_000_000) % 60).cast(S).str.zfill(2),
                     ((t // 1000) % 1000).cast(S).str.zfill(3), (t % 1000).cast(S).str.zfill(3))


def slot_head(func: str) -> pl.Expr:
    return pl.format(f"slot {func:>12.12}: id {{}} | task {{}} | ", pad(C("slot"), 2), C("task"))


def rows(df: pl.DataFrame, t: pl.Expr, order: int, lvl: str, body: pl.Expr, raw: bool = False) -> pl.DataFrame:
    return df.select(t.cast(pl.Int64).alias("t"), (C("ridx") * 64 + order).cast(pl.Int64).alias("k"),
                     pl.lit(lvl).alias("lvl"), body.cast(S).alias("body"), pl.lit(raw).alias("raw"))


# -- per-request pieces ---------------------------------------------------------------------------------

def _chunks(df: pl.DataFrame, nb: int) -> pl.DataFrame:
    """One row per prompt chunk (n_batch tokens): P = tokens in the slot after it, B = its size, tc = its end."""
    d = df.filter(C("timed_prompt")).with_columns(
        ((C("eval") + nb - 1) // nb).alias("nch"))
    d = d.with_columns(pl.int_ranges(0, C("nch")).alias("i")).explode("i")
    return d.with_columns(
        (C("cached") + pl.min_horizontal(C("i") * nb + nb, C("eval"))).alias("P"),
        pl.min_horizontal(pl.lit(nb), C("eval") - C("i") * nb).alias("B"),
        (C("cached") + C("i") * nb).alias("p0"),
    ).with_columns(
        (C("t_launch") + 62 + (C("t_pdone") - C("t_launch") - 62) * (C("P") - C("cached")) // C("eval")).alias("tc"),
        (C("t_launch") + 59 + (C("t_pdone") - C("t_launch") - 62) * (C("p0") - C("cached")) // C("eval")).alias("tk"),
        (C("i") == C("nch") - 1).alias("last"),
    )


def _timing_numbers(df: pl.DataFrame, era5: bool) -> dict[str, pl.Expr]:
    pc = (C("t_pdone") - C("t_launch")) // 10  # centi-ms
    gc = (C("t_end") - C("t_pdone")) // 10
    steps = (C("gen") - 1).clip(0) if era5 else C("gen")
    return {
        "prompt": pl.format("prompt eval time = {} ms / {} tokens ({} ms per token, {} tokens per second)",
                            fixed(pc, 10), pad(C("eval"), 5), ratio(pc, C("eval"), 8),
                            ratio(C("eval"), pc, 8, scale=10_000_000)),
        "eval": pl.format("       eval time = {} ms / {} tokens ({} ms per token, {} tokens per second)",
                          fixed(gc, 10), pad(C("gen"), 5), ratio(gc, steps, 8), ratio(steps, gc, 8, scale=10_000_000)),
        "total": pl.format("      total time = {} ms / {} tokens", fixed(pc + gc, 10), pad(C("eval") + C("gen"), 5)),
    }


def _tg_progress(df: pl.DataFrame) -> pl.DataFrame:
    """era 5: ``n_gen = …, tg = …, tg_3s = …`` once >= 100 tokens, at most every 3 s."""
    d = df.filter((C("gen") > 100) & C("t_pdone").is_not_null()).with_columns(
        ((C("t_gend") - C("t_pdone")) / C("gen")).alias("mpt"))
    d = d.filter(C("mpt") > 0).with_columns((3_000_000 / C("mpt")).ceil().cast(pl.Int64).clip(1).alias("dn"))
    d = d.with_columns(((C("gen") - 101) // C("dn") + 1).alias("cnt"))
    d = d.with_columns(pl.int_ranges(0, C("cnt")).alias("kk")).explode("kk")
    d = d.with_columns((100 + C("kk") * C("dn")).alias("n"))
    d = d.with_columns((C("t_pdone") + (C("n") * C("mpt")).cast(pl.Int64)).alias("tt"),
                       (100_000_000 / C("mpt")).round().cast(pl.Int64).alias("tgc"))
    body = slot_head("print_timing") + pl.format("n_gen = {}, tg = {} t/s, tg_3s = {} t/s", pad(C("n"), 6),
                                                 fixed(C("tgc"), 6), fixed(C("tgc"), 6))
    return d.select(C("tt").alias("t"), (C("ridx") * 64 + 20 + C("kk").clip(0, 20)).alias("k"),
                    pl.lit("I").alias("lvl"), body.alias("body"), pl.lit(False).alias("raw"))


def _pp_progress(df: pl.DataFrame, nb: int) -> pl.DataFrame:
    """era 5: ``prompt processing, n_tokens = …`` per chunk once the prompt has taken >= 3 s."""
    d = _chunks(df.filter((C("t_pdone") - C("t_launch")) >= 3_000_000), nb)
    d = d.filter((C("tc") - C("t_launch")) >= 3_000_000).with_columns(
        (C("P") - C("cached")).alias("done_n"), (C("tc") - C("t_launch")).alias("el"))
    body = slot_head("print_timing") + pl.format(
        "prompt processing, n_tokens = {}, progress = {}, t = {} s / {} tokens per second",
        pad(C("done_n"), 6), dec(C("P"), C("prompt_logged"), 2), fixed((C("el") + 5000) // 10_000, 6),
        ratio(C("done_n"), C("el"), 1, scale=100_000_000).str.strip_chars_start())
    return d.select(C("tc").alias("t"), (C("ridx") * 64 + 4 + C("i").clip(0, 14)).alias("k"),
                    pl.lit("I").alias("lvl"), body.alias("body"), pl.lit(False).alias("raw"))


def _select_line(df: pl.DataFrame, lcp_word: str) -> pl.DataFrame:
    lcp = (C("cached") * 10 > C("prompt_logged")) & (C("t_last_prev") >= 0)
    sim = dec(C("cached"), C("prompt_logged"), 3)
    keep = dec(C("cached"), C("prev_n_past").clip(1), 3)
    body = slot_head("get_availabl").str.replace(r"task \d+ \|", "task -1 |") + pl.when(lcp).then(
        pl.format(f"selected slot by LCP similarity, {lcp_word} = {{}} (> 0.100 thold), f_keep = {{}}", sim, keep)
    ).otherwise(pl.format("selected slot by LRU, t_last = {}",
                          pl.when(C("t_last_prev") < 0).then(-1).otherwise(C("t_last_prev") + C("clock0"))))
    return rows(df, C("t_launch") - 174, 0, "I", body)


def era5_lines(df: pl.DataFrame, nb: int) -> list[pl.DataFrame]:
    ok = df.filter(C("timed"))
    err_ctx = df.filter(C("error_kind") == "context")
    err_slot = df.filter(C("error_kind") == "slot_exception")
    canc = df.filter(C("cancel_t").is_not_null())
    tn = _timing_numbers(ok, True)
    rel = slot_head("     release") + pl.format("stop processing: n_tokens = {}, truncated = {}", C("n_past_end"),
                                                 C("truncated").cast(pl.Int8))
    out = [
        _select_line(df, "f_sim_best"),
        rows(df, C("t_launch"), 1, "I", slot_head("launch_slot_") + pl.lit("processing task, is_child = 0")),
        rows(err_ctx, C("t_launch") + 65, 2, "E", pl.format("srv    send_error: task id = {}, error: {}", C("task"), C("error"))),
        rows(err_slot, C("t_end") - 20, 2, "E", slot_head("  operator()") + C("error")),
        rows(err_slot, C("t_end") - 12, 3, "E", pl.format("srv    send_error: task id = {}, error: {}", C("task"), C("error"))),
        _pp_progress(df.filter(C("timed_prompt")), nb),
        _tg_progress(df),
        rows(canc, C("cancel_t"), 60, "W", pl.format("srv          stop: cancel task, id_task = {}", C("task"))),
        rows(ok, C("t_end") - 30, 50, "I", slot_head("print_timing") + tn["prompt"]),
        rows(ok, C("t_end") - 27, 51, "I", slot_head("print_timing") + tn["eval"]),
        rows(ok, C("t_end") - 24, 52, "I", slot_head("print_timing") + tn["total"]),
        rows(ok, C("t_end") - 21, 53, "I", slot_head("print_timing") + pl.format("   graphs reused = {}",
                                                                                  pad(C("graphs_reused"), 10))),
        rows(df, C("t_end"), 61, "I", rel),
    ]
    return out


def _era4_common(df: pl.DataFrame, nb: int, new: bool) -> list[pl.DataFrame]:
    """Prompt lines of era 4: new prompt, input truncated, kv trims, progress, prompt done, context shifts."""
    np_word = "task.n_tokens" if new else "n_prompt_tokens"
    out = [rows(df.filter(C("error_kind") != "exception"), C("t_launch") + 54, 2, "I",
                slot_head("update_slots") + pl.format(f"new prompt, n_ctx_slot = {{}}, n_keep = 0, {np_word} = {{}}",
                                                      C("n_ctx_slot"), C("prompt")))]
    out.append(rows(df.filter(C("input_truncated")), C("t_launch") + 58, 3, "W", slot_head("update_slots") + pl.format(
        "input truncated, n_ctx = {}, n_keep = 0, n_left = {}, n_prompt_tokens = {}", C("n_ctx_slot"), C("n_ctx_slot"),
        C("prompt_logged"))))
    ch = _chunks(df, nb)
    kk = C("ridx") * 64 + 4 + 2 * C("i").clip(0, 10)
    if new:
        rm = pl.format("n_tokens = {}, memory_seq_rm [{}, end)", C("p0"), C("p0"))
        prog = pl.format("prompt processing progress, n_tokens = {}, batch.n_tokens = {}, progress = {}", C("P"), C("B"),
                         micro6(C("P") - C("cached"), C("prompt_logged")))
        done = pl.format("prompt done, n_tokens = {}, batch.n_tokens = {}", C("P"), C("B"))
    else:
        rm = pl.format("kv cache rm [{}, end)", C("p0"))
        prog = pl.format("prompt processing progress, n_past = {}, n_tokens = {}, progress = {}", C("P"), C("B"),
                         micro6(C("P") - C("cached"), C("prompt_logged")))
        done = pl.format("prompt done, n_past = {}, n_tokens = {}", C("P"), C("B"))
    head = slot_head("update_slots")
    lv = pl.lit("I")
    out.append(ch.select(C("tk").alias("t"), kk.alias("k"), lv.alias("lvl"), (head + rm).alias("body"),
                         pl.lit(False).alias("raw")))
    out.append(ch.select(C("tc").alias("t"), (kk + 1).alias("k"), lv.alias("lvl"), (head + prog).alias("body"),
                         pl.lit(False).alias("raw")))
    last = ch.filter(C("last"))
    out.append(last.select((C("tc") + 5).alias("t"), (C("ridx") * 64 + 30).alias("k"), lv.alias("lvl"),
                           (head + done).alias("body"), pl.lit(False).alias("raw")))
    sh = df.filter(C("n_shifts") > 0).explode("shift_j", "shift_left", "shift_disc").with_columns(
        (C("t_pdone") + C("shift_j") * (C("t_gend") - C("t_pdone")) // C("gen").clip(1)).alias("ts"))
    out.append(rows(sh, C("ts"), 31, "W", head + pl.format("slot context shift, n_keep = 1, n_left = {}, n_discard = {}",
                                                           C("shift_left"), C("shift_disc"))))
    lim = df.filter(C("ctx_train_limited") & C("timed"))
    out.append(rows(lim, C("t_end") - 40, 40, "W", slot_head("process_toke") + pl.format(
        "n_predict ({}) is set for infinite generation. Limiting generated tokens to n_ctx_train ({}) to avoid "
        "EOS-less generation infinite loop", pl.lit(-1), C("n_ctx_train"))))
    return out


def era4_lines(df: pl.DataFrame, nb: int, prefixed: bool) -> list[pl.DataFrame]:
    new = prefixed  # era4-prefix is b7502: newer wordings
    ok = df.filter(C("timed"))
    tn = _timing_numbers(ok, False)
    past = "n_tokens" if new else "n_past"
    rel = slot_head("     release") + pl.format(f"stop processing: {past} = {{}}, truncated = {{}}", C("n_past_end"),
                                                 C("truncated").cast(pl.Int8))
    out = _era4_common(df.filter(C("error_kind") != "context"), nb, new)
    out.append(rows(df, C("t_launch"), 1, "I", slot_head("launch_slot_") + pl.lit("processing task")))
    if new:
        out.append(rows(df, C("t_launch") - 400, 0, "I", pl.lit("srv  params_from_: Chat format: Content-only")))
        out.append(_select_line(df, "sim_best").with_columns(C("k") + 0))
        out.append(rows(df, C("t_launch") - 6, 0, "I", slot_head("launch_slot_").str.replace(r"task \d+ \|", "task -1 |")
                        + pl.lit("sampler chain: logits -> penalties -> dry -> top-n-sigma -> top-k -> typical -> "
                                 "top-p -> min-p -> xtc -> temp-ext -> dist ")))
        ctx = df.filter(C("error_kind") == "context")
        out.append(rows(ctx, C("t_launch") + 54, 2, "I", slot_head("update_slots") + pl.format(
            "new prompt, n_ctx_slot = {}, n_keep = 0, task.n_tokens = {}", C("n_ctx_slot"), C("prompt"))))
        out.append(rows(ctx, C("t_launch") + 64, 3, "E", pl.format("srv    send_error: task id = {}, error: {}",
                                                                    C("task"), C("error"))))
        cancel = pl.format("srv          stop: cancel task, id_task = {}", C("task"))
    else:
        cancel = pl.format("srv  cancel_tasks: cancel task, id_task = {}", C("task"))
    err_slot = df.filter(C("error_kind") == "slot_exception")
    out.append(rows(err_slot, C("t_end") - 12, 45, "E", pl.format("srv    send_error: task id = {}, error: {}", C("task"),
                                                                   C("error"))))
    canc = df.filter(C("cancel_t").is_not_null())
    out.append(rows(canc, C("cancel_t"), 46, "W", cancel))
    t_tim = C("t_end") + (-19 if new else 30)
    order_tim = 50 if new else 62
    out.append(rows(ok, t_tim, order_tim, "I", slot_head("print_timing")))
    for j, key in enumerate(("prompt", "eval", "total")):
        out.append(rows(ok, t_tim, order_tim + 1 + j, "I", tn[key], raw=True))
    out.append(rows(df, C("t_end"), 61 if new else 48, "I", rel))
    out.append(rows(df.filter(C("idle_after")), C("t_end") + 40, 63, "I", pl.lit("srv  update_slots: all slots are idle")))
    http = pl.format("srv  log_server_r: request: POST {} 127.0.0.1 {}", C("http_path"), C("http_status"))
    out.append(rows(df.filter(C("http_status").is_not_null()), C("t_resp"), 63, "I", http))
    return out


# -- banners and extra events ---------------------------------------------------------------------------

def banner(era: str, info: dict[str, object]) -> list[tuple[int, str, str, bool]]:
    """Startup lines: (µs after start, level, body, raw)."""
    host, port, np_, nctx, model = info["host"], info["port"], info["np"], info["n_ctx_slot"], info["model"]
    if era == "era5":
        b = [
            (93, "I", "cmn  common_param: common_params_print_info: verbosity = 3 (adjust with the `-lv N` CLI arg)"),
            (11820, "I", f"srv    load_model: loading model '{model}'"),
            (2871455, "I", f"srv    load_model: initializing, n_slots = {np_}, n_ctx_slot = {nctx}, kv_unified = 'false'"),
            (2955118, "I", "srv  llama_server: model loaded"),
            (2955301, "I", f"srv  llama_server: listening on http://{host}:{port}"),
        ]
        if port == 8080:
            b += [(2955305, "W", "srv  llama_server: NOTICE: server default port will be changed to :9931 in a future release"),
                  (2955306, "W", "srv  llama_server:         ref: https://github.com/ggml-org/llama.cpp/pull/26508")]
        return [(t, lv, body, False) for t, lv, body in b]
    sysinfo = ("system_info: n_threads = 8 (n_threads_batch = 8) / 16 | CUDA : ARCHS = 890 | USE_GRAPHS = 1 | "
               "PEER_MAX_BATCH_SIZE = 128 | CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | "
               "LLAMAFILE = 1 | OPENMP = 1 | AARCH64_REPACK = 1 | ")
    template = ["main: chat template, chat_template: {% for message in messages %}{{'<|im_start|>' + message['role'] "
                "+ '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
                "{{ '<|im_start|>assistant\\n' }}{% endif %}, example_format: '<|im_start|>system",
                "You are a helpful assistant<|im_end|>", "<|im_start|>user", "Hello<|im_end|>",
                "<|im_start|>assistant", "Hi there<|im_end|>", "<|im_start|>user", "How are you?<|im_end|>",
                "<|im_start|>assistant", "'"]
    slots_new = [f"slot   load_model: id {i:2d} | task -1 | new slot, n_ctx = {nctx}" for i in range(int(np_))]  # type: ignore[call-overload]
    slots_old = [f"slot         init: id {i:2d} | task -1 | new slot n_ctx_slot = {nctx}" for i in range(int(np_))]  # type: ignore[call-overload]
    if era == "era4":
        lines = ["build: 4747 (c392e509) with cc (Ubuntu 13.3.0-6ubuntu2~24.04) 13.3.0 for x86_64-linux-gnu",
                 "system info: n_threads = 8, n_threads_batch = 8, total_threads = 16", "", sysinfo, "",
                 f"main: HTTP server is listening, hostname: {host}, port: {port}, http threads: 15",
                 "main: loading model", f"srv    load_model: loading model '{model}'",
                 f"llama_model_loader: loaded meta data with 24 key-value pairs and 291 tensors from {model} (version GGUF V3 (latest))",
                 f"print_info: n_ctx_train      = {info['n_ctx_train']}",
                 f"llama_init_from_model: n_seq_max     = {np_}",
                 f"llama_init_from_model: n_ctx         = {info['n_ctx']}",
                 f"llama_init_from_model: n_ctx_per_seq = {nctx}",
                 f"srv          init: initializing slots, n_slots = {np_}", *slots_old, "main: model loaded",
                 *template, f"main: server is listening on http://{host}:{port} - starting the main loop",
                 "srv  update_slots: all slots are idle"]
        return [(100 + 1000 * i, "I", line, False) for i, line in enumerate(lines)]
    lines2: list[tuple[str, str, bool]] = [
        ("I", "build: 7502 (e1f15b454) with cc (Ubuntu 13.3.0-6ubuntu2~24.04) 13.3.0 for x86_64-linux-gnu", False),
        ("I", "system info: n_threads = 8, n_threads_batch = 8, total_threads = 16", False), ("I", "", False),
        ("I", sysinfo, False), ("I", "", False), ("I", "init: using 15 threads for HTTP server", False),
        ("I", "start: binding port with default address family", False), ("I", "main: loading model", False),
        ("I", f"srv    load_model: loading model '{model}'", False),
        ("I", f"llama_context: n_seq_max     = {np_}", False), ("I", f"llama_context: n_ctx         = {info['n_ctx']}", False),
        ("I", f"llama_context: n_ctx_seq     = {nctx}", False),
        ("I", f"srv    load_model: initializing slots, n_slots = {np_}", False), *[("I", s, False) for s in slots_new],
        ("W", "srv    load_model: prompt cache is enabled, size limit: 8192 MiB", False),
        ("I", "load_model: " + template[0][len("main: "):], False), *[("I", x, True) for x in template[1:]],
        ("I", "main: model loaded", False), ("I", f"main: server is listening on http://{host}:{port}", False),
        ("I", "main: starting the main loop...", False), ("I", "srv  update_slots: all slots are idle", False)]
    return [(400 + 1500 * i, lv, body, raw) for i, (lv, body, raw) in enumerate(lines2)]


def extra_lines(era: str, extras: pl.DataFrame, http_path: str) -> list[pl.DataFrame]:
    if extras.is_empty():
        return []
    out = []
    exc = extras.filter(C("kind") == "exception")
    msg = "Failed to parse messages: Missing 'content' in message"
    k = (C("eidx") + 1) * 64 + 10**15
    if era == "era4":
        body = pl.lit(f'got exception: {{"code":500,"message":"{msg}","type":"server_error"}}')
    else:
        body = pl.lit(f'srv    operator(): got exception: {{"error":{{"code":500,"message":"{msg}","type":"server_error"}}}}')
    out.append(exc.select(C("t"), k.alias("k"), pl.lit("W").alias("lvl"), body.alias("body"), pl.lit(False).alias("raw")))
    if era != "era5":
        out.append(exc.select((C("t") + 300).alias("t"), (k + 1).alias("k"), pl.lit("I").alias("lvl"),
                              pl.lit(f"srv  log_server_r: request: POST {http_path} 127.0.0.1 500").alias("body"),
                              pl.lit(False).alias("raw")))
    canc = extras.filter(C("kind") == "cancel")
    word = "srv  cancel_tasks" if era == "era4" else "srv          stop"
    out.append(canc.select(C("t"), k.alias("k"), pl.lit("W").alias("lvl"),
                           pl.format(f"{word}: cancel task, id_task = {{}}", C("task")).alias("body"),
                           pl.lit(False).alias("raw")))
    return out


# -- rendering ------------------------------------------------------------------------------------------

LEVEL_COLOR = {"I": "\x1b[32mI \x1b[0m", "W": "\x1b[35mW ", "E": "\x1b[31mE ", "D": "\x1b[33mD "}


@dataclass(frozen=True)
class LogHost:
    """What a server's prefix and wrapper print besides the body: its launch time, host, pid and port."""
    launched_at: datetime
    hostname: str
    pid: int
    port: int
    ts_shift_us: int = 0  # the router's own clock started this much later than the server's


def finish_lines(lines: pl.DataFrame, era: Era, wrapper: str, host: LogHost) -> pl.DataFrame:
    """Sorted rows → one ``line`` column with the era's prefix and the wrapper applied."""
    ts_shift_us = host.ts_shift_us
    lines = lines.sort(["t", "k"])
    body = C("body")
    if era.prefix:
        if wrapper == "ansi":
            lvl = pl.col("lvl").replace_strict(LEVEL_COLOR, default=pl.col("lvl") + " ")
            pre = pl.format("\x1b[34m{}\x1b[0m {}", elapsed_ts(C("t") + ts_shift_us), lvl)
        else:
            pre = pl.format("{} {} ", elapsed_ts(C("t") + ts_shift_us), C("lvl"))
        body = pl.when(C("raw")).then(body).otherwise(pre + body)
        if wrapper == "ansi":
            reset = (C("lvl").shift(1).is_in(["W", "E", "D"]) & ~C("raw").shift(1)).fill_null(False)
            body = pl.when(reset).then(pl.lit("\x1b[0m") + body).otherwise(body)
    elif wrapper == "ansi":
        raise InputError(f"the ansi wrapper needs a format with a log prefix, not {era.name}",
                         hint="use --format era5 or era4-prefix")
    abs_t = pl.lit(host.launched_at).dt.replace_time_zone(None) + pl.duration(microseconds=C("t"))
    if wrapper == "journald":
        body = pl.format("{} {} llama-server[{}]: {}", abs_t.dt.strftime("%b %d %H:%M:%S"), pl.lit(host.hostname),
                         pl.lit(host.pid), body)
    elif wrapper == "docker":
        body = pl.format("{} {}", abs_t.dt.strftime("%Y-%m-%dT%H:%M:%S.%9fZ"), body)
    elif wrapper == "router":
        body = pl.format("[{}] {}", pl.lit(f"{host.port:5d}"), body)
    return lines.select(C("t"), C("k"), body.alias("line"))


def write_lines(frames: list[pl.DataFrame], fh: object) -> int:
    """Write ``line`` columns to an open binary file; returns bytes written."""
    n = 0
    for f in frames:
        if f.is_empty():
            continue
        import io

        buf = io.BytesIO()
        f.select("line").write_csv(buf, include_header=False, quote_style="never")
        data = buf.getvalue()
        fh.write(data)  # type: ignore[attr-defined]
        n += len(data)
    return n


RequestBuilder = Callable[[pl.DataFrame], list[pl.DataFrame]]


def request_lines(era: str, df: pl.DataFrame, nb: int) -> list[pl.DataFrame]:
    if era == "era5":
        return era5_lines(df, nb)
    if era == "era4":
        return era4_lines(df, nb, prefixed=False)
    if era == "era4-prefix":
        return era4_lines(df, nb, prefixed=True)
    raise InputError(f"unknown log format {era!r}", hint=f"choose one of {', '.join(ERAS)}")


def empty_lines() -> pl.DataFrame:
    return pl.DataFrame(schema={"t": pl.Int64, "k": pl.Int64, "lvl": S, "body": S, "raw": pl.Boolean})


def router_lines(df: pl.DataFrame, info: dict[str, object], spawn_us: int) -> pl.DataFrame:
    """The router's own lines (router clock = child clock + spawn_us)."""
    model = Path(str(info["model"])).stem
    port = info["port"]
    head = [
        (88, "I", "cmn  common_param: common_params_print_info: verbosity = 3 (adjust with the `-lv N` CLI arg)"),
        (3402, "I", "srv  llama_server: starting server in router mode. models will be automatically loaded on-demand"),
        (3910, "I", "srv  llama_server: listening on http://127.0.0.1:8080"),
        (spawn_us - 400, "I", f"srv  ensure_model: model name={model} is not loaded, loading..."),
        (spawn_us - 50, "I", f"srv          load: spawning server instance with name={model} on port {port}"),
        (spawn_us, "I", f"srv  ensure_model: waiting until model name={model} is fully loaded..."),
    ]
    base = pl.DataFrame({"t": [h[0] - spawn_us for h in head], "k": list(range(-100, -100 + len(head))),
                         "lvl": [h[1] for h in head], "body": [h[2] for h in head], "raw": [False] * len(head)},
                        schema={"t": pl.Int64, "k": pl.Int64, "lvl": S, "body": S, "raw": pl.Boolean})
    prox = rows(df, C("t_launch") - 900, 0, "I",
                pl.lit(f"srv  proxy_reques: proxying request to model {model} on port {port}")).with_columns(C("k") - 1)
    return pl.concat([base, prox])
