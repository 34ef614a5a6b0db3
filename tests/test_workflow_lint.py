"""The workflow itself: formatted (snakefmt), lint-clean, and a dry run plans every job."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

from conftest import REPO
from helpers import copy_workflow, dry_run


def run(*args):
    return subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=300)


def test_snakefmt_check():
    proc = run(sys.executable, "-m", "snakefmt", "--check", ".")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_lint_is_clean():
    proc = run(sys.executable, "-m", "snakemake", "--lint")
    assert proc.returncode == 0 and "Congratulations" in proc.stdout + proc.stderr, proc.stdout + proc.stderr


def test_dry_run_plans_one_measure_job_per_configuration(tmp_path):
    copy_workflow(tmp_path)
    out = dry_run(tmp_path)
    plan = subprocess.run(
        [sys.executable, "-m", "crashline", "plan", "--json"],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO / "src")},
        capture_output=True,
        text=True,
        check=True,
    )
    n_configs = len(json.loads(plan.stdout))
    assert ["measure", str(n_configs)] in [line.split() for line in out.splitlines()], out


def test_configfile_runs_that_file_alone_with_the_ids_plan_prints(tmp_path):
    """--configfile FILE is the whole config: none of the demo's models, defaults or claims leak in."""
    copy_workflow(tmp_path)
    (tmp_path / "mine.yaml").write_text(
        "models:\n  mine:\n    source: synthetic:tiny-moe\n"
        "configurations:\n  - grid: {ubatch: [128, 512]}\n"
        "workloads:\n  - {name: short, prompt_tokens: 64, gen_tokens: 16}\n"
    )
    out = dry_run(tmp_path, "--configfile", "mine.yaml")
    counts = {m[1]: int(m[2]) for m in re.finditer(r"^(\w+)\s+(\d+)$", out.split("Job stats:", 1)[1], re.M)}
    assert counts == {
        "fetch_model": 1,
        "provision_server": 1,
        "inspect_model": 1,
        "warmup": 1,
        "measure": 2,
        "needle": 2,
        "aggregate": 1,
        "needle_table": 1,
        "kv_quality_table": 1,  # no quantised KV type here: an empty table, and no kv_quality job
        "validity": 1,
        "report": 1,
        "total": 13,
    }, out
    assert "gemma3-270m" not in out and "tiny-moe" not in out.replace("synthetic:tiny-moe", "")
    plan = subprocess.run(
        [sys.executable, "-m", "crashline", "plan", "--json", "--config", "mine.yaml"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO / "src")},
        capture_output=True,
        text=True,
        check=True,
    )
    ids = {item["id"] for item in json.loads(plan.stdout)}
    planned = set(re.findall(r"records/mine/([0-9a-f]{10})/measure\.json", out))
    assert len(ids) == 2 and planned == ids


def test_the_needle_of_a_fit_aimed_at_the_margin_waits_for_its_measurement(tmp_path):
    """#22: recall of a --fit on is checked at the --fit-target its measurement settled on, so its needle job takes
    the measure record as an input (and passes it to the job); a plain configuration's needle does not wait."""
    copy_workflow(tmp_path)
    (tmp_path / "mine.yaml").write_text(
        "models:\n  mine:\n    source: synthetic:tiny-moe\n"
        "configurations:\n  - settings: {fit: 'on'}\n  - settings: {ubatch: 128}\n"
        "workloads:\n  - {name: short, prompt_tokens: 64, gen_tokens: 16}\n"
    )
    out = dry_run(tmp_path, "--configfile", "mine.yaml")
    needles = [block for block in out.split("\n\n") if re.search(r"^rule needle:", block.strip(), re.M)]
    waits = {
        re.search(r"records/mine/(\w+)/needle\.json", b).group(1): re.findall(
            r"records/mine/(\w+)/measure\.json", re.search(r"^\s*input: (.*)$", b, re.M).group(1)
        )
        for b in needles
    }
    assert sorted(map(len, waits.values())) == [0, 1], out
    (fit,) = [cid for cid, measured in waits.items() if measured == [cid]]
    plan = subprocess.run(
        [sys.executable, "-m", "crashline", "plan", "--config", "mine.yaml"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO / "src")},
        capture_output=True,
        text=True,
        check=True,
    )
    assert f"{fit}  " in plan.stdout and "--fit on" in plan.stdout.split(f"{fit}  ", 1)[1].splitlines()[0]
