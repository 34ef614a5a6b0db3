"""One measurement job against a real llama-server on a real (synthetic MoE) GGUF: every outcome
writes a record, and no server process outlives the job."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import time

import pandas as pd
import psutil
import pytest

from crashline.config import plan as C
from crashline.core import records
from crashline.core.stats import end_to_end_tps
from crashline.jobs import serving
from helpers import run


def test_ok_record_has_speeds_placement_and_memory(tmp_path, tiny_moe, server_provenance):
    rec = run(
        tmp_path,
        tiny_moe,
        server_provenance,
        {"ubatch": 128, "ctx": 2048},
        [
            {"name": "short", "prompt_tokens": 100, "gen_tokens": 16},
            {"name": "deep", "prompt_tokens": 1000, "gen_tokens": 400},
        ],
    )
    assert rec["outcome"] == "ok", rec["message"]
    assert [w["name"] for w in rec["workloads"]] == ["short", "deep"]
    for w, n_prompt, n_gen in zip(rec["workloads"], (100, 1000), (16, 400)):
        assert w["outcome"] == "ok"
        requests = [r for run in w["runs"] for r in run["requests"]]
        assert w["concurrency"] == 1 and [len(run["requests"]) for run in w["runs"]] == [1, 1]
        assert [r["prompt_n"] for r in requests] == [n_prompt, n_prompt]
        assert [r["predicted_n"] for r in requests] == [n_gen, n_gen]
        # one untimed run at the workload's own depth before its timed ones, kept apart (warmup_requests: 1)
        assert [[r["prompt_n"] for r in run["requests"]] for run in w["warmup_runs"]] == [[n_prompt]]
        assert w["warmup_runs"][0]["requests"][0]["end_s"] > 0
        assert all(0 < r["ttft_s"] < r["end_s"] for r in requests)
        assert w["prefill_tps"]["n"] == 2 and w["prefill_tps"]["median"] > 0
        assert w["decode_tps"]["min"] <= w["decode_tps"]["median"] <= w["decode_tps"]["max"]
    assert rec["placement"]["n_ctx"] == 2048 and rec["placement"]["n_ubatch"] == 128
    assert rec["placement"]["n_threads"] == 2
    assert rec["memory"]["peak_rss_mib"] > 0 and {"load", "short", "deep"} <= set(rec["memory"]["per_phase"])
    frame = pd.read_parquet(tmp_path / "telemetry.parquet")
    assert {"load", "short", "deep"} <= set(frame["phase"]) and frame["t"].is_monotonic_increasing
    decode = rec["workloads"][1]["telemetry"]["decode"]
    assert decode["server_cpu_cores"] > 0.3 and decode["majflt_per_s"] is not None and decode["samples"] >= 1
    deep = rec["memory"]["per_phase"]["deep"]
    assert 0 < deep["cpu_server_cores"] <= 2.5 and deep["cpu_other_cores"] >= 0 and deep["seconds"] > 0
    cost = rec["memory"]["sampler_cost"]  # the sampler timed its own samples
    assert cost["samples"] >= len(frame) and 0 < cost["cpu_ms_per_sample"] <= cost["wall_ms_per_sample"] * 1.5
    assert rec["memory"]["pcie_source"] is None  # no GPU here
    assert rec["returncode"] == 0 and rec["command"][0] == server_provenance["binary"]
    assert "-ub" in rec["command"] and rec["command"][rec["command"].index("-ub") + 1] == "128"


def test_an_entry_with_starts_is_started_again_and_its_starts_are_one_row(tmp_path, tiny_moe, server_provenance):
    """An entry's ``starts`` (#22: tune's --fit on runs, so that the spread between starts decides whether one ties
    the answer): start 2 is a whole measurement in start-2/ beside the first, and the tables pool the two as a search's
    finalist (every request of both, each start's median, both starts counted); the first alone is one start."""
    from crashline.tables.aggregate import tables

    short = [{"name": "short", "prompt_tokens": 64, "gen_tokens": 8}]
    rec = run(tmp_path, tiny_moe, server_provenance, {"ctx": 1024}, short, reps=2, starts=2)
    assert rec["outcome"] == "ok"
    later = records.load(tmp_path / "start-2" / "measure.json", "measure")
    assert later["outcome"] == "ok" and later["config_id"] == rec["config_id"] and later["settings"] == rec["settings"]
    assert later["started_at"] >= rec["finished_at"]  # one after the other
    assert (tmp_path / "start-2" / "server.log").read_text() and (tmp_path / "start-2" / "telemetry.parquet").exists()
    assert tables([tmp_path / "measure.json"])[0]["starts"].tolist() == [1]
    configs, measurements = tables([tmp_path / "start-2" / "measure.json", tmp_path / "measure.json"])
    (row,) = measurements.to_dict("records")
    assert configs["starts"].tolist() == [2] and configs["server_starts"].tolist() == [2]
    assert row["decode_tps_n"] == 4  # every timed request of both starts
    medians = [rec["workloads"][0]["decode_tps"]["median"], later["workloads"][0]["decode_tps"]["median"]]
    assert list(row["decode_tps_start_medians"]) == pytest.approx(medians)


def test_the_time_limit_leaves_out_an_entry_s_later_starts(tmp_path, tiny_moe, server_provenance, monkeypatch):
    """tune --time: once a start would end past the run's limit, an entry asked for 3 starts starts no more, and its
    record says so (the first start always runs)."""
    from crashline.core.atomic import write_json
    from crashline.core.paths import RecordFolder
    from crashline.engine import eta

    write_json(tmp_path / "plan.json", {"jobs": [], "started": time.time() - 60})  # the run's minute is spent
    monkeypatch.setenv(eta.PLAN_ENV, str(tmp_path / "plan.json"))
    short = [{"name": "short", "prompt_tokens": 32, "gen_tokens": 4}]
    rec = run(tmp_path, tiny_moe, server_provenance, {"ctx": 2048}, short, starts=3, time_limit_s=60)
    second, third = (records.load(RecordFolder(tmp_path).later_start(k).measure, "measure") for k in (2, 3))
    assert rec["outcome"] == "ok" and "time_cut" not in rec
    assert second["time_cut"].startswith("start 2 of 3 left out: the time limit (60 s) leaves 0 s")
    assert second["left_out"] == third["left_out"] == second["time_cut"] and "time_cut" not in third
    assert not RecordFolder(tmp_path).later_start(2).server_log.exists()  # no server started


def test_a_later_start_is_timed_without_the_checks_it_leaves_to_the_first():
    """A later start runs the timed workloads only (``FIRST_START_ONLY``): the time limit prices it from the earlier
    starts' clocks less their conversations and soak (a default gemma start: 80 s, 35 of them its conversation)."""
    laps = {"server_start": 1.1, "workloads": 42.9, "conversations": 34.8, "soak": 0.0, "total": 80.3}
    from crashline.jobs import measure as M

    assert M._seconds({"time_budget_s": laps}) == pytest.approx(45.5)
    assert M._seconds({"time_budget_s": {"total": 12.0}}) == 12.0 and M._seconds({}) == 0.0


def test_prompt_beyond_context_is_a_failure_of_the_configuration(tmp_path, tiny_moe, server_provenance):
    rec = run(
        tmp_path,
        tiny_moe,
        server_provenance,
        {"ctx": 512},
        [
            {"name": "short", "prompt_tokens": 64, "gen_tokens": 8},
            {"name": "long", "prompt_tokens": 1024, "gen_tokens": 8},
        ],
        reps=1,
    )
    assert rec["outcome"] == "context_exceeded" and rec["phase"] == "long"
    assert "exceeds the available context size" in rec["message"]
    assert rec["workloads"][0]["outcome"] == "ok" and rec["workloads"][1]["decode_tps"] is None


def test_not_a_gguf_fails_at_load(tmp_path, server_provenance):
    bogus = tmp_path / "bogus.gguf"
    bogus.write_bytes(b"this is not a model\n" * 100)
    rec = run(tmp_path, bogus, server_provenance, {}, [{"name": "short", "prompt_tokens": 32, "gen_tokens": 4}])
    assert (rec["outcome"], rec["failure"], rec["phase"]) == ("load_failed", "model_file", "load")
    assert rec["workloads"] == [] and rec["log_tail"]


def test_an_argument_the_server_refuses_is_named_with_llama_cpp_s_own_line(tmp_path, tiny_moe, server_provenance):
    rec = run(
        tmp_path,
        tiny_moe,
        server_provenance,
        {"extra_args": ["--numa", "bogus"]},
        [{"name": "short", "prompt_tokens": 32, "gen_tokens": 4}],
    )
    assert (rec["outcome"], rec["failure"], rec["phase"]) == ("load_failed", "arguments", "load")
    assert rec["message"].startswith('error while handling argument "--numa": invalid value'), rec["message"]
    assert "exit status 1" in rec["message"]


def test_flags_the_build_lacks_are_left_out_of_the_command(tmp_path, tiny_moe, server_provenance):
    older = {
        **server_provenance,
        "help_flags": [f for f in server_provenance["help_flags"] if f not in ("-lm", "--fit")],
    }
    rec = run(tmp_path, tiny_moe, older, {}, [{"name": "short", "prompt_tokens": 32, "gen_tokens": 4}], reps=1)
    assert rec["outcome"] == "ok" and rec["flags_left_out"] == {"load_mode": "-lm", "fit": "--fit"}
    assert "-lm" not in rec["command"] and "--fit" not in rec["command"] and "-ub" in rec["command"]


def test_server_killed_during_a_workload_is_recorded_as_crashed(tmp_path, tiny_moe, server_provenance, monkeypatch):
    original = serving.one_run

    def kill_then_run(client, prompts, workload, index, n_requests):
        if workload["name"] == "second":
            for p in psutil.Process(os.getpid()).children(recursive=True):
                if p.name() == "llama-server":
                    os.killpg(p.pid, signal.SIGKILL)  # not reaped here: the job must see the signal
                    time.sleep(1)
        return original(client, prompts, workload, index, n_requests)

    monkeypatch.setattr(serving, "one_run", kill_then_run)
    rec = run(
        tmp_path,
        tiny_moe,
        server_provenance,
        {},
        [
            {"name": "first", "prompt_tokens": 32, "gen_tokens": 4},
            {"name": "second", "prompt_tokens": 32, "gen_tokens": 4},
        ],
        reps=1,
    )
    assert rec["outcome"] == "crashed" and rec["phase"] == "second"
    assert "SIGKILL" in rec["message"]
    assert rec["workloads"][0]["outcome"] == "ok"


def test_request_timeout(tmp_path, tiny_moe, server_provenance):
    rec = run(
        tmp_path,
        tiny_moe,
        server_provenance,
        {"ctx": 4096},
        [{"name": "slow", "prompt_tokens": 3000, "gen_tokens": 64}],
        reps=1,
        request_timeout_s=0.05,
    )
    assert rec["outcome"] == "timeout" and rec["phase"] == "slow"


def test_a_resent_workload_decodes_over_its_warm_up_s_prompt_from_the_cache(tmp_path, tiny_moe, server_provenance):
    """decode_from: resent: one fresh prefill per start (the warm-up), then each timed repetition sends that prompt
    again with the prompt cache on; its prefill and time to first token are the warm-up's, its end-to-end time
    the warm-up's first token plus its own decode."""
    rec = run(
        tmp_path,
        tiny_moe,
        server_provenance,
        {"ctx": 2048},
        [
            {"name": "fresh", "prompt_tokens": 1000, "gen_tokens": 64},
            {"name": "resent", "prompt_tokens": 1000, "gen_tokens": 64, "decode_from": "resent"},
        ],
    )
    assert rec["outcome"] == "ok", rec["message"]
    fresh, resent = rec["workloads"]
    warm = resent["warmup_runs"][0]["requests"][0]
    assert warm["prompt_n"] == 1000 and not warm.get("cache_n")
    timed = [r for run_ in resent["runs"] for r in run_["requests"]]
    assert len(timed) == 2
    for r in timed:
        assert r["cache_n"] >= 900 and r["prompt_n"] + r["cache_n"] == 1000 and r["predicted_n"] == 64
        assert r["first_s"] == warm["ttft_s"] and r["ttft_s"] < warm["ttft_s"]
    # prefill and the time to first token: the warm-up's, once; decode: every timed repetition
    assert resent["prefill_tps"]["n"] == 1 and resent["prefill_tps"]["median"] == pytest.approx(warm["prefill_tps"])
    assert resent["ttft_s"]["n"] == 1 and resent["ttft_s"]["median"] == pytest.approx(warm["ttft_s"])
    assert resent["decode_tps"]["n"] == 2
    for r in timed:
        assert end_to_end_tps(r) == pytest.approx(1064 / (warm["ttft_s"] + r["end_s"] - r["ttft_s"]))
    assert resent["e2e_tps"]["n"] == 2 and resent["e2e_tps"]["median"] < 1064 / min(r["end_s"] for r in timed)
    assert [r["prompt_n"] for run_ in fresh["runs"] for r in run_["requests"]] == [1000, 1000]


def test_simultaneous_requests_on_parallel_slots(tmp_path, tiny_moe, server_provenance):
    rec = run(
        tmp_path,
        tiny_moe,
        server_provenance,
        {"parallel": 2, "ctx": 2048},
        [
            {"name": "single", "prompt_tokens": 200, "gen_tokens": 32},
            {"name": "both-slots", "prompt_tokens": 200, "gen_tokens": 32, "concurrency": "slots"},
        ],
    )
    assert rec["outcome"] == "ok", rec["message"]
    single, both = rec["workloads"]
    assert (single["concurrency"], both["concurrency"]) == (1, 2)
    for run_ in both["runs"]:
        assert len(run_["requests"]) == 2
        assert all(r["prompt_n"] == 200 and r["predicted_n"] == 32 for r in run_["requests"])
        # The aggregate counts every generated token over the wall-clock time of the whole batch.
        assert run_["aggregate_tps"] == pytest.approx(64 / run_["wall_s"], rel=1e-3)
        assert run_["wall_s"] >= max(r["end_s"] for r in run_["requests"]) * 0.99
    assert both["decode_tps"]["n"] == 4 and both["aggregate_tps"]["n"] == 2 and both["ttft_s"]["n"] == 4
    assert rec["placement"]["n_parallel"] == 2
    assert rec["placement"]["n_ctx_slot"] in (1024, 2048)  # per slot: ctx / parallel, or ctx when unified


def test_what_llama_cpp_really_used_is_read_back(tmp_path, tiny_moe, server_provenance):
    # llama.cpp rounds each slot's context up to a multiple of 256 (-c 1000 -np 3 runs with 3 x 512) and
    # clamps the batch to the context asked for.
    rec = run(
        tmp_path,
        tiny_moe,
        server_provenance,
        {"ctx": 1000, "parallel": 3},
        [{"name": "short", "prompt_tokens": 32, "gen_tokens": 4}],
        reps=1,
    )
    assert rec["outcome"] == "ok"
    assert rec["settings_used"] == {"ctx": {"asked": 1000, "used": 1536}, "batch": {"asked": 2048, "used": 1000}}
    from crashline.tables.aggregate import _config_row

    assert _config_row(rec)["settings_used"] == "ctx 1536 (asked 1000), batch 1000 (asked 2048)"


def test_a_boundary_layer_in_part_on_the_cpu_reaches_the_server_as_one_argument(tmp_path, tiny_moe, server_provenance):
    """A partial placement (jobs.search's step 4b): ``-ot`` with a regular expression of ( | and \\ reaches
    llama-server as one argument, which loads and serves with it (an expression it could not compile would stop it
    at load), and the configuration's label quotes it for a shell."""
    from crashline.core import settings as S
    from crashline.engine.planner import Partial

    value = Partial(1, ("gate", "down"))
    rec = run(
        tmp_path,
        tiny_moe,
        server_provenance,
        {"n_cpu_moe": value.whole, "override_tensor": value.override},
        [{"name": "short", "prompt_tokens": 32, "gen_tokens": 4}],
        reps=1,
    )
    assert rec["outcome"] == "ok", rec.get("message")
    at = rec["command"].index("-ot")
    assert rec["command"][at + 1] == r"blk\.1\.ffn_(gate|down)_exps=CPU"
    assert "-ot 'blk\\.1\\.ffn_(gate|down)_exps=CPU'" in S.label(rec["settings"])


def test_a_slot_cut_to_the_trained_context_is_read_back(tmp_path, tiny_moe, server_provenance):
    # The tiny MoE was trained on 8K: llama-server allocates the KV cache for -c 16384 but serves 8192 a slot,
    # so a 12K-token prompt is refused. The record says so before any workload does.
    rec = run(
        tmp_path,
        tiny_moe,
        server_provenance,
        {"ctx": 16384},
        [{"name": "long", "prompt_tokens": 12000, "gen_tokens": 4}],
        reps=1,
    )
    assert rec["settings_used"]["ctx_per_slot"] == {"asked": 16384, "used": 8192}
    assert (rec["outcome"], rec["phase"]) == ("context_exceeded", "long")


# --- outcomes with a real server: truncated, crashline's own error, no /health in time ----------------

FILL = {"name": "fill", "prompt_tokens": 480, "gen_tokens": 64}  # 480 + 64 > the slot's 512: the context fills


@pytest.fixture(scope="module")
def context_filled(tmp_path_factory, tiny_moe, server_provenance):
    """Without context shift the server stops generating when the slot's context is full."""
    return run(
        tmp_path_factory.mktemp("filled"),
        tiny_moe,
        server_provenance,
        {"ctx": 512, "extra_args": ["--no-context-shift"]},
        [{"name": "short", "prompt_tokens": 32, "gen_tokens": 8}, FILL],
        reps=1,
    )


def test_generation_cut_short_by_the_context_is_truncated(context_filled):
    rec = context_filled
    assert (rec["outcome"], rec["failure"], rec["phase"]) == ("truncated", "truncated", "fill")
    short, fill = rec["workloads"]
    assert short["outcome"] == "ok" and fill["outcome"] == "truncated" and fill["message"] == rec["message"]
    # the untimed warm-up at the workload's depth is the run that met the full context: no timed run followed
    assert fill["runs"] == [] and len(fill["warmup_runs"]) == 1
    (request,) = fill["warmup_runs"][0]["requests"]
    assert request["prompt_n"] == 480 and 0 < request["predicted_n"] < 64 and request["truncated"]
    assert fill["decode_tps"] is None and fill["prefill_tps"] is None  # a cut run gives no speeds
    assert rec["placement"]["n_ctx_slot"] == 512


def test_truncated_message_says_what_was_cut(context_filled):
    (request,) = context_filled["workloads"][1]["warmup_runs"][0]["requests"]
    assert context_filled["message"] == f"server generated {request['predicted_n']} tokens, 64 were asked"


def test_a_crashline_fault_is_an_error_record_and_the_server_is_stopped(
    tmp_path, tiny_moe, server_provenance, monkeypatch
):
    def broken(runs):
        raise ValueError("no summary today")

    monkeypatch.setattr(serving, "summarize", broken)  # fails after the workload ran, with the server still serving
    rec = run(
        tmp_path, tiny_moe, server_provenance, {}, [{"name": "short", "prompt_tokens": 32, "gen_tokens": 4}], reps=1
    )
    assert (rec["outcome"], rec["failure"], rec["phase"]) == ("error", "crashline", "short")
    assert rec["message"] == "ValueError: no summary today" and rec["load_s"] > 0
    assert rec["returncode"] == 0  # stopped by crashline's SIGINT, the way a finished job stops it
    assert rec["memory"]["per_phase"]["load"]["rss_mib"] > 0 and (tmp_path / "telemetry.parquet").exists()


def test_no_health_within_the_startup_timeout(tmp_path, tiny_moe, server_provenance, monkeypatch):
    validate = C.validate

    def startup_timeout(raw, schema):
        cfg = validate(raw, schema)
        cfg["server"]["startup_timeout_s"] = 0.01  # the schema allows it; run() asks for 120
        return cfg

    monkeypatch.setattr(C, "validate", startup_timeout)
    rec = run(tmp_path, tiny_moe, server_provenance, {}, [{"name": "short", "prompt_tokens": 32, "gen_tokens": 4}])
    assert (rec["outcome"], rec["failure"], rec["phase"]) == ("timeout", "timeout", "load")
    assert rec["message"] == "timed out during load" and rec["workloads"] == [] and "load_s" not in rec
    assert rec["command"][0] == server_provenance["binary"]  # a server was started, and stopped


# --- llama.cpp's --fit aims at crashline's headroom ----------------------------------------------------------------


def test_fit_on_starts_aimed_at_the_margin_and_the_context(tmp_path, tiny_moe, server_provenance, monkeypatch):
    """A CPU build has no device for --fit to place on, but it takes the flags and aims at the target: its log
    says "will leave N >= 777 MiB of system memory"."""
    validate = C.validate

    def margin_777(raw, schema):
        cfg = validate(raw, schema)
        cfg["budget"]["margin_mib"] = 777  # run() asks for the default budget
        return cfg

    monkeypatch.setattr(C, "validate", margin_777)
    short = [{"name": "short", "prompt_tokens": 32, "gen_tokens": 4}]
    rec = run(tmp_path, tiny_moe, server_provenance, {"fit": "on", "ctx": 2048}, short, reps=1)
    assert rec["outcome"] == "ok", rec["message"]
    command = rec["command"]
    assert command[command.index("--fit") + 1] == "on"
    assert command[command.index("--fit-target") + 1] == "777" and command[command.index("--fit-ctx") + 1] == "2048"
    assert (rec["settings"]["fit_target"], rec["settings"]["fit_ctx"]) == (777, 2048)  # what was passed, recorded
    assert "fit_target" not in rec["given"] and rec["flags_left_out"] == {}
    assert ">= 777 MiB" in (tmp_path / "server.log").read_text()

    # a build from before --fit-target and --fit-ctx runs fit on without them, and says so
    older = {
        **server_provenance,
        "help_flags": [
            f for f in server_provenance["help_flags"] if f not in ("--fit-target", "-fitt", "--fit-ctx", "-fitc")
        ],
    }
    (tmp_path / "older").mkdir()
    rec = run(tmp_path / "older", tiny_moe, older, {"fit": "on", "ctx": 2048}, short, reps=1)
    assert rec["outcome"] == "ok" and rec["flags_left_out"] == {"fit_target": "--fit-target", "fit_ctx": "--fit-ctx"}
    assert "--fit-target" not in rec["command"] and "--fit-ctx" not in rec["command"] and "--fit" in rec["command"]


def _aimed_job(
    tmp_path, monkeypatch, headroom_at, outcome_at=lambda target: "ok", starts=1, fit_free_at=None, load_at=None
):
    """measure() of a --fit on configuration whose target crashline chose (margin 1024), each start played by a
    stand-in for _measure whose peak leaves ``headroom_at(target)`` MiB: the loop of measure_aimed, no server.
    ``load_at(target)``: the headroom its load peak leaves, where a start that may skip its timing is stopped once
    loaded when that less the planner's serving growth is under the margin (as _measure's work does)."""
    from crashline.core import records
    from crashline.core.paths import RecordFolder
    from crashline.core.settings import aim_fit, resolve
    from crashline.jobs import measure as M
    from crashline.jobs import spec as S

    started = []

    def one_start(spec, inputs, paths, load_only=False, skip_under_margin=None):
        target = spec.item.settings["fit_target"]
        started.append((target, skip_under_margin))
        paths.server_log.write_text(f"server log at --fit-target {target}\n")
        paths.telemetry_file.write_text(f"telemetry at {target}")
        record = {
            "model": {"name": "m"},
            "config_id": spec.item.id,
            "settings": spec.item.settings,
            "job_key": M.job_key(spec.measurement, inputs.provenance, inputs.fetch_record),
            "outcome": outcome_at(target),
            "memory": {"headroom_mib": float(headroom_at(target))},
            "placement": {"fit_free_mib": {"CUDA0": fit_free_at(target)} if fit_free_at else None},
            "time_budget_s": {"server_start": 20.0, "workloads": 10.0, "total": 31.0},
            "workloads": [],
            "conversations": [],
        }
        if load_at and skip_under_margin is not None:
            at_load = {"load_headroom_mib": load_at(target), "headroom_mib": load_at(target) - M.planner.SERVING_MIB}
            record["serving_predicted_at_load"] = at_load
            if at_load["headroom_mib"] < skip_under_margin:
                record.update(memory={"headroom_mib": load_at(target)}, stopped_at_load=True)
        return records.write(paths.record, "measure", record)

    monkeypatch.setattr(M, "_measure", one_start)
    settings = aim_fit(resolve({"fit": "on", "ctx": 32768}), 1024)
    item = S.Item("fit", settings, {"fit": "on", "ctx": 32768}, starts)
    limits, budget = S.ServerLimits(300, 900, 30), S.Budget(vram_budget_mib=12288)  # as a spec gives it: no margin
    measurement = S.Measurement(limits, (), 1, 0, budget, S.Telemetry(0.25))
    record = M.measure(
        S.MeasureSpec("m", item, measurement),
        S.JobInputs({}, {}, {}),
        M.MeasurePaths(tmp_path / "measure.json", tmp_path / "server.log"),
    )
    for k in range(2, starts + 1):  # the later starts' jobs
        M.measure(
            S.MeasureSpec("m", item, measurement, start=k),
            S.JobInputs({}, {}, {}),
            M.MeasurePaths.of(RecordFolder(tmp_path).later_start(k)),
        )
    return record, started


def test_fit_on_short_of_the_margin_starts_again_with_the_target_raised_by_the_shortfall(tmp_path, monkeypatch):
    """#22: llama.cpp's --fit leaves --fit-target free by its own estimate; the H200's peaks left 832 and 918 MiB of
    a 1,024 MiB target. The start that fell short is kept, the next raises the target by the shortfall (rounded up
    to 64 MiB), and the record is the start that left the margin, its starts and time counted in the tables."""
    from crashline.tables.aggregate import _time_columns, fit_aim_text

    record, starts = _aimed_job(tmp_path, monkeypatch, lambda target: target - 192 + (40 if target > 1024 else 0))
    assert starts == [(1024, 1024), (1216, 1024)]  # each start but the last skips timing once under the margin
    assert record["settings"]["fit_target"] == 1216 and record["memory"]["headroom_mib"] == 1064
    aim = record["fit_aim"]
    assert [(a["fit_target"], a["headroom_mib"]) for a in aim["attempts"]] == [(1024, 832), (1216, 1064)]
    assert (aim["margin_mib"], aim["asked_fit_target"]) == (1024, 1024)
    kept = tmp_path / "fit-target-1024"
    assert records.load(kept / "measure.json", "measure")["settings"]["fit_target"] == 1024
    assert (kept / "server.log").read_text() == "server log at --fit-target 1024\n"
    assert (kept / "telemetry.parquet").read_text() == "telemetry at 1024"
    assert (tmp_path / "server.log").read_text() == "server log at --fit-target 1216\n"
    assert records.load(tmp_path / "measure.json", "measure") == record
    times = _time_columns(record)
    assert (times["server_starts"], times["job_s"], times["serving_s"]) == (2, 62.0, 60.0)
    assert fit_aim_text(aim) == (
        "--fit-target 1024 left 832 MiB, under the 1,024 MiB margin; --fit-target 1216 left 1,064 MiB"
    )


def test_fit_on_aimed_raises_the_target_past_what_fit_projected_to_leave(tmp_path, monkeypatch):
    """Session 23's H200 lease: --fit projected 1,184 MiB free with one placement at targets 1,024, 1,088 and 1,152,
    and each start left 979 MiB: three starts of one placement. The raise starts from fit's projection, so the next
    start has another placement; fit's error (205 MiB here) is the shortfall the raise adds."""

    def fit_free(target):  # fit's placements: one per ~300 MiB of expert tensors, the largest whose free >= target
        return next(free for free in (1184, 1490, 1800) if free >= target)

    record, starts = _aimed_job(tmp_path, monkeypatch, lambda target: fit_free(target) - 205, fit_free_at=fit_free)
    assert starts == [(1024, 1024), (1248, 1024)]
    assert record["memory"]["headroom_mib"] == 1490 - 205


def test_an_aimed_fit_predicted_short_at_load_is_stopped_there_and_raised_by_the_predicted_shortfall(
    tmp_path, monkeypatch
):
    """Session 30's H100 lease: each --fit on reference's first start (target 1024) ran its whole 100K-token warm-up
    (about 50 s) to learn it left 979 MiB. Its load peak already says so: the load's headroom less what serving adds
    (planner.SERVING_MIB) is under the margin, so the start ends once loaded and the raise is the same (fit's
    projection 1,183 + the predicted shortfall rounded up to 64). A start predicted to keep the margin is served."""
    from crashline.tables.aggregate import fit_aim_text

    def fit_free(target):
        return next(free for free in (1183, 1490) if free >= target)

    record, starts = _aimed_job(
        tmp_path,
        monkeypatch,
        lambda target: fit_free(target) - 204,
        fit_free_at=fit_free,
        load_at=lambda target: fit_free(target) - 204 + 136,  # serving grew by 136 MiB on that run
    )
    assert starts == [(1024, 1024), (1247, 1024)]  # 1183 + 64: 1115 - 154 = 961 is 63 short
    assert record["memory"]["headroom_mib"] == 1490 - 204 and not record.get("stopped_at_load")
    first = records.load(tmp_path / "fit-target-1024" / "measure.json", "measure")
    assert first["stopped_at_load"] and first["serving_predicted_at_load"]["headroom_mib"] == 961
    assert [a.get("predicted_headroom_mib") for a in record["fit_aim"]["attempts"]] == [961, None]
    assert fit_aim_text(record["fit_aim"]) == (
        "--fit-target 1024 stopped once loaded, serving predicted to leave 961 MiB, under the 1,024 MiB margin; "
        "--fit-target 1247 left 1,286 MiB"
    )


def test_a_resumed_aim_reuses_the_start_it_kept_before_the_stop(tmp_path, monkeypatch):
    """A tune stopped between two calls of the GPU machine resumes the aimed --fit on: the start it kept under
    fit-target-T/ with the same job key is not run again (a 100,000-token start on the H200); one measured under
    another key (another build, workload or budget) is."""
    from crashline.core import records

    def short_then_ok(target):
        return 900 if target == 1024 else 1100

    _aimed_job(tmp_path, monkeypatch, short_then_ok)
    (tmp_path / "measure.json").unlink()  # stopped before the job ended: the kept start stays
    record, starts = _aimed_job(tmp_path, monkeypatch, short_then_ok)
    assert starts == [(1152, 1024)]
    assert [(a["fit_target"], a["headroom_mib"]) for a in record["fit_aim"]["attempts"]] == [(1024, 900), (1152, 1100)]

    kept = tmp_path / "fit-target-1024" / "measure.json"
    records.write(kept, "measure", {**records.load(kept, "measure"), "job_key": "another"})
    (tmp_path / "measure.json").unlink()
    _, starts = _aimed_job(tmp_path, monkeypatch, short_then_ok)
    assert starts == [(1024, 1024), (1152, 1024)]


def test_fit_on_aimed_stops_after_three_starts_and_an_oom_raises_it_by_the_margin(tmp_path, monkeypatch):
    record, starts = _aimed_job(
        tmp_path, monkeypatch, lambda target: 500.0, lambda target: "oom" if target == 1024 else "ok"
    )
    assert starts == [(1024, 1024), (2048, 1024), (2624, None)]  # the last start is timed whatever it leaves
    assert [a["outcome"] for a in record["fit_aim"]["attempts"]] == ["oom", "ok", "ok"]
    assert sorted(p.name for p in tmp_path.glob("fit-target-*")) == ["fit-target-1024", "fit-target-2048"]

    for path in tmp_path.iterdir():
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    record, starts = _aimed_job(tmp_path, monkeypatch, lambda target: 2000.0, lambda target: "load_failed")
    assert starts == [(1024, 1024)]  # a failure a higher target cannot mend: one start
    assert len(record["fit_aim"]["attempts"]) == 1


def test_an_aimed_fit_with_starts_is_started_again_at_the_target_it_settled_on(tmp_path, monkeypatch):
    """tune starts its --fit on runs as often as a finalist: start 2 runs at the target the aim settled on, timed
    whatever it leaves; the tables count every start (two aimed, one more) and pool the two that served."""
    from crashline.tables.aggregate import _pooled_records, _time_columns

    record, started = _aimed_job(
        tmp_path, monkeypatch, lambda target: target - 192 + (40 if target > 1024 else 0), starts=2
    )
    assert started == [(1024, 1024), (1216, 1024), (1216, None)]
    assert record["settings"]["fit_target"] == 1216
    assert records.load(tmp_path / "start-2" / "measure.json", "measure")["settings"]["fit_target"] == 1216
    assert (tmp_path / "start-2" / "server.log").read_text() == "server log at --fit-target 1216\n"
    (pooled,) = _pooled_records([tmp_path / "measure.json", tmp_path / "start-2" / "measure.json"], [])
    assert pooled["starts"] == 2 and pooled["fit_aim"] == record["fit_aim"]
    assert _time_columns(pooled)["server_starts"] == 3


@pytest.mark.parametrize(
    ("headroom", "outcome", "said"),
    [
        (900.0, "ok", "--fit on left less than the 1,024 MiB margin at every target"),
        (2000.0, "load_failed", "start 1 ended load_failed, so it cannot be the answer"),
    ],
)
def test_a_fit_that_cannot_be_the_answer_is_not_started_again(tmp_path, monkeypatch, capsys, headroom, outcome, said):
    from crashline.tables.aggregate import _pooled_records

    record, started = _aimed_job(tmp_path, monkeypatch, lambda target: headroom, lambda target: outcome, starts=2)
    assert all(skip for _, skip in started[:-1])  # the aim's starts, none after it
    assert records.load(tmp_path / "start-2" / "measure.json", "measure")["left_out"].startswith(said)
    assert f"start 2 left out: {said}" in capsys.readouterr().err
    (pooled,) = _pooled_records([tmp_path / "measure.json", tmp_path / "start-2" / "measure.json"], [])
    assert pooled.get("starts", 1) == 1 and pooled["outcome"] == outcome


def test_only_a_target_crashline_chose_is_aimed():
    from crashline.core.settings import aim_fit, fit_aimed, resolve

    assert fit_aimed(aim_fit(resolve({"fit": "on"}), 1024), {"fit": "on"})
    assert not fit_aimed(resolve({"fit": "on", "fit_target": 2048}), {"fit": "on", "fit_target": 2048})
    assert not fit_aimed(aim_fit(resolve({}), 1024), {})  # not --fit on
    assert not fit_aimed(resolve({"fit": "on"}), {"fit": "on"})  # no margin to aim at


def test_every_record_says_where_its_time_went(tmp_path, tiny_moe, server_provenance):
    """#18: the job's wall time in laps (setup, waiting for the lock, ballast, server start to ready, the untimed
    warm-up request, the workloads, the conversations and the soak (none here), stop, the telemetry written, the
    analysis) that add up to its total."""
    rec = run(tmp_path, tiny_moe, server_provenance, {}, [{"name": "w", "prompt_tokens": 64, "gen_tokens": 8}], reps=2)
    budget = rec["time_budget_s"]
    laps = ("setup", "lock_wait", "ballast", "server_start", "warmup_request", "workloads", "conversations", "soak")
    laps += ("stop",)
    laps += ("telemetry",)
    assert list(budget) == [*laps, "analysis", "total"]
    assert sum(v for k, v in budget.items() if k != "total") == pytest.approx(budget["total"], abs=0.02)
    assert budget["server_start"] >= rec["load_s"] - 0.01 and budget["workloads"] > 0
    requests = sum(r["wall_s"] for w in rec["workloads"] for r in w["runs"])
    assert budget["workloads"] >= requests  # the measured requests are inside the workloads' lap


def test_host_memory_bandwidth_is_measured_once_per_machine(monkeypatch):
    """Provisioning measures it and provenance.json keeps it with the hostname; a job on that machine reads it
    instead of spending 1.5 s measuring again, and a job elsewhere measures its own."""
    import platform

    from crashline.core import host

    calls = []
    passes = {"gbs": 12.5, "passes": [12.5, 11.9, 12.1], "spread": 0.048, "threads": 2, "total_mib": 256}
    monkeypatch.setattr(host, "memory_bandwidth", lambda: calls.append(1) or passes)
    here = {"host_memory_bandwidth": {"hostname": platform.node(), "gbs": 31.0}}
    assert host.memory_bandwidth_from(here) == 31.0 and not calls
    elsewhere = {"host_memory_bandwidth": {"hostname": platform.node() + "-other", "gbs": 31.0}}
    assert host.memory_bandwidth_from(elsewhere) == 12.5 and host.memory_bandwidth_from({}) == 12.5
    assert len(calls) == 2


def test_host_memory_bandwidth_is_kept_once_per_machine(tmp_path, monkeypatch):
    """#40 item 6: the first provisioning on a host measures (a real copy here) and keeps every pass and their spread
    in the cache folder; a later one reads the same figure, so two runs on one machine share their bound (they read
    58 to 106 GB/s when each measured its own); a file of another host or a broken file measure again."""
    import platform

    from crashline.core import host

    first = host.measured_memory_bandwidth(tmp_path, passes=3)  # real: every pass, their spread, the best
    assert first["hostname"] == platform.node() and len(first["passes"]) == 3
    assert first["gbs"] == max(first["passes"]) > 0 and first["spread"] >= 0 and first["measured_at"]
    (kept,) = (tmp_path / "host-bandwidth").iterdir()
    calls = []
    monkeypatch.setattr(host, "memory_bandwidth", lambda **_: calls.append(1) or {"gbs": 1.0, "passes": [1.0]})
    assert host.measured_memory_bandwidth(tmp_path) == first and not calls  # read, not measured again
    moved = json.loads(kept.read_text()) | {"hostname": platform.node() + "-other"}
    kept.write_text(json.dumps(moved))  # a file of another host (a shared home folder)
    assert host.measured_memory_bandwidth(tmp_path)["gbs"] == 1.0 and len(calls) == 1
    kept.write_text("{not json")
    assert host.measured_memory_bandwidth(tmp_path)["gbs"] == 1.0 and len(calls) == 2
    assert json.loads(kept.read_text())["gbs"] == 1.0  # written over, whole


def test_the_host_memory_bandwidth_keeps_every_pass_and_their_spread():
    """A real measurement, small: the best pass is the figure, every pass is kept, the spread is the slowest pass's
    shortfall."""
    from crashline.core import host

    found = host.memory_bandwidth(threads=2, total_mib=64, passes=3, repeats=2)
    assert len(found["passes"]) == 3 and found["gbs"] == max(found["passes"]) > 0
    assert found["spread"] == round((found["gbs"] - min(found["passes"])) / found["gbs"], 4)
    assert (found["threads"], found["total_mib"]) == (2, 64)


class _Peaks:
    """The sampler as _run_each reads it: the phase it is told, and a GPU peak per workload (a CPU machine has none)."""

    def __init__(self, gpu_mib: float):
        self.peaks, self.gpu_mib = {}, gpu_mib

    def phase(self, name: str) -> None:
        self.peaks[name] = {"gpu_mib": self.gpu_mib}

    def quiet(self, wait_s: float) -> None:
        return None  # the CPU cannot be read: no wait

    def others_so_far(self) -> None:
        return None


@contextlib.contextmanager
def _two_workloads(tiny_moe, server_provenance, tmp_path):
    """A real llama-server on the tiny MoE, ready, with its client, prompt source, two short workloads and settings,
    for tests that drive ``serving._run_each`` with a sampler of their own."""
    from crashline.core.settings import command_line, resolve
    from crashline.engine.server import ServerProcess
    from crashline.engine.workloads import Client, PromptSource

    workloads = [
        {"name": "a", "prompt_tokens": 64, "gen_tokens": 4},
        {"name": "b", "prompt_tokens": 128, "gen_tokens": 4},
    ]
    settings = resolve({"ctx": 1024, "threads": 2})
    with ServerProcess(command_line(server_provenance["binary"], str(tiny_moe), settings), tmp_path / "s.log") as srv:
        assert srv.start_ready(120) == "ready", srv.log_text()[-2000:]
        client = Client.of(srv, 120)
        yield srv, client, PromptSource(client), workloads, settings


def test_a_search_probe_under_the_margin_after_its_warm_up_skips_its_timed_repetitions(
    tiny_moe, server_provenance, tmp_path
):
    """#25: a probe whose warm-up left less headroom than the margin cannot be recommended, so its timed repetitions
    would decide nothing (11 s a probe at 16K on the H200); every workload still runs its warm-up at its depth."""
    with _two_workloads(tiny_moe, server_provenance, tmp_path) as (srv, client, prompts, workloads, settings):

        def run(peak_mib, margin_mib):
            return serving._run_each(
                srv, _Peaks(peak_mib), client, prompts, workloads, (1, 2), 120, settings, 12_288, margin_mib
            )

        tight, failure = run(11_500, 1024)  # 788 MiB of headroom after the warm-up
        assert failure is None
        assert [(len(w["warmup_runs"]), len(w["runs"]), w["outcome"]) for w in tight] == [(1, 0, "ok"), (1, 0, "ok")]
        assert all("788 MiB of headroom, under the 1,024 MiB margin" in w["timed_skipped"] for w in tight)
        assert all(w["decode_tps"] is None for w in tight)  # no speed for a configuration that cannot be chosen
        for peak, margin in ((11_500, 512), (11_500, None)):  # room for the margin, or an ordinary measurement
            full, _ = run(peak, margin)
            assert [(len(w["runs"]), "timed_skipped" in w) for w in full] == [(2, False), (2, False)]


class _Busy(_Peaks):
    """The sampler's CPU readings as _run_each reads them: other processes busy (``others``, in turn) during the timed
    requests, and a wait that finds a quiet stretch or not."""

    def __init__(self, others: list[float], quiet_found: bool):
        super().__init__(0.0)
        self.others, self.quiet_found, self.waits = list(others), quiet_found, []

    def others_so_far(self) -> float:
        return self.others.pop(0) if self.others else 0.0

    def quiet(self, wait_s: float) -> dict:
        self.waits.append(wait_s)
        return {"waited_s": 4.0, "other_cores": 0.1 if self.quiet_found else 1.1, "quiet": self.quiet_found}


def test_timed_requests_other_processes_competed_with_run_again_once_in_a_quiet_stretch(
    tiny_moe, server_provenance, tmp_path, capsys
):
    """#41: a workload whose timed requests ran while other processes used more than CONTENTION_CORES runs them again
    once a wait finds a quiet stretch (its contended requests kept apart, not counted), once per server start; where
    no quiet stretch comes, they stay as measured (and the tables mark them contended)."""
    with _two_workloads(tiny_moe, server_provenance, tmp_path) as (srv, client, prompts, workloads, settings):

        def run(sampler):
            out, failure = serving._run_each(
                srv, sampler, client, prompts, workloads, (1, 2), 120, settings, None, None
            )
            assert failure is None
            return out

        busy = _Busy([1.2, 1.4], quiet_found=True)  # both workloads contended: only the first is timed again
        first, second = run(busy)
        assert (len(first["contended_runs"]), len(first["runs"]), first["decode_tps"] is not None) == (2, 2, True)
        assert "contended_runs" not in second and len(second["runs"]) == 2
        assert busy.waits == [30.0, 26.0, 22.0]  # a's wait, its redo's, b's: each what the start had left
        said = capsys.readouterr().err
        assert "a: other processes used 1.2 cores during the timed requests: waited 4 s for other processes to " in said
        assert said.count("timing them again") == 1

        (kept, _) = run(_Busy([1.2], quiet_found=False))  # no quiet stretch: as measured
        assert "contended_runs" not in kept and len(kept["runs"]) == 2


def test_what_other_processes_used_so_far_in_a_phase_is_read_from_real_counters():
    """Sampler.others_so_far on real /proc counters: a busy process beside an idle "server" reads busy; after a
    quiet() wait the count starts again."""
    import subprocess
    import sys
    import time

    from crashline.engine.telemetry import Sampler

    server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with Sampler(server.pid) as sampler:
            if not sampler.quiet(10.0, step_s=0.5)["quiet"]:
                pytest.skip("other processes keep this machine busy: no quiet stretch to start from")
            spin = subprocess.Popen(
                [sys.executable, "-c", "import time\nend = time.time() + 1.5\nwhile time.time() < end: pass"]
            )
            time.sleep(1.0)
            busy = sampler.others_so_far()
            spin.wait()
            assert busy > 0.3, busy
            assert sampler.quiet(10.0, step_s=0.5)["quiet"]
            time.sleep(0.5)
            assert sampler.others_so_far() < 0.3
    finally:
        server.kill()


def test_the_report_says_where_the_bound_s_bandwidth_comes_from_and_how_much_its_passes_spread():
    """#40 item 6: the bound's source and spread beside the ratios (the limits section's lead)."""
    from crashline.report.suspects import bandwidth_text

    measured = {"hostname": "h200", "gbs": 103.51, "passes": [79.2, 103.51, 100.63], "spread": 0.2349}
    said = bandwidth_text({"host_memory_bandwidth": measured | {"measured_at": "2026-12-07 01:40"}})
    assert said.startswith("The host's memory bandwidth in the bound: 103.5 GB/s, the best pass of a copy measured ")
    assert "once for h200 on 2026-12-07 01:40 UTC, its 3 passes 23% apart, and read by every later run" in said
    undated = bandwidth_text({"host_memory_bandwidth": measured})
    assert "once for h200, its 3 passes" in undated
    assert bandwidth_text({}) is None


def test_the_serving_headroom_is_predicted_from_the_load_peak_against_the_emulated_card():
    """serving_at_load: what a loaded server's peak leaves of the VRAM limit (the emulated card's budget), less what
    serving adds (planner.SERVING_MIB); nothing to predict without a card or a peak."""
    from types import SimpleNamespace

    from crashline.jobs import measure as M

    sampled = {"peak_gpu_mib": 30_614.0}
    sampler = SimpleNamespace(now=lambda: None, result=lambda: sampled)
    host = {"gpu": {"devices": [{"name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81_559}]}}
    at_load = M.serving_at_load(SimpleNamespace(sampler=sampler), 31_729, host)
    assert at_load == {"load_headroom_mib": 1_115.0, "headroom_mib": 1_115.0 - M.planner.SERVING_MIB}
    assert M.serving_at_load(SimpleNamespace(sampler=sampler), None, host)["load_headroom_mib"] == 81_559 - 30_614
    assert M.serving_at_load(SimpleNamespace(sampler=sampler), 31_729, {"gpu": {}}) is None
    assert M.serving_at_load(SimpleNamespace(sampler=None), 31_729, host) is None  # no telemetry
    sampled["peak_gpu_mib"] = None
    assert M.serving_at_load(SimpleNamespace(sampler=sampler), 31_729, host) is None
