"""No llama-server outlives crashline: a SIGTERM unwinds like Ctrl-C (the server is stopped with its
memory breakdown), and when crashline is killed outright the kernel's parent-death signal stops it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil

from conftest import REPO

SCRIPT = textwrap.dedent("""
    import signal, sys, time
    from pathlib import Path
    from crashline.cli.main import _exit_on_sigterm
    from crashline.engine.server import ServerProcess
    binary, model, log, handle = sys.argv[1:5]
    if handle == "yes":
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
    with ServerProcess([binary, "-m", model, "-c", "512"], Path(log)) as server:
        assert server.start_ready(120) == "ready"
        print(server.proc.pid, flush=True)
        time.sleep(120)
""")


def start(tmp_path, server_binary, tiny_moe, handle: str):
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    parent = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, server_binary, str(tiny_moe), str(tmp_path / "server.log"), handle],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    server_pid = int(parent.stdout.readline())
    assert psutil.pid_exists(server_pid)
    return parent, server_pid


def gone(pid: int, within_s: float = 30) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.1)
    return False


def test_sigterm_stops_the_server_like_ctrl_c(tmp_path, server_binary, tiny_moe):
    parent, server_pid = start(tmp_path, server_binary, tiny_moe, handle="yes")
    parent.send_signal(signal.SIGTERM)
    assert parent.wait(60) == 128 + signal.SIGTERM
    assert gone(server_pid)
    log = (tmp_path / "server.log").read_text(errors="replace")
    assert "memory breakdown" in log  # stopped with SIGINT: llama-server printed its memory at exit


def test_server_dies_with_a_killed_parent(tmp_path, server_binary, tiny_moe):
    parent, server_pid = start(tmp_path, server_binary, tiny_moe, handle="no")
    parent.send_signal(signal.SIGKILL)
    parent.wait(60)
    assert gone(server_pid), "the server outlived the process that started it"


def test_the_server_gets_the_environment_of_when_it_starts_without_secrets(tmp_path, monkeypatch):
    """A job takes its GPU lease after making its server: the server must still see the lease's
    CUDA_VISIBLE_DEVICES (it would use every GPU otherwise), and never a Hugging Face token."""
    from crashline.engine.server import ServerProcess

    server = ServerProcess(
        ["sh", "-c", 'echo "gpus=$CUDA_VISIBLE_DEVICES token=$HF_TOKEN"; exec sleep 30'], tmp_path / "log"
    )
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-of-the-lease")
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    with server:
        server.start()
        deadline = time.monotonic() + 10
        while "gpus=" not in server.log_text() and time.monotonic() < deadline:
            time.sleep(0.05)
    assert server.log_text().strip() == "gpus=GPU-of-the-lease token="


def test_the_log_leaves_out_the_prompt_cache_listing_and_keeps_everything_else(tmp_path):
    """llama.cpp lists every cached prompt at every request: a 75-second soak of unique prompts wrote 468 MB of log on
    an H200. Those lines are left out on their way to the file; every other line is kept, in order, as written."""
    from crashline.engine.server import ServerProcess

    lines = [
        "0.01.000.001 I srv  get_availabl: updating prompt cache",
        "0.01.000.002 I srv          load:  - prompt with length 575, lcp = 1, f_keep = 0.0",
        "0.01.000.003 I srv        update:    - prompt 0x55587cec6fb0:     575 tokens, checkpoints:  0,     1.130 MiB",
        "0.01.000.004 I srv        update:  - cache state: 2 prompts, 2.260 MiB (limits: 8192.000 MiB, 8192 tokens)",
        "0.01.000.005 I slot print_timing: id  0 | task 7 | prompt eval time =  4.53 ms /   511 tokens",
    ]
    script = tmp_path / "server.sh"
    script.write_text("#!/bin/sh\n" + "".join(f"echo '{line}'\n" for line in lines) + "echo 'to stderr' >&2\n")
    script.chmod(0o755)
    server = ServerProcess([str(script)], tmp_path / "server.log")
    server.start()
    server.proc.wait(timeout=10)
    server.stop()
    kept = server.log_text().splitlines()
    assert kept == [lines[0], lines[3], lines[4], "to stderr"]
    # a restart appends to the same log through a new filter
    server.start(append=True)
    server.proc.wait(timeout=10)
    server.stop()
    assert server.log_text().splitlines() == kept * 2
