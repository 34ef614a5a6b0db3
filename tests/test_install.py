"""The package as a user installs it: a wheel in a fresh virtual environment, run from a folder
that is not the repository, finds its schemas and prose inside itself."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import yaml

from conftest import FIXTURES, REPO


def _run(cmd, cwd, env=None):
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def test_the_wheel_works_outside_the_repository(tmp_path):
    project = tmp_path / "project"  # only what the wheel is built from: no config/ beside it
    shutil.copytree(REPO / "src", project / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, project / name)
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", tmp_path / "dist", project], cwd=tmp_path)
    (wheel,) = (tmp_path / "dist").glob("crashline-*.whl")
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--system-site-packages", venv], cwd=tmp_path)  # dependencies from here
    _run([venv / "bin" / "python", "-m", "pip", "install", "-q", "--no-deps", wheel], cwd=tmp_path)

    work = tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "CRASHLINE_CONFIG")}
    where = _run([venv / "bin" / "python", "-c", "import crashline; print(crashline.__file__)"], work, env)
    assert where.startswith(str(venv)), f"imported {where.strip()}, not the installed wheel"

    (work / "mine.yaml").write_text(
        yaml.safe_dump(
            {
                "models": {"tiny": {"source": "synthetic:tiny-moe"}},
                "configurations": [{"grid": {"ubatch": [128, 512]}}],
                "workloads": [{"name": "short", "prompt_tokens": 64, "gen_tokens": 16}],
            }
        )
    )
    plan = _run([venv / "bin" / "crashline", "plan", "--config", "mine.yaml"], work, env)
    assert plan.count("tiny ") == 2 and "-ub 128" in plan and "1 model(s) (tiny), 2 configuration(s)" in plan
    parsed = json.loads(
        _run([venv / "bin" / "crashline", "parse-log", FIXTURES / "cpu-logs" / "ok-cpu-gemma3-270m.log"], work, env)
    )
    assert parsed["classification"]["outcome"] == "ok" and parsed["placement"]["n_ctx"]
    # Without a config file in the working directory the error says which file it looked for.
    proc = subprocess.run([venv / "bin" / "crashline", "plan"], cwd=work, env=env, capture_output=True, text=True)
    assert proc.returncode == 2 and "configuration file not found: config/config.yaml" in proc.stderr
