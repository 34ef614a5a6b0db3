"""Progress on the console (issue #14 item 5): every job says what it does as it happens, one line
at a time, prefixed by the job; long tasks report at most one line every few seconds.

The unit tests check the line format, where lines go (stderr once; stderr and the console under
Snakemake) and the rate limit. The workflow test runs `snakemake --cores 1 report` on a search and a
configuration that cannot start, and reads the console: server starts, repetitions with their
speeds, the search's probes with the bound they leave, and the failure."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest

from conftest import REPO
from helpers import copy_workflow
from crashline.core import progress
from crashline.engine import provision
from crashline.jobs.serving import say_run
from crashline.jobs.serve import outcome_text
from crashline.jobs.search_rules import bound_text


@pytest.fixture(autouse=True)
def fresh_progress(monkeypatch):
    """No console and no job name from another test."""
    monkeypatch.setattr(progress, "_console", None)
    monkeypatch.setattr(progress, "_label", None)


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_line_names_the_job_and_is_one_line(capsys):
    progress.say("ready in 1.4 s")
    with progress.job("measure tiny 9893f4ee63"):
        progress.say("crashed (warmup: killed by SIGSEGV)\nbacktrace follows")
        with progress.job("measure tiny other"):  # a search's probe keeps the search's name
            progress.say("x" * 1000)
    progress.say("after")
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "[crashline] ready in 1.4 s"
    assert lines[1] == "[measure tiny 9893f4ee63] crashed (warmup: killed by SIGSEGV) backtrace follows"
    assert lines[2].startswith("[measure tiny 9893f4ee63] xxx") and len(lines[2]) < progress.MAX_CHARS + 40
    assert lines[3] == "[crashline] after" and len(lines) == 4


def test_under_snakemake_lines_go_to_the_log_and_the_console_once_each(capsys):
    read, write = os.pipe()
    progress.to_console(write, "search tiny 4e2ede3998")
    progress.say("probe 1: n_cpu_moe 3 ok; boundary in 0..3")
    line = "[search tiny 4e2ede3998] probe 1: n_cpu_moe 3 ok; boundary in 0..3\n"
    assert os.read(read, 4096).decode() == line
    assert capsys.readouterr().err == line
    os.close(read)
    progress.say("the console is gone")  # a closed console is dropped; the job goes on
    assert progress._console is None and "gone" in capsys.readouterr().err
    os.close(write)


def test_run_by_hand_the_console_is_stderr_and_gets_each_line_once(tmp_path):
    """`python -m crashline ...` without Snakemake: to_console given the same file as stderr writes once."""
    code = (
        "import os, sys; from crashline.core import progress;"
        "progress.to_console(os.dup(2), 'measure tiny abc'); progress.say('ready in 1.0 s')"
    )
    with open(tmp_path / "err", "w") as err:
        subprocess.run([sys.executable, "-c", code], stderr=err, check=True, env={"PYTHONPATH": str(REPO / "src")})
    assert (tmp_path / "err").read_text() == "[measure tiny abc] ready in 1.0 s\n"


def test_meter_says_at_most_one_line_every_interval_and_nothing_for_a_short_task(capsys):
    clock = Clock()
    quick = progress.Meter("sha256 of small.gguf", 100 << 20, every_s=10, clock=clock)
    for i in range(100):
        clock.now += 0.05
        quick.add(1 << 20)
    quick.finish()
    assert capsys.readouterr().err == ""  # 5 s: no line at all

    clock = Clock()
    big = progress.Meter("sha256 of big.gguf", 40 << 30, every_s=10, clock=clock)
    for i in range(4096):  # 40 GiB in 10 MiB blocks, 25 ms each: 102 s
        clock.now += 0.025
        big.add(10 << 20)
    big.finish()
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 11, lines  # one every 10 s, and the end
    assert lines[0] == "[crashline] sha256 of big.gguf: 3.9 GiB of 40.0 GiB (10%), 400.0 MiB/s, about 1.5 min left"
    assert lines[-1] == "[crashline] sha256 of big.gguf: done, 40.0 GiB, in 1.7 min"


def test_meter_steps_and_percent_and_a_resumed_download():
    clock = Clock()
    steps = progress.Meter("building llama-server and llama-bench", unit="steps", clock=clock)
    clock.now += 60
    steps.update(123, 456)
    assert steps.text() == "building llama-server and llama-bench: 123/456 (27%), about 2.7 min left"
    steps.unit = "%"
    steps.update(50)
    assert steps.text() == "building llama-server and llama-bench: 50%, about 60 s left"
    clock = Clock()
    download = progress.Meter("downloading big.gguf", 10 << 30, clock=clock, start=8 << 30)
    clock.now += 10
    download.update((8 << 30) + (100 << 20))
    assert download.text() == "downloading big.gguf: 8.1 GiB of 10.0 GiB (81%), 10.0 MiB/s, about 3.2 min left"


def test_watching_reports_a_file_another_library_writes(tmp_path, capsys):
    target = tmp_path / "part"
    target.write_bytes(b"")
    with progress.watching("downloading x.gguf from owner/repo", lambda: target.stat().st_size, every_s=0.05):
        for _ in range(5):
            with open(target, "ab") as f:
                f.write(b"x" * 1024)
            time.sleep(0.05)
    lines = capsys.readouterr().err.splitlines()
    assert lines and lines[-1].startswith("[crashline] downloading x.gguf from owner/repo: done, 5.0 KiB")


def test_build_progress_from_ninja_and_make_lines(tmp_path, capsys):
    script = "; ".join(f"echo '[{i}/4] Building CXX object x{i}.o'" for i in range(1, 5))
    script += "; echo '[ 50%] Building CXX object y.o'; echo '[100%] Linking CXX executable llama-server'"
    log = open(tmp_path / "build.log", "w")
    meter = progress.Meter("building llama-server", unit="steps", every_s=0)
    code, tail = provision._run_step(["sh", "-c", script], log, meter)
    log.close()
    lines = capsys.readouterr().err.splitlines()
    assert code == 0 and "Linking" in tail and (tmp_path / "build.log").read_text().count("\n") == 6
    assert lines[0].startswith("[crashline] building llama-server: 1/4 (25%)")
    assert lines[3].startswith("[crashline] building llama-server: 4/4 (100%)")
    assert lines[4].startswith("[crashline] building llama-server: 50%") and len(lines) == 6


def test_outcome_and_bound_texts():
    crash = {"outcome": "crashed", "failure": "signal", "phase": "warmup", "message": "killed by SIGSEGV"}
    assert outcome_text(crash) == "crashed (warmup: killed by SIGSEGV)"
    kv = {"outcome": "load_failed", "failure": "kv_cache", "phase": "load", "message": "failed\nsecond line"}
    assert outcome_text(kv) == "load_failed: kv_cache (load: failed)"
    assert bound_text({}, 0, 40) == "boundary in 0..40, if any"
    assert bound_text({40: True}, 0, 40) == "boundary in 0..40"
    assert bound_text({40: True, 16: True, 15: False}, 0, 40) == "boundary at 16"
    assert bound_text({40: True, 19: True, 12: False, 15: False}, 0, 40) == "boundary in 16..19"
    assert bound_text({40: False}, 0, 40) == "no survivor up to n_cpu_moe 40"


def test_a_repetition_line_has_its_speeds_and_with_a_gpu_peak_vram_and_headroom(capsys):
    one = {"requests": [{"prefill_tps": 812.34, "decode_tps": 95.06}], "aggregate_tps": 95.0}
    say_run({"name": "short"}, 0, 3, one, None, None)
    two = {"requests": [{"prefill_tps": 400.0, "decode_tps": 40.0}, {"prefill_tps": 500.0, "decode_tps": 50.0}]}
    say_run({"name": "depth-100k"}, 2, 3, {**two, "aggregate_tps": 88.8}, 22123.4, 24576)
    assert capsys.readouterr().err.splitlines() == [
        "[crashline] short 1/3: prefill 812.3 t/s, decode 95.1 t/s",
        "[crashline] depth-100k 3/3: prefill 450.0 t/s, decode 45.0 t/s per request (2 at once, 88.8 t/s "
        "generated in all), peak VRAM 22,123 MiB, headroom 2,453 MiB of 24,576",
    ]


CONFIG = """
models:
  tiny:
    source: synthetic:tiny-moe
configurations:
  - settings: {ubatch: 128}
    search: {n_cpu_moe: [0, 3], climb: 0}
  - settings: {extra_args: ["--numa", "bogus"]}   # llama-server refuses the value: the job fails at load
workloads:
  - {name: short, prompt_tokens: 64, gen_tokens: 16}
repetitions: 2
"""


@pytest.mark.e2e
def test_the_workflow_console_shows_each_job_as_it_happens(tmp_path, server_provenance):
    copy_workflow(tmp_path)
    (tmp_path / "progress.yaml").write_text(CONFIG)
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "--cores", "1", "report", "--configfile", "progress.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=1200,
        env={**os.environ, "PYTHONPATH": str(REPO / "src")},
    )
    console = proc.stdout + proc.stderr
    assert proc.returncode == 0, console[-5000:]
    # #41: the main command ends with the answer, the summary table and where the report is, as tune does
    ending = proc.stdout.strip().splitlines()
    assert ending[-1] == "report: results/report.md and results/report.html", proc.stdout[-3000:]
    assert any(line.startswith("tiny: use ") for line in ending), proc.stdout[-3000:]
    assert (tmp_path / "results" / "summary.md").read_text().strip().splitlines()[-1] in ending
    search = re.compile(r"^\[search tiny [0-9a-f]{10}\] (.*)$", re.M).findall(console)
    tps = r"[\d,]+\.\d t/s"
    server = r"starting llama-server: tiny -ngl 999 --n-cpu-moe (\d) .*-ub 128 "
    assert [int(n) for line in search if (m := re.match(server, line)) for n in m.groups()] == [3, 0], search
    assert sum(bool(re.fullmatch(r"llama-server ready in \d+\.\d s", line)) for line in search) == 2
    assert sum(bool(re.fullmatch(rf"short [12]/2: prefill {tps}, decode {tps}", line)) for line in search) == 2
    calibrated = "calibration: n_cpu_moe 3 (the most expert layers on the CPU with one on the card)"
    assert any(line.startswith(calibrated) for line in search)
    assert "loaded and stopped (no workloads: a calibration)" in search
    assert "probe 1: n_cpu_moe 0 ok; boundary at 0" in search
    assert "search done: boundary n_cpu_moe 0, use 0, 2 server starts" in search
    failed = re.compile(r"^\[measure tiny [0-9a-f]{10}\] (.*)$", re.M).findall(console)
    assert any(line.startswith("starting llama-server: tiny ") and "--numa bogus" in line for line in failed)
    refused = 'load_failed: arguments (load: error while handling argument "--numa": invalid value'
    assert f"llama-server did not start: {refused}" in "\n".join(failed)
    assert f"measurement {refused}" in "\n".join(failed)
    # each line is in the job's log as well, once
    (log,) = (tmp_path / "results" / "logs" / "search" / "tiny").glob("*.log")
    assert log.read_text().count("probe 1: n_cpu_moe 0 ok; boundary at 0") == 1
    assert console.count("probe 1: n_cpu_moe 0 ok; boundary at 0") == 1


def test_a_job_waiting_for_a_lock_says_so_again_every_interval(tmp_path, capsys, monkeypatch):
    """A waiting job was silent for up to 456 s (issue #27): it says who holds the lock and how long it has waited,
    again every STILL_WAITING_S (30 s; 1 s here)."""
    import subprocess
    import sys
    import time

    from crashline.core import locks

    monkeypatch.setattr(locks, "STILL_WAITING_S", 1)
    path = tmp_path / "server.lock"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, sys, time; f = open(sys.argv[1], 'a+'); fcntl.flock(f, fcntl.LOCK_EX); "
            "f.write('pid 1 (the other job)'); f.flush(); print('held', flush=True); time.sleep(3.5)",
            str(path),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline().strip() == "held"
    started = time.monotonic()
    with locks.held(path, "this job", "waits for {holder}"):
        waited = time.monotonic() - started
    holder.wait()
    said = capsys.readouterr().err
    assert "this job waits for pid 1 (the other job)" in said and 2.5 < waited < 10
    assert said.count("this job still waits for pid 1 (the other job)") >= 2 and "got the lock after" in said


def test_a_llama_bench_run_that_prints_nothing_for_minutes_is_said_to_be_running(tmp_path, capsys, monkeypatch):
    """#27 item 8: the llama-bench check was silent for 5 minutes. A stand-in binary that answers after 0.5 s
    (as llama-bench, only at its end), with the heartbeat every 0.1 s: lines while it runs, none after."""
    from crashline.crosscheck import validity

    bench = tmp_path / "llama-bench"
    bench.write_text('#!/bin/sh\nsleep 0.5\necho \'[{"avg_ts": 10.0, "stddev_ts": 0.5, "samples_ts": [10.0]}]\'\n')
    bench.chmod(0o755)
    monkeypatch.setattr(progress, "HEARTBEAT_S", 0.1)
    result = validity.run_bench(str(bench), "m.gguf", [], ["-p", "8", "-n", "0", "-d", "0"], 1, 5)
    assert result["mean_tps"] == 10.0
    lines = [x for x in capsys.readouterr().err.splitlines() if "still running" in x]
    assert len(lines) >= 3 and lines[0].startswith("[crashline] llama-bench -p 8 -n 0 -d 0 (up to 5 s): still running")
    time.sleep(0.3)
    assert "still running" not in capsys.readouterr().err  # the heartbeat ended with the run
