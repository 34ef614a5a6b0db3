"""The columns of the Parquet tables (aggregate.py writes them): names, keys and Arrow types in one place.

Each table is an ordered mapping of column name to Arrow type. ``aggregate`` writes exactly these
columns, in this order and of these types, whether the table has rows or not; readers name columns
through the constants here rather than spelling them out.

Lists and nested values are native: ``command_argv`` a list of strings, ``buffers``,
``bottleneck_rows``, ``probe_rows`` and ``value_rows`` lists of structs, ``range_lo``/``range_hi``
and ``s_*`` scalars.
"""

from __future__ import annotations

import pyarrow as pa

from .settings import SETTINGS

SETTING_PREFIX = "s_"  # every setting of a configuration is a column: s_ctx, s_n_cpu_moe, ...

CONFIGS_KEY = ("model", "config_id")
MEASUREMENTS_KEY = (*CONFIGS_KEY, "workload")
SEARCHES_KEY = ("model", "group")

STATS = ("median", "min", "max", "n", "spread_pct")  # of each metric, over the requests of every repetition
METRICS = ("prefill_tps", "decode_tps", "aggregate_tps", "ttft_s")

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


def setting(name: str) -> str:
    """The column of a setting: ``setting("n_cpu_moe") == "s_n_cpu_moe"``."""
    return SETTING_PREFIX + name


def stat(metric: str, name: str) -> str:
    """The column of one statistic of a metric: ``stat("decode_tps", "median") == "decode_tps_median"``."""
    return f"{metric}_{name}"


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
    "environment": TEXT,
    "cpu_model": TEXT,
    "gpu": TEXT,
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
    "load_peak_gpu_mib": FLOAT,
    "vram_limit_mib": INT,
    "vram_limit_is": TEXT,  # "budget" (emulated) or "card"
    "headroom_mib": FLOAT,
    "peak_pct_of_limit": FLOAT,
    "log_tail": TEXT,
    "n_ctx": INT,
    "n_threads": INT,
    "n_parallel": INT,
    "n_ctx_slot": INT,
    "settings_used": TEXT,
    "n_threads_batch": INT,
    "layers_offloaded": INT,
    "buffers": BUFFERS,
    "started_at": TEXT,
}

WORKLOAD: dict[str, pa.DataType] = {
    "workload": TEXT,
    "prompt_tokens": INT,
    "gen_tokens": INT,
    "concurrency": INT,
    "workload_outcome": TEXT,
    "workload_message": TEXT,
    **_stat_columns(),
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

SEARCHES: dict[str, pa.DataType] = {
    "model": TEXT,
    "group": TEXT,
    **settings_columns(leave_out=("n_cpu_moe",)),  # the searched setting: the rows below are its values
    "server_args": TEXT,
    "range_lo": INT,
    "range_hi": INT,
    "limit_mib": INT,
    "margin_mib": INT,
    "predicted_lowest": INT,
    "arithmetic": TEXT,
    "full_residency": TEXT,
    "boundary": INT,
    "recommended_n_cpu_moe": INT,
    "server_starts": INT,
    "probe_rows": PROBE_ROWS,
    "value_rows": VALUE_ROWS,
}


def schema(columns: dict[str, pa.DataType]) -> pa.Schema:
    return pa.schema(list(columns.items()))
