"""A job's lease on its GPUs (crashline.core.locks): which GPUs it may use, which it gets, its share of the CPUs, and
real file locks between real processes. NVML is the fake of tests/fake_nvml.py (boards with UUIDs and local
CPUs); the GPU machine runs the same code on real GPUs (tests/test_gpu_live.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from crashline.core import locks
from crashline.core.locks import Lease, LeaseError

from conftest import REPO
from fake_nvml import FakeNvml


@pytest.fixture
def boards(monkeypatch):
    """Installs a FakeNvml with the boards given (a count, or each one's local CPUs) as ``pynvml``."""

    def install(boards) -> FakeNvml:
        fake = FakeNvml(boards=boards)
        monkeypatch.setitem(sys.modules, "pynvml", fake)
        return fake

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return install


def uuids(gpus: list[dict]) -> list[str]:
    return [g["uuid"] for g in gpus]


def test_every_gpu_is_visible_unless_cuda_visible_devices_narrows_them(boards, monkeypatch):
    nv = boards(3)
    every = [b.uuid for b in nv.boards]
    assert uuids(locks.visible_gpus()[0]) == every
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,0")  # nvidia-smi's numbers, in the order given
    assert uuids(locks.visible_gpus()[0]) == [every[2], every[0]]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", nv.boards[1].uuid[:12])  # a UUID's prefix, as CUDA takes it
    assert uuids(locks.visible_gpus()[0]) == [every[1]]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert locks.visible_gpus() == ([], "no GPU (CUDA_VISIBLE_DEVICES is empty)")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,7")
    with pytest.raises(LeaseError, match=r"CUDA_VISIBLE_DEVICES='0,7' names '7', which is none of this machine's GPUs"):
        locks.visible_gpus()


def test_the_cpus_are_shared_by_physical_core_among_gpus_that_are_close_to_the_same_cpus():
    allowed = set(range(16))
    near = [{"uuid": u, "local_cpus": list(range(16))} for u in "abcd"]
    shares = [locks.cpu_share(near, [g], allowed) for g in near]
    assert shares == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]
    assert locks.cpu_share(near, near[:2], allowed) == list(range(8))  # two GPUs, two shares
    numa = [{"uuid": "a", "local_cpus": list(range(8))}, {"uuid": "b", "local_cpus": list(range(8, 16))}]
    assert [locks.cpu_share(numa, [g], allowed) for g in numa] == [list(range(8)), list(range(8, 16))]
    unknown = [{"uuid": "a", "local_cpus": None}, {"uuid": "b", "local_cpus": None}]
    assert [locks.cpu_share(unknown, [g], {0, 1, 2}) for g in unknown] == [[0], [1, 2]]
    assert locks.cpu_share(near[:1], near[:1], allowed) is None  # one GPU visible: every CPU, as before


def test_the_lease_adds_threads_for_its_share_unless_the_configuration_sets_them():
    lease = Lease(gpus=[{"uuid": "GPU-a"}], cpus=[0, 1, 2, 3], threads=4)
    assert lease.server_args({"threads": None}) == ["-t", "4"]
    assert lease.server_args({"threads": 12}) == []
    assert Lease().server_args({"threads": None}) == []


def test_a_lease_names_its_gpus_in_the_environment_and_gives_everything_back(boards, tmp_path, monkeypatch):
    nv = boards([[0], [1]])
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "FASTEST_FIRST")
    affinity = os.sched_getaffinity(0)
    with locks.lease("job", 1, tmp_path) as held:
        assert held.uuids == [nv.boards[0].uuid] and locks.current() is held
        assert os.environ["CUDA_VISIBLE_DEVICES"] == nv.boards[0].uuid
        assert os.environ["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
        assert held.cpus == [0] and os.sched_getaffinity(0) == {0} and held.threads == 1
        with locks.lease("a probe of the job", 1, tmp_path) as inner:  # a search's probes: the job's own lease
            assert inner is held
        with pytest.raises(LeaseError, match="needs 2 GPUs; the job holds 1"):
            with locks.lease("a probe on two GPUs", 2, tmp_path):
                pass
    assert locks.current() is None and os.sched_getaffinity(0) == affinity
    assert os.environ["CUDA_DEVICE_ORDER"] == "FASTEST_FIRST" and "CUDA_VISIBLE_DEVICES" not in os.environ


def test_more_gpus_than_visible_is_an_error_naming_them(boards, tmp_path, monkeypatch):
    boards(2)
    with pytest.raises(LeaseError, match=r"needs 3 GPUs; this machine lets it use 2 \(NVIDIA H200 GPU-"):
        with locks.lease("measure m abc", 3, tmp_path):
            pass
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(LeaseError, match="needs 2 GPUs; this machine has none that it may use"):
        with locks.lease("measure m abc", 2, tmp_path):
            pass


HOLDER = """
import json, os, sys, time
sys.modules["pynvml"] = __import__("fake_nvml").FakeNvml(boards=2)
from crashline.core import locks
with locks.lease(sys.argv[1], int(sys.argv[2]), sys.argv[3], host_memory=sys.argv[5] == "cpu") as held:
    print(json.dumps({"gpus": held.uuids, "waited_s": held.waited_s, "visible": os.environ["CUDA_VISIBLE_DEVICES"],
                      "cpus": sorted(os.sched_getaffinity(0)), "host_memory": held.host_memory}), flush=True)
    time.sleep(float(sys.argv[4]))
"""


def holder(tmp_path, name: str, gpus: int, hold_s: float, weights: str = "gpu", visible=None) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO / "tests")])}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
    return subprocess.Popen(
        [sys.executable, "-c", HOLDER, name, str(gpus), str(tmp_path), str(hold_s), weights],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def said(proc: subprocess.Popen) -> dict:
    line = proc.stdout.readline()
    assert line, proc.stderr.read()
    return json.loads(line)


def test_jobs_in_separate_processes_get_separate_gpus_and_a_third_waits(tmp_path):
    first, second = holder(tmp_path, "first", 1, 3), holder(tmp_path, "second", 1, 3)
    a, b = said(first), said(second)
    assert a["gpus"] != b["gpus"] and {a["visible"], b["visible"]} == {a["gpus"][0], b["gpus"][0]}
    assert len(a["cpus"]) == len(b["cpus"]) and not set(a["cpus"]) & set(b["cpus"])  # a share each
    started = time.monotonic()
    third = holder(tmp_path, "third", 1, 0)
    c = said(third)
    assert c["waited_s"] > 1 and time.monotonic() - started > 1, "the third job started while both GPUs were held"
    assert "waits for 1 of 2 GPUs to be free (held by pid" in third.stderr.read()
    for p in (first, second, third):
        assert p.wait(30) == 0


def test_a_job_on_two_gpus_holds_none_while_it_waits_and_a_killed_holder_frees_its_gpu(tmp_path):
    one = holder(tmp_path, "one", 1, 60)
    said(one)
    both = holder(tmp_path, "both", 2, 0)
    time.sleep(1.5)
    single = holder(tmp_path, "single", 1, 0)  # the free GPU is free: the waiting two-GPU job holds nothing
    assert said(single)["waited_s"] < 1
    one.kill()  # SIGKILL: the kernel releases its lock
    one.wait(30)
    got = said(both)
    assert len(got["gpus"]) == 2 and got["visible"] == ",".join(got["gpus"]) and got["waited_s"] > 1
    assert both.wait(30) == 0 and single.wait(30) == 0


def test_jobs_reading_weights_from_host_memory_run_one_at_a_time_beside_jobs_on_their_gpus(tmp_path):
    """Two jobs with experts on the CPU share the host's memory bandwidth (their decode fell by up to 40% beside
    each other on two H200s): the second waits, holding no GPU, while a job wholly on its GPU runs beside."""
    first = holder(tmp_path, "experts on the CPU", 1, 3, "cpu")
    assert said(first)["host_memory"] is True
    second = holder(tmp_path, "more experts on the CPU", 1, 0, "cpu")
    time.sleep(1)
    beside = holder(tmp_path, "all on the GPU", 1, 0)  # the second GPU is free: the waiting job holds none
    got = said(beside)
    assert got["waited_s"] < 1 and got["host_memory"] is False
    later = said(second)
    assert later["waited_s"] > 1.5 and later["host_memory"] is True
    assert "waits for pid" in second.stderr.read()
    for p in (first, second, beside):
        assert p.wait(30) == 0


def test_the_host_memory_lock_spans_runs_that_see_one_gpu_each(tmp_path):
    """Two runs on one machine, each given one GPU (CUDA_VISIBLE_DEVICES, or SLURM): they still share the host's
    memory, so their jobs with experts on the CPU still run one at a time."""
    first = holder(tmp_path, "run A", 1, 3, "cpu", visible="0")
    a = said(first)
    assert a["host_memory"] is True
    second = holder(tmp_path, "run B", 1, 0, "cpu", visible="1")
    b = said(second)
    assert b["waited_s"] > 1.5 and b["gpus"] != a["gpus"]
    for p in (first, second):
        assert p.wait(30) == 0


def test_with_gpus_of_two_kinds_a_job_uses_the_first_kind_unless_another_is_made_visible(
    boards, tmp_path, monkeypatch, capsys
):
    nv = boards(3)
    nv.boards[1].name = "NVIDIA A100-SXM4-80GB"
    with locks.lease("measure m abc", 2, tmp_path) as held:  # GPUs 0 and 2: the first one's kind
        assert [g["index"] for g in held.gpus] == [0, 2]
    assert "measuring on the NVIDIA H200 GPUs only (0, 2)" in capsys.readouterr().err
    with pytest.raises(LeaseError, match="needs 3 GPUs; this machine lets it use 2"):
        with locks.lease("measure m abc", 3, tmp_path):
            pass
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    with locks.lease("measure m abc", 1, tmp_path) as held:
        assert held.gpus[0]["name"] == "NVIDIA A100-SXM4-80GB"


def test_which_configurations_read_weights_from_host_memory():
    from crashline.core.settings import resolve, weights_on_cpu

    assert not weights_on_cpu(resolve({}), 48)
    assert weights_on_cpu(resolve({"n_cpu_moe": 8}), 48)
    assert weights_on_cpu(resolve({"n_gpu_layers": 30}), 48) and not weights_on_cpu(resolve({"n_gpu_layers": 49}), 48)
    assert weights_on_cpu(resolve({"fit": "on"}), 48)
    assert weights_on_cpu(resolve({"override_tensor": "exps=CPU"}), 48)
    assert not weights_on_cpu(resolve({"n_gpu_layers": 30}), None)  # layers unknown: not assumed


def test_gpus_that_a_configuration_would_get_anyway_leave_its_id_unchanged():
    from crashline.core.settings import SettingsError, config_id, gpu_count, resolve

    def cid(settings):
        return config_id("m", resolve(settings))

    assert cid({"gpus": 1}) == cid({}) and gpu_count(resolve({})) == 1
    assert cid({"tensor_split": "3,1", "gpus": 2}) == cid({"tensor_split": "3,1"})
    assert gpu_count(resolve({"tensor_split": "3,1"})) == 2 and gpu_count(resolve({"gpus": 2})) == 2
    assert cid({"gpus": 2}) != cid({})
    with pytest.raises(SettingsError, match="tensor_split = '1,1,1' has 3 shares but gpus = 2; set gpus: 3"):
        resolve({"tensor_split": "1,1,1", "gpus": 2})
    with pytest.raises(SettingsError, match="main_gpu = 1 names GPU 1 of the server's 1"):
        resolve({"main_gpu": 1})


def test_without_a_gpu_one_lock_stands_for_the_machine(tmp_path):
    """The lease of a machine without a GPU: a second job waits for the first's server to stop."""
    script = (
        "import sys, time; from crashline.core import locks\n"
        "with locks.lease('holder', 1, sys.argv[1]):\n    print('held', flush=True); time.sleep(3)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.Popen([sys.executable, "-c", script, str(tmp_path)], stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout.readline().strip() == "held"
    started = time.monotonic()
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    try:
        with locks.lease("second", 1, tmp_path) as held:
            assert held.gpus == [] and held.cpus is None
            waited = time.monotonic() - started
    finally:
        del os.environ["CUDA_VISIBLE_DEVICES"]
    proc.wait(30)
    assert waited > 1.5, "the second job started its server while the first held the machine"


def test_a_measurement_holds_its_gpu_names_it_and_runs_on_its_share_of_the_cpus(
    boards, tmp_path, tiny_moe, server_provenance, monkeypatch
):
    """The measurement path with two (fake) GPUs and a real llama-server (CPU build): the record names the GPU it
    held, the host's devices are that GPU alone, and the server got the share's threads (read back from its log)."""
    from helpers import fetch_record, measure_one

    nv = boards(2)
    monkeypatch.setattr(locks, "LOCK_DIR", tmp_path / "locks")
    config = {
        "models": {"tiny": {"source": f"file:{tiny_moe}"}},
        "configurations": [{"settings": {"ctx": 1024}}],
        "workloads": [{"name": "short", "prompt_tokens": 32, "gen_tokens": 8}],
        "repetitions": 1,
    }
    rec = measure_one(tmp_path, "tiny", fetch_record(tiny_moe), server_provenance, config)
    assert rec["outcome"] == "ok", rec["message"]
    first = nv.boards[0].uuid
    share = locks.cpu_share(locks.visible_gpus()[0], [{"uuid": first}], os.sched_getaffinity(0))
    assert rec["lease"]["gpus"] == [first] and rec["lease"]["cpus"] == share
    assert [d["uuid"] for d in rec["host"]["gpu"]["devices"]] == [first]
    threads = rec["lease"]["threads"]
    assert rec["command"][rec["command"].index("-t") + 1] == str(threads) and rec["placement"]["n_threads"] == threads
    assert "CUDA_VISIBLE_DEVICES" not in os.environ and locks.current() is None
