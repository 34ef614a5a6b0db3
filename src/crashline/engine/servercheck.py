"""Prove a llama-server binary works on this machine before any measurement trusts it.

``--version`` runs even where the compute kernels cannot (a build that uses AVX-512 or AMX where
the OS does not enable them dies at its first matrix product). So every binary, built or given,
serves one short real request on a tiny synthetic MoE: the server starts, warms up, generates a
few tokens and stops. The result says what ran, how long it took, and how it failed.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import requests

from . import logparse
from ..core.locks import lease
from .server import ServerProcess
from .workloads import Client, RequestFailed

CHECK_MODEL = "synthetic:tiny-moe"
CHECK_ARGS = ("-c", "512", "-np", "1")
CHECK_TOKENS = 8
STARTUP_TIMEOUT_S = 60  # the 2 MiB model loads in seconds; a binary that hangs holds the machine's lock this long
REQUEST_TIMEOUT_S = 120


def check_model(cache_dir: Path) -> Path:
    """The tiny random-weight MoE the check serves (written once into the cache)."""
    from ..models.sources import fetch

    record = fetch(CHECK_MODEL, Path(cache_dir) / "models" / "_server-check", cache_dir=Path(cache_dir))
    return Path(record["files"][0]["path"])


def _signal_name(returncode: int | None) -> str | None:
    if returncode is None or returncode >= 0:
        return None
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


def run_check(binary: Path, cache_dir: Path) -> dict:
    """Serve one short request with ``binary``; the result has ``ok`` and, if not, how it failed."""
    model = check_model(cache_dir)
    command = [str(binary), "-m", str(model), *CHECK_ARGS]
    started = time.monotonic()
    result: dict = {"model": CHECK_MODEL, "command": command, "request": f"{CHECK_TOKENS} tokens generated"}
    with tempfile.TemporaryDirectory(prefix="crashline-check-") as tmp:
        server = ServerProcess(command, Path(tmp) / "server.log")
        phase = "load"
        with lease(f"the check of {binary}"), server:
            state = server.start_ready(STARTUP_TIMEOUT_S)
            if state == "ready":
                phase = "request"
                try:
                    reply = Client.of(server, REQUEST_TIMEOUT_S).complete("The", CHECK_TOKENS)
                    result["tokens_generated"] = reply.get("tokens_predicted")
                except (requests.RequestException, RequestFailed) as exc:
                    result["request_error"] = str(exc)[:300]
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        server.proc.wait(timeout=5)  # a server that died under the request
            died = server.proc.poll() is not None
            if died:
                server.returncode = server.proc.returncode
        log = server.log_text()
    verdict = logparse.classify(log, server.returncode, phase_hint=phase, timed_out=state == "timeout")
    ok = not died and result.get("tokens_generated") == CHECK_TOKENS
    result.update(
        ok=ok,
        seconds=round(time.monotonic() - started, 1),
        phase=None if ok else verdict["phase"] or phase,
        returncode=server.returncode if died else None,
        signal=_signal_name(server.returncode) if died else None,
        outcome="ok" if ok else (verdict["outcome"] if verdict["outcome"] != "ok" else "request_failed"),
        message=None if ok else (verdict["message"] or result.get("request_error") or "no answer"),
        log_tail=None if ok else "\n".join(log.splitlines()[-15:]),
    )
    return result


def describe_failure(binary: Path, result: dict) -> str:
    """One paragraph: which binary, what the check did, how it died."""
    how = f"killed by {result['signal']}" if result.get("signal") else result["outcome"]
    if result.get("signal") == "SIGKILL":
        how += ", which crashline never sends a check (the OOM killer, or someone's kill): no broken build; run again"
    return (
        f"{binary} failed crashline's server check ({how} during {result['phase']}: {result['message']}). "
        f"The check served {result['request']} on a tiny synthetic MoE with: "
        f"{' '.join(result['command'])}\nlast lines of its log:\n{result['log_tail']}"
    )
