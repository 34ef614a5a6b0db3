"""The n_cpu_moe search with a real llama-server on the synthetic MoE (CPU: no VRAM limit, so the
lowest value survives: without a climb the search stops after the calibration and one probe; with one
it measures the values above, then starts the finalists again, interleaved)."""

from __future__ import annotations

import copy
import re
import statistics
import tarfile

import pytest

import pandas as pd
import yaml

from conftest import REPO
from helpers import fetch_record, recorded
from crashline.config.plan import load_schema
from crashline.tables import aggregate
from crashline.config import plan as C
from crashline.jobs import spec as jobs
from crashline.engine import planner, workloads
from crashline.core import records, settings as S
from crashline.report import build as report
from crashline.report import cost as cost_mod
from crashline.core.atomic import read_json, write_json
from crashline.models.manifest import inspect_gguf
from crashline.jobs.search import run_search


SCHEMA = load_schema()
TUNE_H200 = REPO / "bench" / "results" / "tune-h200" / "qwen3-30b-a3b" / "tune"


def test_search_on_cpu_writes_probes_summary_and_report(tmp_path, tiny_moe, server_provenance):
    cfg = C.validate(
        {
            "models": {"tiny": {"source": f"file:{tiny_moe}"}},
            "defaults": {"threads": 2, "ctx": 2048},
            "configurations": [{"grid": {"ubatch": [256]}, "search": {"n_cpu_moe": [0, 4], "climb": 0}}],
            "workloads": [{"name": "short", "prompt_tokens": 64, "gen_tokens": 8}],
            "repetitions": 1,
        },
        SCHEMA,
    )
    assert C.expand(cfg) == []
    (group,) = C.expand_searches(cfg)
    assert group["range"] == [0, 4] and "n_cpu_moe" not in group["given"]
    fetch = fetch_record(tiny_moe)
    out = tmp_path / "search" / "tiny" / group["id"]
    spec = jobs.spec("search", cfg, "tiny", group["id"])
    summary = run_search(spec, jobs.JobInputs(fetch, inspect_gguf(tiny_moe), server_provenance), out)
    assert summary["boundary"] == summary["recommended_n_cpu_moe"] == summary["lowest_with_margin"] == 0
    assert summary["climbed"] == summary["finalists"] == [] and summary["lead_held"] is None  # climb: 0
    assert summary["probes"] == [{"n_cpu_moe": 0, "survived": True}]
    assert summary["server_starts"] == 2  # calibration at 3 (layer 3's experts on the card), then 0
    statuses = {v["n_cpu_moe"]: v["status"] for v in summary["values"]}
    assert statuses[0] == "measured" and statuses[2].startswith("not measured") and statuses[4].startswith("not meas")
    assert statuses[3] == "calibration: started and stopped once ready, no workloads"
    # the calibration loaded 3 and stopped it: no workloads, a record of its own beside the probes', not a probe
    calib = records.load(out / "records" / summary["calibration"] / "measure.json", "measure")
    assert calib["load_only"] and calib["outcome"] == "ok" and calib["workloads"] == []
    assert calib["settings"]["n_cpu_moe"] == 3 and calib["placement"]["buffers_mib"]
    assert summary["calibration_time_budget_s"]["server_start"] > 0 and "workloads" not in summary["records"]
    probes = sorted((out / "records").glob("*/measure.json"))
    assert len(probes) == 1 and summary["records"] == [probes[0].parent.name]
    configs, measurements = aggregate.write(
        probes, tmp_path / "c.parquet", tmp_path / "m.parquet", [out / "search.json"], tmp_path / "s.parquet"
    )
    assert sorted(configs["s_n_cpu_moe"]) == [0] and (configs["outcome"] == "ok").all()
    searches = pd.read_parquet(tmp_path / "s.parquet")
    assert searches["server_starts"].tolist() == [2]
    # the cost counts the calibration's start and clock beside the probe's
    spent = cost_mod.cost(configs, None, {}, searches)
    assert spent["server_starts"] == 2 and spent["calibrations"] == 1
    assert spent["measure_s"] == pytest.approx(configs["job_s"].sum() + searches["calibration_job_s"].sum(), abs=0.1)
    write_json(tmp_path / "prov.json", server_provenance)
    report.render(
        tmp_path / "c.parquet",
        tmp_path / "m.parquet",
        tmp_path / "prov.json",
        cfg,
        tmp_path / "r.md",
        tmp_path / "r.html",
        tmp_path / "s.parquet",
    )
    md = (tmp_path / "r.md").read_text()
    assert "**Planner**" in md and "Probed in this order: 0." in md and "use n_cpu_moe 0" in md
    assert (  # every value, in runs
        "- 0 ✓ chosen\n- 1–2 fit by the same prediction (not measured)\n"
        "- 3 calibration: started and stopped once ready, no workloads\n- 4 fit by the same prediction (not measured)\n"
    ) in md


def test_search_climbs_then_starts_the_finalists_again_interleaved(tmp_path, tiny_moe, server_provenance):
    """climb 2, starts 2 on CPU, where every value fits and speeds differ by noise only: the mechanics. The values
    above the lowest (0) are measured while not clearly slower; the finalists' second starts follow their first
    ones in the same order (A B, then A B); their rows pool every request of both starts; the winner has the
    highest pooled median of the search's rows (what the report ranks); the lead is counted per start pair."""
    cfg = C.validate(
        {
            "models": {"tiny": {"source": f"file:{tiny_moe}"}},
            "defaults": {"threads": 2, "ctx": 2048},
            "configurations": [{"search": {"n_cpu_moe": [0, 4], "climb": 2, "starts": 2}}],
            "workloads": [{"name": "short", "prompt_tokens": 64, "gen_tokens": 16}],
            "repetitions": 2,
            "objective": {"metric": "decode_tps"},  # the climb and the finalists' mechanics, checked on decode
        },
        SCHEMA,
    )
    (group,) = C.expand_searches(cfg)
    spec = jobs.spec("search", cfg, "tiny", group["id"])
    assert (spec.group.climb, spec.group.starts) == (2, 2)
    assert (spec.group.objective.metric, spec.group.objective.workload) == ("decode_tps", "short")
    out = tmp_path / "search"

    def search() -> dict:
        inputs = jobs.JobInputs(fetch_record(tiny_moe), inspect_gguf(tiny_moe), server_provenance)
        return run_search(spec, inputs, out)

    summary = search()
    assert summary["boundary"] == summary["lowest_with_margin"] == 0
    assert summary["objective"]["metric"] == "decode_tps" and summary["objective"]["workload"] == "short"

    def rec(record_id: str) -> dict:
        return records.load(out / "records" / record_id / "measure.json", "measure")

    def speed(record_id: str) -> planner.Speed:
        return planner.Speed.of(rec(record_id)["workloads"][0]["decode_tps"])

    cid = {v: S.config_id("tiny", S.resolve({**group["given"], "n_cpu_moe": v})) for v in range(5)}

    # The climb: 1 always; 2 unless 1 was clearly slower than 0. Each verdict is the rule's on the records.
    climbed = summary["climbed"]
    assert [c["n_cpu_moe"] for c in climbed] == ([1] if climbed[0]["verdict"] == "slower" else [1, 2])
    best = 0
    for c in climbed:
        s, b = speed(cid[c["n_cpu_moe"]]), speed(cid[best])
        assert (c["median"], c["min"], c["max"], c["n"]) == (s.median, s.low, s.high, 2)  # 2 repetitions, 1 request
        rule = "slower" if s.high < b.low else "faster" if s.low > b.high else "within noise"
        assert c["verdict"] == rule
        best = max((best, c["n_cpu_moe"]), key=lambda v: (speed(cid[v]).median, v))
    measured = {0, *(c["n_cpu_moe"] for c in climbed)}  # 3, the calibration, was loaded and stopped only
    assert {v["n_cpu_moe"] for v in summary["values"] if v["status"] == "measured"} == measured
    assert summary["calibration"].endswith("/calibration") and summary["calibration"] not in summary["records"]

    # The finalists: chosen from the first starts by the rule, at least two; a challenger may have joined.
    first = {v: speed(cid[v]) for v in sorted(measured, key=lambda v: rec(cid[v])["started_at"])}
    finals = [f["n_cpu_moe"] for f in summary["finalists"]]
    chosen = planner.finalists(first)
    assert len(chosen) >= 2 and finals[: len(chosen)] == [v for v in finals if v in chosen]
    assert set(chosen) <= set(finals) <= measured
    for f in summary["finalists"]:
        assert f["records"] == [cid[f["n_cpu_moe"]], f"{cid[f['n_cpu_moe']]}/start-2"] and f["starts"] == 2
        assert f["start_medians"] == [speed(r).median for r in f["records"]] and f["survived"]
        assert all(rec(r)["config_id"] == f["config_id"] == cid[f["n_cpu_moe"]] for r in f["records"])
    starts_2 = [f"{cid[v]}/start-2" for v in finals]
    assert summary["records"] == sorted([cid[v] for v in measured] + starts_2)
    assert summary["server_starts"] == len(measured) + len(finals) + 1  # and the calibration

    # Interleaved: every finalist's first start, then every second start, in the same order (A B ... A B ...).
    paths = {r: out / "records" / r / "measure.json" for f in summary["finalists"] for r in f["records"]}
    in_time = sorted(paths, key=lambda r: paths[r].stat().st_mtime_ns)  # each record written as its start ends
    assert [rec(r)["started_at"] for r in in_time] == sorted(rec(r)["started_at"] for r in in_time)
    order = [(int(r.endswith("/start-2")) + 1, next(v for v in finals if r.startswith(cid[v]))) for r in in_time]
    initial = [v for v in finals if v in chosen]
    # a challenger's first start was a climb probe: it may lie between the initial finalists' starts
    of_initial = [o for o in order if o[1] in initial]
    assert of_initial[: 2 * len(initial)] == [(1, v) for v in initial] + [(2, v) for v in initial]
    assert [(o["start"], o["n_cpu_moe"]) for o in summary["start_order"]] == [(2, v) for v in finals]

    # The tables: one row per configuration; a finalist's row pools both starts (n = 2 starts x 2 repetitions x 1).
    configs, measurements = aggregate.write(
        aggregate_paths := [out / "records" / r / "measure.json" for r in summary["records"]],
        tmp_path / "c.parquet",
        tmp_path / "m.parquet",
        [out / "search.json"],
        tmp_path / "s.parquet",
    )
    assert len(aggregate_paths) == summary["server_starts"] - 1 and configs["config_id"].is_unique
    rows = measurements.set_index("s_n_cpu_moe")
    assert sorted(rows.index) == sorted(measured) and (configs["outcome"] == "ok").all()
    for v in measured:
        row, starts = rows.loc[v], 2 if v in finals else 1
        assert configs.set_index("s_n_cpu_moe").loc[v, "starts"] == starts
        assert row["decode_tps_n"] == starts * 2 * 1
        ids = [cid[v], f"{cid[v]}/start-2"][:starts]
        requests = [r["decode_tps"] for i in ids for run in rec(i)["workloads"][0]["runs"] for r in run["requests"]]
        assert row["decode_tps_median"] == statistics.median(requests)
        assert list(row["decode_tps_start_medians"]) == [speed(i).median for i in ids]
    for f in summary["finalists"]:
        assert (f["median"], f["n"]) == (rows.loc[f["n_cpu_moe"], "decode_tps_median"], 4)

    # The winner: the fastest pooled median, of the finalists and of every row of the search alike.
    winner = summary["recommended_n_cpu_moe"]
    assert winner == max(finals, key=lambda v: (rows.loc[v, "decode_tps_median"], v))
    assert winner == max(measured, key=lambda v: (rows.loc[v, "decode_tps_median"], v))  # what the report ranks
    runner = max((v for v in finals if v != winner), key=lambda v: (rows.loc[v, "decode_tps_median"], v))
    pairs = zip(rows.loc[winner, "decode_tps_start_medians"], rows.loc[runner, "decode_tps_start_medians"])
    won = sum(a > b for a, b in pairs)
    assert (summary["runner_up"], summary["lead_won"], summary["lead_pairs"]) == (runner, won, 2)
    assert summary["lead_held"].startswith(
        f"n_cpu_moe {winner} faster than n_cpu_moe {runner} (the runner-up) in {won} of 2 interleaved start pairs"
    )
    (row,) = pd.read_parquet(tmp_path / "s.parquet").to_dict("records")
    assert (row["recommended_n_cpu_moe"], row["lowest_with_margin"], row["lead_held"]) == (
        winner,
        0,
        summary["lead_held"],
    )
    assert (row["climb_limit"], row["starts_per_finalist"], row["objective_workload"]) == (2, 2, "short")
    assert [f["n_cpu_moe"] for f in row["finalists"]] == finals and list(row["finalists"][0]["start_medians"])
    assert [c["verdict"] for c in row["climbed"]] == [c["verdict"] for c in climbed]

    # The same spec again: every start's record reused (none measured again), the same answer.
    written = {p: p.stat().st_mtime_ns for p in (out / "records").rglob("measure.json")}
    again = search()
    assert {p: p.stat().st_mtime_ns for p in (out / "records").rglob("measure.json")} == written
    assert again == summary
    assert read_json(out / "search.json")["recommended_n_cpu_moe"] == winner


def test_a_search_with_a_draft_model_loads_it_in_every_probe(tmp_path, tiny_moe, server_provenance):
    """tune --draft on a GPU (#43 item 2) is a search whose settings hold a draft model: its calibration and probes
    start llama-server with the draft (the probes' inputs once left the draft's file out: every search failed)."""
    draft = tmp_path / "tiny-draft.gguf"
    draft.write_bytes(tiny_moe.read_bytes())
    cfg = C.validate(
        {
            "models": {"tiny": {"source": f"file:{tiny_moe}"}, "tiny-draft": {"source": f"file:{draft}"}},
            "defaults": {"threads": 2, "ctx": 2048},
            "configurations": [
                {"models": ["tiny"], "settings": {"draft_model": "tiny-draft"}, "search": {"n_cpu_moe": [0, 4]}}
            ],
            "workloads": [{"name": "short", "prompt_tokens": 64, "gen_tokens": 16}],
            "repetitions": 1,
        },
        SCHEMA,
    )
    (group,) = C.expand_searches(cfg)
    spec = jobs.spec("search", cfg, "tiny", group["id"])
    assert spec.draft_model == "tiny-draft"
    inputs = jobs.JobInputs(fetch_record(tiny_moe), inspect_gguf(tiny_moe), server_provenance, str(draft))
    summary = run_search(spec, inputs, tmp_path / "search")
    assert summary["boundary"] == summary["lowest_with_margin"] == 0  # every value fits without a GPU: all survived
    starts = sorted((tmp_path / "search" / "records").glob("**/measure.json"))
    assert len(starts) == summary["server_starts"] >= 2
    for path in starts:
        command = records.load(path, "measure")["command"]
        assert command[command.index("-md") + 1] == str(draft) and records.load(path, "measure")["outcome"] == "ok"


def test_the_time_limit_leaves_out_the_climb_and_the_finalists_further_starts(
    tmp_path, tiny_moe, server_provenance, monkeypatch
):
    """tune --time (#40 item 3): a run whose time is spent measures the boundary and the margin all the same, then
    leaves out the climb and the finalists' further starts, saying so in the summary; without the key a search's
    spec is as before (its params unchanged, so nothing reruns)."""
    from crashline.engine import eta

    raw = {
        "models": {"tiny": {"source": f"file:{tiny_moe}"}},
        "defaults": {"threads": 2, "ctx": 2048},
        "configurations": [{"search": {"n_cpu_moe": [0, 4], "climb": 2, "starts": 2}}],
        "workloads": [{"name": "short", "prompt_tokens": 64, "gen_tokens": 16}],
        "repetitions": 2,
    }
    cfg = C.validate({**raw, "time_limit_s": 60}, SCHEMA)
    (group,) = C.expand_searches(cfg)
    spec = jobs.spec("search", cfg, "tiny", group["id"])
    unlimited = jobs.spec("search", C.validate(copy.deepcopy(raw), SCHEMA), "tiny", group["id"])
    assert spec.group.time_limit_s == 60 and "time_limit_s" not in unlimited.to_dict()["group"]
    plan_file = tmp_path / "plan.json"
    write_json(plan_file, {"jobs": [], "started": __import__("time").time() - 60})  # the run's minute is spent
    monkeypatch.setenv(eta.PLAN_ENV, str(plan_file))
    inputs = jobs.JobInputs(fetch_record(tiny_moe), inspect_gguf(tiny_moe), server_provenance)
    summary = run_search(spec, inputs, tmp_path / "search")
    assert summary["boundary"] == summary["lowest_with_margin"] == summary["recommended_n_cpu_moe"] == 0
    assert summary["server_starts"] == 2  # the calibration and the boundary's probe: never left out
    climb_cut, finals_cut = summary["time_cut"]
    assert climb_cut.startswith("the climb from n_cpu_moe 1 on left out: the time limit (60 s) leaves 0 s")
    assert summary["climbed"] == [] and summary["climb_stop"] == climb_cut
    assert finals_cut.startswith("the finalists' start 2 of 2 and any later one left out: the time limit")
    assert [(f["n_cpu_moe"], f["starts"]) for f in summary["finalists"]] == [(0, 1)]
    assert summary["lead_held"].endswith(finals_cut) and summary["time_limit_s"] == 60


def test_starts_of_one_configuration_pool_into_one_row(tmp_path):
    """Two starts of the H200's n_cpu_moe 29 (the second slower, with less headroom): one row, every request of
    both in its statistics, each start's median, the least headroom; a start that crashed makes the row crashed."""
    from conftest import FIXTURES

    first = records.load(FIXTURES / "h200-records" / "ncmoe29.json", "measure")
    for w in first["workloads"]:
        w["runs"] = [{"requests": [r]} for r in w["runs"]]  # a run of one request, as measure records it now
    second = copy.deepcopy(first)
    for w in second["workloads"]:
        for run in w["runs"]:
            for r in run["requests"]:
                r["decode_tps"] *= 0.8
        w["decode_tps"] = {k: v * 0.8 if k in ("median", "min", "max") else v for k, v in w["decode_tps"].items()}
    second["memory"]["headroom_mib"] = 900.0
    second["memory"]["per_phase"]["depth-16k"]["gpu_mib"] = 11388.0
    search_dir = tmp_path / "search"
    for rid, rec in (("abc", first), ("abc/start-2", second)):
        records.write(search_dir / "records" / rid / "measure.json", "measure", rec)
    records.write(
        search_dir / "search.json",
        "search",
        {
            **read_json(FIXTURES / "h200-search" / "search.json"),
            "finalists": [{"n_cpu_moe": 29, "records": ["abc", "abc/start-2"]}],
            "records": ["abc", "abc/start-2"],
        },
    )
    paths = [search_dir / "records" / rid / "measure.json" for rid in ("abc", "abc/start-2")]
    configs, measurements = aggregate.tables(paths, [search_dir / "search.json"])
    (config,) = configs.to_dict("records")
    assert (config["starts"], config["headroom_mib"], config["outcome"]) == (2, 900.0, "ok")
    row = measurements.set_index("workload").loc["depth-16k"]
    requests = [
        r["decode_tps"]
        for rec in (first, second)
        for w in rec["workloads"]
        if w["name"] == "depth-16k"
        for run in w["runs"]
        for r in run["requests"]
    ]
    assert row["decode_tps_n"] == len(requests) == 4 and row["decode_tps_median"] == statistics.median(requests)
    assert list(row["decode_tps_start_medians"]) == pytest.approx([55.0, 44.0], abs=0.05)
    assert row["workload_peak_gpu_mib"] == 11388.0
    assert aggregate.tables(paths)[0]["starts"].tolist() == [1, 1]  # without the search that lists them: two rows
    second.update(outcome="crashed", failure="signal", phase="short", message="killed by SIGSEGV")
    records.write(paths[1], "measure", second)
    (config,) = aggregate.tables(paths, [search_dir / "search.json"])[0].to_dict("records")
    assert (config["outcome"], config["phase"], config["starts"]) == ("crashed", "short", 2)


def test_calibration_counts_only_the_cards_buffers():
    """The H200 record at n_cpu_moe 29 (ub 2048): CUDA0 holds weights 6,691.09, KV 3,072 and a compute buffer of
    476.05 MiB; CUDA_Host's 192.07 MiB of pinned compute is RAM. The rest is the load peak less the card's
    buffers; the total the planner predicts at this ubatch is the same either way."""
    from conftest import FIXTURES
    from crashline.core.atomic import read_json
    from crashline.jobs.search_rules import calibration

    compute, rest = calibration(read_json(FIXTURES / "h200-records" / "ncmoe29.json"), 2048)
    assert compute(2048) == 476.05
    assert rest == pytest.approx(10830 - 6691.09 - 3072 - 476.05)


def test_a_range_beyond_the_models_layers_is_refused_naming_them(tmp_path):
    """n_cpu_moe [10, 20] on a 4-layer model printed '10..4', nan, and recommended 4, outside the range (#26)."""
    from crashline.config.file import ConfigError

    bare = jobs.Measurement(jobs.ServerLimits(1, 1, 1), (), 1, 0, jobs.Budget(), jobs.Telemetry(0.25))
    spec = jobs.SearchSpec("tiny", jobs.SearchGroup("g", {}, (10, 20), 1024), bare)
    with pytest.raises(ConfigError, match=r"the model has 4 layers.*give a range within 0\.\.4"):
        run_search(spec, jobs.JobInputs({}, {"layers": 4}, {}), tmp_path)


def _request(first_s: float, decode: float) -> dict:
    return {k: {"median": v, "min": v, "max": v, "n": 6} for k, v in (("ttft_s", first_s), ("decode_tps", decode))}


def _rival(
    objective: dict, median: float, low: float, high: float, survived: bool = True, request: dict | None = None
) -> dict:
    """A rival search's summary as far as ``best_rival`` reads it: its objective and its winner's finalist row."""
    return {
        "group": f"rival-{median:g}",
        "objective": objective,
        "recommended_n_cpu_moe": 3,
        "finalists": [
            {
                "n_cpu_moe": 3,
                "median": median,
                "min": low,
                "max": high,
                "n": 6,
                "survived": survived,
                "request": request,
            },  # fmt: skip
            {"n_cpu_moe": 4, "median": median * 2, "min": low * 2, "max": high * 2, "n": 6, "survived": True},
        ],
    }


def test_the_best_rival_is_the_fastest_winner_ranked_by_the_same_objective():
    from crashline.jobs.search_rules import best_rival

    e2e = jobs.Objective("e2e_tps", "long")
    assert best_rival([], e2e) is None
    slow, fast = _rival(e2e.as_dict(), 100, 90, 110), _rival(e2e.as_dict(), 200, 150, 210)
    # the winner's row, not the runner-up's (which is faster here, and did not win)
    assert best_rival([slow, fast], e2e) == ("rival-200", 3, planner.Speed(200, 150, 210, 6), None)
    decode = {**e2e.as_dict(), "metric": "decode_tps"}
    assert best_rival([_rival(decode, 900, 800, 950), slow], e2e)[0] == "rival-100"
    assert best_rival([_rival(e2e.as_dict(), 900, 800, 950, survived=False)], e2e) is None  # a start failed: no bar
    assert best_rival([{**fast, "finalists": []}], e2e) is None  # a search without a climb has no speeds


@pytest.mark.parametrize(
    ("rival_tps", "rival_request"),
    [(1e9, _request(1e-9, 1e9)), (1e-6, _request(1e3, 1e-6)), (1e9, _request(1e-9, 1e-3)), (1e9, None)],
    ids=["faster-at-every-reply", "slower", "faster-only-for-short-replies", "reply-unknown"],
)
def test_a_search_clearly_slower_than_its_rival_stops_at_the_lowest_value_with_the_margin(
    tmp_path, tiny_moe, server_provenance, rival_tps, rival_request
):
    """prune, on a real server: the lowest value with the margin measured, then compared with the rival's winner.
    Against a rival far faster (its whole range above) at every reply length of 1 to what the context leaves, the
    search is cut short there: no climb, no finalists, two server starts (the calibration and that value), and the
    report says why. Against one far slower, one faster only while the reply is short (its decode far slower: #40,
    a configuration 21% faster on decode was dropped at a 64-token reply), or one whose request figures are unknown,
    it climbs and its finalists start as the answer's would."""
    cfg = C.validate(
        {
            "models": {"tiny": {"source": f"file:{tiny_moe}"}},
            "defaults": {"threads": 2, "ctx": 2048},
            "configurations": [{"search": {"n_cpu_moe": [0, 4], "climb": 1, "starts": 2, "prune": True}}],
            "workloads": [{"name": "short", "prompt_tokens": 64, "gen_tokens": 8}],
            "repetitions": 1,
        },
        SCHEMA,
    )
    (group,) = C.expand_searches(cfg)
    assert group["rivals"] == []  # the first search of its model has none
    spec = jobs.spec("search", cfg, "tiny", group["id"])
    rival = _rival(spec.group.objective.as_dict(), rival_tps, rival_tps * 0.9, rival_tps * 1.1, request=rival_request)
    out = tmp_path / "search"
    inputs = jobs.JobInputs(fetch_record(tiny_moe), inspect_gguf(tiny_moe), server_provenance, rivals=(rival,))
    summary = run_search(spec, inputs, out)
    assert summary["rival"] == {"search": rival["group"], "n_cpu_moe": 3, "median": rival_tps, "n": 6} | {
        "min": rival_tps * 0.9,
        "max": rival_tps * 1.1,
    }
    if rival_request and rival_request["decode_tps"]["median"] > 1:
        assert summary["cut_short"] and summary["climbed"] == summary["finalists"] == []
        assert summary["server_starts"] == 2 and summary["recommended_n_cpu_moe"] == 0
        assert summary["climb_stop"].startswith("cut short: n_cpu_moe 0, the lowest with the margin, e2e t/s")
        assert f"lies wholly below the winner of search {rival['group']}, n_cpu_moe 3" in summary["climb_stop"]
        tables = [tmp_path / f"{t}.parquet" for t in ("c", "m")]
        aggregate.write([], *tables, [out / "search.json"], tmp_path / "s.parquet")
        from crashline.report.searches import climb_text

        (row,) = pd.read_parquet(tmp_path / "s.parquet").to_dict("records")
        assert climb_text(row) == f"No climb: {summary['climb_stop']}."
    else:
        assert not summary["cut_short"] and [c["n_cpu_moe"] for c in summary["climbed"]] == [1]
        assert len(summary["finalists"]) == 2


def test_a_request_loses_at_every_reply_only_where_it_loses_at_the_shortest_and_the_longest():
    """t(n) = first + n ÷ decode: a quicker first token with a slower decode loses once the reply is long enough
    (#40: at the seed's scale `-ub 1024` finished a 16K request first past about 144 tokens)."""
    fast_prefill = planner.Request(planner.Speed(2.4, 2.3, 2.5), planner.Speed(54.3, 53.2, 55.8))
    fast_decode = planner.Request(planner.Speed(2.9, 2.8, 3.0), planner.Speed(65.5, 58.1, 66.8))
    assert not planner.loses_at_every_reply(fast_decode, fast_prefill, 4096)  # it wins past the crossing
    assert planner.loses_at_every_reply(fast_decode, fast_prefill, 16)  # a 16-token reply at most: it never does
    assert not planner.loses_at_every_reply(fast_prefill, fast_decode, 16)
    # by the medians, as the answer's reply-length line judges: a wide range of requests alone keeps none in the race
    noisy = planner.Request(planner.Speed(2.9, 2.0, 3.5), planner.Speed(50.0, 40.0, 70.0))
    assert planner.loses_at_every_reply(noisy, fast_prefill, 4096)
    assert planner.Request.of({"ttft_s": {"median": 1.0, "min": 1.0, "max": 1.0}}) is None  # no decode: unknown


def test_the_boundary_layer_in_part_on_the_card_races_the_climb_on_the_h200_search(tmp_path, monkeypatch):
    """``partial``: the H200 tune's -ub 2048 search (12,288 MiB, margin 1,024) found 29 the lowest value with the
    margin (28 did not keep it). Layer 28's up and gate experts brought to the card are predicted from 29's measured
    headroom less those tensors' bytes (the manifest's) and the 96 MiB of activations a split layer adds at -ub 2048;
    under the margin (1,308 - 216 - 96 = 996 MiB), the smaller move, its up alone, is tried: started with
    ``--n-cpu-moe 28 -ot blk\\.28\\.ffn_(gate|down)_exps=CPU``. Answered here as 29's record with the predicted
    headroom and a faster request, it races the climb's values, gets the winner's starts and wins: the summary names
    its override."""
    from crashline.jobs import spec as jobs
    from crashline.jobs import search as search_mod

    (folder,) = [p.parent for p in TUNE_H200.glob("results/search/*/*/search.json") if "4a7dabea11" in str(p)]
    manifest = read_json(TUNE_H200 / "results" / "models" / "qwen3-30b-a3b" / "manifest.json")
    for row in manifest["per_layer"]:  # as today's manifest has it: the synthetic model's three are alike
        row["expert_tensor_bytes"] = dict.fromkeys(("up", "gate", "down"), row["expert_bytes"] // 3)
    by_n = {}
    for path in sorted(folder.glob("records/*/measure.json")):
        rec = read_json(path)
        by_n.setdefault(rec["settings"]["n_cpu_moe"], rec)
    h29 = by_n[29]["memory"]["headroom_mib"]
    split = manifest["per_layer"][28]["expert_tensor_bytes"]
    on_card = lambda override: [t for t in ("up", "gate", "down") if t not in override.split("ffn_")[1]]  # noqa: E731
    # a split layer's activations crossing to the CPU, one of 48 MiB per gate or up tensor on the card
    crossing = lambda override: len({"gate", "up"} & set(on_card(override))) * 2048 * 8 * 768 * 4 / 2**20  # noqa: E731
    started = []

    def h200(spec, inputs, paths, load_only=False):
        settings = spec.item.settings
        started.append((settings["n_cpu_moe"], settings.get("override_tensor")))
        if not settings.get("override_tensor"):
            return recorded(folder, paths.record.relative_to(tmp_path))
        rec = copy.deepcopy(by_n[29])
        override = settings["override_tensor"]
        rec["memory"]["headroom_mib"] = h29 - sum(split[t] for t in on_card(override)) / 2**20 - crossing(override)
        for w in rec["workloads"]:  # every request 1.3 times as fast
            for req in (r for run in w["runs"] for r in run["requests"]):
                for key in ("prompt_ms", "predicted_ms", "ttft_s", "end_s"):
                    req[key] = req[key] / 1.3 if req.get(key) is not None else None
                for key in ("prefill_tps", "decode_tps"):
                    req[key] = req[key] * 1.3 if req.get(key) is not None else None
            w.update(workloads.summarize(w["runs"]))
        rec["settings"], rec["id"] = settings, spec.item.id
        return rec

    monkeypatch.setattr(search_mod, "measure", h200)
    raw = yaml.safe_load((TUNE_H200 / "tune.yaml").read_text())
    for entry in raw["configurations"]:
        if "search" in entry:
            entry["search"]["partial"] = True
    cfg = C.validate({**raw, "results_dir": str(tmp_path)}, SCHEMA)
    real = read_json(folder / "search.json")
    spec = jobs.spec("search", cfg, "qwen3-30b-a3b", real["group"])
    assert spec.group.partial
    summary = search_mod.run_search(spec, jobs.JobInputs({}, manifest, {}), tmp_path)
    mib = lambda names: round(sum(split[t] for t in names) / 2**20, 1)  # noqa: E731
    tried = summary["partial"]  # the larger move first, until one keeps the margin
    assert [(e["n_cpu_moe"], e["override_tensor"], e["moved_mib"]) for e in tried] == [
        (28, r"blk\.28\.ffn_down_exps=CPU", mib(["up", "gate"])),
        (28, r"blk\.28\.ffn_(gate|down)_exps=CPU", mib(["up"])),
    ][: len(tried)]
    for entry in tried:
        left = h29 - entry["moved_mib"] - crossing(entry["override_tensor"])
        assert entry["predicted_headroom_mib"] == round(left, 1)
        kept = entry["predicted_headroom_mib"] >= 1024
        assert entry["status"].startswith("measured: kept" if kept else "skipped: predicted to leave")
    assert tried[-1]["status"] == "measured: kept the margin"
    tried = tried[-1]
    assert started.count((28, tried["override_tensor"])) == 2  # its first start and its finalist start
    (won,) = [f for f in summary["finalists"] if f["override_tensor"]]
    assert won["starts"] == summary["starts"] == 2 and won["n_cpu_moe"] == 28
    assert (summary["recommended_n_cpu_moe"], summary["recommended_override_tensor"]) == (28, tried["override_tensor"])
    assert S.label(S.resolve({"n_cpu_moe": 28, "override_tensor": tried["override_tensor"]})).count("'") == 2
    from crashline.report.searches import finalists_text, partial_text

    (row,) = aggregate.search_table([tmp_path / "search.json"]).to_dict("records")
    said = partial_text(row)
    assert said.startswith("Layer 28 in part on the card, with --n-cpu-moe 28: -ot blk\\.28\\.ffn_down_exps=CPU (")
    assert said.endswith(f"left {tried['headroom_mib']:,.0f} MiB): measured.")
    assert f"28 with -ot {tried['override_tensor']}: 2 starts" in finalists_text(row)


def test_a_partial_winner_is_the_first_recall_candidate_before_a_faster_whole_layer_of_the_same_n(tmp_path):
    """The search's recall check starts with its winner. A partial placement shares its n_cpu_moe with the whole
    layer: the winner is found by n_cpu_moe and -ot together, not by the n_cpu_moe alone (which put the whole 30,
    faster here, first). Records of the H200 tune's -ub 2048 search, one copied as a partial placement of 30."""
    import shutil

    from crashline.jobs import needle as needle_job
    from crashline.jobs.contract import Objective

    (folder,) = [p.parent for p in TUNE_H200.glob("results/search/*/*/search.json") if "4a7dabea11" in str(p)]
    copy_ = tmp_path / "search"
    shutil.copytree(folder, copy_)
    summary = read_json(copy_ / "search.json")
    partial = read_json(copy_ / "records" / "2b5b114356" / "measure.json")  # 31's start, slower than 30's
    override = planner.Partial(30, ("down",)).override
    partial["settings"] = {**partial["settings"], "n_cpu_moe": 30, "override_tensor": override}
    partial["config_id"] = "a1b2c3d4e5"
    write_json(copy_ / "records" / "a1b2c3d4e5" / "measure.json", partial)
    summary.update(recommended_n_cpu_moe=30, recommended_override_tensor=override)
    summary["records"] = [*summary["records"], "a1b2c3d4e5"]
    write_json(copy_ / "search.json", summary)
    objective = Objective(**summary["objective"])
    candidates = needle_job.search_candidates(copy_ / "search.json", objective, summary["margin_mib"])
    assert candidates[0].id == "a1b2c3d4e5"
    assert candidates[1].settings["n_cpu_moe"] == 30 and not candidates[1].settings.get("override_tensor")


# The partial placements started on a GPU: (run, model, the whole value beside it, the split's override, the
# activations counted in MiB). Session 28 (H200, the 8-layer 30B-A3B shape at -c 32768 -ub 2048 under 4,440 MiB):
# n_cpu_moe 4 left 1,342 MiB; layer 3's up and gate brought to the card left 1,030, not the 1,126 the weights alone
# predicted, its compute buffer 476.05 -> 572.05 MiB (two activations). Session 30 (H100, the seed-scale shape at
# -c 131072 -ub 2048 q4_0 under 31,729 MiB, 100K prompts): layer 17's up alone brought to the card beside
# n_cpu_moe 18, its compute buffer 1,024.13 -> 1,070.13 MiB (one activation, 48 counted).
# (Session 30's run ended part-way, so its folder is kept packed, seed100k.tgz, not as a rendered example.)
SPLITS = [
    ("lease-2026-12-07-s28/s8p", "s8", 4, r"blk\.3\.ffn_down_exps=CPU", 96.0),
    ("lease-2026-12-07-s30/seed100k.tgz", "seed", 18, r"blk\.17\.ffn_(gate|down)_exps=CPU", 48.0),
]


@pytest.mark.parametrize("folder, model, above, override, counted", SPLITS, ids=["s8-h200", "seed-h100"])
def test_a_split_layer_s_peak_is_predicted_from_the_gpu_runs_that_measured_it(
    folder, model, above, override, counted, tmp_path
):
    """A split layer's activations, one per gate or up tensor left on the card, are what its server log's compute
    buffer grew by (within 2 MiB, the planner on the safe side), and the planner predicts the split's headroom and its
    load peak's rise over the whole value beside it as measured."""
    run = REPO / "bench" / "results" / folder
    if run.suffix == ".tgz":
        with tarfile.open(run) as packed:
            packed.extractall(tmp_path, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
        run = tmp_path / run.stem
    run = run / "tune" / "results"
    manifest = read_json(run / "models" / model / "manifest.json")
    records_of = {
        (r["settings"]["n_cpu_moe"], r["settings"].get("override_tensor")): (path.parent, r)
        for path in run.glob(f"search/{model}/*/records/*/measure.json")
        for r in [read_json(path)]
    }
    (whole_dir, whole), (split_dir, split) = records_of[(above, None)], records_of[(above - 1, override)]
    compute = {
        key: float(re.search(r"CUDA0 compute buffer size =\s+([\d.]+) MiB", (d / "server.log").read_text()).group(1))
        for key, d in (("whole", whole_dir), ("split", split_dir))
    }
    on_cpu = planner.Partial.of(split["settings"]).on_cpu
    assert planner.split_layer_mib(manifest, 2048, on_cpu) == counted
    assert 0 <= counted - (compute["split"] - compute["whole"]) <= 2
    placements = planner.partials(manifest, above - 1, whole["memory"]["headroom_mib"], 2048)
    (predicted,) = [left for value, _, left in placements if value.override == override]
    assert 0 <= split["memory"]["headroom_mib"] - predicted <= 3
    # and the whole prediction of that configuration (context, serving_peak) counts both: its load peak's rise over
    # the whole value's is the tensors brought to the card and the activations
    load = lambda rec: rec["memory"]["per_phase"]["load"]["gpu_mib"]  # noqa: E731
    compute_model = planner.ComputeModel({2048: compute["whole"]})
    rise = (
        planner.predict(manifest, split["settings"], compute_model, 0)["load_mib"]
        - planner.predict(manifest, whole["settings"], compute_model, 0)["load_mib"]
    )
    assert 0 <= rise - (load(split) - load(whole)) <= 3


def test_session_30s_100k_search_replayed_on_its_own_clock_prices_an_optional_start_as_a_whole_one(
    tmp_path, monkeypatch
):
    """Session 30's seed-scale 100K tune (--time 15m, H100) ran its -ub 2048 search's partial probe and climb, then
    went past its time: an optional start was priced at the mean of every start so far (60 s), calibration and
    probes that ended at a failed load or their warm-up included, where a whole start at 100K took about 100 s.
    Replayed here from its records, each start taking the seconds its record says, with the same work owed elsewhere
    (the other search's boundary, margin and neighbour; one whole start for each aimed --fit on reference): the
    partial probe still fits, the climb and the finalists' second starts are left out, priced at the whole starts."""
    from types import SimpleNamespace

    from crashline.engine import eta
    from crashline.jobs import search as search_mod

    with tarfile.open(REPO / "bench" / "results" / "lease-2026-12-07-s30" / "seed100k.tgz") as packed:
        packed.extractall(tmp_path, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    run = tmp_path / "seed100k" / "tune"
    folder = run / "results" / "search" / "seed" / "7ef81a8a73"
    clock = SimpleNamespace(now=1_000_000.0)
    fake_time = SimpleNamespace(time=lambda: clock.now, monotonic=lambda: clock.now)
    monkeypatch.setattr(search_mod, "time", fake_time)
    monkeypatch.setattr(eta, "time", fake_time)

    def replayed(spec, inputs, paths, load_only=False):
        rec = recorded(folder, paths.record.relative_to(tmp_path / "out"))
        clock.now += rec["time_budget_s"]["total"]
        return rec

    monkeypatch.setattr(search_mod, "measure", replayed)
    owed = [{"job": "measure", "out": str(tmp_path / f"ref{k}.json"), "starts": 2, "must": 1} for k in (1, 2)] + [
        {"job": "search", "out": str(tmp_path / "s2.json"), "starts": 9, "must": 3, "probes": str(tmp_path / "p")}
    ]
    # the search began 62 s into the run (provisioning, the model file's sha256), as on the H100
    write_json(tmp_path / "plan.json", {"jobs": owed, "started": clock.now - 62})
    monkeypatch.setenv(eta.PLAN_ENV, str(tmp_path / "plan.json"))
    raw = yaml.safe_load((run / "tune.yaml").read_text())
    cfg = C.validate({**raw, "results_dir": str(tmp_path / "results")}, SCHEMA)
    spec = jobs.spec("search", cfg, "seed", "7ef81a8a73")
    manifest = read_json(run / "results" / "models" / "seed" / "manifest.json")
    summary = search_mod.run_search(spec, jobs.JobInputs({}, manifest, {}), tmp_path / "out")
    assert summary["recommended_n_cpu_moe"] == 18 and summary["partial"][-1]["status"].startswith("measured")
    assert summary["climbed"] == []
    climb_cut, finals_cut = summary["time_cut"]
    assert climb_cut == (
        "the climb from n_cpu_moe 19 on left out: the time limit (15 min) leaves 77 s once 5 start(s) other jobs "
        "must still make are set aside, and a server start takes about 1.7 min"
    )
    assert finals_cut.startswith("the finalists' start 2 of 2 and any later one left out")
    assert clock.now - (1_000_000.0 - 62) + 5 * 100 < 900  # what it spent, with the owed starts, ends in time
