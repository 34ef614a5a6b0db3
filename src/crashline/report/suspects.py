"""What limits a configuration's speed, in the report's words: each suspect's cell (GPU link, memory bandwidth,
busy, CPU, paging, disk), the deciding ones, and the limits table of a model at its objective's workload."""

from __future__ import annotations

import pandas as pd

from ..core.thresholds import missing, shared
from .rows import num


GPU_SUSPECTS = ("PCIe", "GPU memory bandwidth", "GPU busy", "GPU SMs busy")


SUSPECT_COLUMNS = (*GPU_SUSPECTS, "CPU", "paging", "disk reads")


def _suspect_cell(row: dict | None, gpu: bool, name: str) -> str:
    if row is None:
        if name in GPU_SUSPECTS and not gpu:
            return "no GPU"
        return "not measured: needs GPM (Hopper or later)" if name == "GPU SMs busy" else "–"
    value = row["measured"]
    text = "–" if value is None else f"{value:,.1f} {row['unit']}"
    if row.get("fraction") is not None:
        text += f" ({row['fraction']:.0%} of {row['limit']:,.0f})"
    if row.get("per_token"):
        text += f", {row['per_token']}"
    return f"{text}: {row['verdict']}"


def _bound(w) -> str:
    """The decode bound, with where its placement came from when that is the log alone; else why it is unknown."""
    if missing(w["decode_bound_tps"]):
        return "–" if missing(w.get("decode_bound_unknown")) else f"unknown: {w['decode_bound_unknown']}"
    return num(w["decode_bound_tps"], 1) + (" (placement from the log)" if w.get("decode_bound_from") == "log" else "")


DECIDING = ("saturated", "busy", "paging", "reading")


def _short_suspect(row: dict) -> str:
    """A suspect in a few words: "GPU busy 96%", "CPU 7.8 of 8 cores", "paging 120 faults/s"."""
    name = row["suspect"].split(" (")[0]
    if row.get("fraction") is not None and row["unit"] == "%":
        return f"{name} {row['fraction']:.0%}"
    if row.get("fraction") is not None:
        return f"{name} {row['measured']:,.1f} of {row['limit']:,.0f} {row['unit']} ({row['fraction']:.0%})"
    return f"{name} {row['measured']:,.1f} {row['unit']}"


def deciding(rows: list[dict]) -> list[str]:
    """The one or two suspects that decide the verdict: those near or at their limit (or paging, reading),
    else the busiest one; the most loaded first."""
    measured = [r for r in rows if r.get("measured") is not None]
    hot = [r for r in measured if r["verdict"] in DECIDING]
    pick = hot or sorted((r for r in measured if r.get("fraction") is not None), key=lambda r: -r["fraction"])[:1]
    pick = sorted(pick, key=lambda r: -(r.get("fraction") or 1))[:2]
    return [_short_suspect(r) for r in pick]


def bandwidth_text(provenance: dict) -> str | None:
    """Where the host's memory bandwidth behind the decode bound comes from, and how much its passes spread (#40
    item 6: the same machine read 58 to 106 GB/s on four runs, so a ratio to the bound moves with it)."""
    found = (provenance or {}).get("host_memory_bandwidth") or {}
    if not found.get("gbs"):
        return None
    passes = found.get("passes") or []
    spread = (
        f", its {len(passes)} passes {found['spread']:.0%} apart" if passes and found.get("spread") is not None else ""
    )
    when = f" on {found['measured_at']} UTC" if found.get("measured_at") else ""
    return (
        f"The host's memory bandwidth in the bound: {found['gbs']:,.1f} GB/s, the best pass of a copy measured once "
        f"for {found.get('hostname') or 'this host'}{when}{spread}, and read by every later run there; a ratio to "
        "the bound is as sure as that figure."
    )


def _contention(w) -> list[str]:
    """Other processes as a suspect, first, where they used more than CONTENTION_CORES during the workload."""
    if not shared(w.get("cpu_other_cores")):
        return []
    cores = w.get("cpu_logical_cores")
    of = "" if missing(cores) else f" of {int(cores)}"
    return [f"other processes {w['cpu_other_cores']:.1f}{of} cores: rerun on a quiet machine"]


def limits(measurements: pd.DataFrame, configs: pd.DataFrame, workload: str) -> list[dict]:
    """One row per surviving configuration: each suspect during steady decode, the bound, the verdict, and
    the suspects that decide it."""
    out = []
    rows = measurements[(measurements["workload"] == workload) & (measurements["workload_outcome"] == "ok")]
    for _, w in rows.iterrows():
        gpu = w["gpu"] != "no GPU"
        suspects = {r["suspect"].split(" (")[0]: r for r in w["bottleneck_rows"]}
        out.append(
            {
                "config_id": w["config_id"],
                "server_args": w["server_args"],
                "decode": num(w["decode_tps_median"], 1),
                "bound": _bound(w),
                "ratio": f"{w['measured_over_bound']:.0%}" if not missing(w["measured_over_bound"]) else "–",
                "cells": [_suspect_cell(suspects.get(name), gpu, name) for name in SUSPECT_COLUMNS],
                "deciding": "; ".join([*_contention(w), *deciding(list(w["bottleneck_rows"]))]) or "–",
                "verdict": "–" if missing(w["bottleneck_verdict"]) else w["bottleneck_verdict"],
            }
        )
    return out
