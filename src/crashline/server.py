"""A real llama-server process: started without a shell on a free loopback port, logged to a file,
stopped with SIGINT (so it prints its memory breakdown), and its process group killed if it hangs.
If crashline itself dies without stopping it (SIGKILL, a crash), the kernel sends the server SIGTERM
(Linux's parent-death signal), so no server is left holding the GPU.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import requests

HOST = "127.0.0.1"
PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child before exec: ask for SIGTERM when the thread that started us ends (Linux only)."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


class ServerProcess:
    """One llama-server. Use as a context manager so that it is always stopped."""

    def __init__(self, command: list[str], log_path: Path, env: dict | None = None):
        self.base_command = list(command)
        self.log_path = Path(log_path)
        self.env = env
        self.port: int | None = None
        self.proc: subprocess.Popen | None = None
        self.returncode: int | None = None
        self.started_at: float | None = None
        self.ready_after_s: float | None = None

    @property
    def command(self) -> list[str]:
        return [*self.base_command, "--host", HOST, "--port", str(self.port), "-lv", "4"]

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def start(self) -> None:
        self.port = free_port()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                self.command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True, env=self.env, preexec_fn=_die_with_parent,
            )
        self.started_at = time.monotonic()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_ready(self, timeout_s: float) -> str:
        """Poll /health: "ready", "exited" (the process ended), or "timeout"."""
        deadline = time.monotonic() + timeout_s
        session = requests.Session()
        while time.monotonic() < deadline:
            if not self.alive():
                self.returncode = self.proc.returncode
                return "exited"
            try:
                if session.get(f"{self.url}/health", timeout=2).status_code == 200:
                    self.ready_after_s = time.monotonic() - self.started_at
                    return "ready"
            except requests.RequestException:
                pass
            time.sleep(0.1)
        return "timeout"

    def stop(self, timeout_s: float = 30) -> int | None:
        """SIGINT, wait; then SIGKILL the whole process group. Returns the exit status."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        # Children of the server (none expected) must not outlive it either.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        if self.returncode is None:
            self.returncode = self.proc.returncode
        return self.returncode

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def __enter__(self) -> "ServerProcess":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
