"""The store's tables and their columns: the contract every module and the docs share.

Each table is a list of ``Column(name, type, description)``, the type named (``I64``, ``STR``, ...) so that the
CLI can read the tables without loading polars; ``Column.dtype`` is the polars type.  The table reference (docs/tables.md) is
checked against this module by a test, so the two cannot drift.  ``events`` also carries one column per
typed field declared in ``parsers/formats/fields.toml`` (see ``events_columns``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

from forensics.lazy import lazy_import

if TYPE_CHECKING:
    import polars as pl
else:  # loaded on first use: the CLI reads the table names to build its help (forensics.lazy)
    pl = lazy_import("polars")

# A column's type by name, turned into polars' type when a frame needs it (``Column.dtype``, ``polars_type``)
I64, F64, STR, BOOL, TS, LIST_STR = "Int64", "Float64", "String", "Boolean", "Datetime[us, UTC]", "List[String]"


@cache
def polars_type(kind: str) -> pl.DataType:
    """The polars type of a column type named here (``I64`` ... ``LIST_STR``)."""
    return {I64: pl.Int64(), F64: pl.Float64(), STR: pl.String(), BOOL: pl.Boolean(), TS: pl.Datetime("us", "UTC"),
            LIST_STR: pl.List(pl.String())}[kind]


@dataclass(frozen=True)
class Column:
    name: str
    kind: str  # I64, F64, STR, BOOL, TS or LIST_STR
    description: str

    @property
    def dtype(self) -> pl.DataType:
        return polars_type(self.kind)

FILES = [
    Column("path", STR, "path of the input file as given (relative paths are kept relative)"),
    Column("file_id", STR, "stable id of the file in the store (hash of its resolved path)"),
    Column("run", STR, "run the file's records belong to"),
    Column("format", STR, "detected (or forced) format name"),
    Column("compression", STR, "gzip, zstd or null"),
    Column("size_bytes", I64, "size of the file on disk when ingested"),
    Column("bytes_read", I64, "bytes of (decompressed) content parsed so far"),
    Column("held_back_bytes", I64, "bytes of an unterminated last line not read yet (file still being written)"),
    Column("lines_total", I64, "lines read so far"),
    Column("lines_parsed", I64, "lines recognised as a record or as the continuation of one"),
    Column("lines_skipped", I64, "blank lines and lines deliberately ignored (see skipped_by_kind)"),
    Column("lines_unparsed", I64, "lines no pattern recognised (kept in the unparsed table)"),
    Column("skipped_by_kind", STR, "JSON object: skipped line counts by kind"),
    Column("head_sha256", STR, "hash of the first 4 KiB, to notice a file replaced under the same path"),
    Column("mtime", F64, "modification time of the file when ingested (epoch seconds)"),
    Column("ingested_at", TS, "when the file was (last) ingested"),
]

INSTANCES = [
    Column("run", STR, "run of the file"),
    Column("instance", STR, "instance id: file label, router child port, and #N for the Nth start in the file"),
    Column("path", STR, "log file the instance was read from"),
    Column("format", STR, "format of the lines"),
    Column("router_port", I64, "router child port when the lines came through a router ([port] prefix)"),
    Column("build", I64, "llama.cpp build number when logged"),
    Column("commit", STR, "llama.cpp commit when logged"),
    Column("model", STR, "model path or name when logged"),
    Column("n_ctx", I64, "whole-server context size when logged"),
    Column("n_slots", I64, "number of slots (-np) when logged, else the number of slots seen"),
    Column("n_ctx_slot", I64, "context size of one slot when logged"),
    Column("n_ctx_train", I64, "training context of the model when logged"),
    Column("host", STR, "listen host when logged"),
    Column("port", I64, "listen port when logged"),
    Column("started_at", TS, "absolute start time when known (anchor or absolute prefix)"),
    Column("time_basis", STR, "absolute (times on the lines), elapsed, anchored (elapsed, given a wall-clock start by "
           "--started-at), or order (no time on the lines); where the replay join placed the requests is their "
           "clock (requests.clock) and its offset matches.offset_s"),
    Column("line_first", I64, "first line of the instance in the file"),
    Column("line_last", I64, "last line of the instance in the file"),
    Column("requests", I64, "requests the instance served"),
    Column("crashed", BOOL, "the process died: a failed assert, an abort, an uncaught exception, a signal, a GPU "
           "out-of-memory (its lines are events of role crash)"),
    Column("crash", STR, "what the crash said (the first crash line's message)"),
    Column("crash_line", I64, "first line of the crash"),
]

EVENTS_BASE = [
    Column("run", STR, "run of the file"),
    Column("path", STR, "log file"),
    Column("line_no", I64, "1-based line number in the file"),
    Column("instance", STR, "instance the line belongs to"),
    Column("kind", STR, "line kind (see the format definitions)"),
    Column("role", STR, "what the line means for its request or instance: start, release, timing_prompt, timing_eval, "
           "timing_total, progress, error, cancel, crash, crash_detail, http, ... (the kind's role in its format file)"),
    Column("level", STR, "level letter or word when logged (I, W, E, D, INFO, ...)"),
    Column("elapsed_s", F64, "seconds since the process started, when the line carries elapsed time"),
    Column("ts", TS, "absolute time when known"),
    Column("host_wrapper", STR, "host name from a syslog/journald wrapper"),
]

REQUESTS = [
    Column("run", STR, "run the request belongs to"),
    Column("instance", STR, "server instance (file, router port, restart) that served it"),
    Column("path", STR, "log file"),
    Column("slot", I64, "slot id"),
    Column("task", I64, "task id (a join key only: task ids jump)"),
    Column("seq", I64, "order of the request on its slot within the instance (1, 2, ...)"),
    Column("prompt_tokens", I64, "prompt tokens, cache included (new prompt line, or n_past - gen + 1)"),
    Column("prompt_eval_tokens", I64, "prompt tokens evaluated (timings; cache excluded)"),
    Column("cached_tokens", I64, "prompt tokens served from cache, where logged or derivable"),
    Column("gen_tokens", I64, "generated tokens"),
    Column("prompt_ms", F64, "prompt processing time"),
    Column("gen_ms", F64, "generation time"),
    Column("total_ms", F64, "total time as logged (prompt + generation)"),
    Column("gen_tok_per_s", F64, "gen_tokens / gen_ms * 1000"),
    Column("n_past_end", I64, "tokens in the slot at release (n_past / n_tokens)"),
    Column("n_ctx_slot", I64, "context size of the slot when known"),
    Column("stop_reason", STR, "eos (ended by itself: EOS or a stop word), limit, word, context, cancelled, error, unknown"),
    Column("truncated", BOOL, "released with truncated = 1 (context shift, truncation or context full)"),
    Column("prompt_truncated", BOOL, "the prompt did not fit the slot and was cut (`input truncated`)"),
    Column("context_shift", BOOL, "a context shift happened during the request"),
    Column("n_predict", I64, "output cap in force when logged (-1 = none)"),
    Column("http_status", I64, "HTTP status of the request line tied to it, when logged"),
    Column("http_path", STR, "HTTP path of the request line tied to it"),
    Column("error", STR, "error text tied to the task (send_error, exception)"),
    Column("complete", BOOL, "the log shows the request's end (release or timings)"),
    Column("read_by", STR, "format: read from lines a format knows; general: from lines of a layout no format knows, "
           "by the general rule (a slot or task id with token counts or timings, parsers/formats/general.toml)"),
    Column("t_start", TS, "absolute start time when an anchor exists"),
    Column("t_end", TS, "absolute end time when an anchor exists"),
    Column("clock", STR, "how t_start/t_end were placed: log (the line's own absolute time), anchored (elapsed time "
           "plus the manifest's launched_at or the instance's known start), aligned (elapsed time plus the offset that "
           "lines the attempts' send times up with the requests), attempt (no time on the lines: at the send of the "
           "attempt it served), order (no time on the lines: estimated from the order on its slot); null: nothing "
           "places it. A request that ran never gets t_end <= t_start: an end that cannot be placed is null"),
    Column("elapsed_start_s", F64, "start, seconds since process start (when the log has elapsed time)"),
    Column("elapsed_end_s", F64, "end, seconds since process start"),
    Column("line_first", I64, "first line of the request (evidence)"),
    Column("line_last", I64, "last line of the request (evidence)"),
    Column("replay_run", STR, "the replay run the join attributed it to (the attempt it served, else the run whose "
                              "time window holds it); null without replay records"),
]

UNPARSED = [
    Column("run", STR, "run of the file"),
    Column("path", STR, "file"),
    Column("line_no", I64, "1-based line number"),
    Column("text", STR, "the line as read (invalid UTF-8 replaced)"),
    Column("shape", STR, "the line with numbers and hex ids masked, for grouping"),
]

RUNS = [
    Column("run", STR, "run id"),
    Column("started_at", TS, "run start"),
    Column("ended_at", TS, "run end"),
    Column("concurrency", I64, "client concurrency / np of the run"),
    Column("model", STR, "model"),
    Column("ended_how", STR, "completed, killed, crashed, unknown"),
    Column("ended_detail", STR, "e.g. killed by a watchdog after N s"),
    Column("items_expected", I64, "size of the expected universe of items"),
    Column("stages", STR, "JSON array of stage names"),
    Column("config", STR, "JSON object: free-form run configuration and budgets"),
    Column("servers", STR, "JSON array: server instances (name, host:port, log file, launched_at)"),
    Column("source", STR, "manifest file"),
    Column("items", STR, "JSON array: the expected universe of items (null when the run has no manifest)"),
    Column("stage_items", STR, "JSON object: stage -> the items the manifest sends through it (a stage not named applies "
                               "to the items sent to it at least once)"),
    Column("summary_requests", I64, "requests the run's summary counts (a summary-only file: no per-request rows)"),
    Column("summary_ok", I64, "requests the summary counts as completed"),
    Column("summary_failed", I64, "requests the summary counts as failed"),
    Column("summary_input_tokens", I64, "prompt tokens the summary counts"),
    Column("summary_output_tokens", I64, "generated tokens the summary counts"),
    Column("summary_duration_s", F64, "run duration the summary states"),
    Column("alias", STR, "the run id the records carry, when they were tied to this run (the server log's run in the "
                         "same folder, or --run)"),
]

ATTEMPTS = [
    Column("run", STR, "run id"),
    Column("item", STR, "item (e.g. a ticker)"),
    Column("stage", STR, "stage name"),
    Column("attempt", I64, "attempt number (1 = first try)"),
    Column("server", STR, "server instance name used by the harness"),
    Column("started_at", TS, "client send time"),
    Column("ended_at", TS, "client end time"),
    Column("http_status", I64, "HTTP status (null = no response)"),
    Column("error", STR, "client-side error text"),
    Column("outcome", STR, "ok, failed, parse_error, timeout, cancelled"),
    Column("id_slot", I64, "slot id from the server's response"),
    Column("tokens_evaluated", I64, "prompt tokens (response)"),
    Column("tokens_predicted", I64, "generated tokens (response)"),
    Column("stop_type", STR, "stop type from the response (eos, limit, word, none)"),
    Column("truncated", BOOL, "truncated flag from the response"),
    Column("prompt_n", I64, "timings.prompt_n"),
    Column("prompt_ms", F64, "timings.prompt_ms"),
    Column("predicted_n", I64, "timings.predicted_n"),
    Column("predicted_ms", F64, "timings.predicted_ms"),
    Column("output_text", STR, "output text when kept"),
    Column("output_chars", I64, "output length in characters"),
    Column("max_tokens", I64, "output cap the request asked for"),
    Column("latency_ms", F64, "client-side latency: send to last byte"),
    Column("ttft_ms", F64, "client-side time to first token"),
    Column("itl_ms", F64, "client-side mean inter-token latency"),
    Column("started_rel_s", F64, "send time on the records' own clock (seconds from the file's first relative time), "
                                 "when no wall-clock anchor placed it (started_at is then empty)"),
    Column("ended_rel_s", F64, "end time on the records' own clock, likewise"),
    Column("source", STR, "records file"),
    Column("source_line", I64, "line in the records file"),
    Column("alias", STR, "the run id the record carries, when it was tied to this run (see runs.alias)"),
]

ITEMS = [
    Column("run", STR, "run id"),
    Column("item", STR, "item"),
    Column("stage", STR, "stage"),
    Column("attempts", I64, "attempts made"),
    Column("outcome", STR, "final outcome: ok, or the outcome of the last attempt, or never_attempted"),
    Column("done", BOOL, "the item x stage finished ok"),
]

MATCHES = [
    Column("run", STR, "run id of the attempt"),
    Column("item", STR, "item"),
    Column("stage", STR, "stage"),
    Column("attempt", I64, "attempt number"),
    Column("instance", STR, "server instance of the matched request (best guess when ambiguous)"),
    Column("server", STR, "the server the attempt reached, by the manifest's name: the attempt's own server; else "
           "the manifest server whose log holds the matched request; else (ambiguous) the one server all its "
           "candidates are on; else the one server every instance it may have reached belongs to; else null (the "
           "attempt names none and several could have served it)"),
    Column("path", STR, "log file of the matched request"),
    Column("slot", I64, "slot of the matched request"),
    Column("task", I64, "task of the matched request"),
    Column("seq", I64, "seq of the matched request on its slot"),
    Column("match", STR, "matched, ambiguous or unmatched"),
    Column("reason", STR, "how it matched (slot+tokens+time, ...), or why not (no_instance, rejected_before_slot, "
                          "client_timeout, client_cancelled, no_slot_request, ...)"),
    Column("offset_s", F64, "seconds added to the log's elapsed time to get wall-clock time (null: absolute or order)"),
]

SERVER_METRICS = [
    Column("run", STR, "run of the folder the dump was found in"),
    Column("path", STR, "the dump file (a Prometheus /metrics text exposition)"),
    Column("server", STR, "the server the file name names (metrics_main.prom: main), else null"),
    Column("taken", STR, "start or end when the file name says (metrics_end.prom: end), else null"),
    Column("name", STR, "metric name as exposed (llamacpp:prompt_tokens_total, ...)"),
    Column("labels", STR, "JSON object of the sample's labels (null without labels)"),
    Column("value", F64, "sample value (counters: totals since the server started, when the dump was taken)"),
    Column("type", STR, "counter, gauge, histogram, ... from the # TYPE line"),
    Column("help", STR, "the # HELP text"),
    Column("sample_ts", I64, "the sample's own timestamp (ms since epoch) when it carries one"),
    Column("line", I64, "line of the sample in the dump"),
]

SLOT_STATES = [
    Column("run", STR, "run of the folder the dump was found in"),
    Column("path", STR, "the dump file (the JSON array /slots returns)"),
    Column("server", STR, "the server the file name names (slots_backup.json: backup), else null"),
    Column("taken", STR, "start or end when the file name says, else null"),
    Column("slot", I64, "slot id"),
    Column("id_task", I64, "task the slot holds or last held (-1: none)"),
    Column("n_ctx", I64, "context size of the slot"),
    Column("is_processing", BOOL, "the slot was busy when the dump was taken (2024: state = 1)"),
    Column("n_prompt_tokens", I64, "prompt tokens of its task (2026 builds)"),
    Column("n_prompt_tokens_processed", I64, "prompt tokens evaluated (cache excluded; 2026 builds)"),
    Column("n_prompt_tokens_cache", I64, "prompt tokens served from the cache (b10406+)"),
    Column("n_decoded", I64, "tokens generated so far by its task (next_token.n_decoded)"),
    Column("n_remain", I64, "tokens its cap still allows (next_token.n_remain; -1: no cap)"),
    Column("has_next_token", BOOL, "the task was still generating"),
    Column("n_predict", I64, "output cap of its task (params.n_predict; -1: none)"),
    Column("max_tokens", I64, "the request's max_tokens when listed"),
    Column("prompt_chars", I64, "length of the prompt text the dump shows"),
    Column("generated_chars", I64, "length of the generated text the dump shows (2026 builds)"),
    Column("raw", STR, "the slot's object as dumped, without its prompt and generated texts (JSON)"),
]

TABLES: dict[str, list[Column]] = {
    "files": FILES,
    "instances": INSTANCES,
    "events": EVENTS_BASE,
    "requests": REQUESTS,
    "unparsed": UNPARSED,
    "runs": RUNS,
    "attempts": ATTEMPTS,
    "items": ITEMS,
    "matches": MATCHES,
    "server_metrics": SERVER_METRICS,
    "slot_states": SLOT_STATES,
}


# ---------------------------------------------------------------------------------------- derived tables
# What the analysis derives once per run and stores (forensics.analyse, forensics.derived): every output reads
# these, so a figure is the same wherever it appears.  Each finding's rows are derived too (``finding_<name>``,
# its listing's columns: docs/findings.md).

REQUEST_FACTS = [
    Column("run", STR, "run the request belongs to"),
    Column("instance", STR, "the server instance under the one name every output gives it (the manifest's server "
                            "name, else the log's label)"),
    Column("instance_id", STR, "the instance's id in the store's tables (requests, events, instances)"),
    Column("path", STR, "log file"),
    Column("slot", I64, "slot id"),
    Column("task", I64, "task id"),
    Column("seq", I64, "order of the request on its slot within the instance"),
    Column("item", STR, "item of the attempt the join tied to it"),
    Column("stage", STR, "stage of that attempt"),
    Column("attempt", I64, "attempt number of that attempt"),
    Column("prompt_tokens", I64, "prompt tokens: the log's, else the prompt its attempt (or a retry of it) sent"),
    Column("prompt_source", STR, "where prompt_tokens comes from: log, attempt, retry"),
    Column("cached_tokens", I64, "prompt tokens served from the slot's cache, where logged"),
    Column("gen_tokens", I64, "generated tokens: the log's, else what the output added to the slot's context before "
                              "it stopped, else its attempt's"),
    Column("gen_logged", I64, "generated tokens as the log gave them"),
    Column("gen_ms", F64, "generation time"),
    Column("seconds", F64, "how long it ran: the server's timings when above zero, else end - start (never 0 for a "
                           "request that ran; null: unknown)"),
    Column("tpot_ms", F64, "gen_ms / gen_tokens"),
    Column("n_past_end", I64, "tokens in the slot at release"),
    Column("ctx_slot", I64, "the slot's context"),
    Column("stop_reason", STR, "stop reason as logged"),
    Column("truncated", BOOL, "released with truncated = 1"),
    Column("context_shift", BOOL, "a context shift happened during the request"),
    Column("n_predict", I64, "output cap as logged (-1 = none)"),
    Column("cap_sent", I64, "output cap the harness sent (its attempt's max_tokens)"),
    Column("cap", I64, "the cap in force: the log's n_predict when positive, else cap_sent"),
    Column("stop_cause", STR, "what ended it: client, error, n_ctx_train, shutdown, context, cap, eos, word, unknown"),
    Column("failed", BOOL, "an error, HTTP >= 400, stop reason error, or cancelled"),
    Column("http_status", I64, "HTTP status of its request line"),
    Column("error", STR, "error text tied to its task"),
    Column("complete", BOOL, "the log shows its end"),
    Column("prompt_truncated", BOOL, "the prompt was cut to fit the slot"),
    Column("prompt_rejected", BOOL, "the server refused the prompt for its length"),
    Column("ctx_error", BOOL, "its error says generation hit the end of the context"),
    Column("ctx_full", BOOL, "it reached the slot's context by the server's own word"),
    Column("t_start", TS, "wall-clock start (null: nothing places it)"),
    Column("t_end", TS, "wall-clock end"),
    Column("clock", STR, "how t_start was placed: log, anchored, elapsed, attempt, order, aligned (null: not placed)"),
    Column("elapsed_start_s", F64, "start, seconds since its process started"),
    Column("elapsed_end_s", F64, "end, seconds since its process started"),
    Column("line_first", I64, "first line of the request"),
    Column("line_last", I64, "last line of the request"),
    Column("start_key", F64, "a sortable start: epoch(t_start), else elapsed_start_s"),
    Column("bgroup", STR, "the baseline group normal requests are taken from: stage:<stage>, else instance:<name>"),
    Column("err_shape", STR, "the error with digits masked"),
    Column("clean", BOOL, "ended by itself or at its cap, without error: a baseline request"),
]

INSTANCE_FACTS = [
    Column("run", STR, "run of the instance"),
    Column("instance", STR, "the one name every output gives the instance"),
    Column("instance_id", STR, "the instance's id in the store's tables"),
    Column("path", STR, "its log file"),
    Column("build", I64, "llama.cpp build number when logged"),
    Column("model", STR, "model path or name when logged"),
    Column("n_slots", I64, "slots (-np)"),
    Column("n_ctx_slot", I64, "context of one slot"),
    Column("port", I64, "listen port when logged"),
    Column("time_basis", STR, "absolute, elapsed, anchored or order"),
    Column("requests", I64, "requests it served"),
    Column("crashed", BOOL, "the process died"),
]

RUN_FACTS = [
    Column("run", STR, "run id"),
    Column("build", I64, "build of the servers that served it (the log's, else the manifest's config.build)"),
    Column("commit", STR, "their commit"),
    Column("model", STR, "the model file's name, else the manifest's model"),
    Column("n_ctx", I64, "the server's whole context (-c): the log's, else the manifest's config"),
    Column("n_ctx_slot", I64, "the largest slot context logged"),
    Column("context_shift", BOOL, "the server shifted the context (or the manifest says it was run with it)"),
    Column("host", STR, "the manifest's config.host, else the host of its lines' wrapper"),
    Column("stages", STR, "the manifest's stages (JSON)"),
    Column("caps", STR, "the output cap the harness sent per stage (stage=cap, ...)"),
    Column("sweep", STR, "the manifest's config.sweep"),
    Column("setup_key", STR, "a digest of the setup: runs with the same key are comparable (forensics.setups)"),
    Column("setup", STR, "the setup in words"),
    Column("np", I64, "parallel slots: the manifest's concurrency, else the slots that served it, else the peak"),
    Column("np_source", STR, "manifest, n_slots or peak_busy"),
    Column("source", STR, "requests measured from records or server"),
    Column("time_basis", STR, "the clock the run's requests are on"),
    Column("estimated", BOOL, "no time at all: wall time and rates are estimates from the order"),
    Column("requests", I64, "requests measured (attempts with records, else server requests)"),
    Column("failed", I64, "failed requests, as the failed finding counts them"),
    Column("wall_s", F64, "first request start to last end"),
    Column("run_s", F64, "the manifest's duration"),
    Column("gen_tokens", I64, "generated tokens"),
    Column("prompt_tokens", I64, "prompt tokens"),
    Column("gen_tok_per_s", F64, "generated tokens / wall_s"),
    Column("req_per_s", F64, "successful requests / wall_s"),
    Column("latency_mean_s", F64, "mean request latency"),
    Column("latency_p50_s", F64, "median request latency"),
    Column("latency_p90_s", F64, "p90 request latency"),
    Column("latency_p95_s", F64, "p95 request latency"),
    Column("latency_p99_s", F64, "p99 request latency"),
    Column("latency_max_s", F64, "longest request"),
    Column("tpot_mean_ms", F64, "mean time per output token"),
    Column("tpot_p50_ms", F64, "median time per output token"),
    Column("effective_concurrency", F64, "sum of request durations / wall_s"),
    Column("peak_busy_slots", I64, "most requests in flight at once"),
    Column("server_requests", I64, "server requests in its logs"),
    Column("slots", I64, "slots that served them"),
    Column("healthy", BOOL, "the verdict found nothing abnormal"),
]

VERDICT_FACTS = [
    Column("run", STR, "run id"),
    Column("n", I64, "the fact's place in the run's verdict"),
    Column("kind", STR, "the finding it tells (dead_slot, runaway, failed, cost, healthy, ...)"),
    Column("severity", STR, "finding (the run is unhealthy), advice or note"),
    Column("sentence", STR, "the sentence"),
    Column("evidence", LIST_STR, "path:first-last of the lines it rests on"),
    Column("fields", STR, "its numbers (JSON)"),
]

CAP_FACTS = [
    Column("run", STR, "run id"),
    Column("stage", STR, "the requests' stage (null when unknown)"),
    Column("gen_tokens", I64, "their generated tokens"),
    Column("own_cap", I64, "the cap in force on them (the log's n_predict, else the harness's; null = none)"),
    Column("normal", BOOL, "clean and not a runaway"),
    Column("runaway", BOOL, "a runaway"),
    Column("prompt_tokens", I64, "their prompt tokens (only normal ones: null for the others)"),
    Column("ctx_slot", I64, "their slot's context"),
    Column("n", I64, "requests alike in all the above: what `forensics cap` counts (`cap.sql`, grouped)"),
    Column("ms_per_token", F64, "the sum of their generation ms per token (null counted as 0)"),
]

RUN_RECORDS = [
    Column("run", STR, "run id"),
    Column("alias", STR, "the run id its records carried, when they were tied to it"),
    Column("np", I64, "the manifest's concurrency"),
    Column("items_expected", I64, "items the run was to finish"),
    Column("items_done", I64, "items every stage of which finished ok"),
    Column("items_missing", I64, "items not done"),
    Column("attempts", I64, "attempts the harness made"),
    Column("requests", I64, "server requests the join gave the run"),
    Column("wall_s", F64, "the manifest's start to end, else the first send to the last answer"),
    Column("ended", STR, "how the run ended"),
    Column("from", STR, "records, or summary for a run read from a benchmark's summary alone"),
    Column("listed", BOOL, "the run has replay records, a manifest or items (what `forensics runs` lists)"),
]

DERIVED: dict[str, list[Column]] = {
    "run_records": RUN_RECORDS,
    "request_facts": REQUEST_FACTS,
    "instance_facts": INSTANCE_FACTS,
    "run_facts": RUN_FACTS,
    "verdict_facts": VERDICT_FACTS,
    "cap_facts": CAP_FACTS,
}


def conform_derived(df: pl.DataFrame, table: str) -> pl.DataFrame:
    """``df`` with exactly the derived table's columns, in order, with their types (missing ones null)."""
    cols = [pl.col(c.name).cast(c.dtype) if c.name in df.columns else pl.lit(None, dtype=c.dtype).alias(c.name)
            for c in DERIVED[table]]
    return df.select(cols)


def polars_schema(table: str) -> dict[str, pl.DataType]:
    return {c.name: c.dtype for c in TABLES[table]}


def empty(table: str) -> pl.DataFrame:
    return pl.DataFrame(schema=polars_schema(table))


def conform(df: pl.DataFrame, table: str) -> pl.DataFrame:
    """Give ``df`` exactly the table's columns, in order, with their types (missing ones null)."""
    declared = TABLES[table]
    have = df.schema
    if len(have) >= len(declared) and (table == "events" or len(have) == len(declared)) and all(
            name == c.name and dtype == c.dtype for (name, dtype), c in zip(have.items(), declared, strict=False)):
        return df  # already the table's columns, in order, with their types
    cols = []
    for c in declared:
        if c.name in df.columns:
            cols.append(pl.col(c.name).cast(c.dtype))
        else:
            cols.append(pl.lit(None, dtype=c.dtype).alias(c.name))
    extra = [n for n in df.columns if n not in {c.name for c in TABLES[table]}]
    if table == "events":
        return df.select([*cols, *[pl.col(n) for n in extra]])
    return df.select(cols)
