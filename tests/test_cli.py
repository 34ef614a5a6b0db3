"""The command line: each verb runs without Snakemake; bad input is a clear error, exit status 2."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import FIXTURES, REPO


def crashline(*args, cwd=REPO):
    return subprocess.run([sys.executable, "-m", "crashline", *args], cwd=cwd, capture_output=True, text=True,
                          env={"PYTHONPATH": str(REPO / "src"), "PATH": "/usr/bin:/bin"}, timeout=120)


def test_parse_log_explains_a_crashed_server():
    proc = crashline("parse-log", str(FIXTURES / "cuda-logs" / "oom-abort-at-warmup.log"))
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["classification"]["outcome"] == "oom" and out["classification"]["phase"] == "warmup"
    assert out["placement"]["buffers_mib"]["CUDA0:compute"] > 0


def test_plan_lists_every_configuration_with_its_arguments():
    proc = crashline("plan", "--json")
    items = json.loads(proc.stdout)
    assert len(items) >= 4 and all(len(i["id"]) == 10 for i in items)
    text = crashline("plan").stdout
    assert all(i["id"] in text for i in items) and "-ub 128" in text


def test_bad_config_is_a_clear_error(tmp_path):
    bad = tmp_path / "c.yaml"
    bad.write_text("models: {m: {source: 'file:/x.gguf'}}\nconfigurations: [{settings: {n_cpu_mo: 3}}]\n"
                   "workloads: [{name: s, prompt_tokens: 8, gen_tokens: 8}]\n")
    proc = crashline("plan", "--config", str(bad))
    assert proc.returncode == 2
    assert "unknown server setting(s) 'n_cpu_mo'" in proc.stderr and "n_cpu_moe" in proc.stderr


def test_unknown_model_and_missing_file_are_clear_errors(tmp_path):
    proc = crashline("fetch", "--model", "nope")
    assert proc.returncode == 2 and "no model 'nope'" in proc.stderr
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"results_dir: {tmp_path}/r\nmodels: {{m: {{source: 'file:{tmp_path}/missing.gguf'}}}}\n"
                   "configurations: [{settings: {}}]\nworkloads: [{name: s, prompt_tokens: 8, gen_tokens: 8}]\n")
    proc = crashline("fetch", "--config", str(cfg), "--model", "m")
    assert proc.returncode == 2 and "missing.gguf" in proc.stderr
    assert not (tmp_path / "r" / "models" / "m" / "fetch.json").exists()
