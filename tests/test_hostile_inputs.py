"""Hostile inputs (issue #38 item 4): each case that was silent, late or blamed the wrong cause gets a clear error
where the input is read (the key, the value and the fix, on one line) or the right failure kind. Real files, real
llama-server logs and servers, a real git repository and real Snakemake runs; nothing is mocked."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from crashline.config import claims as K
from crashline.config import plan as C
from crashline.config.file import load_schema
from crashline.config import source as source_mod
from crashline.core import locks
from crashline.core.records import Outcome
from crashline.engine import logparse
from crashline.engine.server import ServerProcess

from conftest import FIXTURES, REPO, SMALL_RUN_CONFIG, snakemake_in
from helpers import copy_workflow, fetch_record, measure_one, run
import test_publish

SCHEMA = C.load_schema()
OTHER_USER = 65534  # nobody
PARALLEL_LOG = FIXTURES / "cpu-logs" / "loadfail-parallel-4096.log"


def crashline(*args: str, cwd: Path | None = None, env: dict | None = None, timeout: int = 60):
    return subprocess.run(
        [sys.executable, "-m", "crashline", *args],
        cwd=cwd or REPO,
        env={**os.environ, "PYTHONPATH": str(REPO / "src"), **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def one_error_line(proc: subprocess.CompletedProcess, verb: str) -> str:
    """The CLI's error: status 2, one line on stderr, naming the verb."""
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert len(lines) == 1 and lines[0].startswith(f"crashline {verb}: error: "), proc.stderr
    return lines[0]


def base() -> dict:
    return {
        "models": {"m": {"source": "file:/x.gguf"}},
        "configurations": [{"grid": {"ubatch": [128, 512]}}],
        "workloads": [{"name": "short", "prompt_tokens": 128, "gen_tokens": 16}],
    }


def other_users_folder(path: Path) -> Path:
    if os.getuid() != 0:
        pytest.skip("a folder of another local user needs root to make")
    path.mkdir(mode=0o700)
    os.chown(path, OTHER_USER, OTHER_USER)
    return path


# -- 1. model names from file names --------------------------------------------------------------------------------


def test_non_ascii_model_file_names_stay_two_models_with_stable_names():
    """模型.gguf and модель.gguf both became the name 'model', and tune's second run replaced the first's records.
    A name keeps what a folder and a Snakemake wildcard may hold and adds a hash of the file name where characters
    had to go; an ASCII name is unchanged."""
    model_name, NAME_RE = source_mod.model_name, source_mod.NAME_RE
    first, second = model_name("file:/a/模型.gguf"), model_name("file:/b/модель.gguf")
    assert first != second
    assert all(NAME_RE.match(n) and n.startswith("model-") for n in (first, second))
    assert model_name("file:/elsewhere/模型.gguf") == first  # the same file name is the same model every run
    assert model_name("file:/m/my model.gguf") != model_name("file:/m/my+model.gguf")
    assert model_name("file:/m/Qwen3-30B-A3B-Q4_K_M.gguf") == "Qwen3-30B-A3B-Q4_K_M"
    assert model_name("hf:o/r/gemma-3-270m-Q4_K_M.gguf@main") == "gemma-3-270m-Q4_K_M"
    assert model_name("synthetic:tiny-moe") == "tiny-moe"
    assert model_name("https://example.com/m/%E6%A8%A1%E5%9E%8B.gguf") == first  # the file's name, unescaped


def test_tune_names_two_non_ascii_models_apart(tmp_path):
    from crashline.cli.tune import model_source

    a, b = tmp_path / "模型.gguf", tmp_path / "модель.gguf"
    for path in (a, b):
        path.write_bytes(b"GGUF")
    assert model_source(str(a))[0] != model_source(str(b))[0]


# -- 2. parse-log reads a bounded part of a regular file -------------------------------------------------------------


def test_parse_log_refuses_a_device_and_a_pipe_at_once(tmp_path):
    """`parse-log /dev/zero` read without end; a named pipe with no writer blocked the open."""
    said = one_error_line(crashline("parse-log", "/dev/zero", timeout=30), "parse-log")
    assert "/dev/zero is a character device, not a log file" in said
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    said = one_error_line(crashline("parse-log", str(fifo), timeout=30), "parse-log")
    assert "is a named pipe, not a log file" in said
    said = one_error_line(crashline("parse-log", str(tmp_path), timeout=30), "parse-log")
    assert "is a folder, not a log file" in said


def test_parse_log_reads_the_head_and_the_tail_of_a_long_log(tmp_path):
    """A real log with 40 MiB of serving lines in its middle: the load (head) and the end (tail) are read, not
    the middle; the classification comes from the tail, the placement from the head."""
    lines = PARALLEL_LOG.read_text().splitlines(keepends=True)
    cut = next(i for i, line in enumerate(lines) if "n_seq_max must be" in line)
    filler = "0.01.000.000 D srv  update_slots: all slots are idle\n"
    path = tmp_path / "long.log"
    with path.open("w") as f:
        f.writelines(lines[:cut])
        f.write(filler * (40 * 1024 * 1024 // len(filler)))
        f.writelines(lines[cut:])
    text = logparse.read_bounded(path)
    assert len(text.encode()) <= logparse.HEAD_BYTES + logparse.TAIL_BYTES
    assert text.startswith(lines[0]) and text.endswith(lines[-1])
    done = crashline("parse-log", str(path), timeout=60)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["classification"]["failure"] == "settings"
    assert summary["placement"]["n_threads"] == 2  # from the head


# -- 3. numbers are finite and bounded at load ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, said",
    [
        ("1.0e+16", "server.request_timeout_s = 1e+16: 1e+16 is greater than the maximum of 604800"),
        (".nan", "server.request_timeout_s = nan: expected a finite number"),
        (".inf", "server.request_timeout_s = inf: expected a finite number"),
        ("-.inf", "server.request_timeout_s = -inf: expected a finite number"),
    ],
)
def test_a_timeout_past_any_sense_is_refused_by_plan(tmp_path, value, said):
    """request_timeout_s 1.0e+16, .nan and .inf passed `plan`, then every run failed "expected a number"."""
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump(base()) + f"server: {{request_timeout_s: {value}}}\n")
    line = one_error_line(crashline("plan", "--config", str(cfg)), "plan")
    assert f"config key {said}" in line


@pytest.mark.parametrize(
    "where, value",
    [
        (("server", "startup_timeout_s"), float("nan")),
        (("server", "stop_timeout_s"), 1e16),
        (("soak", "must_survive_h"), float("inf")),
        (("soak", "duration_s"), float("nan")),
        (("telemetry", "interval_s"), float("nan")),
        (("objective", "max_ttft_s"), 1e16),
        (("budget", "vram_budget_mib"), 10**30),
        (("budget", "host_ram_mib"), 10**30),
        (("validity", "repetitions"), 10**30),
        (("needle", "gen_tokens"), 10**30),
        (("needle", "depths"), [float("nan")]),
        (("needle", "lengths"), [float("inf")]),
    ],
)
def test_every_number_of_the_config_is_finite_and_bounded(where, value):
    cfg = base()
    cfg.setdefault(where[0], {})[where[1]] = value
    with pytest.raises(C.ConfigError) as err:
        C.validate(cfg, SCHEMA)
    message = str(err.value)
    assert message.startswith(f"config key {'.'.join(where)}") and "\n" not in message
    assert "finite number" in message or "maximum of" in message


def _numbers_without_a_bound(schema, path="") -> list[str]:
    found = []
    if isinstance(schema, dict):
        kind = schema.get("type")
        kinds = [kind] if isinstance(kind, str) else kind or []
        if {"number", "integer"} & set(kinds) and "maximum" not in schema:
            found.append(path)
        for key, sub in schema.items():
            if key not in ("description", "default", "enum", "const"):
                found += _numbers_without_a_bound(sub, f"{path}.{key}")
    elif isinstance(schema, list):
        for i, sub in enumerate(schema):
            found += _numbers_without_a_bound(sub, f"{path}[{i}]")
    return found


@pytest.mark.parametrize("name", ["schema.yaml", "claims.schema.yaml"])
def test_every_number_in_the_schemas_has_a_maximum(name):
    """The one place that refuses .nan and .inf (config.file's number type) leaves the bound to each key."""
    assert _numbers_without_a_bound(load_schema(name)) == []


def test_a_claims_file_with_a_nan_speed_is_refused_at_load(tmp_path):
    raw = yaml.safe_load((FIXTURES / "claims" / "mixed.yaml").read_text())
    raw["source"]["local_copy"] = str(FIXTURES / "claims" / "upstream-README.md")
    raw["rows"][0]["claimed"]["decode_tps"] = float("nan")
    path = tmp_path / "nan.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(K.ClaimsError, match=r"key rows\.0\.claimed\.decode_tps = nan: expected a finite number"):
        K.load_claims([path], C.validate(base(), SCHEMA))


def test_a_synthetic_shape_past_what_gguf_holds_is_refused_at_load():
    cfg = base()
    cfg["models"]["n"] = {"source": "synthetic:n", "synthetic": {"layers": 10**30}}
    with pytest.raises(C.ConfigError, match=r"models\.n\.synthetic\.layers = 1000000000000000000000000000000: must"):
        C.validate(cfg, SCHEMA)


# -- 4. llama.cpp's refusal of -np above 256 -----------------------------------------------------------------------


def test_parallel_above_llama_cpp_s_limit_is_a_settings_failure_in_the_real_log():
    """A real llama-server log (tests/fixtures/cpu-logs, made by crashline's ServerProcess with parallel 4096 on the
    synthetic tiny MoE): it was load_failed 'unknown' while the log said why."""
    text = PARALLEL_LOG.read_text()
    for found in (logparse.classify(text, 1), logparse.summarize(PARALLEL_LOG)["classification"]):
        assert (found["outcome"], found["failure"], found["phase"]) == ("load_failed", "settings", "load")
        assert "n_seq_max must be <= 256" in found["message"] and "parallel (-np)" in found["message"]


def test_a_real_server_asked_for_4096_slots_fails_with_the_settings_kind(tmp_path, server_binary, tiny_moe):
    """The same refusal from the llama-server the suite uses, as crashline starts it (its flags, -lv 4), with
    -np 4096 put in by hand: a config may no longer ask for it (core.settings refuses parallel above 256)."""
    from crashline.core import settings as S

    command = S.command_line(server_binary, str(tiny_moe), S.resolve({"ctx": 4096, "threads": 2, "parallel": 4}))
    command[command.index("-np") + 1] = "4096"
    server = ServerProcess(command, tmp_path / "server.log")
    try:
        server.start()
        server.proc.wait(timeout=120)
    finally:
        server.stop(5)
    found = logparse.classify(server.log_text(), server.proc.returncode)
    assert (found["outcome"], found["failure"]) == ("load_failed", "settings"), found
    assert "n_seq_max must be <= 256" in found["message"]


# -- 5. a lock folder another user owns ---------------------------------------------------------------------------


def test_a_lock_folder_of_another_user_ends_the_measurement_with_its_error(tmp_path, monkeypatch, server_provenance):
    """It was recorded as the configuration's 'error' outcome, the server's log never written, and Snakemake said
    only to raise --latency-wait; now the job ends with the refusal, which names the folder and the fix."""
    from crashline.models import synthetic

    theirs = other_users_folder(tmp_path / "theirs")
    monkeypatch.setattr(locks, "LOCK_DIR", theirs)
    model = tmp_path / "tiny.gguf"
    synthetic.write_moe_gguf(model, synthetic.DEFAULT_TINY)
    config = {
        "models": {"tiny": {"source": f"file:{model}"}},
        "defaults": {"threads": 2},
        "configurations": [{"settings": {"ubatch": 128}}],
        "workloads": [{"name": "short", "prompt_tokens": 32, "gen_tokens": 4}],
        "repetitions": 1,
    }
    with pytest.raises(locks.UnsafeLockError) as err:
        measure_one(tmp_path, "tiny", fetch_record(model), server_provenance, config)
    said = str(err.value)
    assert f"lock folder {theirs} belongs to user 65534" in said and "CRASHLINE_LOCK_DIR" in said
    assert not (tmp_path / "measure.json").exists()  # no configuration's result


# -- 5 and 7 together: a run that fails at the lock, then snakemake --report ----------------------------------------


def test_a_run_failing_at_a_foreign_lock_folder_says_so_and_report_names_that_job(tmp_path, small_run):
    """A finished run, one record measured again under a lock folder of another user: the console has crashline's
    one line (not Snakemake's --latency-wait advice), and `snakemake --report` then names the failed job, its error
    and its log (it said only that configs.csv was missing, after removing the tables itself)."""
    work = tmp_path / "run"
    shutil.copytree(small_run, work, symlinks=True)
    theirs = other_users_folder(tmp_path / "theirs")
    (record,) = (work / "results" / "records").glob("*/*/measure.json")
    record.unlink()

    def smk(*args):
        return snakemake_in(work, *args, timeout=900, env={"CRASHLINE_LOCK_DIR": str(theirs)})

    failed = smk("report")
    said = failed.stdout + failed.stderr
    assert failed.returncode != 0
    assert f"crashline measure: error: lock folder {theirs} belongs to user 65534" in said, said[-3000:]
    assert "latency-wait" not in said and "MissingOutputException" not in said, said[-3000:]
    tables = sorted(p.name for p in (work / "results" / "tables").iterdir())
    packed = smk("--report", str(tmp_path / "r.zip"))
    said = packed.stdout + packed.stderr
    assert packed.returncode != 0 and not (tmp_path / "r.zip").exists()
    assert "marked for report but does not exist" not in said, said[-3000:]
    cid = record.parent.name
    assert (
        f"the last run failed: job measure (model=tiny-moe, cid={cid}) failed: crashline measure: error: lock" in said
    )
    assert f"its log is results/logs/measure/tiny-moe/{cid}.log" in said, said[-3000:]
    assert sorted(p.name for p in (work / "results" / "tables").iterdir()) == tables  # --report removed nothing


# -- 6. publish says what it pushed, and a failure is an error -------------------------------------------------------


git = test_publish.git  # a real git, as an upstream's maintainer's
bare = test_publish.bare  # the fixture: a real bare repository with the upstream README on main


def publish_setup(tmp_path, publish: dict, **source) -> Path:
    """A config with one claims file (tests/fixtures/claims/mixed.yaml) and empty tables: the config's path."""
    raw = yaml.safe_load((FIXTURES / "claims" / "mixed.yaml").read_text())
    raw["source"]["local_copy"] = str(FIXTURES / "claims" / "upstream-README.md")
    raw["source"].update(source)
    (tmp_path / "mixed.yaml").write_text(yaml.safe_dump(raw))
    results = tmp_path / "results"
    (results / "tables").mkdir(parents=True)
    pd.DataFrame(columns=["model", "config_id", "outcome"]).to_parquet(results / "tables" / "configs.parquet")
    pd.DataFrame(columns=["model", "config_id"]).to_parquet(results / "tables" / "measurements.parquet")
    cfg = {
        **base(),
        "results_dir": str(results),
        "defaults": {"threads": 2},
        "claims": [str(tmp_path / "mixed.yaml")],
        "publish": publish,
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_a_pull_request_that_fails_after_the_push_is_an_error_naming_both(tmp_path, bare):
    """It exited 0 and, under Snakemake, said nothing on the console."""
    remote, seed = bare
    both = {"push": True, "open_pr": True, "branch": "crashline/fix"}
    cfg = publish_setup(tmp_path, both, git=str(remote), revision=seed, hf_repo="owner/model")
    env = {k: "" for k in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")}
    done = crashline("publish", "--config", str(cfg), env=env)
    sha = git(f"--git-dir={remote}", "rev-parse", "crashline/fix")
    said = one_error_line(done, "publish")
    assert (
        f"mixed: branch crashline/fix was pushed to {remote} at {sha[:12]}, but the pull request on owner/model" in said
    )
    assert "no Hugging Face token" in said and "run publish again" in said
    assert f"pushed branch crashline/fix to {remote} at {sha[:12]}" in done.stdout  # what left the machine


def test_a_push_that_fails_is_one_line_naming_the_branch_the_remote_and_what_to_do(tmp_path, bare):
    """A remote that refuses the push (a real pre-receive hook): git's several lines were the error as they came."""
    remote, seed = bare
    hook = remote / "hooks" / "pre-receive"
    hook.write_text("#!/bin/sh\necho 'pushes are closed here' >&2\nexit 1\n")
    hook.chmod(hook.stat().st_mode | stat.S_IXUSR)
    cfg = publish_setup(tmp_path, {"push": True, "branch": "crashline/fix"}, git=str(remote), revision=seed)
    said = one_error_line(crashline("publish", "--config", str(cfg)), "publish")
    assert f"mixed: the push of branch crashline/fix to {remote} failed: git push failed" in said
    assert "pushes are closed here" in said and "check source.git in" in said and "run publish again" in said


def test_a_push_that_succeeds_says_what_was_pushed(tmp_path, bare):
    remote, seed = bare
    cfg = publish_setup(tmp_path, {"push": True, "branch": "crashline/fix"}, git=str(remote), revision=seed)
    done = crashline("publish", "--config", str(cfg))
    assert done.returncode == 0, done.stderr
    sha = git(f"--git-dir={remote}", "rev-parse", "crashline/fix")
    assert f"mixed: {tmp_path}/results/publish/mixed/README.md" in done.stdout
    assert f"(pushed branch crashline/fix to {remote} at {sha[:12]})" in done.stdout


# -- 7. snakemake --report after a failed run -----------------------------------------------------------------------


def test_snakemake_report_after_a_failed_run_names_the_job_its_error_and_its_log(tmp_path):
    """A run whose only model source does not exist fails in fetch_model: --report named only the rule (or, with a
    report.md of an earlier run there, Snakemake's 'configs.csv marked for report but does not exist')."""
    copy_workflow(tmp_path)
    (tmp_path / "gone.yaml").write_text(
        "models:\n  gone:\n    source: file:/nowhere/gone.gguf\nconfigurations:\n  - settings: {ubatch: 128}\n"
        "workloads:\n  - {name: short, prompt_tokens: 32, gen_tokens: 4}\nrepetitions: 1\n"
    )

    def smk(*args):
        return snakemake_in(tmp_path, *args, "--configfile", "gone.yaml", timeout=600)

    assert smk("report").returncode != 0
    expected = (
        "the last run failed: job fetch_model (model=gone) failed: crashline fetch: error: model source "
        "'file:/nowhere/gone.gguf': no such file /nowhere/gone.gguf; its log is results/logs/fetch/gone.log; "
        "fix that and run `snakemake --cores 1 report` again"
    )
    packed = smk("--report", "r.zip")
    said = packed.stdout + packed.stderr
    assert packed.returncode != 0 and "results/report.md does not exist: " + expected in said, said[-2000:]
    time.sleep(0.05)
    (tmp_path / "results" / "report.md").write_text("# an earlier run's report\n")  # its tables are gone
    packed = smk("--report", "r.zip")
    said = packed.stdout + packed.stderr
    assert packed.returncode != 0 and not (tmp_path / "r.zip").exists()
    assert "marked for report but does not exist" not in said
    assert "results/report.html does not exist: " + expected in said, said[-2000:]


# -- 8. a claims row identical to the user's configuration ----------------------------------------------------------

SAME_ROW = """\
title: A table whose one row is the user's own configuration
source:
  url: https://example.com/tiny/README.md
  file: README.md
  local_copy: {upstream}
  anchor: Performance
model: tiny-moe
workload: {{prompt_tokens: 8000, gen_tokens: 16}}
rows:
  - label: ub 512
    claimed: {{prefill_tps: 1000, decode_tps: 50}}
    stated: {{ubatch: 512}}
    unknown: [threads, ctx, parallel]
"""


def test_a_claims_row_equal_to_the_user_s_configuration_keeps_the_recommendation(tmp_path, server_provenance):
    """The row's 8000-token workload is past the configuration's 4096-token context: it ran on the user's own
    configuration (the same id) and its context_exceeded made the report say "No recommendation". The user asked
    about their workloads; the row's failure belongs to the correction, which still shows it."""
    copy_workflow(tmp_path)
    claims = tmp_path / "config" / "claims" / "same.yaml"
    claims.write_text(SAME_ROW.format(upstream=FIXTURES / "claims" / "upstream-README.md"))
    (tmp_path / "config" / "config.yaml").write_text(SMALL_RUN_CONFIG + f"claims: [{claims}]\n")
    plan = C.load(tmp_path / "config" / "config.yaml")
    (item,) = C.expand(plan)  # the row is the user's configuration: one configuration, measured once
    done = snakemake_in(tmp_path, "report")
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    (answer,) = json.loads((tmp_path / "results" / "recommendation.json").read_text())
    assert answer["winner"] == item["id"], answer
    measured = pd.read_parquet(tmp_path / "results" / "tables" / "measurements.parquet")
    row = measured[measured["workload"] == "claim-pp8000-tg16"].iloc[0]
    assert row["workload_outcome"] == Outcome.CONTEXT_EXCEEDED
    section = (tmp_path / "results" / "report.md").read_text()
    assert "No recommendation" not in section


def test_a_claims_workload_that_fails_leaves_the_configuration_s_own_outcome(tmp_path, tiny_moe, server_provenance):
    """The measurement alone, on a real server: the config's workload survives, the row's is past the context."""
    rec = run(
        tmp_path,
        tiny_moe,
        server_provenance,
        {"ctx": 1024},
        [
            {"name": "short", "prompt_tokens": 64, "gen_tokens": 4},
            {"name": "claim-pp2000-tg4", "prompt_tokens": 2000, "gen_tokens": 4},
        ],
        reps=1,
    )
    assert rec["outcome"] == Outcome.OK, rec["message"]
    outcomes = {w["name"]: w["outcome"] for w in rec["workloads"]}
    assert outcomes == {"short": Outcome.OK, "claim-pp2000-tg4": Outcome.CONTEXT_EXCEEDED}
