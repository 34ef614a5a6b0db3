"""The workflow through a real SLURM cluster: Debian's slurmctld and slurmd on loopback, started by this
test as one node (with munge), and snakemake-executor-plugin-slurm with the workflow's profiles/slurm. Every job
that starts a llama-server runs as a SLURM job (its record names the job), the light rules on this machine.

The local cluster has no accounting database, so job states come from squeue (the plugin's
--slurm-status-command squeue; with its default, sacct, it would wait forever), and it has no GPUs, so the
profile's GPU requests are set to 0.

The plugin is installed into a virtual environment of this test's own (on top of the test's packages): imported
where SLURM's client is installed but no cluster runs, it spends about 10 s in `scontrol show config` at every
Snakemake start, which every other workflow test would pay."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from helpers import copy_workflow

pytestmark = [pytest.mark.slurm, pytest.mark.e2e]

SERVER_RULES = ("provision_server", "measure", "search", "needle", "search_needle", "validity")
SLURM_CONF = """\
ClusterName=crashline-test
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
MpiDefault=none
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
ReturnToService=2
MinJobAge=300
StateSaveLocation={base}/spool/ctld
SlurmdSpoolDir={base}/spool/d
SlurmctldPidFile={base}/run/slurmctld.pid
SlurmdPidFile={base}/run/slurmd.pid
SlurmctldLogFile={base}/log/slurmctld.log
SlurmdLogFile={base}/log/slurmd.log
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
NodeName=localhost NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={memory} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


def _daemons() -> list[psutil.Process]:
    return [p for p in psutil.process_iter(["name"]) if p.info["name"] in ("slurmctld", "slurmd")]


@pytest.fixture(scope="module")
def slurm_cluster(tmp_path_factory):
    """A one-node SLURM cluster on loopback for this module; its environment (SLURM_CONF) for the clients."""
    missing = [b for b in ("slurmctld", "slurmd", "sinfo", "squeue", "sbatch", "munged") if not shutil.which(b)]
    if missing:
        pytest.skip(f"Debian's slurmctld, slurmd, slurm-client and munge are not installed ({', '.join(missing)})")
    if os.geteuid() != 0:
        pytest.skip("starting slurmctld and slurmd needs root")
    if _daemons():
        pytest.skip("a SLURM daemon is already running on this machine; this test starts its own cluster")
    base = tmp_path_factory.mktemp("slurm")
    for sub in ("spool/ctld", "spool/d", "log", "run"):
        (base / sub).mkdir(parents=True)
    memory = int(psutil.virtual_memory().total / (1 << 20) * 0.8)
    conf = base / "slurm.conf"
    conf.write_text(SLURM_CONF.format(base=base, cpus=os.cpu_count(), memory=memory))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    munged = None
    if not any(
        p.info["name"] == "munged" and p.status() != psutil.STATUS_ZOMBIE for p in psutil.process_iter(["name"])
    ):
        Path("/run/munge").mkdir(parents=True, exist_ok=True)
        shutil.chown("/run/munge", "munge", "munge")
        subprocess.run(["runuser", "-u", "munge", "--", "munged"], check=True)
        munged = Path("/run/munge/munged.pid")
    subprocess.run(["slurmctld"], env=env, check=True)
    subprocess.run(["slurmd", "-N", "localhost"], env=env, check=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            state = subprocess.run(["sinfo", "-h", "-o", "%T"], env=env, capture_output=True, text=True).stdout
            if state.strip() == "idle":
                break
            time.sleep(0.5)
        else:
            logs = "\n".join(p.read_text()[-2000:] for p in (base / "log").glob("*.log"))
            pytest.fail(f"the SLURM node never became idle:\n{logs}")
        yield env
    finally:
        subprocess.run(["scontrol", "shutdown"], env=env, capture_output=True)
        deadline = time.monotonic() + 30
        while _daemons() and time.monotonic() < deadline:
            time.sleep(0.2)
        for p in _daemons():
            p.kill()
        if munged and munged.exists():  # the munged this test started
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(munged.read_text().strip()), signal.SIGTERM)


# As pyproject.toml's extra `slurm`. The job-step plugin is pinned too: 0.6.1 drops every SLURM_* variable but the
# job's identity before its srun, SLURM_CONF included, so srun in the job no longer finds this test cluster's config.
PLUGINS = ["snakemake-executor-plugin-slurm==2.8.0", "snakemake-executor-plugin-slurm-jobstep==0.6.0"]


@pytest.fixture(scope="module")
def slurm_python(tmp_path_factory) -> str:
    """A Python with this test's packages and the SLURM executor plugin."""
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    got = subprocess.run([python, "-m", "pip", "install", "-q", *PLUGINS], capture_output=True, text=True)
    if got.returncode != 0:
        pytest.skip(f"{' '.join(PLUGINS)} could not be installed: {got.stderr.strip()[-300:]}")
    return python


# The workflow on a small config (the default one took 15 minutes here through SLURM): the synthetic MoE at two
# micro-batches, one short workload, the recall check (not applicable to random weights: its job still runs).
SMALL_CONFIG = """\
models:
  tiny-moe: {source: "synthetic:tiny-moe"}
defaults: {ctx: 2048, threads: 2}
configurations:
  - grid: {ubatch: [128, 512]}
workloads:
  - {name: short, prompt_tokens: 128, gen_tokens: 16}
repetitions: 1
"""


@pytest.mark.timeout(1200)
def test_the_workflow_runs_its_server_jobs_as_slurm_jobs(tmp_path, slurm_cluster, slurm_python):
    copy_workflow(tmp_path)
    (tmp_path / "config" / "config.yaml").write_text(SMALL_CONFIG)
    no_gpus = [f"{rule}:gpu=0" for rule in SERVER_RULES]
    done = subprocess.run(
        [
            slurm_python,
            "-m",
            "snakemake",
            "report",
            "--workflow-profile",
            "profiles/slurm",
            "--slurm-status-command",
            "squeue",
            "--slurm-init-seconds-before-status-checks",
            "1",
            "--seconds-between-status-checks",
            "1",
            "--slurm-keep-successful-logs",
            "--jobs",
            "2",
            "--default-resources",
            "slurm_partition=debug",
            "mem_mb=1000",
            "runtime=30",
            "cpus_per_task=1",
            "--set-resources",
            *no_gpus,
        ],
        cwd=tmp_path,
        env=slurm_cluster,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert done.returncode == 0, done.stderr[-6000:]
    results = tmp_path / "results"
    assert (results / "report.md").exists() and (results / "validity" / "llama-bench.json").exists()
    records = sorted(results.glob("records/*/*/measure.json"))
    assert len(records) == 2  # the config's two configurations
    jobs = {json.loads(p.read_text())["host"]["slurm_job_id"] for p in records}
    assert None not in jobs and len(jobs) == len(records), "each measurement ran as its own SLURM job"
    logs = tmp_path / ".snakemake" / "slurm_logs"
    assert {p.name for p in logs.iterdir()} >= {f"rule_{r}" for r in ("provision_server", "measure", "needle")}
    assert not (logs / "rule_report").exists() and not (logs / "rule_aggregate").exists(), "light rules ran here"
