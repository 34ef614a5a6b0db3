"""The workflow when every server dies: a binary that passes crashline's check (on its tiny
synthetic model) but is killed by SIGILL on the user's models, as a build with an instruction the
machine lacks would be on bigger tensors. The run still ends with a report that says so at the top."""

from __future__ import annotations

import os
import subprocess
import sys

import pandas as pd
import pytest

from conftest import REPO
from helpers import copy_workflow

pytestmark = pytest.mark.e2e

# Runs the real llama-server for --version/--help/--list-devices and for crashline's check model;
# traps (SIGILL) on any other model.
DIES_ON_REAL_MODELS_C = r"""
#include <string.h>
#include <unistd.h>
int main(int argc, char **argv) {
    int serve_real = 0, check = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-m") && i + 1 < argc) serve_real = !strstr(argv[i + 1], "_server-check");
        check |= !strcmp(argv[i], "--version") || !strcmp(argv[i], "--help") || !strcmp(argv[i], "--list-devices");
    }
    if (serve_real && !check) __builtin_trap();
    argv[0] = REAL_SERVER;
    execv(REAL_SERVER, argv);
    return 127;
}
"""


def test_every_server_killed_the_same_way_still_gives_a_report_that_blames_the_binary(tmp_path, server_binary):
    copy_workflow(tmp_path)
    (tmp_path / "fake.c").write_text(DIES_ON_REAL_MODELS_C)
    subprocess.run(
        ["cc", f'-DREAL_SERVER="{server_binary}"', "-o", str(tmp_path / "llama-server"), str(tmp_path / "fake.c")],
        check=True,
    )
    (tmp_path / "broken.yaml").write_text(
        f"server: {{binary: {tmp_path / 'llama-server'}}}\n"
        "models:\n  tiny:\n    source: synthetic:tiny-moe\n"
        "configurations:\n  - grid: {ubatch: [128, 512]}\n"
        "workloads:\n  - {name: short, prompt_tokens: 64, gen_tokens: 8}\n"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "--cores", "1", "report", "--configfile", "broken.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "PYTHONPATH": str(REPO / "src")},
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-5000:]
    configs = pd.read_parquet(tmp_path / "results" / "tables" / "configs.parquet")
    assert len(configs) == 2 and set(configs["outcome"]) == {"crashed"}
    assert configs["message"].str.contains("SIGILL").all()
    measurements = pd.read_parquet(tmp_path / "results" / "tables" / "measurements.parquet")
    assert measurements.empty and {"model", "config_id", "workload"} <= set(measurements.columns)
    md = (tmp_path / "results" / "report.md").read_text()
    top = md[: md.index("## Environment")] if "## Environment" in md else md[:3000]
    assert "No configuration of tiny survived" in top and "killed by SIGILL" in top
    assert "binary or this machine" in top and str(tmp_path / "llama-server") in top
    for cid in configs["config_id"]:
        assert cid in top
    html = (tmp_path / "results" / "report.html").read_text()
    assert "No configuration of tiny survived" in html
