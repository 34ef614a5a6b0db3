"""The workflow itself: formatted (snakefmt), lint-clean, and a dry run plans every job."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import REPO


def run(*args):
    return subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=300)


def test_snakefmt_check():
    proc = run(sys.executable, "-m", "snakefmt", "--check", ".")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_lint_is_clean():
    proc = run(sys.executable, "-m", "snakemake", "--lint")
    assert proc.returncode == 0 and "Congratulations" in proc.stdout + proc.stderr, proc.stdout + proc.stderr


def test_dry_run_plans_one_measure_job_per_configuration(tmp_path):
    proc = run(sys.executable, "-m", "snakemake", "-n", "report", "--forcerun", "measure")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    plan = subprocess.run([sys.executable, "-m", "crashline", "plan", "--json"], cwd=REPO,
                          capture_output=True, text=True, check=True)
    n_configs = len(json.loads(plan.stdout))
    assert ["measure", str(n_configs)] in [line.split() for line in out.splitlines()], out
