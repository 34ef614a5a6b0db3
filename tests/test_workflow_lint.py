"""The workflow itself: formatted (snakefmt), lint-clean, and a dry run plans every job."""

from __future__ import annotations

import json
import os
import shutil
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
    """In a copy of the workflow, so that results of the checkout do not matter."""
    for name in ("Snakefile", "rules", "config", "profiles", "envs"):
        (shutil.copytree if (REPO / name).is_dir() else shutil.copy)(REPO / name, tmp_path / name)
    proc = subprocess.run([sys.executable, "-m", "snakemake", "-n", "report"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    plan = subprocess.run([sys.executable, "-m", "crashline", "plan", "--json"], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO / "src")},
                          capture_output=True, text=True, check=True)
    n_configs = len(json.loads(plan.stdout))
    assert ["measure", str(n_configs)] in [line.split() for line in out.splitlines()], out
