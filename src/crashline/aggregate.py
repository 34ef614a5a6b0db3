"""Records (JSON, one per job) into Parquet tables; reports read only these tables.

``configs``: one row per model × configuration (outcome, failure phase, placement, memory).
``measurements``: one row per model × configuration × workload, every setting a column.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pandas as pd

from . import host as host_mod
from . import settings as settings_mod
from .atomic import atomic_path, read_json


def _settings_columns(resolved: dict) -> dict:
    return {
        f"s_{k}": (" ".join(v) if isinstance(v, list) else v) for k, v in resolved.items()
    }


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
        "command": json.dumps(rec.get("command")),
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
        "headroom_mib": memory.get("headroom_mib"),
        "peak_pct_of_limit": memory.get("peak_pct_of_limit"),
        "log_tail": rec.get("log_tail"),
        "n_ctx": placement.get("n_ctx"),
        "n_threads": placement.get("n_threads"),
        "n_parallel": placement.get("n_parallel"),
        "n_ctx_slot": placement.get("n_ctx_slot"),
        "settings_used": ", ".join(f"{k} {v['used']} (asked {v['asked']})"
                                   for k, v in (rec.get("settings_used") or {}).items()) or None,
        "n_threads_batch": placement.get("n_threads_batch"),
        "layers_offloaded": placement.get("layers_offloaded"),
        "buffers_mib": json.dumps(placement.get("buffers_mib") or {}),
        "started_at": rec.get("started_at"),
    }


def _stat_columns(prefix: str, s: dict | None) -> dict:
    s = s or {}
    return {f"{prefix}_{k}": s.get(k) for k in ("median", "min", "max", "n", "spread_pct")}


def _workload_columns(w: dict, peak: dict) -> dict:
    """The columns a workload adds to its configuration's row in ``measurements``."""
    return {
        "workload": w["name"],
        "prompt_tokens": w["prompt_tokens"],
        "gen_tokens": w["gen_tokens"],
        "concurrency": w.get("concurrency", 1),
        "workload_outcome": w["outcome"],
        "workload_message": w.get("message"),
        **_stat_columns("prefill_tps", w.get("prefill_tps")),
        **_stat_columns("decode_tps", w.get("decode_tps")),
        **_stat_columns("aggregate_tps", w.get("aggregate_tps")),
        **_stat_columns("ttft_s", w.get("ttft_s")),
        "workload_peak_rss_mib": peak.get("rss_mib"),
        "workload_peak_gpu_mib": peak.get("gpu_mib"),
        "cpu_server_cores": peak.get("cpu_server_cores"),
        "cpu_other_cores": peak.get("cpu_other_cores"),
        "decode_bound_tps": (w.get("decode_bound") or {}).get("bound_tps"),
        "measured_over_bound": (w.get("decode_bound") or {}).get("measured_over_bound"),
        "bottleneck_verdict": (w.get("bottleneck") or {}).get("verdict"),
        "bottleneck": json.dumps((w.get("bottleneck") or {}).get("rows") or []),
    }


def _blank(**fields) -> defaultdict:
    """A record (or part of one) with nothing in it: every field not given is None."""
    return defaultdict(lambda: None, fields)


# The rows built from these name every column of a table, for a table with no rows: readers select
# columns by name, whether or not anything was measured or survived.
BLANK_RECORD = _blank(model=_blank(), settings=dict.fromkeys(settings_mod.SETTINGS), server={}, host={"gpu": {}})
BLANK_WORKLOAD = _blank()
BLANK_SEARCH = _blank(settings={})


def _frame(rows: list[dict], columns: list[str]) -> pd.DataFrame:
    """The rows as a table; with no rows, a table that still has every column."""
    return pd.DataFrame(rows) if rows else pd.DataFrame(columns=columns)


def tables(record_paths: list[Path]) -> tuple[pd.DataFrame, pd.DataFrame]:
    configs, measurements = [], []
    for path in record_paths:
        rec = read_json(path)
        row = _config_row(rec)
        configs.append(row)
        per_phase = (rec.get("memory") or {}).get("per_phase") or {}
        measurements += [{**row, **_workload_columns(w, per_phase.get(w["name"], {}))}
                         for w in rec.get("workloads", [])]
    config_frame = _frame(configs, list(_config_row(BLANK_RECORD)))
    return config_frame, _frame(measurements, [*config_frame.columns, *_workload_columns(BLANK_WORKLOAD, {})])


def _search_row(s: dict) -> dict:
    return {
        "model": s["model"], "group": s["group"], "settings": json.dumps(s["settings"]),
        "server_args": settings_mod.label({**s["settings"], "n_cpu_moe": None}),
        "range": json.dumps(s["range"]), "limit_mib": s["limit_mib"], "margin_mib": s["margin_mib"],
        "predicted_lowest": s["predicted_lowest"], "arithmetic": s["arithmetic"],
        "full_residency": s["full_residency"], "boundary": s["boundary"],
        "recommended_n_cpu_moe": s["recommended_n_cpu_moe"], "server_starts": s["server_starts"],
        "probes": json.dumps(s["probes"]), "values": json.dumps(s["values"]),
    }


def search_table(summary_paths: list[Path]) -> pd.DataFrame:
    """One row per n_cpu_moe search: what was predicted, probed, skipped, and where the line is."""
    return _frame([_search_row(read_json(p)) for p in summary_paths], list(_search_row(BLANK_SEARCH)))


def write(record_paths: list[Path], configs_path: Path, measurements_path: Path,
          search_paths: list[Path] = (), searches_path: Path | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    configs, measurements = tables([Path(p) for p in record_paths])
    outputs = [(configs, configs_path), (measurements, measurements_path)]
    if searches_path is not None:
        outputs.append((search_table([Path(p) for p in search_paths]), searches_path))
    for frame, path in outputs:
        with atomic_path(path) as tmp:
            frame.to_parquet(tmp, index=False)
    return configs, measurements
