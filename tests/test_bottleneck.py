"""Bottleneck verdicts and the decode bound: PCIe link arithmetic, bytes per token by device."""

from __future__ import annotations

import pytest

from crashline import bottleneck
from crashline.settings import resolve

from test_planner import QWEN


def test_pcie_link_bandwidth_per_direction():
    assert bottleneck.pcie_limit_mbs(5, 16) == pytest.approx(63015, rel=1e-3)  # 32 GT/s, 128b/130b, 16 lanes
    assert bottleneck.pcie_limit_mbs(4, 16) == pytest.approx(31508, rel=1e-3)
    assert bottleneck.pcie_limit_mbs(3, 8) == pytest.approx(7877, rel=1e-3)
    assert bottleneck.pcie_limit_mbs(None, 16) is None


def test_bytes_per_token_split_by_n_cpu_moe():
    layers = QWEN["layers"]
    expert = QWEN["per_layer"][0]["expert_bytes"]
    active = 8 / 128
    all_gpu = bottleneck.bytes_per_token(
        {**QWEN, "n_expert": 128, "n_expert_used": 8}, resolve({"ctx": 32768}), 0, True
    )
    assert all_gpu["cpu"] == 0
    split = bottleneck.bytes_per_token(
        {**QWEN, "n_expert": 128, "n_expert_used": 8}, resolve({"ctx": 32768, "n_cpu_moe": 28}), 0, True
    )
    assert split["cpu"] == pytest.approx(28 * expert * active)
    assert split["gpu"] + split["cpu"] == pytest.approx(all_gpu["gpu"])
    experts_on_cpu = bottleneck.bytes_per_token(
        {**QWEN, "n_expert": 128, "n_expert_used": 8}, resolve({"ctx": 32768, "n_cpu_moe": layers}), 0, True
    )
    assert experts_on_cpu["cpu"] == pytest.approx(layers * expert * active)  # every layer's experts, nothing else
    cpu_only = bottleneck.bytes_per_token({**QWEN, "n_expert": 128, "n_expert_used": 8}, resolve({}), 0, False)
    assert cpu_only["gpu"] == 0 and cpu_only["cpu"] == pytest.approx(all_gpu["gpu"])
    # The KV cache read per token grows with depth: 96 KiB per token of context for this shape.
    deep = bottleneck.bytes_per_token({**QWEN, "n_expert": 128, "n_expert_used": 8}, resolve({}), 16384, False)
    assert deep["cpu"] - cpu_only["cpu"] == pytest.approx(16384 * 96 * 1024)


def test_bound_is_serial_time_over_both_devices():
    m = {**QWEN, "n_expert": 128, "n_expert_used": 8}
    s = resolve({"n_cpu_moe": 28})
    b = bottleneck.decode_bound(m, s, 1024, gpu_gbs=4000.0, cpu_gbs=50.0)
    assert b["bound_tps"] == pytest.approx(1 / (b["gpu_bytes"] / 4000e9 + b["cpu_bytes"] / 50e9))


def decode(**kw):
    base = {
        "pcie_rx_kbs": 1_000_000,
        "pcie_tx_kbs": 50_000,
        "pcie_gen": 5,
        "pcie_width": 16,
        "gpu_mem_pct": 14,
        "gpu_sm_pct": 50,
        "server_cpu_cores": 8.0,
        "majflt_per_s": 0,
        "swap_in_bytes_per_s": 0,
        "swap_out_bytes_per_s": 0,
        "disk_read_bytes_per_s": 0,
    }
    return {**base, **kw}


def test_serial_wait_when_both_devices_are_partly_busy():
    t = bottleneck.table(decode(), decode_tps=50.0, n_threads=16, gpu=True)
    assert t["verdict"].startswith("serial wait between devices")
    pcie = t["rows"][0]
    assert pcie["verdict"] == "far from it" and pcie["per_token"] == "21.00 MB/token"


def test_saturated_and_paging_verdicts():
    assert bottleneck.table(decode(gpu_sm_pct=97), 50.0, 16, True)["verdict"] == "limited by GPU busy"
    assert bottleneck.table(decode(server_cpu_cores=15.5), 50.0, 16, True)["verdict"].startswith("limited by CPU")
    assert bottleneck.table(decode(majflt_per_s=300), 50.0, 16, True)["verdict"].startswith("waiting on storage")
    cpu_only = bottleneck.table(decode(server_cpu_cores=1.95), 20.0, 2, gpu=False)
    assert [r["suspect"] for r in cpu_only["rows"]][0].startswith("CPU") and cpu_only["verdict"].startswith(
        "limited by CPU"
    )
    assert bottleneck.table(None, None, 2, False)["rows"] == []
