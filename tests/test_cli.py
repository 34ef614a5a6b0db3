"""The command line: each verb runs without Snakemake; bad input is a clear error, exit status 2."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from crashline.engine.logparse import is_server_log

from conftest import FIXTURES, REPO


def crashline(*args, cwd=REPO):
    return subprocess.run(
        [sys.executable, "-m", "crashline", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(REPO / "src"), "PATH": "/usr/bin:/bin"},
        timeout=120,
    )


def test_parse_log_explains_a_crashed_server():
    proc = crashline("parse-log", str(FIXTURES / "cuda-logs" / "oom-abort-at-warmup.log"))
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["classification"]["outcome"] == "oom" and out["classification"]["phase"] == "warmup"
    assert out["placement"]["buffers_mib"]["CUDA0:compute"] > 0


def test_plan_lists_every_configuration_with_its_arguments():
    proc = crashline("plan", "--json")
    items = json.loads(proc.stdout)
    assert len(items) >= 4 and all(len(i["id"]) == 10 for i in items)
    text = crashline("plan").stdout
    assert all(i["id"] in text for i in items) and "-ub 128" in text


def test_bad_config_is_a_clear_error(tmp_path):
    bad = tmp_path / "c.yaml"
    bad.write_text(
        "models: {m: {source: 'file:/x.gguf'}}\nconfigurations: [{settings: {n_cpu_mo: 3}}]\n"
        "workloads: [{name: s, prompt_tokens: 8, gen_tokens: 8}]\n"
    )
    proc = crashline("plan", "--config", str(bad))
    assert proc.returncode == 2
    assert "unknown server setting(s) 'n_cpu_mo'" in proc.stderr and "n_cpu_moe" in proc.stderr


def test_unknown_model_and_missing_file_are_clear_errors(tmp_path):
    proc = crashline("fetch", "--model", "nope")
    assert proc.returncode == 2 and "no model 'nope'" in proc.stderr
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        f"results_dir: {tmp_path}/r\nmodels: {{m: {{source: 'file:{tmp_path}/missing.gguf'}}}}\n"
        "configurations: [{settings: {}}]\nworkloads: [{name: s, prompt_tokens: 8, gen_tokens: 8}]\n"
    )
    proc = crashline("fetch", "--config", str(cfg), "--model", "m")
    assert proc.returncode == 2 and "missing.gguf" in proc.stderr
    assert not (tmp_path / "r" / "models" / "m" / "fetch.json").exists()


# -- errors, pipes and signals -------------------------------------------------------------------

SHARED_LOGS = REPO.parent / "shared" / "fixtures" / "llama-server-cuda-logs"  # where this checkout has one
LOG_DIRS = [FIXTURES / "cpu-logs", FIXTURES / "cuda-logs", SHARED_LOGS]
SERVER_LOGS = sorted(p for d in LOG_DIRS for p in d.glob("*.log"))


@pytest.mark.parametrize("log", SERVER_LOGS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_real_log_is_a_server_log(log):
    """Load failures, an OOM at warm-up and the not-a-GGUF log included."""
    assert is_server_log(log.read_text(errors="replace"))


@pytest.mark.parametrize(
    "text",
    [
        'error while handling argument "-lm": invalid value\n\nusage:\n',
        "llama_model_loader: loaded meta data with 35 key-value pairs\n",
        "build: 4798 (1782cdfe) with cc (GCC) 13.3.0 for x86_64-linux-gnu\n",
    ],
)
def test_logs_without_timestamps_are_server_logs(text):
    assert is_server_log(text)


def test_parse_log_refuses_what_is_not_a_server_log(tmp_path):
    (tmp_path / "empty.log").write_text("")
    for name in ("README.md", "tests/fixtures/cuda-logs/runs.json", str(tmp_path / "empty.log")):
        proc = crashline("parse-log", name)
        assert proc.returncode == 2 and proc.stdout == "", proc.stdout
        assert proc.stderr.startswith(f"crashline parse-log: error: {name} is not a llama-server log: ")
        assert proc.stderr.count("\n") == 1, proc.stderr
    assert "none of its lines" in crashline("parse-log", "README.md").stderr


@pytest.mark.parametrize("big", [False, True], ids=["written-at-exit", "written-by-the-verb"])
def test_a_reader_that_closes_the_pipe_early_ends_it_quietly(tmp_path, big):
    """`parse-log FILE | head -1`: stdout's reader is gone before the first write. A short output is
    written when crashline flushes at the end, a long one (many error lines) while the verb prints."""
    log = FIXTURES / "cpu-logs" / "ok-cpu-gemma3-270m.log"
    if big:
        log = tmp_path / "big.log"
        log.write_text("".join(f"0.00.001.{i:03d} E srv  load_model: failed to read block {i}\n" for i in range(999)))
    read, write = os.pipe()
    os.close(read)
    with open(write, "wb") as out:
        proc = subprocess.run(
            [sys.executable, "-m", "crashline", "parse-log", str(log)],
            cwd=REPO,
            stdout=out,
            stderr=subprocess.PIPE,
            text=True,
            env={"PYTHONPATH": str(REPO / "src"), "PATH": "/usr/bin:/bin"},
            timeout=120,
        )
    assert proc.returncode == 128 + signal.SIGPIPE and proc.stderr == ""


def test_an_unexpected_error_is_one_line_and_debug_shows_the_traceback(tmp_path):
    args = ("warmup", "--fetch-record", "README.md", "--out", str(tmp_path / "w.json"))  # not JSON
    error = "crashline warmup: error: JSONDecodeError: Expecting value: line 1 column 1 (char 0)"
    proc = crashline(*args)
    assert proc.returncode == 2 and proc.stderr == f"{error} (run with --debug for the traceback)\n"
    debug = crashline("--debug", *args)
    assert debug.returncode == 2 and debug.stderr.startswith("Traceback (most recent call last):")
    assert debug.stderr.splitlines()[-1] == error
    usage = crashline("plan", "--no-such-flag")
    assert usage.returncode == 2 and usage.stderr.count("\n") == 1 and "--no-such-flag" in usage.stderr


def _catches_sigterm(pid: int) -> bool:
    caught = next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("SigCgt:"))
    return bool(int(caught.split()[1], 16) & (1 << (signal.SIGTERM - 1)))


@pytest.mark.parametrize(
    ("sig", "status", "shown"),
    [(signal.SIGTERM, 128 + signal.SIGTERM, ""), (signal.SIGINT, -signal.SIGINT, "KeyboardInterrupt")],
)
def test_sigterm_and_ctrl_c_still_unwind_the_verb(sig, status, shown):
    """Not turned into an error line: SIGTERM exits 143 as before, Ctrl-C ends as Python's KeyboardInterrupt."""
    proc = subprocess.Popen(  # a verb blocked reading its input (parse-log refuses a pipe: it would read without end)
        [sys.executable, "-m", "crashline", "inspect", "--fetch-record", "/dev/stdin"],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={"PYTHONPATH": str(REPO / "src"), "PATH": "/usr/bin:/bin"},
    )
    deadline = time.monotonic() + 60
    while not _catches_sigterm(proc.pid) and time.monotonic() < deadline:  # blocked reading stdin by then
        time.sleep(0.05)
    proc.send_signal(sig)
    proc.wait(timeout=60)  # stdin still open: the verb cannot end by reading an empty input before the signal lands
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == status and "error:" not in err and shown in err, err


def test_every_input_error_of_the_package_is_a_crashline_error_and_printed_as_its_message(tmp_path):
    """One base (#24): each kind of error whose message names the input and the fix derives from CrashlineError, so
    every verb prints it as it is. An unsafe lock folder was printed as 'UnsafeLockError: …', as if a bug."""
    import importlib
    import pkgutil

    import crashline as package
    from crashline.core.errors import CrashlineError

    # caught where they happen and recorded or retried, never printed by a verb
    internal = {"BudgetError", "HostBudgetError", "LeaseError", "Busy", "BenchError", "TuneStopped", "RequestFailed"}
    found = {}
    for mod in pkgutil.walk_packages(package.__path__, "crashline."):
        if mod.name.endswith("__main__"):
            continue
        module = importlib.import_module(mod.name)
        for name, obj in vars(module).items():
            if isinstance(obj, type) and issubclass(obj, Exception) and obj.__module__ == module.__name__:
                found[name] = obj
    assert {"ConfigError", "SettingsError", "UnsafeLockError", "CompareError", "RecordError"} <= set(found)
    public = {n: cls for n, cls in found.items() if not n.startswith("_") and n not in internal}
    assert [n for n, cls in public.items() if not issubclass(cls, CrashlineError)] == []
    (tmp_path / "a").mkdir()
    proc = crashline("compare", str(tmp_path / "a"), "--out", str(tmp_path / "c"))  # no results there
    assert proc.returncode == 2 and proc.stderr.startswith("crashline compare: error: ") and "Error:" not in proc.stderr
