"""Telemetry and bottleneck verdicts from real H200 runs (bench/placement.py, synthetic
Qwen3-30B-A3B shape): the saved time series are analysed again and must give the same picture.
The ``gpm-`` runs come from the sampler with GPM (SM share, DRAM bandwidth, PCIe between samples);
the others from the earlier sampler without it. Then the sampler itself, against a fake NVML board
whose readings each test sets."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import pandas as pd
import psutil
import pytest

from crashline.jobs import measure
from crashline.core.atomic import read_json
from crashline.jobs.measure import memory_summary
from crashline.engine.telemetry import Sampler, window_summary

from conftest import FIXTURES
from fake_nvml import MIB, NOT_SUPPORTED, FakeNvml

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


def load_reads(name: str) -> tuple[float, float]:
    """Bytes read from the disk, by the machine and by the server, over a run's load phase (window_summary)."""
    frame = pd.read_parquet(DATA / f"{name}.parquet")
    t = frame.loc[frame["phase"] == "load", "t"]
    s = window_summary(frame, [(t.iloc[0], t.iloc[-1])])
    return s["disk_read_bytes_per_s"] * s["seconds"], s["server_read_bytes_per_s"] * s["seconds"]


def test_cold_load_reads_the_model_from_the_disk_and_warm_load_reads_nothing():
    warm, cold = read_json(DATA / "budget-b65d6887e2.json"), read_json(DATA / "budget-c9fccb9204.json")
    assert (warm["settings"]["page_cache"], cold["settings"]["page_cache"]) == ("warm", "cold")
    # The cold server itself read the whole 16 GiB GGUF (16,868,879,648 bytes, less its header) while it loaded.
    assert load_reads("budget-c9fccb9204") == pytest.approx((16868548608, 16868548608), rel=1e-3)  # s rounded to ms
    assert load_reads("budget-b65d6887e2") == (0, 0)


def test_gpm_partly_offloaded_decode_leaves_dram_and_pcie_idle(tmp_path):
    rec = analysed(tmp_path, "gpm-budget-b65d6887e2")  # --n-cpu-moe 29 under a 12 GiB budget, GPM sampler
    assert rec["memory"]["pcie_source"] == "GPM"
    w = deep(rec)
    rows = {r["suspect"].split(" (")[0]: r for r in w["bottleneck"]["rows"]}
    assert "DRAM bandwidth used" in next(
        r["suspect"] for r in w["bottleneck"]["rows"] if r["suspect"].startswith("GPU memory bandwidth")
    )
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


# --- the sampler against a fake NVML (tests/fake_nvml.py) ------------------------------------------


@pytest.fixture
def board(monkeypatch):
    """Makes a FakeNvml (with or without GPM) and installs it as ``pynvml`` for the sampler to import."""

    def install(gpm: bool) -> FakeNvml:
        fake = FakeNvml(gpm)
        monkeypatch.setitem(sys.modules, "pynvml", fake)
        return fake

    return install


@pytest.fixture
def server_tree():
    """A stand-in for llama-server: a process with a child, both real (the sampler reads their /proc)."""
    proc = subprocess.Popen(["sh", "-c", "sleep 60 & wait"], start_new_session=True)
    deadline = time.monotonic() + 10
    while not psutil.Process(proc.pid).children() and time.monotonic() < deadline:
        time.sleep(0.01)
    (child,) = psutil.Process(proc.pid).children()
    yield proc.pid, child.pid
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def sampled(server: int, steps) -> tuple[Sampler, pd.DataFrame, dict]:
    """A sampler (no periodic samples: each ``step(sampler)`` takes what it needs) following ``server``."""
    sampler = Sampler(interval_s=3600)
    with sampler:
        sampler.follow(server)
        for step in steps:
            step(sampler)
    try:
        return sampler, sampler.frame(), sampler.result()
    finally:
        sampler.close()


def reading(nv: FakeNvml, then, **board):
    """A step: set the board's readings, then ``then(sampler)`` (a sample, or the start of a phase)."""

    def step(sampler):
        for name, value in board.items():
            setattr(nv, name, value)
        then(sampler)

    return step


def periodic(sampler):
    sampler._sample()  # what the sampler's thread does every interval_s


ROW_COLUMNS = {
    "t",
    "phase",
    "server_cpu_s",
    "server_rss_mib",
    "server_minflt",
    "server_majflt",
    "server_read_bytes",
    "machine_busy_s",
    "machine_steal_s",
    "swap_in_bytes",
    "swap_out_bytes",
    "disk_read_bytes",
    "gpu_sm_pct",
    "gpu_mem_pct",
    "pcie_rx_kbs",
    "pcie_tx_kbs",
    "pcie_gen",
    "pcie_width",
    "sm_clock_mhz",
    "mem_clock_mhz",
    "power_w",
    "gpu_mib",
}


def test_nvml_rows_and_phase_peaks_count_the_servers_processes_only(board, server_tree):
    nv = board(gpm=False)
    server, child = server_tree
    others = {os.getpid(): 5000, 1: None}  # other processes on the card (one the driver gives no figure for)
    _, frame, result = sampled(
        server,
        [
            reading(nv, periodic, processes={server: 700, child: 300, **others}),
            reading(nv, lambda s: s.phase("short"), processes={server: 900, child: 300, **others}),
            reading(nv, periodic, processes={server: 1100, child: 400, **others, 12345: 9000}),
            reading(nv, lambda s: s.phase("stop"), processes={server: 600, **others}),
        ],
    )
    assert set(frame.columns) == ROW_COLUMNS  # no GPM columns, and no energy (its query costs 3.5 ms)
    assert frame["gpu_mib"].tolist() == [1000, 1200, 1500, 600]
    assert frame["phase"].tolist() == ["load", "load", "short", "short"]
    first = frame.iloc[0]
    assert first[["gpu_sm_pct", "gpu_mem_pct", "pcie_rx_kbs", "pcie_tx_kbs"]].tolist() == [37, 12, 2000, 300]
    assert first[["pcie_gen", "pcie_width", "sm_clock_mhz", "mem_clock_mhz"]].tolist() == [5, 16, 1980, 2619]
    assert first["power_w"] == 250.0 and first["server_rss_mib"] > 0
    phases = result["per_phase"]
    assert (phases["load"]["gpu_mib"], phases["short"]["gpu_mib"]) == (1200, 1500)  # the peaks, not the last
    assert {phases["load"]["gpu_source"], phases["short"]["gpu_source"]} == {"process"}
    assert (result["gpu_present"], result["gpu_baseline_used_mib"], result["peak_gpu_mib"]) == (True, 1000, 1500)
    assert result["pcie_source"] == "throughput samples" and nv.shut
    assert result["gpu_memory_bandwidth_gbs"] == pytest.approx(3352.32)  # 2619 MHz x 2 x 5120 bits


def limit_figures(summary: dict) -> tuple:
    keys = ("vram_limit_mib", "vram_limit_is", "headroom_mib", "headroom_pct", "peak_pct_of_limit")
    return tuple(summary[k] for k in keys)


def test_memory_summary_of_the_sampled_peaks(board, server_tree):
    nv = board(gpm=False)
    server, _ = server_tree
    _, _, result = sampled(server, [reading(nv, periodic, processes={server: 1500})])
    card = {"gpu": {"devices": [{"memory_total_mib": 143771}]}}
    summary = memory_summary(result, None, card)
    assert summary["per_phase"]["load"]["gpu_mib"] == 1500 and summary["peak_gpu_mib"] == 1500
    assert limit_figures(summary) == (143771, "card", 142271, 98.96, 1.04)
    assert limit_figures(memory_summary(result, 12288, card)) == (12288, "budget", 10788, 87.79, 12.21)


@pytest.mark.parametrize(
    "processes",
    [{}, {4_000_000: 3000}, NOT_SUPPORTED],
    ids=["no process listed", "pids of another pid namespace", "query not supported"],
)
def test_vram_falls_back_to_the_device_delta_when_the_server_is_not_listed(board, server_tree, processes):
    nv = board(gpm=False)  # 1000 MiB used when the sampler starts: the baseline
    _, frame, result = sampled(
        server_tree[0],
        [
            reading(nv, periodic, processes=processes, used_mib=2500),
            reading(nv, lambda s: s.phase("short"), processes=processes, used_mib=4096),
        ],
    )
    assert frame["gpu_mib"].tolist() == [1500, 3096]
    load = result["per_phase"]["load"]
    assert (load["gpu_mib"], load["gpu_source"]) == (3096, "device delta")


GPM_COLUMNS = ["gpm_sm_pct", "gpm_occupancy_pct", "gpm_dram_bw_pct", "pcie_rx_kbs", "pcie_tx_kbs"]


def test_gpm_figures_are_per_span_and_spans_under_a_tenth_of_a_second_are_skipped(board, server_tree):
    nv = board(gpm=True)
    nv.spans = [
        {"sm": 42.0, "occupancy": 17.5, "dram": 63.0, "rx": 100.0, "tx": 10.0},
        {"sm": 80.0, "occupancy": 30.0, "dram": None, "rx": 1.0, "tx": 2.0},
    ]  # no DRAM figure this time
    nv.power_mw = None  # a board without a power reading: absent, not zero
    wait = [lambda s: time.sleep(0.15), periodic]
    _, frame, result = sampled(server_tree[0], [*wait, periodic, *wait])  # 0.15 s, at once, 0.15 s later
    assert frame[GPM_COLUMNS].iloc[0].tolist() == [42.0, 17.5, 63.0, 100 * MIB / 1000, 10 * MIB / 1000]
    assert frame[GPM_COLUMNS].iloc[1].isna().all()  # skipped (the H200 said 0% SMs busy): none, not 0
    third = frame[GPM_COLUMNS].iloc[2]
    assert third.drop("gpm_dram_bw_pct").tolist() == [80.0, 30.0, 1 * MIB / 1000, 2 * MIB / 1000]
    assert pd.isna(third["gpm_dram_bw_pct"])  # a metric NVML did not return is absent, not 0
    assert nv.span_pairs == [(0, 1), (1, 2)]  # the skipped sample took no GPM sample: its span stayed open
    assert frame["power_w"].isna().all() and (frame["gpu_sm_pct"] == 37).all()
    assert result["pcie_source"] == "GPM" and nv.freed == 2 and nv.shut
    decode = window_summary(frame, [(frame["t"].iloc[0], frame["t"].iloc[2])])
    assert (decode["gpm_sm_pct"], decode["gpm_dram_bw_pct"], decode["samples"]) == (61.0, 63.0, 3)


def test_with_two_gpus_each_one_s_memory_is_counted_and_the_tightest_sets_the_headroom(board, server_tree):
    """A configuration on two GPUs (tensor split): each GPU's own peak against its own limit; the headroom that
    decides survival with margin is the GPU with the least room, not the sum over both."""
    nv = board(gpm=False)
    nv.boards = [nv.boards[0], *FakeNvml(boards=2).boards[1:]]
    first, second = nv.boards
    server, _ = server_tree
    sampler = Sampler(interval_s=3600, uuids=[second.uuid, first.uuid])  # the lease's order
    with sampler:
        sampler.follow(server)
        first.processes, second.processes = {server: 9000}, {server: 3000}
        sampler._sample()
        first.processes, second.processes = {server: 7000}, {server: 11000}
        sampler._sample()
    frame, result = sampler.frame(), sampler.result()
    sampler.close()
    assert frame[["gpu_mib", "gpu0_mib", "gpu1_mib"]].values.tolist() == [[12000, 3000, 9000], [18000, 11000, 7000]]
    assert result["peak_gpu_mib"] == 18000 and result["peak_gpus_mib"] == [11000, 9000]
    card = {
        "gpu": {
            "devices": [{"name": "NVIDIA H200", "uuid": b.uuid, "memory_total_mib": 143771} for b in (second, first)]
        }
    }
    summary = memory_summary(result, 12288, card)
    assert summary["vram_limit_mib"] == 2 * 12288
    assert [g["headroom_mib"] for g in summary["per_gpu"]] == [1288, 3288] and summary["tightest_gpu"] == 0
    assert (summary["headroom_mib"], summary["peak_pct_of_limit"]) == (1288, round(11000 / 12288 * 100, 2))
