"""A real llama-server process: started without a shell on a free loopback port, logged to a file,
stopped with SIGINT (so it prints its memory breakdown), and its process group killed if it hangs.
If crashline itself dies without stopping it (SIGKILL, a crash), the kernel sends the server SIGTERM
(Linux's parent-death signal), so no server is left holding the GPU. With a host-memory budget the server runs in
a memory cgroup of its own (``hostmem``), which it creates at its first start and removes once it has stopped.

Its log leaves out llama.cpp's listing of the host prompt cache, one line per cached prompt at every request
(``NOISE``): under a soak of unique prompts that is quadratic in the requests (468 MB of log in 75 s on an H200, 2,045
requests), and nothing reads it; its summary line (``cache state: N prompts, X MiB``) stays. ``grep`` filters it on
its way to the file, so the server's own writes never wait on Python.

Every server answers only requests that carry its own random key (``--api-key-file``, a 0600 file removed
once the server has read it; a key on the command line would show in /proc to every local user): another
local process can reach the loopback port, but cannot use the server. /health stays open, as llama.cpp keeps it.

A server sees only what crashline chose (``server_env``): a handful of variables (``PASSED_VARIABLES``: the path,
the locale, which GPUs), none of llama.cpp's own (``LLAMA_ARG_*``, ``LLAMA_API_KEY``, ``GGML_*``), and a private empty
folder of its own as its home, its config and cache folders and its working directory, so llama.cpp reads no
``~/.config/llama.cpp/config.ini``. The system-wide ``/etc/llama.cpp/config.ini`` cannot be hidden that way: a server
is not started while it exists, and one whose log says it read a config file anyway is stopped (``ForeignSettings``).
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import requests

from ..core.atomic import open_output
from ..core.errors import CrashlineError
from .hostmem import MemoryCgroup

HOST = "127.0.0.1"
# llama-server's per-entry lines of its host prompt cache: "srv  load:  - prompt with length 575, lcp = 1, ..." and
# "srv  update:    - prompt 0x5558...: 575 tokens, checkpoints: 0, 1.130 MiB", one per cached prompt per request.
NOISE = r" srv +(load|update): +- prompt "
PR_SET_PDEATHSIG = 1
PORT_ATTEMPTS = 3
BIND_FAILED_RE = re.compile(r"couldn't bind HTTP server socket")
# The variables a llama.cpp binary gets from crashline's environment; nothing else reaches it. llama.cpp reads any
# flag from LLAMA_ARG_* (the model, the key, tools), its key from LLAMA_API_KEY, its port from AIP_HTTP_PORT and
# behaviour from GGML_*; a token is no business of a server given -m. What is passed picks the programs and libraries
# it runs with, the locale, the GPUs a job holds and where the CUDA driver keeps the kernels it compiles (the user's
# ~/.nv/ComputeCache unless CUDA_CACHE_PATH says otherwise: an empty home would compile them at every start).
PASSED_VARIABLES = (
    "PATH", "LD_LIBRARY_PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ",
    "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "CUDA_CACHE_PATH", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES",
    "HSA_OVERRIDE_GFX_VERSION", "GGML_VK_VISIBLE_DEVICES",  # ROCm on a consumer card; Vulkan's device choice
)  # fmt: skip
# llama.cpp applies this before its command line (common/arg.cpp, common_params_apply_system_config), and no
# environment moves it; the user-level one lies under the home, which a server gets empty.
SYSTEM_CONFIG = Path("/etc/llama.cpp/config.ini")
CONFIG_READ_RE = re.compile(r"using config file: (.*)")


class ForeignSettings(CrashlineError, RuntimeError):
    """A llama.cpp config file would set (or did set) a server's settings behind crashline's command line."""


def system_config_refusal(path: Path | None = None) -> str | None:
    """Why no server may start while the system-wide config.ini exists; None where it does not."""
    path = path or SYSTEM_CONFIG
    if not path.exists():
        return None
    return (
        f"{path} exists: every llama-server reads it before its command line, so its settings would apply to "
        "every measurement without the record showing them; move it away while crashline runs"
    )


def server_env(env: dict, home: str | os.PathLike) -> dict:
    """The environment a llama.cpp binary gets: ``PASSED_VARIABLES`` of ``env``, and ``home`` (a private empty
    folder) as its home, config, cache and temporary folder."""
    home = str(home)
    kept = {k: env[k] for k in PASSED_VARIABLES if k in env}
    if "CUDA_CACHE_PATH" not in kept and env.get("HOME"):  # the driver's kernel cache stays the user's own
        kept["CUDA_CACHE_PATH"] = str(Path(env["HOME"]) / ".nv" / "ComputeCache")
    return {**kept, "HOME": home, "XDG_CONFIG_HOME": home, "XDG_CACHE_HOME": home, "TMPDIR": home}


@contextlib.contextmanager
def private_home() -> Iterator[Path]:
    """A fresh 0700 folder of this user's for one llama.cpp process (``server_env``), removed afterwards."""
    home = Path(tempfile.mkdtemp(prefix="crashline-home-"))
    try:
        yield home
    finally:
        shutil.rmtree(home, ignore_errors=True)


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

    def __init__(self, command: list[str], log_path: Path, env: dict | None = None, host_ram_mib: int | None = None):
        self.base_command = list(command)
        self.host_ram_mib = host_ram_mib
        self.cgroup: MemoryCgroup | None = None
        self.host_peak_mib: float | None = None  # the cgroup's peak, once stopped under a host budget
        self._exit_noted = False
        self._filter: subprocess.Popen | None = None  # grep between the server and its log
        self.log_path = Path(log_path)
        self.given_env = env  # None: this process's environment when the server starts (a GPU lease's, say)
        self.port: int | None = None
        self.proc: subprocess.Popen | None = None
        self.returncode: int | None = None
        self.started_at: float | None = None
        self.ready_after_s: float | None = None
        self.api_key = secrets.token_urlsafe(32)
        self._key_file: str | None = None
        self._home: contextlib.ExitStack | None = None  # the private folder of ``private_home``, while it serves
        self.home: Path | None = None

    @property
    def command(self) -> list[str]:
        return [
            *self.base_command,
            *("--host", HOST, "--port", str(self.port), "-lv", "4", "--api-key-file", str(self._key_file)),
        ]

    @property
    def headers(self) -> dict[str, str]:
        """What a request to this server carries so that it is answered."""
        return {"Authorization": f"Bearer {self.api_key}"}

    def _write_key(self) -> None:
        fd, self._key_file = tempfile.mkstemp(prefix="crashline-key-", dir=self.home)  # 0600, this user's alone
        with os.fdopen(fd, "w") as f:
            f.write(self.api_key + "\n")

    def _remove_key(self) -> None:
        if self._key_file:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._key_file)

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def _make_home(self) -> None:
        if self._home is None:
            self._home = contextlib.ExitStack()
            self.home = self._home.enter_context(private_home())

    def _remove_home(self) -> None:
        if self._home is not None:
            self._home.close()
            self._home = self.home = None

    def start(self, append: bool = False) -> None:
        if why := system_config_refusal():
            raise ForeignSettings(why)
        self.port = free_port()
        self._remove_key()
        self._make_home()
        self._write_key()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        if self.host_ram_mib and self.cgroup is None:
            self.cgroup = MemoryCgroup(self.host_ram_mib).create()  # HostBudgetError where none can be made
        self._exit_noted = False
        with open_output(self.log_path, append=append, binary=True) as log:  # a retry keeps the earlier lines
            out = self._start_filter(log)
            try:
                self.proc = subprocess.Popen(
                    self.command,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    cwd=self.home,
                    env=server_env(self.given_env or os.environ, self.home),
                    preexec_fn=self._in_child,
                )
            finally:
                if out is not log:
                    os.close(out)  # the server holds the pipe's write end now; grep ends when it closes
        self.started_at = time.monotonic()

    def _start_filter(self, log):
        """The write end of a pipe into ``grep -v NOISE`` appending to ``log`` (line by line, so readers see each
        line as the server writes it); ``log`` itself where there is no grep."""
        grep = shutil.which("grep")
        if grep is None:
            self._filter = None
            return log
        read, write = os.pipe()
        try:
            self._filter = subprocess.Popen(
                [grep, "--line-buffered", "-a", "-v", "-E", NOISE],
                stdin=read,
                stdout=log,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        finally:
            os.close(read)
        return write

    def _wait_filter(self) -> None:
        """Once the server has ended: the filter has written the log's last lines (at EOF it exits)."""
        if self._filter is None:
            return
        try:
            self._filter.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._filter.kill()
            self._filter.wait()
        self._filter = None

    def _in_child(self) -> None:
        _die_with_parent()
        if self.cgroup:
            self.cgroup.join()

    def _note_exit(self) -> None:
        """Once the process has ended under a host budget: the OOM killer's line in its log, if it ended it."""
        if self.proc is not None and self.proc.poll() is not None:
            self._wait_filter()
        if self.cgroup and not self._exit_noted and self.proc is not None and self.proc.poll() is not None:
            self._exit_noted = True
            self.cgroup.note_exit(self.log_path)

    def alive(self) -> bool:
        if self.proc is not None and self.proc.poll() is None:
            return True
        self._note_exit()
        return False

    def _listening(self) -> bool:
        """Whether our own process (not some other program) holds the port."""
        try:
            conns = psutil.Process(self.proc.pid).net_connections(kind="tcp")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return False
        return any(c.status == psutil.CONN_LISTEN and c.laddr.port == self.port for c in conns)

    def wait_ready(self, timeout_s: float) -> str:
        """Poll /health: "ready", "exited" (the process ended), or "timeout". A 200 counts only
        while our process is the one listening on the port."""
        deadline = time.monotonic() + timeout_s
        session = requests.Session()
        while time.monotonic() < deadline:
            if not self.alive():
                self.returncode = self.proc.returncode
                self._remove_key()
                return "exited"
            try:
                if session.get(f"{self.url}/health", timeout=2).status_code == 200 and self._listening():
                    self.ready_after_s = time.monotonic() - self.started_at
                    self._remove_key()  # read at its start: it answers /health only after parsing its arguments
                    self._refuse_foreign_config()
                    return "ready"
            except requests.RequestException:
                pass
            time.sleep(0.1)
        return "timeout"

    def _refuse_foreign_config(self) -> None:
        """ForeignSettings where the log says llama.cpp applied a config file (its settings unseen by the record)."""
        if found := CONFIG_READ_RE.search(self.log_text()):
            raise ForeignSettings(
                f"llama-server read {found[1].strip()} before its command line, so settings the record does not "
                "show applied; move that file away while crashline runs"
            )

    def start_ready(self, timeout_s: float, on_start=None, attempts: int = PORT_ATTEMPTS, append: bool = False) -> str:
        """Start and wait until ready; when another program took the port between choosing and
        binding it, start again on another one (up to ``attempts`` times). ``on_start(self)`` is
        called after each start. ``append``: the log goes on after what an earlier start wrote."""
        for attempt in range(attempts):
            self.returncode = None
            self.start(append=append or attempt > 0)
            if on_start:
                on_start(self)
            state = self.wait_ready(timeout_s)
            if state != "exited" or not BIND_FAILED_RE.search(self.log_text()) or attempt == attempts - 1:
                return state
            with open_output(self.log_path, append=True) as log:
                log.write(f"crashline: port {self.port} was taken by another program; starting again on another\n")
        return state

    def stop(self, timeout_s: float = 30) -> int | None:
        """SIGINT, wait; then SIGKILL the whole process group. Returns the exit status."""
        self._remove_key()
        if self.proc is None:
            self._remove_cgroup()
            self._remove_home()
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
        self._note_exit()
        self._remove_cgroup()
        self._remove_home()
        return self.returncode

    def _remove_cgroup(self) -> None:
        if self.cgroup:
            peaks = [p for p in (self.host_peak_mib, self.cgroup.peak_mib()) if p is not None]
            self.host_peak_mib = max(peaks, default=None)  # over every start (the restart case starts it again)
            self.cgroup.remove()
            self.cgroup = None

    def log_size(self) -> int:
        """Where the log ends now: the offset ``log_since`` reads on from."""
        try:
            return self.log_path.stat().st_size
        except FileNotFoundError:
            return 0

    def log_since(self, offset: int) -> tuple[str, int]:
        """The whole lines the log gained after byte ``offset``, and the offset after them (a line still being
        written waits for the next call)."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(offset)
                data = f.read()
        except FileNotFoundError:
            return "", offset
        whole = data[: data.rfind(b"\n") + 1]
        return whole.decode(errors="replace"), offset + len(whole)

    def log_text(self) -> str:
        self._note_exit()
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
