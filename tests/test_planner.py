"""The planner's arithmetic against what llama-server reported on a real H200 (the fixture logs),
and the boundary search against a survival function."""

from __future__ import annotations

import json
import re

import pytest

from crashline import logparse, planner, synthetic
from crashline.settings import resolve

from conftest import FIXTURES

LOGS = FIXTURES / "cuda-logs"


def manifest_of(shape: dict) -> dict:
    """The manifest fields the planner reads, from the synthetic writer's own tensor plan."""
    resolved = synthetic.resolve_shape(shape)
    per_layer = [
        {"layer": i, "expert_bytes": 0, "shared_expert_bytes": 0, "other_bytes": 0} for i in range(resolved["layers"])
    ]
    output = 0
    for name, shape_np, qtype in synthetic.tensor_plan(resolved):
        nbytes = synthetic.tensor_nbytes(shape_np, qtype)
        m = re.match(r"blk\.(\d+)\.(.+)", name)
        if m:
            per_layer[int(m[1])]["expert_bytes" if "_exps" in m[2] else "other_bytes"] += nbytes
        elif name.startswith(("output.", "output_norm.")):
            output += nbytes
    return {
        "layers": resolved["layers"],
        "per_layer": per_layer,
        "output_bytes": output,
        "n_head_kv": resolved["n_head_kv"],
        "head_dim": resolved["head_dim"],
    }


QWEN = manifest_of(synthetic.QWEN3_30B_A3B)


@pytest.mark.parametrize(
    "log, n_cpu_moe",
    [
        ("ok-full-gpu.log", 0),
        ("ok-ncmoe28-budget12g.log", 28),
        ("ok-ncmoe26-ub512-budget12g.log", 26),
        ("loadfail-compute-buffer.log", 25),
    ],
)
def test_weights_and_kv_match_the_real_buffers(log, n_cpu_moe):
    buffers = logparse.parse_log((LOGS / log).read_text())["buffers_mib"]
    settings = resolve({"n_cpu_moe": n_cpu_moe, "ctx": 32768})
    assert planner.weights_mib(QWEN, settings) == pytest.approx(buffers["CUDA0:model"], rel=0.01)
    assert planner.kv_mib(QWEN, settings) == pytest.approx(buffers["CUDA0:kv"], rel=0.001)


def test_compute_model_and_prediction_of_the_crash():
    runs = {r["file"]: r for r in json.loads((LOGS / "runs.json").read_text())}
    compute = planner.ComputeModel(
        {
            2048: runs["ok-ncmoe28-budget12g.log"]["bufs"]["CUDA0:compute"],
            512: runs["ok-ncmoe26-ub512-budget12g.log"]["bufs"]["CUDA0:compute"],
        }
    )
    assert compute(2048) == pytest.approx(476, abs=1) and 200 < compute(1024) < 476
    settings = resolve({"ctx": 32768, "ubatch": 2048})
    # 11761 MiB budget: n_cpu_moe 12 must be predicted far over, 28 under.
    over = planner.predict(QWEN, {**settings, "n_cpu_moe": 12}, compute, rest_mib=500)
    under = planner.predict(QWEN, {**settings, "n_cpu_moe": 28}, compute, rest_mib=500)
    assert over["total_mib"] > 11761 > under["total_mib"]
    text = planner.arithmetic(over, 11761, 1024)
    assert text.startswith("weights ") and "does not fit" in text
    lowest = planner.predicted_lowest(QWEN, settings, compute, 500, 11761, 0)
    assert 24 <= lowest <= 28  # the real runs: 26 loaded, 28 survived


@pytest.mark.parametrize("boundary", [0, 1, 7, 26, 27, 48])
@pytest.mark.parametrize("start", [0, 20, 26, 30, 48])
def test_search_finds_the_boundary_with_few_probes(boundary, start):
    found, probes = planner.search_lowest(lambda n: n >= boundary, start, 0, 48)
    assert found == boundary
    assert len(probes) <= 2 * 6 + 1  # gallop then bisect: O(log 49)
    if start == boundary and boundary > 0:
        assert len(probes) == 2  # a right prediction costs two server starts


def test_search_when_nothing_survives():
    found, probes = planner.search_lowest(lambda n: False, 10, 0, 48)
    assert found is None and probes[-1] == (48, False)
