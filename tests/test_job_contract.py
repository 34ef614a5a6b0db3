"""The job contract: a job reruns exactly when what it reads changes (its spec is the rule's params),
search probes are reused only under the same workloads, budget and build, and a configuration's id
is what reaches the server."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from conftest import REPO
from crashline.config import plan as C
from crashline.jobs import spec as jobs
from crashline.core import settings as S
from crashline.core.atomic import read_json
from crashline.core.host import gpus
from crashline.models.manifest import inspect_gguf
from crashline.jobs.search import run_search
from helpers import SCHEMA, fetch_record
from helpers import copy_workflow


def test_a_setting_whose_default_adds_no_argument_keeps_every_id(monkeypatch):
    cfg = C.load(REPO / "config" / "config.yaml")
    before = {(i["model"], i["id"]) for i in C.expand(cfg)}
    monkeypatch.setitem(S.SETTINGS, "new_one", S.Setting("new_one", "--new-one", "int", None, "new, unset"))
    after = {(i["model"], i["id"]) for i in C.expand(C.load(REPO / "config" / "config.yaml"))}
    assert after == before
    # ... while one that adds an argument by default is a different command, so a different id.
    monkeypatch.setitem(S.SETTINGS, "new_one", S.Setting("new_one", "--new-one", "int", 0, "new, set"))
    changed = {(i["model"], i["id"]) for i in C.expand(C.load(REPO / "config" / "config.yaml"))}
    assert not changed & before


def test_specs_hold_what_each_job_reads_and_nothing_else():
    cfg = C.load(REPO / "config" / "config.yaml")
    item = C.expand(cfg)[0]
    measure, needle = (jobs.spec(j, cfg, item["model"], item["id"]) for j in ("measure", "needle"))
    job_config = measure.measurement.as_dict()
    assert set(job_config) == {
        *("server", "workloads", "conversations", "repetitions", "warmup_requests", "budget", "telemetry"),
    }
    # a config without conversations has no key for them: its measurements keep their job key
    bare = jobs.spec("measure", {**cfg, "conversations": []}, item["model"], item["id"])
    assert set(bare.measurement.as_dict()) == {
        *("server", "workloads", "repetitions", "warmup_requests", "budget", "telemetry"),
    }
    recall = needle.recall.as_dict(item["model"])
    assert set(recall) == {"models", "server", "budget", "needle"} and set(recall["models"]) == {item["model"]}
    assert set(job_config["server"]) == {"startup_timeout_s", "request_timeout_s", "stop_timeout_s"}
    # the margin decides what may be recommended, not what a server measures: a search and its recall check have it
    assert "margin_mib" not in job_config["budget"] and "margin_mib" not in recall["budget"]
    edited = {**cfg, "needle": {**cfg["needle"], "depths": [0.5]}}
    assert jobs.spec("measure", edited, item["model"], item["id"]) == measure  # recall settings: measure kept
    assert jobs.spec("needle", edited, item["model"], item["id"]) != needle


def test_only_the_spec_builders_read_the_config():
    """#39: a job takes its spec, never the validated config: no function of jobs/ but the builders of jobs/spec.py
    has a ``config`` parameter, or takes keywords it does not name (``**job``)."""
    import ast

    found = []
    for path in sorted((REPO / "src" / "crashline" / "jobs").glob("*.py")):
        if path.name == "spec.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                named = [a.arg for a in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]]
                if "config" in named or node.args.kwarg:
                    found.append(f"{path.name}:{node.lineno} {node.name}")
    assert not found, f"jobs reading the config or unnamed keywords: {found}"


def test_a_spec_is_typed_per_job_and_reads_back_only_as_written():
    """Each server job's spec is a frozen dataclass of its own fields: its text (the rule's params) reads back equal,
    and text that is not a spec (the whole config, a spec lacking a field) is refused naming the keys."""
    import dataclasses
    import json

    cfg = C.load(REPO / "config" / "config.yaml")
    item, group = C.expand(cfg)[0], {"model": "m", "id": "g"}
    for job in ("measure", "needle"):
        spec = jobs.spec(job, cfg, item["model"], item["id"])
        assert type(spec).job == job and jobs.from_json(jobs.to_json(spec)) == spec and spec.id == item["id"]
        with pytest.raises(dataclasses.FrozenInstanceError):
            spec.item = cfg
    assert json.loads(jobs.to_json(jobs.spec("needle", cfg, item["model"], item["id"])))["job"] == "needle"
    whole = json.dumps({"job": "measure", "model": item["model"], **cfg})
    with pytest.raises(C.ConfigError, match=r"--spec of a measure job: unknown key 'budget'.*; no 'item'"):
        jobs.from_json(whole)
    with pytest.raises(C.ConfigError, match="no job of measure, needle, search, search_needle"):
        jobs.from_json(json.dumps(group))
    with pytest.raises(C.ConfigError, match="--spec: not JSON"):
        jobs.from_json("{")


def test_what_changed_names_each_leaf_by_its_path():
    from crashline.core.changes import what_changed

    old = {"workloads": [{"name": "depth-2k", "prompt_tokens": 2048}, {"name": "short", "prompt_tokens": 128}]}
    new = {"workloads": [{"name": "depth-2k", "prompt_tokens": 1536}], "repetitions": 3}
    assert what_changed(old, new) == [
        "repetitions (none) → 3",
        "workloads.depth-2k.prompt_tokens 2048 → 1536",
        "workloads.short.prompt_tokens 128 → (none)",
    ]
    assert what_changed(new, new) == [] and what_changed({}, {str(i): i for i in range(9)}, most=2)[-1] == "and 7 more"


def search_config(tiny_moe, workloads, budget=None):
    return C.validate(
        {
            "models": {"tiny": {"source": f"file:{tiny_moe}"}},
            "configurations": [{"settings": {"ctx": 2048}, "search": {"n_cpu_moe": [0, 2]}}],
            "workloads": workloads,
            "repetitions": 1,
            "budget": {"vram_budget_mib": budget},
        },
        SCHEMA,
    )


SHORT = [{"name": "short", "prompt_tokens": 16, "gen_tokens": 4}]


@pytest.mark.parametrize(
    "edit",
    [
        {"workloads": [{"name": "short", "prompt_tokens": 16, "gen_tokens": 8}]},
        {"budget": 4096},  # without a GPU its probes are refused: measured again all the same, never reused
        {"model": "another file"},  # the same name and shape, other weights (#26: m1's probes answered for m2)
    ],
)
def test_search_probes_are_measured_again_after_an_edit(tmp_path, tiny_moe, server_provenance, edit, capfd):
    out = tmp_path / "search"
    if "model" in edit:
        other = tmp_path / "other" / tiny_moe.name
        other.parent.mkdir()
        data = bytearray(tiny_moe.read_bytes())
        data[-1] ^= 0x01  # the last byte of the last tensor: the same shape, another file
        other.write_bytes(bytes(data))
        edit = {"model": other}

    def search(workloads=SHORT, budget=None, model=tiny_moe):
        cfg = search_config(model, workloads, budget)
        spec = jobs.spec("search", cfg, "tiny", C.expand_searches(cfg)[0]["id"])
        summary = run_search(spec, jobs.JobInputs(fetch_record(model), inspect_gguf(model), server_provenance), out)
        probes = {cid: (out / "records" / cid / "measure.json").stat().st_mtime_ns for cid in summary["records"]}
        return probes, summary

    first, _ = search()
    assert first and search()[0] == first  # the same spec: the probes are reused, not measured again
    capfd.readouterr()
    edited, summary = search(**edit)
    assert set(edited) & set(first) and all(edited[c] != first[c] for c in set(edited) & set(first))
    if "workloads" in edit:  # each probe measured again says what changed, not the whole spec (#27)
        said = "measuring again, since the record was made: config.workloads.short.gen_tokens 4 → 8"
        assert capfd.readouterr().err.count(said) == len(set(edited) & set(first)) + 1  # and the calibration
    # what the folder holds is this search's: an earlier search's other probes are set aside, not left beside (#26)
    kept = {p.parent.relative_to(out / "records").as_posix() for p in (out / "records").rglob("measure.json")}
    assert kept == {*summary["records"], summary["calibration"]}
    if "budget" in edit and not gpus()["present"]:
        assert {read_json(out / "records" / c / "measure.json")["outcome"] for c in edited} == {"budget_refused"}


TINY = """
models:
  tiny:
    source: synthetic:tiny-moe
configurations:
  - settings: {ubatch: 128}
workloads:
  - {name: short, prompt_tokens: 32, gen_tokens: 4}
repetitions: 1
"""


def _snakemake(workdir, *args) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "--cores", "1", "report", "--configfile", "mine.yaml", *args],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "PYTHONPATH": str(REPO / "src")},
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return proc.stdout + proc.stderr


def _planned(out: str) -> dict[str, int]:
    return {m[1]: int(m[2]) for m in re.finditer(r"^(\w+)\s+(\d+)$", out.split("Job stats:", 1)[1], re.M)}


@pytest.mark.e2e
@pytest.mark.parametrize(
    "edit, reruns",
    [
        ("budget:\n  vram_budget_mib: 4096\n", {"measure", "needle"}),  # recall is checked under the budget too
        ("workloads:\n  - {name: short, prompt_tokens: 32, gen_tokens: 8}\n", {"measure"}),
        ("needle:\n  depths: [0.5]\n", {"needle"}),
        ("telemetry:\n  interval_s: 0.5\n", {"measure"}),
        ("server:\n  stop_timeout_s: 20\n", {"measure", "needle"}),
    ],
)
def test_an_edit_reruns_exactly_the_jobs_that_read_it(tmp_path, server_provenance, edit, reruns):
    copy_workflow(tmp_path)
    (tmp_path / "mine.yaml").write_text(TINY)
    _snakemake(tmp_path)
    assert "Nothing to be done" in _snakemake(tmp_path, "-n")
    key = edit.split(":", 1)[0]
    text = TINY if key not in TINY else re.sub(rf"^{key}:.*?(?=^\w|\Z)", "", TINY, flags=re.M | re.S)
    (tmp_path / "mine.yaml").write_text(text + edit)
    planned = _planned(_snakemake(tmp_path, "-n"))
    assert {job for job in ("measure", "needle", "search") if planned.get(job)} == reruns, planned


@pytest.mark.e2e
def test_an_edit_of_the_decision_reruns_the_report_and_the_llama_bench_check_and_no_server_job(
    tmp_path, server_provenance
):
    """The objective and the margin decide the recommendation, which the report says and llama-bench checks: an
    edit of either reruns both (the check once ran on the old winner), and measures nothing again."""
    copy_workflow(tmp_path)
    (tmp_path / "mine.yaml").write_text(TINY)
    _snakemake(tmp_path)
    for edit in ("objective:\n  metric: prefill_tps\n", "budget:\n  margin_mib: 512\n"):
        (tmp_path / "mine.yaml").write_text(TINY + edit)
        planned = _planned(_snakemake(tmp_path, "-n"))
        assert planned.get("validity") == 1 and planned.get("report") == 1, (edit, planned)
        assert not any(planned.get(job) for job in ("measure", "needle", "search")), (edit, planned)


def test_a_dry_run_says_what_changed_in_the_config_as_key_old_new(tmp_path):
    """#41: a dry run's rerun reasons were 634-2,875 characters of Snakemake's JSON; the workflow says each changed
    key once, as `key old → new`, before Snakemake's plan."""
    copy_workflow(tmp_path)
    (tmp_path / "mine.yaml").write_text(TINY)
    first = _snakemake(tmp_path, "-n")
    assert "changed in the config" not in first
    (tmp_path / "mine.yaml").write_text(
        TINY.replace("prompt_tokens: 32", "prompt_tokens: 24").replace("repetitions: 1", "repetitions: 2")
    )
    said = _snakemake(tmp_path, "-n")
    assert (
        "crashline: what changed in the config since the last run\n  repetitions 1 → 2\n"
        "  workloads.short.prompt_tokens 32 → 24\n" in said
    ), said[:3000]
