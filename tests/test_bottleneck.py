"""Bottleneck verdicts and the decode bound: PCIe link arithmetic, bytes per token by device, from the
settings and from the placement the server's log shows."""

from __future__ import annotations

import shutil

import pytest

from crashline.engine import bottleneck, logparse, planner
from crashline.jobs import measure
from crashline.core.atomic import read_json
from crashline.core.settings import resolve

from conftest import FIXTURES
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


# --- the decode bound from the placement the server's log shows -----------------------------------------
# The real H200 logs (cuda-logs/, the synthetic Qwen3-30B-A3B of manifest.json: 48 layers, 128 experts
# of which 8 are active, 324 MiB of experts and 11 MiB of dense weights per layer) and the bandwidths
# the same H200 runs measured (h200-telemetry/*.json).

MANIFEST = read_json(FIXTURES / "h200-telemetry" / "manifest.json")
LOGS = FIXTURES / "cuda-logs"
H200_GBS, CPU_GBS = 4814.304, 76.88
DEPTH = 16384 + 16  # workload depth-16k: prompt + half the generated tokens
ACTIVE = 8 / 128
EXPERTS = MANIFEST["per_layer"][0]["expert_bytes"]
FIT_ON = resolve({"ctx": 32768, "ubatch": 2048, "fit": "on"})  # llama.cpp places: n_cpu_moe, -ngl unset


def moe(n_cpu_moe: int, **more) -> dict:
    return resolve({"ctx": 32768, "ubatch": 2048, "n_cpu_moe": n_cpu_moe, **more})


def placement(log: str) -> dict:
    return logparse.parse_log((LOGS / log).read_text())


def bound(settings: dict, place: dict | None, gpu_gbs=H200_GBS, cpu_gbs=CPU_GBS) -> dict:
    return bottleneck.decode_bound(MANIFEST, settings, DEPTH, gpu_gbs, cpu_gbs, place)


SERVED = [  # every CUDA log whose server placed its weights and KV cache, with its --n-cpu-moe
    ("ok-full-gpu.log", 0),
    ("ok-ncmoe28-budget12g.log", 28),
    ("ok-ncmoe26-ub512-budget12g.log", 26),
    ("loadfail-compute-buffer.log", 25),
    ("oom-abort-at-warmup.log", 26),
]


@pytest.mark.parametrize("log, n", SERVED)
def test_where_the_log_agrees_with_n_cpu_moe_the_bound_is_the_settings_own(log, n):
    with_log = bound(moe(n), placement(log))
    assert with_log["placement_from"] == "settings and log"
    assert {k: with_log[k] for k in ("gpu_bytes", "cpu_bytes", "bound_tps")} == {
        k: bound(moe(n), None)[k] for k in ("gpu_bytes", "cpu_bytes", "bound_tps")
    }
    assert with_log["cpu_bytes"] == pytest.approx(n * EXPERTS * ACTIVE)


@pytest.mark.parametrize("log, n", SERVED)
def test_a_placement_llama_cpp_chose_is_read_from_the_log(log, n):
    """The same logs as if --fit on had chosen that split: the settings say nothing, the buffers say it all.
    The CUDA0 model buffer is the tensors plus a few bytes of padding, so the bytes match to 1e-6."""
    chosen = bound(FIT_ON, placement(log))
    assert chosen["placement_from"] == "log"
    expected = bound(moe(n), None)
    assert chosen["cpu_bytes"] == pytest.approx(n * EXPERTS * ACTIVE, rel=1e-6, abs=1)
    assert chosen["gpu_bytes"] == pytest.approx(expected["gpu_bytes"], rel=1e-6)
    assert chosen["bound_tps"] == pytest.approx(expected["bound_tps"], rel=1e-6)


def test_fit_on_bound_from_the_h200_record_is_its_logged_split_not_all_on_the_gpu():
    """Issue #14: a --fit on row got the all-on-GPU bound (1508 t/s at 16K here: its 63 t/s read as 4% of
    it) although its log put only 7122 of the 16087 MiB of weights on CUDA0. 7122 MiB is the dense part
    (535 MiB), 20 layers of experts and a third of a 21st (one of gate/up/down): between --n-cpu-moe 28
    and 27."""
    rec = read_json(FIXTURES / "h200-records" / "fit-on.json")
    assert rec["placement"]["buffers_mib"]["CUDA0:model"] == 7122.1
    fit = bound(rec["settings"], rec["placement"])
    all_gpu = bound(moe(0), None)
    assert fit["placement_from"] == "log" and fit["bound_tps"] < all_gpu["bound_tps"] / 10
    dense = sum(r["other_bytes"] + r["shared_expert_bytes"] for r in MANIFEST["per_layer"]) + MANIFEST["output_bytes"]
    on_cpu = 48 * EXPERTS - (7122.1 * (1 << 20) - dense)
    assert fit["cpu_bytes"] == pytest.approx(on_cpu * ACTIVE)
    assert fit["gpu_bytes"] + fit["cpu_bytes"] == pytest.approx(all_gpu["gpu_bytes"])  # every byte, somewhere
    assert bound(moe(28), None)["bound_tps"] < fit["bound_tps"] < bound(moe(27), None)["bound_tps"]
    assert fit["bound_tps"] == pytest.approx(122.2, abs=0.05)
    measured = next(w for w in rec["workloads"] if w["name"] == "depth-16k")["decode_tps"]["median"]
    assert measured / fit["bound_tps"] == pytest.approx(0.518, abs=0.001)  # not 0.04


def test_measure_passes_the_records_placement_to_the_bound():
    rec = read_json(FIXTURES / "h200-records" / "fit-on.json")
    rec["memory"] = {**rec["memory"], "gpu_present": True, "gpu_memory_bandwidth_gbs": H200_GBS}
    rec["cpu_memory_bandwidth_gbs"] = CPU_GBS
    measure.add_bottlenecks(rec["workloads"], rec, MANIFEST, rec["settings"])
    deep = next(w for w in rec["workloads"] if w["name"] == "depth-16k")["decode_bound"]
    assert deep["placement_from"] == "log" and deep["bound_tps"] == pytest.approx(122.2, abs=0.05)
    assert deep["measured_over_bound"] == pytest.approx(0.518, abs=0.001)


@pytest.mark.parametrize("name", ["budget-b65d6887e2", "full-d6a4a1a0cf", "gpm-budget-b65d6887e2"])
def test_h200_records_keep_their_bound_when_analysed_again(tmp_path, name):
    """--n-cpu-moe 29 and 0 runs whose logs agree with their settings: the bound stored when they were
    measured, bit for bit."""
    data = FIXTURES / "h200-telemetry"
    stored = read_json(data / f"{name}.json")
    shutil.copy(data / f"{name}.json", tmp_path / "measure.json")
    again = measure.reanalyse(tmp_path / "measure.json", data / f"{name}.parquet", MANIFEST)
    for old, new in zip(stored["workloads"], again["workloads"], strict=True):
        assert new["decode_bound"]["placement_from"] == "settings and log"
        assert new["decode_bound"]["bound_tps"] == old["decode_bound"]["bound_tps"]


def test_the_log_wins_over_settings_it_contradicts():
    """Asked for --n-cpu-moe 28, but the log shows the weights of --n-cpu-moe 26 on the GPU: the server ran
    with what its log shows."""
    ran = bound(moe(28), placement("ok-ncmoe26-ub512-budget12g.log"))
    assert ran["placement_from"] == "log"
    assert ran["bound_tps"] == pytest.approx(bound(moe(26), None)["bound_tps"], rel=1e-6)


def logged(weights_bytes: float, offloaded: int | None, kv_gpu_share: float) -> dict:
    """A placement as parse_log gives it: the GPU's weights, the CPU's mmap span, the KV cache split."""
    mib = 1 << 20
    kv = planner.kv_mib(MANIFEST, FIT_ON)
    return {
        "buffers": [
            {"device": "CPU_Mapped", "kind": "model", "mib": 16087.38},
            {"device": "CUDA0", "kind": "model", "mib": round(weights_bytes / mib, 2)},
            {"device": "CUDA0", "kind": "kv", "mib": kv * kv_gpu_share},
            {"device": "CPU", "kind": "kv", "mib": kv * (1 - kv_gpu_share)},
        ],
        "layers_offloaded": offloaded,
    }


def test_partial_ngl_moves_whole_layers_and_their_kv_cache():
    """-ngl 30: the last 30 layers (dense, experts and KV) on the GPU, the output head and 18 layers not."""
    weights = planner.weights_mib(MANIFEST, moe(0, n_gpu_layers=30)) * (1 << 20)
    place = logged(weights, 30, 30 / 48)
    expected = bound(moe(0, n_gpu_layers=30), None)
    assert bound(moe(0, n_gpu_layers=30), place)["placement_from"] == "settings and log"
    chosen = bound(FIT_ON, place)
    assert chosen["placement_from"] == "log"
    assert chosen["gpu_bytes"] == pytest.approx(expected["gpu_bytes"], rel=1e-6)
    assert chosen["cpu_bytes"] == pytest.approx(expected["cpu_bytes"], rel=1e-6)


def test_override_tensor_experts_to_the_cpu():
    """-ot exps=CPU: every layer offloaded, every expert in RAM; the same bytes as --n-cpu-moe 48."""
    ot = resolve({"ctx": 32768, "ubatch": 2048, "override_tensor": r"\.ffn_.*_exps\.=CPU"})
    assert bound(ot, None)["bound_tps"] is None  # the settings alone do not say where the experts went
    weights = planner.weights_mib(MANIFEST, moe(48)) * (1 << 20)
    chosen = bound(ot, logged(weights, 49, 1.0))
    assert chosen["placement_from"] == "log"
    assert chosen["cpu_bytes"] == pytest.approx(48 * EXPERTS * ACTIVE, rel=1e-6)
    assert chosen["bound_tps"] == pytest.approx(bound(moe(48), None)["bound_tps"], rel=1e-6)
    # extra_args that move tensors make the settings as silent as -ot, in any spelling llama.cpp reads
    assert bound(moe(0, extra_args=["--cpu_moe"]), None)["bound_tps"] is None
    assert bound(moe(0, extra_args=["-ncffn", "4"]), None)["bound_tps"] is None


def test_dense_tensors_kept_in_ram_are_read_there():
    """Less on the GPU than the offloaded layers' dense part (-ot on attention tensors): all of it is dense."""
    chosen = bound(FIT_ON, logged(100 * (1 << 20), 49, 1.0))
    everything = bound(moe(0), None)["gpu_bytes"]
    kv = planner.kv_mib(MANIFEST, {**FIT_ON, "ctx": DEPTH}) * (1 << 20)
    assert chosen["gpu_bytes"] == pytest.approx(100 * (1 << 20) + kv, abs=6000)  # the buffer's 0.01 MiB
    assert chosen["gpu_bytes"] + chosen["cpu_bytes"] == pytest.approx(everything)


def test_unknown_placement_or_bandwidth_is_no_bound():
    assert bound(FIT_ON, None)["bound_tps"] is None and "no log shows it" in bound(FIT_ON, None)["unknown"]
    no_weights = placement("loadfail-model-buffer.log")  # the load failed before any model buffer
    assert bound(FIT_ON, no_weights)["bound_tps"] is None
    assert bound(moe(28), no_weights)["placement_from"] == "settings"  # the settings still say
    # the log shows weights on CUDA0, but no GPU bandwidth was measured: no bound, not an all-CPU one
    unmeasured = bound(FIT_ON, placement("ok-ncmoe28-budget12g.log"), gpu_gbs=None)
    assert unmeasured["bound_tps"] is None and unmeasured["unknown"] == "GPU memory bandwidth not measured"
    no_cpu = bound(moe(28), placement("ok-ncmoe28-budget12g.log"), cpu_gbs=None)
    assert no_cpu["bound_tps"] is None and no_cpu["unknown"] == "CPU memory bandwidth not measured"
    full = bound(moe(0), placement("ok-full-gpu.log"), cpu_gbs=None)  # nothing read from RAM: not needed
    assert full["cpu_bytes"] == 0 and full["bound_tps"] == bound(moe(0), None)["bound_tps"]


def test_a_cpu_only_log_agrees_with_no_gpu():
    cpu_log = logparse.parse_log((FIXTURES / "cpu-logs" / "ok-cpu-gemma3-270m.log").read_text())
    on_cpu = bound(moe(0), cpu_log, gpu_gbs=None)
    assert on_cpu["placement_from"] == "settings and log" and on_cpu["gpu_bytes"] == 0
    assert on_cpu["bound_tps"] == bound(moe(0), None, gpu_gbs=None)["bound_tps"]


def test_disk_reads_are_the_servers_own_not_the_machines():
    """Another program reading the disk is not the server waiting on storage (#27: "waiting on storage" for a
    2 MiB model in RAM, from the whole machine's reads); the machine's count stands in only where the server's
    is unknown, and the row says whose it is."""
    busy_disk = {"disk_read_bytes_per_s": 200 << 20, "server_cpu_cores": 1.0}
    quiet = bottleneck.table({**busy_disk, "server_read_bytes_per_s": 0.0}, 50.0, 2, gpu=False)
    (row,) = [r for r in quiet["rows"] if r["suspect"].startswith("disk reads")]
    assert row["suspect"] == "disk reads (the server's)" and row["verdict"] == "none"
    assert "storage" not in quiet["verdict"]
    reading = bottleneck.table({**busy_disk, "server_read_bytes_per_s": float(64 << 20)}, 50.0, 2, gpu=False)
    assert reading["verdict"] == "waiting on storage: the model is being read from disk during decode"
    unknown = bottleneck.table(busy_disk, 50.0, 2, gpu=False)
    assert any(r["suspect"] == "disk reads (the whole machine's)" for r in unknown["rows"])
