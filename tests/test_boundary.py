"""The crash line, from the real CUDA runs in the fixtures (outcomes classified from their logs)."""

from __future__ import annotations

import json

import pandas as pd

from crashline.engine import logparse
from crashline.tables.boundary import crash_lines

from conftest import FIXTURES

LOGS = FIXTURES / "cuda-logs"
EXIT = {"load_fail rc=1": 1, "load_fail rc=-6": -6, "ok": 0}


def tables():
    configs, measurements = [], []
    for run in json.loads((LOGS / "runs.json").read_text()):
        if run["vram_budget_mib"] is None:
            continue  # the full-GPU run is another card size: another environment
        verdict = logparse.classify((LOGS / run["file"]).read_text(), EXIT[run["outcome"]])
        cid = run["file"]
        configs.append(
            {
                "model": "qwen3moe-30b-a3b",
                "environment": "H200 at 11761 MiB",
                "config_id": cid,
                "s_n_cpu_moe": run["--n-cpu-moe"],
                "s_ubatch": run["-ub"],
                "s_ctx": run["-c"],
                "outcome": verdict["outcome"],
                "headroom_mib": None,
                "peak_pct_of_limit": None,
            }
        )
        if verdict["outcome"] == "ok":
            for workload in ("short", "deep"):
                measurements.append(
                    {
                        "config_id": cid,
                        "environment": "H200 at 11761 MiB",
                        "workload": workload,
                        "workload_outcome": "ok",
                    }
                )
    return pd.DataFrame(configs), pd.DataFrame(measurements)


def test_crash_line_from_real_runs():
    configs, measurements = tables()
    (line,) = crash_lines(configs, measurements, "short", margin_mib=1024)  # ub 512 has one value only
    assert line["label"] == "-ub 2048"
    assert line["tested"] == [12, 24, 25, 26, 28]
    # 12, 24, 25 fail to load (weights, KV, compute); 26 loads and dies at warm-up; 28 survives.
    assert (line["loads_from"], line["short_from"], line["survives_from"]) == (26, 28, 28)
    assert line["monotonic"]
    assert (
        "loads from n_cpu_moe 26" in line["sentence"]
        and "survives every workload from n_cpu_moe 28" in line["sentence"]
    )


def test_headroom_below_margin_is_risky():
    configs, measurements = tables()
    configs.loc[configs["outcome"] == "ok", ["headroom_mib", "peak_pct_of_limit"]] = [300.0, 97.4]
    (line,) = crash_lines(configs, measurements, "short", margin_mib=1024)
    assert (
        line["risky"]
        and "peak 97.4% of the VRAM limit, headroom 300 MiB, less than the margin: risky" in line["sentence"]
    )
