"""Who may run a llama-server now: a job's lease on its GPUs (or, without a GPU, on the machine).

Snakemake's ``gpu`` resource admits N server jobs at once inside one run; two runs (two folders sharing
a machine, or a rerun started after ``--unlock`` while an orphaned job still runs) would otherwise
measure each other. A lease is a file lock (``flock``) per GPU, named by the GPU's UUID, held for the
whole life of the job's ballast and server: the kernel releases it when its holder dies, however it
dies. On a machine without a GPU one lock stands for the machine: one server at a time.

While a job holds a lease, ``CUDA_VISIBLE_DEVICES`` names its GPUs by UUID (``CUDA_DEVICE_ORDER`` is
PCI_BUS_ID, nvidia-smi's order), so the server, llama-bench and the ballast see those GPUs alone; the
sampler and the records name them by UUID. With several GPUs visible, a job also gets its GPU's share
of the CPUs (those NVML calls local to it, split by physical core among the GPUs that share them) and,
unless its configuration sets ``threads``, as many threads as the share has cores: a measurement does
not depend on how many others ran beside it. Make only one GPU visible to give a job every core.

Jobs whose configuration keeps model weights in host memory (experts or layers on the CPU) read them at every
token, and two of them at once share the host's memory bandwidth: on two H200s their decode beside another
such job was 0.58-1.07x of their speed alone, median 0.81 (bench/results/multigpu-h200x2/first-run-env-bug).
Such a job also holds the host's memory lock, so they run one at a time while configurations wholly on their
GPUs run beside them.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import pwd
import random
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import host, progress, settings as settings_mod
from .errors import CrashlineError

# Each user's runs lock in a folder of their own (0700): a folder every user may write to lets anyone plant a
# symbolic link or a file there. An administrator who wants every user's runs to share the GPUs' locks makes one
# folder owned by root with the sticky bit (as /tmp) and points CRASHLINE_LOCK_DIR at it.
DEFAULT_LOCK_DIR = Path(f"/tmp/crashline-locks-{os.getuid()}")
LOCK_DIR = Path(os.environ.get("CRASHLINE_LOCK_DIR", DEFAULT_LOCK_DIR))


class UnsafeLockError(CrashlineError, RuntimeError):
    """A lock folder or file another user could swap or make us write through; the message says which and why."""


STILL_WAITING_S = 30  # a job that waits says so again this often, so that a console is never silent for long


def _wait(f, what: str, started: float) -> None:
    """Take the lock of ``f``, saying every STILL_WAITING_S who holds it and how long this has waited."""
    said = started
    while True:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            now = time.monotonic()
            if now - said >= STILL_WAITING_S:
                progress.say(f"{what} still waits for {f.holder() or 'another process'} ({now - started:.0f} s so far)")
                said = now
            time.sleep(0.2)


@contextlib.contextmanager
def held(path: Path, what: str, waiting: str):
    """Hold an exclusive flock on ``path`` for ``what``. While another process holds it, print ``waiting``
    (formatted with ``holder``, the pid and purpose the holder wrote into the file, and ``lock``) and wait.
    The kernel releases the lock when its holder exits, killed or not: no stale lock remains."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _check_folder(path.parent)
    with _open_lock(path) as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = f.holder() or "another process"
            progress.say(f"{what} {waiting.format(holder=holder, lock=path)}")
            started = time.monotonic()
            _wait(f, what, started)
            progress.say(f"{what} got the lock after {time.monotonic() - started:.0f} s")
        f.say(f"pid {os.getpid()} ({what})\n")
        try:
            yield path
        finally:
            f.say("")
            fcntl.flock(f, fcntl.LOCK_UN)


class Busy(RuntimeError):
    """A lock that another process holds, where waiting for it is not what the caller wants."""


@contextlib.contextmanager
def exclusive(path: Path, what: str):
    """Hold the lock at ``path`` for ``what``, or raise Busy at once, naming its holder."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _check_folder(path.parent)
    f = _try_lock(path, what)
    if f is None:
        raise Busy(f"{_holders([path])} holds {path}")
    try:
        yield path
    finally:
        _release([f])


def _lock_dir(lock_dir: Path | None) -> Path:
    """The lock folder, made 0700 where it is missing; one that another user could change is refused."""
    lock_dir = Path(lock_dir or LOCK_DIR)
    with contextlib.suppress(FileExistsError):
        lock_dir.mkdir(mode=0o700, parents=True)
    _check_folder(lock_dir)
    return lock_dir


def _check_folder(folder: Path) -> None:
    """A folder is safe to lock in when it is no symbolic link and nobody but us (and root) can replace what it
    holds: ours, or root's; and where others may write to it, sticky, so that they cannot remove our files."""
    st = os.lstat(folder)
    own = "a folder of your own, e.g. export CRASHLINE_LOCK_DIR=$HOME/.cache/crashline/locks"
    fix = f"remove it, or set CRASHLINE_LOCK_DIR to {own} (the default is {DEFAULT_LOCK_DIR})"
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise UnsafeLockError(
            f"lock folder {folder} is {'a symbolic link' if stat.S_ISLNK(st.st_mode) else 'no folder'}; {fix}"
        )
    if st.st_uid not in (os.getuid(), 0):
        try:
            owner = f"user {st.st_uid} ({pwd.getpwuid(st.st_uid).pw_name})"
        except KeyError:
            owner = f"user {st.st_uid}"
        raise UnsafeLockError(
            f"lock folder {folder} belongs to {owner}, who could swap its locks; have its owner or root remove it, "
            f"or set CRASHLINE_LOCK_DIR to {own}"
        )
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
        raise UnsafeLockError(
            f"lock folder {folder} is writable by others (mode {stat.S_IMODE(st.st_mode):o}) without the sticky bit; "
            f"chmod +t or go-w it, or {fix}"
        )


class LeaseError(RuntimeError):
    """A job needs more GPUs than this machine lets it see, or CUDA_VISIBLE_DEVICES names one it does not have."""


@dataclass
class Lease:
    """What a job holds: its GPUs (NVML's descriptions, with ``uuid``), its CPUs (None: every one this process
    may use) and the threads a server gets where its configuration sets none (None: llama.cpp's choice)."""

    gpus: list[dict] = field(default_factory=list)
    cpus: list[int] | None = None
    threads: int | None = None
    waited_s: float = 0.0
    host_memory: bool = False  # it held the host's memory lock beside its GPUs

    @property
    def uuids(self) -> list[str]:
        return [g["uuid"] for g in self.gpus]

    def server_args(self, settings: dict) -> list[str]:
        """The arguments the lease adds to a server's command: ``-t`` for its share of the cores."""
        return ["-t", str(self.threads)] if self.threads and settings.get("threads") is None else []

    def describe(self) -> dict:
        return {
            "gpus": self.uuids,
            "cpus": self.cpus,
            "threads": self.threads,
            "host_memory": self.host_memory,
            "waited_s": round(self.waited_s, 3),
        }


_current: Lease | None = None


def current() -> Lease | None:
    """The lease this process holds, if any."""
    return _current


def visible_gpus() -> tuple[list[dict], str | None]:
    """The GPUs a job may use, in nvidia-smi's order: NVML's, narrowed to CUDA_VISIBLE_DEVICES where it is set
    (its numbers are nvidia-smi's, its UUIDs may be prefixes, as CUDA takes them). ([], why) without any."""
    found = host.gpus()
    if not found["present"]:
        return [], found["reason"]
    devices = found["devices"]
    wanted = os.environ.get("CUDA_VISIBLE_DEVICES")
    known = ", ".join(f"{d['index']}: {d['name']} {d['uuid']}" for d in devices)
    if wanted is None:
        return _one_kind(devices, known), None
    picked = []
    for entry in (e.strip() for e in wanted.split(",") if e.strip()):
        match = [d for d in devices if (str(d["index"]) == entry if entry.isdigit() else d["uuid"].startswith(entry))]
        if len(match) != 1:
            raise LeaseError(
                f"CUDA_VISIBLE_DEVICES={wanted!r} names {entry!r}, which is none of this machine's GPUs "
                f"({known}; MIG instances are not supported)"
            )
        picked += match
    if not picked:
        return [], "no GPU (CUDA_VISIBLE_DEVICES is empty)"
    return _one_kind(picked, known), None


def _one_kind(gpus: list[dict], known: str) -> list[dict]:
    """The GPUs of the first one's model: a sweep over GPUs of two models would land in two rankings by the luck
    of which was free. The others are left out, said, until CUDA_VISIBLE_DEVICES names them first."""
    kept = [g for g in gpus if g["name"] == gpus[0]["name"]]
    if len(kept) < len(gpus):
        left = ", ".join(f"{g['index']}: {g['name']}" for g in gpus if g not in kept)
        progress.say(
            f"measuring on the {gpus[0]['name']} GPUs only ({', '.join(str(g['index']) for g in kept)}), one kind at "
            f"a time; left out {left} (set CUDA_VISIBLE_DEVICES to measure on those; this machine: {known})"
        )
    return kept


def _cores(cpus: list[int]) -> list[list[int]]:
    """CPUs grouped by physical core (hyperthread siblings together), in order."""
    cores: dict[tuple, list[int]] = {}
    for cpu in cpus:
        topology = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            key = tuple(topology.joinpath(f).read_text().strip() for f in ("physical_package_id", "core_id"))
        except OSError:
            key = ("cpu", str(cpu))
        cores.setdefault(key, []).append(cpu)
    return list(cores.values())


def cpu_share(visible: list[dict], leased: list[dict], allowed: set[int]) -> list[int] | None:
    """The CPUs of the leased GPUs' shares: each visible GPU's local CPUs (all allowed ones where NVML names none),
    split by physical core among the visible GPUs with the same local CPUs. None with a single GPU visible."""
    if len(visible) < 2:
        return None
    local = {g["uuid"]: sorted(set(g.get("local_cpus") or allowed) & allowed) or sorted(allowed) for g in visible}
    share: set[int] = set()
    for gpu in leased:
        siblings = [g["uuid"] for g in visible if local[g["uuid"]] == local[gpu["uuid"]]]
        cores = _cores(local[gpu["uuid"]])
        rank, n = siblings.index(gpu["uuid"]), len(siblings)
        part = cores[rank * len(cores) // n : (rank + 1) * len(cores) // n] or cores  # fewer cores than GPUs: share
        share.update(cpu for core in part for cpu in core)
    return sorted(share)


def _open_lock(path: Path):
    """The lock file at ``path``, never through a symbolic link. Ours (made 0644 where missing) opens for writing,
    so that it can say who holds it; another user's (in a shared sticky folder) opens read-only: flock needs no
    more, and we write nothing into a file that is not ours. Anything but a plain file of one link is refused."""
    flags = os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NOCTTY
    try:
        try:
            fd = os.open(path, flags | os.O_RDWR | os.O_CREAT, 0o644)
        except PermissionError:
            fd = os.open(path, flags | os.O_RDONLY)  # another user's lock file in a shared folder
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise UnsafeLockError(
                f"lock file {path} is a symbolic link; remove it (nothing was written through it)"
            ) from e
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
        os.close(fd)
        raise UnsafeLockError(
            f"lock file {path} is not a plain file of one link; remove it (nothing was written to it)"
        )
    writable = st.st_uid == os.getuid() and os.access(f"/proc/self/fd/{fd}", os.W_OK)
    return _LockFile(os.fdopen(fd, "r+" if writable else "r"), writable)


class _LockFile:
    """An open lock file; says who holds it only where the file is ours to write."""

    def __init__(self, f, writable: bool):
        self.f, self.writable = f, writable

    def fileno(self) -> int:
        return self.f.fileno()

    def holder(self) -> str:
        self.f.seek(0)
        return self.f.read(200).strip()

    def say(self, text: str) -> None:
        if self.writable:
            self.f.seek(0)
            self.f.truncate()
            self.f.write(text)
            self.f.flush()

    def close(self) -> None:
        self.f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _try_lock(path: Path, what: str):
    """The open, locked file at ``path``, or None while another process holds it."""
    f = _open_lock(path)
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        return None
    f.say(f"pid {os.getpid()} ({what})\n")
    return f


def _release(files: list) -> None:
    for f in files:
        f.say("")
        fcntl.flock(f, fcntl.LOCK_UN)
        f.close()


def _holders(paths: list[Path]) -> str:
    said = []
    for path in paths:
        with contextlib.suppress(OSError):
            said.append(path.read_text().strip() or "another process")
    return "; ".join(said) or "another process"


def _take_gpus(visible: list[dict], n: int, what: str, lock_dir: Path, poll_s: float = 0.2) -> tuple[list[dict], list]:
    """Lock ``n`` of the visible GPUs, the first free ones in order; while fewer are free, hold none and wait."""
    paths = {g["uuid"]: lock_dir / f"gpu-{g['uuid']}.lock" for g in visible}
    said: float | None = None
    while True:
        taken, files = [], []
        for gpu in visible:
            f = _try_lock(paths[gpu["uuid"]], what)
            if f is not None:
                taken.append(gpu)
                files.append(f)
                if len(taken) == n:
                    return taken, files
        _release(files)  # never hold some while waiting for more: two jobs would each wait for the other's
        if said is None or time.monotonic() - said >= STILL_WAITING_S:
            again = "still " if said is not None else ""
            progress.say(
                f"{what} {again}waits for {n} of {len(visible)} GPUs to be free "
                f"(held by {_holders(list(paths.values()))})"
            )
            said = time.monotonic()
        time.sleep(poll_s * random.uniform(0.5, 1.5))  # two jobs that each want two GPUs do not collide in step


def lease_for(what: str, settings: dict, layers: int | None = None):
    """The lease a configuration's server needs: its GPUs (settings.gpu_count) and, where it reads weights from
    host memory (settings.weights_on_cpu, with the model's ``layers`` where known), the host-memory lock."""
    return lease(what, settings_mod.gpu_count(settings), host_memory=settings_mod.weights_on_cpu(settings, layers))


@contextlib.contextmanager
def lease(what: str, gpus: int = 1, lock_dir: Path | None = None, host_memory: bool = False):
    """Hold ``gpus`` GPUs (or, on a machine without one, the machine) for ``what``; yields the Lease. Inside an
    outer lease of this process (a search's probes), the outer one serves. LeaseError: more GPUs than visible.
    ``host_memory``: the configuration reads weights from host memory (settings.weights_on_cpu); on a machine with
    several GPUs (visible to this job or not: another run may use the others) it holds the host's memory lock too,
    taken before its GPUs so that it keeps no GPU idle while it waits."""
    started = time.monotonic()
    shared = host_memory and _current is None and len(host.gpus().get("devices", [])) > 1
    waits = "waits for {holder}, which reads weights from host memory too"
    with held(_lock_dir(lock_dir) / "host-memory.lock", what, waits) if shared else contextlib.nullcontext():
        with _lease(what, gpus, lock_dir) as taken:
            if shared:
                taken.host_memory, taken.waited_s = True, time.monotonic() - started
            yield taken


@contextlib.contextmanager
def _lease(what: str, gpus: int, lock_dir: Path | None):
    global _current
    if _current is not None:
        if _current.gpus and len(_current.gpus) < gpus:
            raise LeaseError(f"{what} needs {gpus} GPUs; the job holds {len(_current.gpus)}")
        yield _current
        return
    lock_dir = _lock_dir(lock_dir)
    visible, why = visible_gpus()
    started = time.monotonic()
    if not visible:
        if gpus > 1:
            raise LeaseError(f"{what} needs {gpus} GPUs; this machine has none that it may use ({why})")
        with held(lock_dir / "server.lock", what, "waits for the llama-server of {holder} to stop (lock {lock})"):
            _current = Lease(waited_s=time.monotonic() - started)
            try:
                yield _current
            finally:
                _current = None
        return
    if gpus > len(visible):
        raise LeaseError(
            f"{what} needs {gpus} GPUs; this machine lets it use {len(visible)} "
            f"({', '.join(g['name'] + ' ' + g['uuid'] for g in visible)})"
        )
    allowed = set(os.sched_getaffinity(0))
    before = {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")}
    taken, files = _take_gpus(visible, gpus, what, lock_dir)
    cpus = None
    try:
        cpus = cpu_share(visible, taken, allowed)
        os.environ.update(CUDA_DEVICE_ORDER="PCI_BUS_ID", CUDA_VISIBLE_DEVICES=",".join(g["uuid"] for g in taken))
        if cpus is not None:
            os.sched_setaffinity(0, cpus)  # the server and llama-bench inherit it
        _current = Lease(taken, cpus, len(_cores(cpus)) if cpus else None, time.monotonic() - started)
        yield _current
    finally:
        _current = None
        if cpus is not None:
            os.sched_setaffinity(0, allowed)
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        _release(files)
