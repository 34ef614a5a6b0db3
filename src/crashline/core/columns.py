"""The columns of the Parquet tables (tables/aggregate.py writes them): names, keys and Arrow types in one place.

Each table is an ordered mapping of column name to Arrow type. ``aggregate`` writes exactly these
columns, in this order and of these types, whether the table has rows or not; readers name columns
through the constants here rather than spelling them out.

Lists and nested values are native: ``command_argv`` and ``*_start_medians`` lists, ``buffers``,
``bottleneck_rows``, ``probe_rows``, ``value_rows``, ``climbed``, ``finalists`` and ``start_order``
lists of structs, ``range_lo``/``range_hi`` and ``s_*`` scalars.
"""

from __future__ import annotations

import pyarrow as pa

from .settings import SETTINGS

SETTING_PREFIX = "s_"  # every setting of a configuration is a column: s_ctx, s_n_cpu_moe, ...

CONFIGS_KEY = ("model", "config_id")
MEASUREMENTS_KEY = (*CONFIGS_KEY, "workload")
CONVERSATIONS_KEY = (*CONFIGS_KEY, "conversation")
SEARCHES_KEY = ("model", "group")

STATS = ("median", "min", "max", "n", "spread_pct")  # of each metric, over the requests of every repetition
METRICS = ("prefill_tps", "decode_tps", "e2e_tps", "aggregate_tps", "ttft_s")

TEXT, INT, FLOAT, BOOL = pa.string(), pa.int64(), pa.float64(), pa.bool_()
SETTING_TYPES = {"int": INT, "bool": BOOL}  # other kinds are text; a list ("extra_args") is joined by spaces

ARGV = pa.list_(TEXT)
BUFFERS = pa.list_(pa.struct([("device", TEXT), ("kind", TEXT), ("mib", FLOAT)]))
BOTTLENECK_ROWS = pa.list_(
    pa.struct(
        [
            ("suspect", TEXT),
            ("measured", FLOAT),
            ("unit", TEXT),
            ("limit", FLOAT),
            ("fraction", FLOAT),
            ("verdict", TEXT),
            ("per_token", TEXT),
            ("occupancy_pct", FLOAT),
        ]
    )
)
PROBE_ROWS = pa.list_(pa.struct([("n_cpu_moe", INT), ("survived", BOOL)]))
VALUE_ROWS = pa.list_(pa.struct([("n_cpu_moe", INT), ("predicted_mib", FLOAT), ("status", TEXT)]))
SPEED = [("median", FLOAT), ("min", FLOAT), ("max", FLOAT), ("n", INT)]  # the objective's, over its requests
# Each value the climb measured: its speed in its first start and its verdict against the best before it
# ("faster", "within noise", "slower": the climb stopped, "failed": not safe with the margin, the climb stopped).
CLIMBED = pa.list_(pa.struct([("n_cpu_moe", INT), *SPEED, ("verdict", TEXT)]))
# Each finalist: its server starts, each start's median, the speed pooled over every request of every start, and
# whether every start survived every workload with the margin (only then can it win).
FINALISTS = pa.list_(
    pa.struct(
        [
            ("n_cpu_moe", INT),
            ("override_tensor", TEXT),  # the boundary layer's experts kept on the CPU too (a partial placement)
            ("config_id", TEXT),
            ("starts", INT),
            ("start_medians", pa.list_(FLOAT)),
            *SPEED,
            ("survived", BOOL),
        ]
    )
)
# the boundary layer's partial placements a search predicted, skipped or started (jobs.search's step 4b)
PARTIAL = pa.list_(
    pa.struct(
        [
            ("n_cpu_moe", INT),
            ("override_tensor", TEXT),
            ("moved_mib", FLOAT),
            ("predicted_headroom_mib", FLOAT),
            ("headroom_mib", FLOAT),
            ("config_id", TEXT),
            ("status", TEXT),
        ]
    )
)
START_ORDER = pa.list_(pa.struct([("n_cpu_moe", INT), ("start", INT)]))  # the finalists' starts 2, 3, ... in order


def setting(name: str) -> str:
    """The column of a setting: ``setting("n_cpu_moe") == "s_n_cpu_moe"``."""
    return SETTING_PREFIX + name


def stat(metric: str, name: str) -> str:
    """The column of one statistic of a metric: ``stat("decode_tps", "median") == "decode_tps_median"``."""
    return f"{metric}_{name}"


def start_medians(metric: str) -> str:
    """The column of a metric's median in each server start: ``decode_tps_start_medians``."""
    return f"{metric}_start_medians"


def settings_columns(leave_out: tuple[str, ...] = ()) -> dict[str, pa.DataType]:
    return {setting(name): SETTING_TYPES.get(s.kind, TEXT) for name, s in SETTINGS.items() if name not in leave_out}


def _stat_columns() -> dict[str, pa.DataType]:
    return {stat(metric, name): INT if name == "n" else FLOAT for metric in METRICS for name in STATS}


CONFIGS: dict[str, pa.DataType] = {
    "model": TEXT,
    "config_id": TEXT,
    "model_source": TEXT,
    "model_sha256": TEXT,
    "architecture": TEXT,
    "quantisation": TEXT,
    "model_bytes": INT,
    **settings_columns(),
    "server_args": TEXT,
    "command_argv": ARGV,
    "server_version": TEXT,
    "server_sha256": TEXT,
    "server_backend": TEXT,
    "server_obtained": TEXT,
    "environment": TEXT,  # what must match to rank together: hardware and driver (crashline.core.host.environment_key)
    "hostname": TEXT,
    "cpu_model": TEXT,
    "cpu_logical_cores": INT,  # the host's: what "other processes used N of M cores" counts against
    "gpu": TEXT,
    "gpu_uuids": TEXT,  # the GPUs the job held, comma-separated
    "gpu_driver": TEXT,
    "vram_budget_mib": INT,
    "margin_mib": INT,
    "repetitions": INT,
    "outcome": TEXT,
    "failure": TEXT,
    "phase": TEXT,
    "message": TEXT,
    "returncode": INT,
    "load_s": FLOAT,
    "page_cache_resident_at_start": FLOAT,
    "page_cache_verified": BOOL,
    "peak_rss_mib": FLOAT,
    "peak_gpu_mib": FLOAT,
    "peak_gpus_mib": pa.list_(FLOAT),  # each GPU's own peak, with several GPUs (in the order of gpu_uuids)
    "load_peak_gpu_mib": FLOAT,
    "vram_limit_mib": INT,
    "vram_limit_is": TEXT,  # "budget" (emulated) or "card"
    "headroom_mib": FLOAT,
    "peak_pct_of_limit": FLOAT,
    "job_s": FLOAT,  # the measurement's whole time (time_budget_s total) ...
    "serving_s": FLOAT,  # ... of which starting the server and serving requests
    "first_request_s": FLOAT,  # the first request after /health (untimed warm-up); null: it never answered
    "server_starts": INT,  # its server's starts: 1, 2 with a conversation's restart case
    "soak_requests": INT,  # the unique-prompt soak (jobs.soak): requests done ...
    "soak_ran_s": FLOAT,
    "soak_outcome": TEXT,
    "soak_said": TEXT,  # its growth and projection in words (jobs.soak.text)
    "soak_hours_to_limit": FLOAT,  # ... hours until the first limit at its rate (empty: nothing grows toward one)
    "soak_limit_first": TEXT,  # "host" (the host budget, else the machine's RAM) or "vram"
    "soak_limit_mib": FLOAT,
    **{
        f"soak_{name}_mib_{what}": FLOAT
        for name in ("rss", "gpu", "cache")  # RSS, VRAM, llama.cpp's host prompt cache: growth per request
        for what in ("per_request", "per_request_low", "per_request_high", "last")
    },
    "host_ram_mib": INT,  # budget.host_ram_mib: the memory cgroup the server ran in
    "host_peak_mib": FLOAT,  # that cgroup's peak (page cache it charged included), else the peak RSS
    "host_headroom_mib": FLOAT,
    "log_tail": TEXT,
    "n_ctx": INT,
    "n_threads": INT,
    "n_parallel": INT,
    "n_ctx_slot": INT,
    "settings_used": TEXT,
    "fit_aim": TEXT,  # --fit on aimed at the margin: each start's --fit-target and what its peak left, in words
    "n_threads_batch": INT,
    "layers_offloaded": INT,
    "buffers": BUFFERS,
    "draft_vram_mib": FLOAT,  # a speculative draft's own buffers on accelerators (its log lines), None without one
    "started_at": TEXT,  # of the first server start
    "starts": INT,  # server starts pooled in this row: 1, or a search finalist's starts
}

WORKLOAD: dict[str, pa.DataType] = {
    "workload": TEXT,
    "prompt_tokens": INT,
    "gen_tokens": INT,
    "concurrency": INT,
    "workload_outcome": TEXT,
    "workload_message": TEXT,
    **_stat_columns(),  # over every request of every repetition of every start
    **{start_medians(metric): pa.list_(FLOAT) for metric in METRICS},  # one median per start
    "draft_drafted": INT,  # with a draft model: tokens drafted over every request ...
    "draft_accepted": INT,  # ... the model accepted ...
    "draft_acceptance": FLOAT,  # ... and their ratio
    "workload_peak_rss_mib": FLOAT,
    "workload_peak_gpu_mib": FLOAT,
    "cpu_server_cores": FLOAT,
    "cpu_other_cores": FLOAT,
    "decode_bound_tps": FLOAT,
    "measured_over_bound": FLOAT,
    "decode_bound_from": TEXT,  # where the placement came from: "settings and log", "log" or "settings"
    "decode_bound_unknown": TEXT,  # why there is no bound
    "bottleneck_verdict": TEXT,
    "bottleneck_rows": BOTTLENECK_ROWS,
}

MEASUREMENTS: dict[str, pa.DataType] = {**CONFIGS, **WORKLOAD}

# Each turn of a conversation workload: which of the conversations at once, its number (or "restart"), the
# history sent, what the server reused of it (cache_n) and evaluated (prompt_n), speeds, its phase's peaks.
# A conversation turn's context checkpoints (jobs.conversations.checkpoints), and the totals of a workload's turns
CHECKPOINT_KEYS = ("checkpoints_created", "checkpoints_restored", "checkpoints_erased", "checkpoints_held")

TURN_ROWS = pa.list_(
    pa.struct(
        [
            ("conversation", INT),
            ("soak", INT),  # its set: 0 the first, 1, 2, ... the soak's
            ("t_s", FLOAT),  # seconds since the conversation workload began
            ("turn", TEXT),
            ("history_tokens", INT),
            ("cache_n", INT),
            ("prompt_n", INT),
            ("ttft_s", FLOAT),
            ("prefill_tps", FLOAT),
            ("decode_tps", FLOAT),
            ("predicted_n", INT),
            ("gpu_mib", FLOAT),
            ("rss_mib", FLOAT),
            ("checkpoints_created", INT),  # context checkpoints its slot made in the turn (sliding-window models)
            ("checkpoints_restored", INT),
            ("checkpoints_erased", INT),
            ("checkpoints_held", INT),  # how many its slot held after the turn (of --ctx-checkpoints)
            ("checkpoint_mib", FLOAT),  # the size of the last one made
            ("outcome", TEXT),
        ]
    )
)

CONVERSATION: dict[str, pa.DataType] = {
    "conversation": TEXT,
    "turn_tokens": INT,
    "reply_tokens": INT,
    "depth_tokens": INT,
    "at_once": INT,  # conversations run at once ("slots" resolved)
    "restart": BOOL,  # whether the restart case was asked for
    "soak_s": FLOAT,  # the soak asked for (0: the first set alone) ...
    "soak_sets": INT,  # ... the sets of conversations that followed the first ...
    "ran_s": FLOAT,  # ... and how long the whole workload ran, restart case included
    "conversation_outcome": TEXT,
    "conversation_message": TEXT,
    "failed_at": TEXT,  # the phase it failed in: "NAME:turn-K", "NAME:restart-load" or "NAME:restart"
    "turns_planned": INT,
    "turns_done": INT,  # turns every conversation completed
    "depth_reached": INT,  # the longest history answered whole plus its reply, in tokens
    "reused_median": FLOAT,  # of turns 2 onwards: cache_n over what had been sent before (history - turn_tokens)
    "gpu_mib_per_1k": FLOAT,  # peak VRAM growth per 1,000 tokens of history (least squares over the turns)
    "rss_mib_per_1k": FLOAT,
    "rss_mib_per_hour": FLOAT,  # host RSS growth per hour of the workload (least squares over its turns' peaks)
    "checkpoints_created": INT,  # context checkpoints made over every turn (none for models without SWA layers)
    "checkpoints_restored": INT,
    "checkpoints_erased": INT,
    "checkpoints_held": INT,  # the most a slot held after a turn
    "checkpoint_mib": FLOAT,  # the largest one made
    "restart_ttft_s": FLOAT,
    "restart_prefill_tps": FLOAT,
    "restart_gpu_mib": FLOAT,
    "restart_rss_mib": FLOAT,
    "turn_rows": TURN_ROWS,
}

CONVERSATIONS: dict[str, pa.DataType] = {**CONFIGS, **CONVERSATION}

SEARCHES: dict[str, pa.DataType] = {
    "model": TEXT,
    "group": TEXT,
    **settings_columns(leave_out=("n_cpu_moe",)),  # the searched setting: the rows below are its values
    "server_args": TEXT,
    "range_lo": INT,
    "range_hi": INT,
    "limit_mib": INT,
    "compute_rows": pa.list_(pa.struct([("ubatch", INT), ("mib", FLOAT)])),  # the calibration's compute buffers
    "rest_mib": FLOAT,  # the calibration's rest (CUDA context, small buffers): with compute_rows, suggest.what_if
    "margin_mib": INT,
    "predicted_lowest": INT,
    "arithmetic": TEXT,
    "full_residency": TEXT,
    "boundary": INT,
    "lowest_with_margin": INT,  # the lowest value that survived every workload with the margin
    "recommended_n_cpu_moe": INT,  # the winner: the fastest finalist (without a climb, lowest_with_margin)
    "recommended_override_tensor": TEXT,  # the winner's -ot where it places its boundary layer in part on the card
    "server_starts": INT,  # every record the search used, starts 2, 3, ... of finalists included
    "calibration_job_s": FLOAT,  # the calibration's start (no workloads, no record in the configs table): its clock
    "calibration_serving_s": FLOAT,  # and the part of it starting the server
    "probe_rows": PROBE_ROWS,
    "value_rows": VALUE_ROWS,
    "objective_metric": TEXT,  # what the climb and the finalists are ranked by (empty without a climb)
    "objective_workload": TEXT,
    "climb_limit": INT,  # the most values measured above lowest_with_margin (config key climb; 0: no climb)
    "climbed": CLIMBED,
    "climb_stop": TEXT,  # why the climb stopped
    "starts_per_finalist": INT,  # config key starts: server starts of each finalist, the first included
    "finalists": FINALISTS,
    "start_order": START_ORDER,
    "partial": PARTIAL,
    "runner_up": INT,  # the finalist with the second pooled median
    "lead_won": INT,  # start pairs (start k of each) in which the winner's median beat the runner-up's ...
    "lead_pairs": INT,  # ... of this many
    "lead_held": TEXT,  # the same in words
}


# A needle length as a table key: its config value as JSON text, so 2048 tokens ("2048") and 0.9 of the context
# ("0.9") stay apart, and 1.0 of the context ("1.0") is no 1 token.
LENGTHS = pa.list_(TEXT)
NEEDLE: dict[str, pa.DataType] = {  # results/tables/needle.parquet: one row per trial (tables/needle.py)
    "model": TEXT,
    "config_id": TEXT,
    "server_args": TEXT,
    "environment": TEXT,
    "server_version": TEXT,
    "server_sha256": TEXT,
    "prompt_style": TEXT,
    "needle_kind": TEXT,
    "applicable": BOOL,  # False: recall does not apply to this model (an embedding model, no generation)
    "recall": TEXT,  # the verdict: pass, fail, not applicable, ...
    "failed_required": LENGTHS,  # the required lengths it failed, as length keys
    "required": LENGTHS,  # every required length
    "outcome": TEXT,
    "failure": TEXT,
    "phase": TEXT,
    "message": TEXT,
    "slot_ctx": INT,
    "started_at": TEXT,
    "job_s": FLOAT,
    "length": TEXT,  # this trial's length key (empty: a configuration without trials)
    "length_target": INT,
    "length_fraction": FLOAT,
    "depth": FLOAT,
    "depth_actual": FLOAT,
    "trial": INT,
    "value": TEXT,
    "answer": TEXT,
    "passed": BOOL,
    "prompt_n": INT,
    "predicted_n": INT,
    "prompt_ms": FLOAT,
    "reason": TEXT,
}


def schema(columns: dict[str, pa.DataType]) -> pa.Schema:
    return pa.schema(list(columns.items()))


KV_QUALITY: dict[str, pa.DataType] = {  # results/tables/kv_quality.parquet: one row per model x KV type
    "model": TEXT,
    "kv": TEXT,  # the KV label: "q8_0" (K and V), "q8_0-q4_0" (K, then V)
    "cache_type_k": TEXT,
    "cache_type_v": TEXT,
    "ctx": INT,  # the context of both passes, whose second half is scored
    "ctx_reason": TEXT,  # why that context: the prompt asked, or kv_quality.max_ctx
    "informative": BOOL,  # False: a random-weight model, or no llama-perplexity (message says which)
    "message": TEXT,
    "kld_mean": FLOAT,  # KL divergence of each scored token's distribution from f16's, nats
    "kld_median": FLOAT,
    "kld_p99": FLOAT,
    "kld_max": FLOAT,
    "same_top_pct": FLOAT,  # % of scored tokens whose most likely next token is f16's
    "ppl": FLOAT,
    "ppl_f16": FLOAT,
    "chunks": INT,
    "scored_ctx": INT,
    "binary": TEXT,
    "started_at": TEXT,
    "finished_at": TEXT,
}
