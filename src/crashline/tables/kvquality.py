"""The KV quality table (``results/tables/kv_quality.parquet``): one row per model x quantised KV type, from the
records ``jobs.kvquality`` writes; and per model, each KV type's speed, KL divergence and recall side by side,
which the report and ``tune``'s answer read."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pyarrow as pa

from ..config.expand import kv_label
from ..core import columns as cols
from ..core import records
from ..core.thresholds import missing
from . import files

F16 = "f16"  # the reference every quantised type is measured against


def table(record_paths) -> pa.Table:
    rows = [records.load(path, "kv_quality") for path in record_paths]
    return files.typed_table([{k: r.get(k) for k in cols.KV_QUALITY} for r in rows], cols.KV_QUALITY)


def write_table(record_paths, path: Path) -> None:
    """``table`` written atomically as Parquet, CSV and JSON."""
    files.write(table([Path(p) for p in record_paths]), path)


def label_of(row) -> str:
    """A configuration row's KV label (``config.expand.kv_label``), "f16" for the reference."""
    return kv_label({"cache_type_k": row.get("s_cache_type_k"), "cache_type_v": row.get("s_cache_type_v")}) or F16


def _value(value):
    return None if missing(value) else value


def side_by_side(
    model: str,
    kv: pd.DataFrame,
    configs: pd.DataFrame,
    measurements: pd.DataFrame,
    needle: pd.DataFrame | None,
    metric: str,
    workload: str,
    max_kld: float,
) -> list[dict]:
    """Per KV type of ``model`` (f16 first): its fastest configuration at the objective ``workload`` by ``metric``
    and that speed, its KL divergence against f16 (median, 99th percentile, mean, same top token), its needle
    recall (configurations of the type that recalled every needle / checked), and ``over``: why its price is above
    ``max_kld`` where it is faster than f16 and its median KL divergence is above it. Empty without a quantised
    type measured."""
    ours = kv[kv["model"] == model] if not kv.empty else kv
    if ours.empty:
        return []
    mine = configs[configs["model"] == model]
    types = mine.assign(kv=[label_of(r) for r in mine.to_dict("records")])[["config_id", "kv"]]
    at = measurements[(measurements["model"] == model) & (measurements["workload"] == workload)]
    at = at[at["workload_outcome"] == "ok"].merge(types, on="config_id")
    speed = cols.stat(metric, "median")
    recalls = pd.DataFrame(columns=["config_id", "recall"])
    if needle is not None and not needle.empty:
        recalls = needle[needle["model"] == model].drop_duplicates("config_id")[["config_id", "recall"]]
    recalls = recalls.merge(types, on="config_id")
    out = []
    for label in [F16, *ours["kv"]]:
        best = at[at["kv"] == label].sort_values(speed, ascending=False).head(1)
        checked = recalls[recalls["kv"] == label]
        row = ours[ours["kv"] == label]
        figures = {} if row.empty else {k: _value(v) for k, v in row.iloc[0].items()}
        out.append(
            {
                "kv": label,
                "config_id": best["config_id"].iloc[0] if len(best) else None,
                "tried": bool((types["kv"] == label).any()),  # False: no configuration of it (f16 not asked)
                "speed": float(best[speed].iloc[0]) if len(best) else None,
                "recall_passed": int((checked["recall"] == "pass").sum()),
                "recall_checked": len(checked),
                "recall_applicable": bool((checked["recall"] != "not_applicable").any()),
                "informative": figures.get("informative", True),
                "message": figures.get("message"),
                **{k: figures.get(k) for k in ("kld_median", "kld_p99", "kld_mean", "same_top_pct", "ctx")},
                "ctx_reason": figures.get("ctx_reason"),
            }
        )
    reference = out[0]["speed"]
    for r in out[1:]:
        faster = r["speed"] is not None and reference is not None and r["speed"] > reference
        r["over"] = (
            f"{r['kv']} is {r['speed'] / reference - 1:.0%} faster than f16, but its median KL divergence "
            f"{r['kld_median']:.4f} is above kv_quality.max_kld {max_kld:g}"
            if faster and r["informative"] and r["kld_median"] is not None and r["kld_median"] > max_kld
            else None
        )
    out[0]["over"] = None
    return out
