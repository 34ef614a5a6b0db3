"""``crashline compare``: finished runs side by side (#27 item 8: no way to compare two runs on one machine, one
plot across them). On the committed recheck runs (gemma3-270m on this machine's native and portable builds), and
on rows made to lie apart or measured once."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pandas as pd
import pytest

from conftest import RECHECK, WIDTHS, unreadable
from crashline.config.plan import ConfigError
from crashline.report.compare import compare, read_run
from crashline.tables import compare as C

PORTABLE = RECHECK / "portable" / "results"


def _objective_row(folder, cid):
    m = pd.read_parquet(folder / "tables" / "measurements.parquet")
    return m[(m["config_id"] == cid) & (m["workload"] == "depth-2k")].iloc[0]


def test_two_runs_of_one_configuration_on_two_builds(tmp_path, native_run):
    page, rows = compare([f"native={native_run}", f"portable={PORTABLE}"], tmp_path / "cmp")
    native, portable = rows
    assert (native["run"], native["verdict"], native["ratio"]) == ("native", "reference", None)
    # The ratio and the verdict from the two tables themselves: medians, and the repetitions' ranges (one start).
    a, b = _objective_row(native_run, native["winner"]), _objective_row(PORTABLE, portable["winner"])
    assert portable["ratio"] == round(b["e2e_tps_median"] / a["e2e_tps_median"], 3)
    apart = b["e2e_tps_max"] < a["e2e_tps_min"] or a["e2e_tps_max"] < b["e2e_tps_min"]
    assert portable["verdict"] == ("slower" if apart else "tied")
    assert native["build"] != portable["build"]  # the two builds are named by their sha256
    md = page.read_text()
    assert f"portable is {portable['verdict']} ({portable['ratio']:.2f}×)" in md
    assert "| native |" in md and "| portable |" in md and "the same settings as the others" in md
    assert "![" in md and (tmp_path / "cmp" / "figures" / "compare-gemma3-270m.svg").exists()
    svg = (tmp_path / "cmp" / "figures" / "compare-gemma3-270m.svg").read_text()
    assert "native (reference)" in svg and "portable" in svg
    saved = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    assert [r["run"] for r in saved] == ["native", "portable"] and saved[1]["spread"]["of"]


def test_the_page_reads_whole_in_chromium(tmp_path, browser, native_run):
    compare([f"native={native_run}", f"portable={PORTABLE}"], tmp_path / "cmp")
    assert unreadable(browser, tmp_path / "cmp" / "compare.html") == {}, WIDTHS
    assert not browser.console()


def _run(name, medians, n=3, objective="end to end t/s per request at workload w"):
    rows = pd.DataFrame(
        [
            {
                "model": "m",
                "config_id": "c1",
                "workload": "w",
                "concurrency": 1,
                "environment": "cpu",
                "server_args": "-ub 512",
                "server_version": "v",
                "server_sha256": name * 12,
                "e2e_tps_median": sorted(medians)[len(medians) // 2],
                "e2e_tps_min": min(medians) - 1,
                "e2e_tps_max": max(medians) + 1,
                "e2e_tps_n": n,
                "e2e_tps_start_medians": medians,
                **{f"{k}_median": 1.0 for k in ("prefill_tps", "decode_tps", "ttft_s")},
            }
        ]
    )
    answer = {"model": "m", "environment": "cpu", "objective": objective, "metric": "e2e_tps", "workload": "w"}
    return C.Run(name, [{**answer, "winner": "c1", "use": "-ub 512", "measured": {"concurrency": 1}}], rows)


def test_speeds_apart_between_starts_are_faster_or_slower_and_one_request_cannot_tell():
    base = _run("a", [100.0, 102.0])
    assert [r["verdict"] for r in C.compare([base, _run("b", [120.0, 121.0])])] == ["reference", "faster"]
    assert [r["verdict"] for r in C.compare([base, _run("b", [90.0, 91.0])])] == ["reference", "slower"]
    assert C.compare([base, _run("b", [101.0, 103.0])])[1]["verdict"] == "tied"
    assert C.compare([base, _run("b", [130.0], n=1)])[1]["verdict"] == "cannot tell"


def test_runs_ranked_by_different_objectives_are_refused():
    other = _run("b", [100.0, 101.0], objective="decode t/s per request at workload w")
    with pytest.raises(C.CompareError, match=r"different objectives \(a: end to end .*; b: decode"):
        C.compare([_run("a", [100.0, 101.0]), other])


def test_what_is_not_a_finished_run_and_two_runs_named_alike_are_refused(tmp_path, native_run):
    with pytest.raises(ConfigError, match="not the results folder of a finished crashline run"):
        read_run(str(tmp_path))
    with pytest.raises(ConfigError, match="named alike"):
        compare([f"x={native_run}", f"x={PORTABLE}"], tmp_path / "cmp")
    with pytest.raises(ConfigError, match="at least two"):
        compare([str(native_run)], tmp_path / "cmp")
    assert not (tmp_path / "cmp").exists()  # nothing written for a refused comparison


def test_the_verb_prints_the_table_and_names_the_files(tmp_path, native_run):
    a, b = tmp_path / "a", tmp_path / "b"
    shutil.copytree(native_run, a)
    shutil.copytree(PORTABLE, b)
    done = subprocess.run(
        [sys.executable, "-m", "crashline", "compare", str(a), str(b), "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert f"| {a} |" in done.stdout and f"| {b} |" in done.stdout and "written:" in done.stdout
    (a / "recommendation.json").unlink()
    refused = subprocess.run(
        [sys.executable, "-m", "crashline", "compare", str(a), str(b)], capture_output=True, text=True, cwd=tmp_path
    )
    assert refused.returncode != 0 and "its recommendation" in refused.stderr and "\n" not in refused.stderr.strip()


def test_a_model_only_one_run_measured_says_so_instead_of_an_empty_comparison():
    """#41: "Against mine (3,870.0 end to end t/s): ." where only one run had the model."""
    from crashline.report.compare import _headline

    only = {"run": "mine", "verdict": "reference", "median": 3870.0, "ratio": None, "metric_label": "end to end"}
    said = _headline([only])
    assert said.startswith("Only mine measured this model (3,870.0 ") and said.endswith(": nothing to compare."), said
