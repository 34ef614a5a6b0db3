"""Exit codes for scripts (#41 item 5): `tune` exited 0 when nothing survived, `recheck` 0 on a regression and
`compare` 0 whatever it found; `recheck` on the very build the run used said the build "kept all", not "the same
build"; there was no `--version`. On the committed recheck runs (gemma3-270m on this machine's native and
portable builds, bench/results/recheck-portable), the workflow itself left out: tune and recheck run as the CLI runs
them, and their workflow's results are those runs' (copied, some of them changed)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from importlib.metadata import version

import pandas as pd
import pytest

from conftest import RECHECK, REPO
from crashline.cli import tune as T
from crashline.cli.exits import MEANING, Exit
from crashline.cli.main import main
from crashline.core.supervision import WORKFLOW_PID
from crashline.tables.recheck import compare as recheck_rows
from crashline.tables.recheck import headline
from test_readme import section
from test_recheck import tables

PORTABLE = RECHECK / "portable" / "results"


def copy(source, dest):
    return shutil.copytree(source, dest, symlinks=True)


def slowed(results, factor: float = 0.5):
    """Every configuration of a run ``factor`` times as fast end to end: its medians and ranges, start by start."""
    path = results / "tables" / "measurements.parquet"
    m = pd.read_parquet(path)
    for column in ("e2e_tps_median", "e2e_tps_min", "e2e_tps_max"):
        m[column] = m[column] * factor
    m["e2e_tps_start_medians"] = [[v * factor for v in values] for values in m["e2e_tps_start_medians"]]
    m.to_parquet(path)
    return results


def contended(results, cores: float = 1.24):
    """Every workload of a run measured while other processes used ``cores`` of the host's cores."""
    path = results / "tables" / "measurements.parquet"
    m = pd.read_parquet(path)
    m["cpu_other_cores"] = cores
    m.to_parquet(path)
    return results


BUSY = "inconclusive: other processes used 1.2 of 2 cores during these measurements; rerun on a quiet machine"


def unanswered(results):
    """The run's answer gone: nothing survived (recommendation.json as the report writes it then)."""
    path = results / "recommendation.json"
    answers = json.loads(path.read_text())
    path.write_text(json.dumps([{**a, "winner": None, "why": "no configuration survived"} for a in answers]))
    return results


def failed(results):
    """Every configuration of the run crashed."""
    path = results / "tables" / "configs.parquet"
    c = pd.read_parquet(path)
    c["outcome"], c["phase"] = "crashed", "depth-2k"
    c.to_parquet(path)
    return results


@pytest.fixture
def workflow_gives(monkeypatch):
    """tune and recheck run as the CLI runs them, the workflow left out: it "writes" the results folder given."""
    given = {}

    def run_workflow(config_path, workdir, root):
        shutil.copytree(given["results"], workdir / "results", symlinks=True, dirs_exist_ok=True)
        return True

    monkeypatch.setenv(WORKFLOW_PID, "")  # run_folder sets it for the jobs: restored after the test
    monkeypatch.setattr(T, "run_workflow", run_workflow)
    return given


# ----------------------------------------------------------------------------- --version and the documented codes


def test_version_prints_the_package_version():
    done = subprocess.run([sys.executable, "-m", "crashline", "--version"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"crashline {version('crashline')}"


def test_help_and_the_docs_list_every_code():
    done = subprocess.run([sys.executable, "-m", "crashline", "--help"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    said = " ".join(done.stdout.split("exit status:")[1].split())
    documented = section((REPO / "docs" / "tune.md").read_text(), "Exit codes")
    for code, meaning in MEANING.items():
        assert f"{int(code)} {meaning}" in said
        assert f"- `{int(code)}`:" in documented
    assert len(set(Exit)) == len(Exit) and Exit.ANSWERED == 0 and Exit.ERROR == 2


# ----------------------------------------------------------------------------- tune


def tune(tmp_path, capsys) -> tuple[int, str]:
    status = main(["tune", "synthetic:tiny-moe", "--ctx", "4096", "--prompt", "1024", "--out", str(tmp_path / "t")])
    return status, capsys.readouterr().out


def test_tune_with_an_answer_exits_0(tmp_path, capsys, workflow_gives, native_run):
    workflow_gives["results"] = native_run
    status, out = tune(tmp_path, capsys)
    assert (status, out.count(": use ")) == (0, 1), out


def test_tune_where_nothing_survived_exits_3_and_still_says_why(tmp_path, capsys, workflow_gives, native_run):
    workflow_gives["results"] = unanswered(copy(native_run, tmp_path / "none"))
    status, out = tune(tmp_path, capsys)
    assert status == Exit.NOTHING_SURVIVED == 3, out
    assert "no recommendation: no configuration survived" in out and "report:" in out


# ----------------------------------------------------------------------------- recheck


def recheck(tmp_path, capsys, earlier) -> tuple[int, str]:
    status = main(["recheck", str(earlier), "--binary", "/bin/true", "--out", str(tmp_path / "re")])
    return status, capsys.readouterr().out


def test_recheck_on_another_build_that_kept_everything_exits_0(tmp_path, capsys, workflow_gives, native_run):
    workflow_gives["results"] = PORTABLE
    status, out = recheck(tmp_path, capsys, copy(native_run, tmp_path / "earlier"))
    assert status == 0 and "this build" in out and "kept all 1 configuration(s)" in out, out
    assert "same build" not in out


def test_recheck_that_found_a_regression_exits_4(tmp_path, capsys, workflow_gives, native_run):
    workflow_gives["results"] = failed(copy(PORTABLE, tmp_path / "now"))
    status, out = recheck(tmp_path, capsys, copy(native_run, tmp_path / "earlier"))
    assert status == Exit.REGRESSED == 4, out
    assert "regressed" in out and ": fails now" in out


def test_recheck_slower_beyond_the_noise_exits_4(tmp_path, capsys, workflow_gives, native_run):
    workflow_gives["results"] = slowed(copy(PORTABLE, tmp_path / "now"))
    status, out = recheck(tmp_path, capsys, copy(native_run, tmp_path / "earlier"))
    assert status == Exit.REGRESSED, out
    assert re.search(r"is slower \(0\.\d\dx the e2e_tps\)", out), out


def test_recheck_on_the_very_build_the_run_used_says_the_same_build(tmp_path, capsys, workflow_gives, native_run):
    workflow_gives["results"] = native_run  # the earlier run's own tables: its llama-server's sha256
    status, out = recheck(tmp_path, capsys, copy(native_run, tmp_path / "earlier"))
    assert status == 0, out
    assert out.splitlines()[1].startswith("The same build as the earlier run (") and "the same sha256" in out, out
    assert "this build" not in out


def test_recheck_slower_while_other_processes_competed_is_inconclusive_and_exits_0(
    tmp_path, capsys, workflow_gives, native_run
):
    """#41: `recheck` said "tied 0.30x" without a word of the contention; slower beside a build is no regression."""
    workflow_gives["results"] = contended(slowed(copy(PORTABLE, tmp_path / "now")))
    status, out = recheck(tmp_path, capsys, copy(native_run, tmp_path / "earlier"))
    assert status == 0 and ": inconclusive, e2e_tps 0." in out, out
    assert f"kept all 0 configuration(s) measured in both: none fails or is slower beyond the noise; 1 {BUSY}" in out


def test_a_regression_on_the_same_build_is_not_laid_on_the_build():
    then, now = tables(a=("ok", 100, 95, 105)), tables(a=("crashed", None, None, None))
    (row,) = recheck_rows(*then, *now, "e2e_tps", "w")
    said = headline([row])
    assert row["same_build"] and said.startswith("The same build as the earlier run (b1 (aaaaaaaaaaaa)")
    assert "regressed: m a now fails" in said and "the build did not change" in said


# ----------------------------------------------------------------------------- compare


def compare(tmp_path, capsys, *runs) -> tuple[int, str]:
    status = main(["compare", *(f"{name}={path}" for name, path in runs), "--out", str(tmp_path / "cmp")])
    return status, capsys.readouterr().out


def test_compare_tied_exits_0(tmp_path, capsys, native_run):
    status, out = compare(tmp_path, capsys, ("native", native_run), ("portable", PORTABLE))
    assert status == 0 and "portable is tied" in out, out


def test_compare_with_a_run_slower_than_the_first_exits_4(tmp_path, capsys, native_run):
    slow = slowed(copy(PORTABLE, tmp_path / "slow"))
    status, out = compare(tmp_path, capsys, ("native", native_run), ("slow", slow))
    assert status == Exit.REGRESSED and "slow is slower" in out, out
    status, out = compare(tmp_path, capsys, ("slow", slow), ("native", native_run))  # the other way round: faster
    assert status == 0 and "native is faster" in out, out


def test_compare_with_a_run_that_lost_its_answer_exits_4_but_not_one_that_gained_it(tmp_path, capsys, native_run):
    none = unanswered(copy(PORTABLE, tmp_path / "none"))
    status, out = compare(tmp_path, capsys, ("native", native_run), ("none", none))
    assert status == Exit.REGRESSED and "none: no answer" in out, out
    status, out = compare(tmp_path, capsys, ("none", none), ("native", native_run))
    assert status == 0, out


def test_compare_with_a_run_measured_while_others_competed_is_inconclusive_and_exits_0(tmp_path, capsys, native_run):
    busy = contended(slowed(copy(PORTABLE, tmp_path / "busy")))
    status, out = compare(tmp_path, capsys, ("native", native_run), ("busy", busy))
    assert status == 0 and "busy is inconclusive (0." in out and BUSY in out, out
