"""Records (JSON, one per job) into Parquet tables; reports read only these tables.

``configs``: one row per model × configuration (outcome, failure phase, placement, memory).
``measurements``: one row per model × configuration × workload, every setting a column.
``searches``: one row per n_cpu_moe search.

Every table has the columns ``columns`` names, of the types it gives, with rows or without.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pyarrow as pa

from . import columns as cols
from . import host as host_mod
from . import records
from . import settings as settings_mod
from . import tablefiles


def _settings_columns(resolved: dict) -> dict:
    return {cols.setting(k): (" ".join(v) if isinstance(v, list) else v) for k, v in resolved.items()}


def _config_row(rec: dict) -> dict:
    placement = rec.get("placement") or {}
    memory = rec.get("memory") or {}
    budget = rec.get("budget") or {}
    gpu = rec["host"]["gpu"]
    return {
        "model": rec["model"]["name"],
        "config_id": rec["config_id"],
        "model_source": rec["model"]["source"],
        "model_sha256": rec["model"]["sha256"],
        "architecture": rec["model"].get("architecture"),
        "quantisation": rec["model"].get("quantisation"),
        "model_bytes": rec["model"].get("total_bytes"),
        **_settings_columns(rec["settings"]),
        "server_args": settings_mod.label(rec["settings"]),
        "command_argv": rec.get("command"),
        "server_version": rec["server"].get("version"),
        "server_sha256": rec["server"].get("sha256"),
        "server_backend": rec["server"].get("backend"),
        "server_obtained": rec["server"].get("obtained"),
        # A different VRAM budget is a different card: never ranked or averaged together.
        "environment": host_mod.environment_key(rec["host"]) + f"|budget {budget.get('vram_budget_mib') or 'none'}",
        "cpu_model": rec["host"].get("cpu_model"),
        "gpu": ", ".join(d["name"] for d in gpu.get("devices", [])) or "no GPU",
        "vram_budget_mib": budget.get("vram_budget_mib"),
        "margin_mib": budget.get("margin_mib"),
        "repetitions": rec.get("repetitions"),
        "outcome": rec["outcome"],
        "failure": rec.get("failure"),
        "phase": rec.get("phase"),
        "message": rec.get("message"),
        "returncode": rec.get("returncode"),
        "load_s": rec.get("load_s"),
        "page_cache_resident_at_start": rec.get("page_cache_resident_at_start"),
        "page_cache_verified": (rec.get("page_cache") or {}).get("verified"),
        "peak_rss_mib": memory.get("peak_rss_mib"),
        "peak_gpu_mib": memory.get("peak_gpu_mib"),
        "load_peak_gpu_mib": ((memory.get("per_phase") or {}).get("load") or {}).get("gpu_mib"),
        "vram_limit_mib": memory.get("vram_limit_mib"),
        "vram_limit_is": memory.get("vram_limit_is"),
        "headroom_mib": memory.get("headroom_mib"),
        "peak_pct_of_limit": memory.get("peak_pct_of_limit"),
        "log_tail": rec.get("log_tail"),
        "n_ctx": placement.get("n_ctx"),
        "n_threads": placement.get("n_threads"),
        "n_parallel": placement.get("n_parallel"),
        "n_ctx_slot": placement.get("n_ctx_slot"),
        "settings_used": ", ".join(
            f"{k} {v['used']} (asked {v['asked']})" for k, v in (rec.get("settings_used") or {}).items()
        )
        or None,
        "n_threads_batch": placement.get("n_threads_batch"),
        "layers_offloaded": placement.get("layers_offloaded"),
        "buffers": placement.get("buffers") or [],
        "started_at": rec.get("started_at"),
    }


def _stat_columns(w: dict) -> dict:
    """Each statistic of each metric of a workload (None for a workload that failed)."""
    return {cols.stat(metric, k): (w.get(metric) or {}).get(k) for metric in cols.METRICS for k in cols.STATS}


def _workload_columns(w: dict, peak: dict) -> dict:
    """The columns a workload adds to its configuration's row in ``measurements``."""
    rows = (w.get("bottleneck") or {}).get("rows") or []
    return {
        "workload": w["name"],
        "prompt_tokens": w["prompt_tokens"],
        "gen_tokens": w["gen_tokens"],
        "concurrency": w.get("concurrency", 1),
        "workload_outcome": w["outcome"],
        "workload_message": w.get("message"),
        **_stat_columns(w),
        "workload_peak_rss_mib": peak.get("rss_mib"),
        "workload_peak_gpu_mib": peak.get("gpu_mib"),
        "cpu_server_cores": peak.get("cpu_server_cores"),
        "cpu_other_cores": peak.get("cpu_other_cores"),
        "decode_bound_tps": (w.get("decode_bound") or {}).get("bound_tps"),
        "measured_over_bound": (w.get("decode_bound") or {}).get("measured_over_bound"),
        "decode_bound_from": (w.get("decode_bound") or {}).get("placement_from"),
        "decode_bound_unknown": (w.get("decode_bound") or {}).get("unknown"),
        "bottleneck_verdict": (w.get("bottleneck") or {}).get("verdict"),
        "bottleneck_rows": rows,
    }


def _column(values: list, kind: pa.DataType | None) -> pa.Array:
    """One column of a table. A scalar is cast safely (2.5 is no int64); lists and structs are built as
    their type; a column the registry does not name (a setting since removed) keeps its values' type."""
    if kind is None:
        return pa.array(values)
    if pa.types.is_nested(kind):
        return pa.array(values, type=kind)
    return pa.array(values).cast(kind)


def _table(rows: list[dict], types: dict[str, pa.DataType]) -> pa.Table:
    """The rows as a table of the registry's columns and types (every column, with no rows too)."""
    names = list(types) + [k for k in dict.fromkeys(k for row in rows for k in row) if k not in types]
    return pa.table({name: _column([row.get(name) for row in rows], types.get(name)) for name in names})


def arrow_tables(record_paths: list[Path]) -> tuple[pa.Table, pa.Table]:
    """``configs`` and ``measurements`` from measure records."""
    configs, measurements = [], []
    for path in record_paths:
        rec = records.load(path, "measure")
        row = _config_row(rec)
        configs.append(row)
        per_phase = (rec.get("memory") or {}).get("per_phase") or {}
        measurements += [
            {**row, **_workload_columns(w, per_phase.get(w["name"], {}))} for w in rec.get("workloads", [])
        ]
    return _table(configs, cols.CONFIGS), _table(measurements, cols.MEASUREMENTS)


def tables(record_paths: list[Path]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``configs`` and ``measurements`` as a reader of the Parquet files sees them."""
    configs, measurements = arrow_tables(record_paths)
    return configs.to_pandas(), measurements.to_pandas()


def _search_row(s: dict) -> dict:
    lo, hi = s["range"]
    return {
        "model": s["model"],
        "group": s["group"],
        **_settings_columns(s["settings"]),
        "server_args": settings_mod.label({**s["settings"], "n_cpu_moe": None}),
        "range_lo": lo,
        "range_hi": hi,
        "limit_mib": s["limit_mib"],
        "margin_mib": s["margin_mib"],
        "predicted_lowest": s["predicted_lowest"],
        "arithmetic": s["arithmetic"],
        "full_residency": s["full_residency"],
        "boundary": s["boundary"],
        "recommended_n_cpu_moe": s["recommended_n_cpu_moe"],
        "server_starts": s["server_starts"],
        "probe_rows": s["probes"],
        "value_rows": s["values"],
    }


def arrow_search_table(summary_paths: list[Path]) -> pa.Table:
    return _table([_search_row(records.load(p, "search")) for p in summary_paths], cols.SEARCHES)


def search_table(summary_paths: list[Path]) -> pd.DataFrame:
    """One row per n_cpu_moe search: what was predicted, probed, skipped, and where the line is."""
    return arrow_search_table(summary_paths).to_pandas()


def write(
    record_paths: list[Path],
    configs_path: Path,
    measurements_path: Path,
    search_paths: list[Path] = (),
    searches_path: Path | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    configs, measurements = arrow_tables([Path(p) for p in record_paths])
    outputs = [(configs, configs_path), (measurements, measurements_path)]
    if searches_path is not None:
        outputs.append((arrow_search_table([Path(p) for p in search_paths]), searches_path))
    for table, path in outputs:
        tablefiles.write(table, path)
    return configs.to_pandas(), measurements.to_pandas()
