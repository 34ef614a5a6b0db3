"""Telemetry and bottleneck verdicts from real H200 runs (bench/placement.py, synthetic
Qwen3-30B-A3B shape): the saved time series are analysed again and must give the same picture.
The ``gpm-`` runs come from the sampler with GPM (SM share, DRAM bandwidth, PCIe between samples);
the others from the earlier sampler without it."""

from __future__ import annotations

import shutil

import pandas as pd
import pytest

from crashline import measure
from crashline.atomic import read_json

from conftest import FIXTURES

DATA = FIXTURES / "h200-telemetry"


def analysed(tmp_path, name):
    shutil.copy(DATA / f"{name}.json", tmp_path / "measure.json")
    return measure.reanalyse(tmp_path / "measure.json", DATA / f"{name}.parquet", read_json(DATA / "manifest.json"))


def deep(rec):
    return next(w for w in rec["workloads"] if w["name"].startswith("depth"))


def test_partly_offloaded_decode_is_cpu_side_not_pcie(tmp_path):
    rec = analysed(tmp_path, "budget-b65d6887e2")  # --n-cpu-moe 29 under a 12 GiB budget, warm
    w = deep(rec)
    rows = {r["suspect"].split(" (")[0]: r for r in w["bottleneck"]["rows"]}
    assert rows["PCIe"]["verdict"] == "far from it" and rows["PCIe"]["fraction"] < 0.05
    assert rows["GPU memory bandwidth"]["verdict"] == "far from it"
    assert rows["CPU"]["verdict"] == "saturated" and w["bottleneck"]["verdict"] == "limited by CPU"
    assert rows["paging"]["verdict"] == "none" and rows["disk reads"]["verdict"] == "none"
    bound = w["decode_bound"]
    assert bound["cpu_bytes"] > 0 and 0.2 < bound["measured_over_bound"] < 1


def test_all_on_gpu_decode_keeps_the_gpu_busy(tmp_path):
    rec = analysed(tmp_path, "full-d6a4a1a0cf")  # --n-cpu-moe 0, no budget
    w = deep(rec)
    rows = {r["suspect"].split(" (")[0]: r for r in w["bottleneck"]["rows"]}
    assert rows["GPU busy"]["verdict"] == "saturated" and rows["CPU"]["verdict"] == "far from it"
    assert w["decode_bound"]["cpu_bytes"] == 0 and w["decode_bound"]["gpu_gbs"] > 1000


def test_cold_load_reads_the_disk_and_is_recorded_as_cold():
    warm, cold = read_json(DATA / "budget-b65d6887e2.json"), read_json(DATA / "budget-c9fccb9204.json")
    assert warm["settings"]["page_cache"] == "warm" and cold["settings"]["page_cache"] == "cold"
    assert cold["page_cache"]["verified"] and cold["page_cache_resident_at_start"] < 0.05
    assert warm["page_cache_resident_at_start"] > 0.95
    assert cold["load_s"] > 2 * warm["load_s"]
    frame = pd.read_parquet(DATA / "budget-c9fccb9204.parquet")
    load = frame[frame["phase"] == "load"]
    assert load["disk_read_bytes"].iloc[-1] - load["disk_read_bytes"].iloc[0] > 8 * (1 << 30)  # most of 16 GiB


def test_gpu_time_series_columns():
    frame = pd.read_parquet(DATA / "full-d6a4a1a0cf.parquet")
    for col in ("gpu_sm_pct", "gpu_mem_pct", "pcie_rx_kbs", "pcie_tx_kbs", "pcie_gen", "pcie_width", "power_w",
                "energy_mj", "gpu_mib", "server_cpu_s", "server_majflt", "swap_in_bytes", "disk_read_bytes"):
        assert frame[col].notna().any(), col
    assert frame["energy_mj"].is_monotonic_increasing
    assert frame["pcie_gen"].max() == pytest.approx(5)


def test_gpm_partly_offloaded_decode_leaves_dram_and_pcie_idle(tmp_path):
    rec = analysed(tmp_path, "gpm-budget-b65d6887e2")  # --n-cpu-moe 29 under a 12 GiB budget, GPM sampler
    assert rec["memory"]["pcie_source"] == "GPM"
    w = deep(rec)
    rows = {r["suspect"].split(" (")[0]: r for r in w["bottleneck"]["rows"]}
    assert "DRAM bandwidth used" in next(r["suspect"] for r in w["bottleneck"]["rows"]
                                         if r["suspect"].startswith("GPU memory bandwidth"))
    assert rows["GPU memory bandwidth"]["fraction"] < 0.05 and rows["GPU SMs busy"]["fraction"] < 0.25
    assert rows["PCIe"]["verdict"] == "far from it" and rows["CPU"]["verdict"] == "saturated"
    assert w["bottleneck"]["verdict"] == "limited by CPU"


def test_gpm_all_on_gpu_decode_is_latency_bound(tmp_path):
    rec = analysed(tmp_path, "gpm-full-d6a4a1a0cf")  # --n-cpu-moe 0, no budget, GPM sampler
    w = deep(rec)
    rows = {r["suspect"].split(" (")[0]: r for r in w["bottleneck"]["rows"]}
    assert rows["GPU busy"]["verdict"] == "saturated"
    assert rows["GPU memory bandwidth"]["verdict"] == "far from it" and rows["GPU SMs busy"]["verdict"] != "saturated"
    assert w["bottleneck"]["verdict"].startswith("limited by GPU latency")


def test_gpm_time_series_has_rates_between_samples():
    frame = pd.read_parquet(DATA / "gpm-full-d6a4a1a0cf.parquet")
    # Every span of 0.1 s or more has its figures. This run predates skipping shorter spans: its two
    # phase-boundary samples a few ms after a periodic one have 0% SMs and no DRAM figure.
    spans = frame[frame["t"].diff() >= 0.1]
    assert len(spans) > 30
    for col in ("gpm_sm_pct", "gpm_occupancy_pct", "gpm_dram_bw_pct", "pcie_rx_kbs", "pcie_tx_kbs"):
        assert spans[col].notna().all() and spans[col].min() >= 0, col
    decode = frame[(frame["phase"] == "depth-16k") & (frame["gpu_sm_pct"] >= 99)]
    assert decode["gpm_sm_pct"].min() > 50 and decode["gpm_dram_bw_pct"].max() < 30  # kernels run, DRAM idles
    assert frame["gpm_dram_bw_pct"].max() <= 100 and "energy_mj" not in frame
