"""What an answer cost, from the jobs' own clocks in the tables: server starts, measurement and serving time, recall
checks, GPU time, the build; and the starts the searches saved against a grid of their ranges."""

from __future__ import annotations

import pandas as pd


def _search_starts(searches: pd.DataFrame | None) -> dict:
    """The searches' server starts, and what a grid would take: every value of their ranges, each started as often
    as a finalist is (#22: the starts the planner saves)."""
    if searches is None or searches.empty or "range_lo" not in searches:
        return {}
    values = searches["range_hi"] - searches["range_lo"] + 1
    grid = (values * searches["starts_per_finalist"].fillna(1).clip(lower=1)).sum()
    return {"search_starts": int(searches["server_starts"].sum()), "grid_starts": int(grid)}


def cost(
    configs: pd.DataFrame, needle: pd.DataFrame | None, provenance: dict, searches: pd.DataFrame | None = None
) -> dict | None:
    """What the answer cost, from the jobs' own clocks: server starts, the measurements' time (searches' probes
    and calibration starts included) and the part of it spent starting servers and serving requests, the recall
    checks' time, the GPU minutes where jobs held one, and the llama-server build (once per machine)."""
    if "job_s" not in configs or configs["job_s"].dropna().empty:
        return None  # records written before the jobs' clocks were tabled
    measured = configs.dropna(subset=["job_s"])
    calibrations = (
        searches.dropna(subset=["calibration_job_s"])
        if searches is not None and "calibration_job_s" in searches
        else pd.DataFrame(columns=["calibration_job_s", "calibration_serving_s"])
    )
    measure_s = float(measured["job_s"].sum()) + float(calibrations["calibration_job_s"].sum())
    serving_s = float(measured["serving_s"].sum()) + float(calibrations["calibration_serving_s"].sum())
    recall = pd.DataFrame()
    if needle is not None and not needle.empty and "job_s" in needle:
        recall = needle.drop_duplicates(["model", "config_id", "environment"])
    recall_s = float(recall["job_s"].dropna().sum()) if not recall.empty else 0.0
    recall_starts = int(recall["applicable"].fillna(False).astype(bool).sum()) if not recall.empty else 0
    on_gpu = measured[measured["gpu"] != "no GPU"]["job_s"].sum()
    restarts = int(measured["server_starts"].sum()) - len(measured)
    return {
        "measurements": len(measured),
        "server_starts": int(measured["server_starts"].sum()) + len(calibrations) + recall_starts,
        "calibrations": len(calibrations),
        **_search_starts(searches),
        "restarts": restarts,
        "recall_starts": recall_starts,
        "measure_s": round(measure_s, 1),
        "serving_s": round(serving_s, 1),
        "overhead_ratio": round(measure_s / serving_s, 3) if serving_s else None,
        "recall_s": round(recall_s, 1),
        "gpu_s": round(float(on_gpu), 1) if on_gpu else None,  # measurements only: recall jobs hold it too
        "build_s": provenance.get("build_seconds"),
        "built": str(provenance.get("obtained") or ""),
    }
