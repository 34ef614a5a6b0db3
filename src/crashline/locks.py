"""One llama-server at a time on this machine, across every crashline run.

Snakemake's ``server`` resource admits one server job at a time inside one run; two runs (two
folders sharing a machine, or a rerun started after ``--unlock`` while an orphaned job still runs)
would otherwise measure each other. The lock is a file lock (``flock``) held for the whole life of
the ballast and the server: the kernel releases it when its holder dies, however it dies.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from pathlib import Path

from . import progress

LOCK_DIR = Path(os.environ.get("CRASHLINE_LOCK_DIR", "/tmp/crashline-locks"))


@contextlib.contextmanager
def held(path: Path, what: str, waiting: str):
    """Hold an exclusive flock on ``path`` for ``what``. While another process holds it, print ``waiting``
    (formatted with ``holder``, the pid and purpose the holder wrote into the file, and ``lock``) and wait.
    The kernel releases the lock when its holder exits, killed or not: no stale lock remains."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "another process"
            progress.say(f"{what} {waiting.format(holder=holder, lock=path)}")
            started = time.monotonic()
            fcntl.flock(f, fcntl.LOCK_EX)
            progress.say(f"{what} got the lock after {time.monotonic() - started:.0f} s")
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()} ({what})\n")
        f.flush()
        try:
            yield path
        finally:
            f.seek(0)
            f.truncate()
            fcntl.flock(f, fcntl.LOCK_UN)


def server_lock(what: str, lock_dir: Path | None = None):
    """Hold the machine's server lock; wait (saying who holds it) while another job does."""
    lock_dir = Path(lock_dir or LOCK_DIR)
    lock_dir.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(PermissionError):
        lock_dir.chmod(0o1777)  # every user's runs share it, as they share the GPU
    return held(lock_dir / "server.lock", what, "waits for the llama-server of {holder} to stop (lock {lock})")
