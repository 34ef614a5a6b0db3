"""crashline recheck: an earlier run's recommended configurations measured again on another llama-server build,
and the report of the new run says which build regressed what (survived then and now, the first request after
/health, the speed ratio, peak memory)."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from conftest import REPO
from crashline.config.file import ConfigError
from crashline.cli import recheck as R
from crashline.tables.recheck import compare, headline

# ----------------------------------------------------------------------------- the comparison, on tables


def tables(**by_id) -> tuple[pd.DataFrame, pd.DataFrame]:
    """configs and measurements tables of one model: id -> (outcome, e2e median, min, max)."""
    configs, measurements = [], []
    for cid, (outcome, median, low, high) in by_id.items():
        row = {
            "model": "m",
            "config_id": cid,
            "server_args": f"-ub {cid}",
            "server_version": "b1",
            "server_sha256": "a" * 64,
            "outcome": outcome,
            "phase": None if outcome == "ok" else "depth-2k",
            "first_request_s": 0.2 if outcome == "ok" else None,
            "peak_gpu_mib": 1000.0,
            "peak_rss_mib": 500.0,
        }
        configs.append(row)
        stats = {"e2e_tps_median": median, "e2e_tps_min": low, "e2e_tps_max": high, "e2e_tps_n": 3}
        measurements.append({**row, "workload": "w", **stats})
    return pd.DataFrame(configs), pd.DataFrame(measurements)


def test_each_configuration_is_judged_then_against_now():
    then = tables(a=("ok", 100, 95, 105), b=("ok", 100, 95, 105), c=("ok", 100, 98, 102), d=("oom", None, None, None))
    now = tables(a=("ok", 101, 96, 104), b=("crashed", None, None, None), c=("ok", 80, 78, 82), d=("ok", 90, 88, 92))
    now[0]["server_version"], now[0]["server_sha256"] = "b2", "b" * 64  # another build: other bits
    rows = {r["config_id"]: r for r in compare(*then, *now, "e2e_tps", "w")}
    assert {k: r["verdict"] for k, r in rows.items()} == {
        "a": "tied",  # the ranges overlap
        "b": "fails now",
        "c": "slower",
        "d": "survives now",
    }
    assert rows["c"]["ratio"] == 0.8 and rows["b"]["failed_now"] == "crashed at depth-2k"
    assert rows["b"]["first_request_s_then"] == 0.2 and rows["b"]["first_request_s_now"] is None
    said = headline(list(rows.values()))
    assert said.startswith("Against the earlier run (b1 (aaaaaaaaaaaa)), this build (b2 (bbbbbbbbbbbb)) regressed")
    assert "m b now fails (crashed at depth-2k)" in said and "m c is slower (0.80x the e2e_tps)" in said
    kept = headline([rows["a"], rows["d"]])
    assert "kept all 2 configuration(s)" in kept and "regressed" not in kept


def test_one_request_a_side_cannot_tell_slower_from_noise():
    """With one repetition each range is one number: any difference would read as slower. It is said so instead
    (the same build, rechecked, once read "regressed: 0.80x")."""
    then, now = tables(a=("ok", 100, 100, 100)), tables(a=("ok", 80, 80, 80))
    for frame in (then[1], now[1]):
        frame["e2e_tps_n"] = 1
    (row,) = compare(*then, *now, "e2e_tps", "w")
    assert row["verdict"] == "cannot tell" and row["ratio"] == 0.8
    said = headline([row])
    assert "kept all 1 configuration(s)" in said and "1 measured once on a side" in said and "regressed" not in said


def test_only_configurations_measured_in_both_are_compared():
    then = tables(a=("ok", 100, 95, 105))
    now = tables(a=("ok", 100, 95, 105), z=("ok", 100, 95, 105))
    assert [r["config_id"] for r in compare(*then, *now, "e2e_tps", "w")] == ["a"]


def test_a_folder_that_holds_no_finished_run_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="not the results folder of a finished crashline run"):
        R.config(tmp_path, "/bin/true", tmp_path / "out")


# ----------------------------------------------------------------------------- the whole thing, real servers


def crashline(*args, cwd) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    return subprocess.run(
        [sys.executable, "-m", "crashline", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=1200
    )


def wrapper(folder, real: str, *appended: str):
    """Another "build": a script that runs the real llama-server with arguments of its own appended (the last of a
    flag wins), as a regression of the next build would change what the same command does."""
    folder.mkdir()
    path = folder / "llama-server"
    path.write_text(f'#!/bin/sh\nexec "{real}" "$@" {" ".join(appended)}\n')
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.mark.e2e
@pytest.mark.timeout(1800)
def test_recheck_on_another_build_says_what_it_broke(tmp_path, small_run, server_provenance):
    """The same recommended configuration on a build whose context stops at 1024 tokens: the 2000-token workload
    that survived before fails now, and both the printed answer and the new report say so."""
    earlier = small_run / "results"
    broken = wrapper(tmp_path / "broken", server_provenance["binary"], "-c", "1024")
    done = crashline("recheck", str(earlier), "--binary", str(broken), "--out", str(tmp_path / "re"), cwd=tmp_path)
    assert done.returncode == 4, (done.stdout + done.stderr)[-4000:]  # a regression (cli.exits.Exit.REGRESSED)
    (winner,) = json.loads((earlier / "recommendation.json").read_text())
    assert f"tiny-moe {winner['winner']}: fails now" in done.stdout, done.stdout
    assert "regressed" in done.stdout
    report = (tmp_path / "re" / "results" / "report.md").read_text()
    assert "Recheck" in report and "regressed" in report and "context_exceeded" in report
    configs = pd.read_parquet(tmp_path / "re" / "results" / "tables" / "configs.parquet")
    assert list(configs["config_id"]) == [winner["winner"]]  # the same configuration, by its id
    assert configs["server_sha256"].iloc[0] != server_provenance["sha256"]


@pytest.mark.e2e
@pytest.mark.timeout(1800)
def test_recheck_on_an_equal_build_keeps_every_configuration(tmp_path, small_run, server_provenance):
    earlier = small_run / "results"
    # a copy of the build folder (the binary and the shared libraries beside it): another path, the same bits
    folder = shutil.copytree(Path(server_provenance["binary"]).parent, tmp_path / "same", symlinks=True)
    same = Path(folder) / "llama-server"
    done = crashline("recheck", str(earlier), "--binary", str(same), "--out", str(tmp_path / "re"), cwd=tmp_path)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert "kept all 1 configuration(s)" in done.stdout, done.stdout  # measured once a side: speed not compared
    assert "The same build as the earlier run" in done.stdout, done.stdout  # the same bits, said as such
    first = pd.read_parquet(tmp_path / "re" / "results" / "tables" / "configs.parquet")["first_request_s"]
    assert first.iloc[0] > 0  # the first request after /health answered, and its time is in the table
