"""The GPU code, live: the ballast, the NVML/GPM sampler, budget_refused and load failures produced at a
budget chosen to cause them. Skipped without an NVIDIA GPU; run on the GPU machine with
`pytest -m gpu -v tests/test_gpu_live.py`."""

from __future__ import annotations

import math
import time

import pytest

from crashline.config import plan as C
from crashline.models import synthetic
from crashline.engine.ballast import Ballast, BudgetError
from crashline.core.host import gpus
from helpers import SCHEMA, fetch_record

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not gpus()["present"], reason="needs an NVIDIA GPU (NVML)")]

# About 1.8 GiB of Q4_0 experts and a 256K context: the weights alone exceed a 1 GiB budget, and at
# 256K tokens the f16 KV cache (32 KiB per token) does not fit beside them in 3 GiB.
MEDIUM = {
    "layers": 16,
    "n_embd": 2048,
    "n_head": 16,
    "n_head_kv": 4,
    "head_dim": 128,
    "n_expert": 32,
    "n_expert_used": 4,
    "expert_ffn": 1024,
    "ffn": 1024,
    "vocab": 32000,
    "ctx": 262144,
    "quant": "Q4_0",
}


@pytest.fixture(scope="module")
def medium_moe(tmp_path_factory):
    path = tmp_path_factory.mktemp("models") / "medium-moe.gguf"
    synthetic.write_moe_gguf(path, MEDIUM)
    return path


def _free_mib() -> int:
    return gpus()["devices"][0]["memory_free_mib"]


def test_the_ballast_leaves_the_budget_free_and_gives_it_back():
    before = _free_mib()
    with Ballast(8192) as ballast:
        during = _free_mib()
        assert abs(during - 8192) <= 64, ballast.info
        assert abs(ballast.info["held_mib"] - (before - during)) <= 64
    assert abs(_free_mib() - before) <= 64


def test_a_budget_above_the_free_memory_is_refused():
    with pytest.raises(BudgetError, match=r"vram_budget_mib = \d+ but GPU 0 has only \d+ MiB free"):
        with Ballast(_free_mib() + 10_000):
            pass


def measure(tmp_path, model, provenance, settings, budget_mib=None, gen_tokens=64, prompt_tokens=128):
    from crashline.jobs import measure as M
    from crashline.jobs import spec as S

    cfg = C.validate(
        {
            "models": {"m": {"source": f"file:{model}"}},
            "configurations": [{"settings": settings}],
            "workloads": [{"name": "short", "prompt_tokens": prompt_tokens, "gen_tokens": gen_tokens}],
            "repetitions": 1,
            "budget": {"vram_budget_mib": budget_mib},
        },
        SCHEMA,
    )
    (item,) = C.expand(cfg)
    return M.measure(
        S.measure_spec(cfg, "m", item["id"]),
        S.JobInputs(fetch_record(model), {}, provenance),
        M.MeasurePaths(tmp_path / "measure.json", tmp_path / "server.log"),
    )


def test_the_sampler_sees_the_server_s_own_vram_and_gpm(tmp_path, medium_moe, server_provenance):
    rec = measure(tmp_path, medium_moe, server_provenance, {"ctx": 4096}, gen_tokens=2048)  # seconds of decode
    assert rec["outcome"] == "ok", rec["message"]
    model_mib = sum(b["mib"] for b in rec["placement"]["buffers"] if b["device"].startswith("CUDA"))
    memory = rec["memory"]
    assert memory["per_phase"]["short"]["gpu_source"] == "process"
    assert memory["peak_gpu_mib"] >= model_mib, (memory["peak_gpu_mib"], model_mib)
    decode = rec["workloads"][0]["telemetry"]["decode"]
    if memory["pcie_source"] == "GPM":
        assert decode["gpm_sm_pct"] > 0 and decode["gpm_dram_bw_pct"] > 0, decode


def test_budget_refused_live(tmp_path, medium_moe, server_provenance):
    rec = measure(tmp_path, medium_moe, server_provenance, {"ctx": 4096}, budget_mib=_free_mib() + 10_000)
    assert (rec["outcome"], rec["failure"], rec["phase"]) == ("budget_refused", "budget", "start")


@pytest.mark.parametrize(
    "budget_mib, settings, failure",
    [
        (1024, {"ctx": 4096}, "weights"),  # the expert weights alone are larger than the budget
        (3072, {"ctx": 262144}, "kv_cache"),  # weights fit; 8 GiB of KV do not
    ],
)
def test_load_failures_produced_live(tmp_path, medium_moe, server_provenance, budget_mib, settings, failure):
    started = time.monotonic()
    rec = measure(tmp_path, medium_moe, server_provenance, settings, budget_mib=budget_mib)
    assert (rec["outcome"], rec["failure"], rec["phase"]) == ("load_failed", failure, "load"), rec["message"]
    assert rec["ballast"]["budget_mib"] == budget_mib and time.monotonic() - started < 120


def test_fit_on_aimed_at_the_margin_live(tmp_path, medium_moe, server_provenance):
    """#22: --fit on with crashline's target (the 1,024 MiB margin) on a 3 GiB card, a 2,048-token prompt at
    -ub 2048: every start that left less than the margin is kept and the next raises --fit-target by the
    shortfall, until one leaves the margin (three starts at most); the record is the last start's."""
    from crashline.jobs import measure as M

    settings = {"ctx": 4096, "ubatch": 2048, "batch": 2048, "fit": "on"}  # the default margin: 1,024 MiB
    rec = measure(tmp_path, medium_moe, server_provenance, settings, budget_mib=3072, gen_tokens=32, prompt_tokens=2048)
    attempts = rec["fit_aim"]["attempts"]
    print("fit aim:", [(a["fit_target"], a["outcome"], a["headroom_mib"]) for a in attempts])
    assert rec["outcome"] == "ok", rec["message"]
    assert attempts[0]["fit_target"] == 1024 and len(attempts) <= M.FIT_AIM_STARTS
    for before, after in zip(attempts, attempts[1:]):
        short = 1024 if before["outcome"] == "oom" else 1024 - before["headroom_mib"]
        assert short > 0 and after["fit_target"] == before["fit_target"] + math.ceil(math.ceil(short) / 64) * 64
        assert (tmp_path / f"fit-target-{before['fit_target']}" / "measure.json").exists()
    assert attempts[-1]["headroom_mib"] >= 1024 or len(attempts) == M.FIT_AIM_STARTS
    command = rec["command"]
    assert (
        int(command[command.index("--fit-target") + 1]) == attempts[-1]["fit_target"] == rec["settings"]["fit_target"]
    )
    assert rec["memory"]["headroom_mib"] == attempts[-1]["headroom_mib"]


# --- several GPUs: leases by UUID, the ballast on the leased GPU, a configuration across two ------------------

two_gpus = pytest.mark.skipif(len(gpus().get("devices", [])) < 2, reason="needs two NVIDIA GPUs")

HOLD_FIRST_GPU = """
import sys, time
from crashline.core import locks
with locks.lease("holder", 1, sys.argv[1]) as held:
    print(held.uuids[0], flush=True)
    time.sleep(60)
"""


@two_gpus
def test_a_lease_gets_a_free_gpu_by_uuid_and_the_ballast_lands_on_that_gpu_alone(tmp_path, monkeypatch):
    import os
    import subprocess
    import sys

    from crashline.core import locks
    from conftest import REPO

    monkeypatch.setattr(locks, "LOCK_DIR", tmp_path)
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_FIRST_GPU, str(tmp_path)], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        taken = holder.stdout.readline().strip()
        devices = {d["uuid"]: d for d in gpus()["devices"]}
        assert taken == next(iter(devices))  # the first free GPU, in nvidia-smi's order
        with locks.lease("measure", 1) as held:
            (mine,) = held.uuids
            assert mine != taken and os.environ["CUDA_VISIBLE_DEVICES"] == mine
            free_before = {u: d["memory_free_mib"] for u, d in devices.items()}
            with Ballast(8192, held.uuids) as ballast:
                now = {d["uuid"]: d["memory_free_mib"] for d in gpus()["devices"]}
                assert abs(now[mine] - 8192) <= 64, ballast.info
                assert abs(now[taken] - free_before[taken]) <= 64  # the other job's GPU is untouched
    finally:
        holder.kill()
        holder.wait()


@two_gpus
def test_a_configuration_on_two_gpus_has_each_gpu_s_peak_and_the_tightest_headroom(
    tmp_path, medium_moe, server_provenance
):
    settings = {"ctx": 8192, "gpus": 2, "split_mode": "layer", "tensor_split": "3,1"}
    rec = measure(tmp_path, medium_moe, server_provenance, settings, budget_mib=6144)
    assert rec["outcome"] == "ok", rec["message"]
    memory = rec["memory"]
    first, second = memory["per_gpu"]
    assert (
        [g["uuid"] for g in memory["per_gpu"]]
        == rec["lease"]["gpus"]
        == [d["uuid"] for d in rec["host"]["gpu"]["devices"]]
    )
    assert first["peak_mib"] > second["peak_mib"] > 200, memory["per_gpu"]  # three quarters of the layers on the first
    assert (
        memory["headroom_mib"] == min(first["headroom_mib"], second["headroom_mib"])
        and memory["vram_limit_mib"] == 2 * 6144
    )
    assert {b["device"] for b in rec["placement"]["buffers"]} >= {"CUDA0", "CUDA1"}
