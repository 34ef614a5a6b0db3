"""A host-memory budget for one llama-server: a memory cgroup of its own with that limit, so the kernel's OOM
killer ends the server where the user's machine would (``budget.host_ram_mib``).

cgroup v2 is used where its memory controller can be had for a child of this process's cgroup, else cgroup v1's
memory hierarchy; where neither can be written (no root, no delegated cgroup) the budget cannot be emulated and
the job says so (``HostBudgetError``, a ``BudgetError``: no server starts). Swap is limited to nothing, so the limit
is RAM alone. The server joins the group in its child before exec, so everything it allocates is charged there.

After the server ended, ``note_exit`` appends one crashline line to its log when the OOM killer ended it there:
every reader of the log (``logparse.classify``) then says ``oom_host``, never "crashed"."""

from __future__ import annotations

import contextlib
import itertools
import os
import time
from pathlib import Path

from .ballast import BudgetError
from ..core.atomic import open_output
from ..core.units import MIB

MOUNTS = Path("/proc/self/mounts")
OWN_CGROUPS = Path("/proc/self/cgroup")
_names = itertools.count()

# The line note_exit writes; logparse finds it by OOM_MARK (one wording, two ends).
OOM_MARK = "crashline: the kernel's OOM killer ended llama-server"
OOM_LINE = OOM_MARK + " at the host memory budget of {limit} MiB (peak {peak})"


class HostBudgetError(BudgetError):
    """The host-memory budget cannot be set on this machine."""


def _mounts() -> list[tuple[str, str, set[str]]]:
    """(mount point, type, options) of every cgroup mount."""
    out = []
    for line in MOUNTS.read_text().splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[2] in ("cgroup", "cgroup2"):
            out.append((parts[1], parts[2], set(parts[3].split(","))))
    return out


def _own_paths() -> dict[str, str]:
    """This process's cgroup per hierarchy: "" for v2, else each v1 controller."""
    out = {}
    for line in OWN_CGROUPS.read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for name in controllers.split(",") if controllers else [""]:
            out[name] = path
    return out


def _inside(mount: str, path: str) -> Path:
    """The folder of cgroup ``path`` under ``mount`` (a container may see its own cgroup as the mount's root)."""
    full = Path(mount) / path.lstrip("/")
    return full if full.is_dir() else Path(mount)


def _v2_parent() -> Path | None:
    own = _own_paths().get("")
    for mount, kind, _ in _mounts():
        if kind != "cgroup2" or own is None:
            continue
        parent = _inside(mount, own)
        try:
            if "memory" not in (parent / "cgroup.controllers").read_text().split():
                continue
            if "memory" not in (parent / "cgroup.subtree_control").read_text().split():
                (parent / "cgroup.subtree_control").write_text("+memory")  # EBUSY where processes live in it
            return parent
        except OSError:
            continue
    return None


def _v1_parent() -> Path | None:
    own = _own_paths().get("memory")
    for mount, kind, options in _mounts():
        if kind == "cgroup" and "memory" in options and own is not None:
            parent = _inside(mount, own)
            if os.access(parent, os.W_OK):
                return parent
    return None


class MemoryCgroup:
    """One cgroup with a memory limit, made by ``create`` and removed by ``remove`` (kept in one object so the
    server that uses it removes it)."""

    def __init__(self, limit_mib: int):
        self.limit_mib = int(limit_mib)
        self.path: Path | None = None
        self.version: int | None = None

    def create(self) -> MemoryCgroup:
        name = f"crashline-{os.getuid()}-{os.getpid()}-{next(_names)}"
        for version, parent in ((2, _v2_parent), (1, _v1_parent)):
            where = parent()
            if where is None:
                continue
            path = where / name
            try:
                path.mkdir()
            except OSError:
                continue
            self.path, self.version = path, version
            try:
                self._limit()
            except OSError as exc:
                self.remove()
                raise HostBudgetError(f"budget.host_ram_mib: {self.limit_mib} could not be set on {path}: {exc}")
            return self
        raise HostBudgetError(
            f"budget.host_ram_mib: {self.limit_mib} cannot be emulated here: no memory cgroup can be made (cgroup v2 "
            "with its memory controller, or v1's memory hierarchy, writable by this user). Run as root or in a "
            "cgroup delegated to this user (systemd-run --user --scope -p Delegate=yes), or remove host_ram_mib"
        )

    def _limit(self) -> None:
        size = str(self.limit_mib * MIB)
        if self.version == 2:
            (self.path / "memory.max").write_text(size)
            for name, value in (("memory.swap.max", "0"), ("memory.oom.group", "1")):
                with contextlib.suppress(FileNotFoundError):
                    (self.path / name).write_text(value)
        else:
            (self.path / "memory.limit_in_bytes").write_text(size)
            with contextlib.suppress(FileNotFoundError):  # no swap accounting: nothing to limit
                (self.path / "memory.memsw.limit_in_bytes").write_text(size)

    def join(self) -> None:
        """Move the calling process into the group (the server's child, before exec)."""
        (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def _read(self, name: str) -> str | None:
        try:
            return (self.path / name).read_text()
        except (OSError, TypeError):
            return None

    def oom_kills(self) -> int:
        """How many processes the OOM killer ended in the group."""
        text = self._read("memory.events" if self.version == 2 else "memory.oom_control") or ""
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        if self.version == 1:  # kernels before 4.13 count no kills: a limit reached counts as one
            failed = self._read("memory.failcnt")
            return 1 if failed and int(failed) > 0 and "under_oom 1" in text else 0
        return 0

    def peak_mib(self) -> float | None:
        """The group's peak memory use (RAM, the page cache it charged included), where the kernel keeps one."""
        text = self._read("memory.peak" if self.version == 2 else "memory.max_usage_in_bytes")
        return round(int(text) / MIB, 1) if text and text.strip().isdigit() else None

    def note_exit(self, log_path: Path) -> bool:
        """After the server ended: append OOM_LINE to its log if the OOM killer ended it here. True if so."""
        if self.path is None or self.oom_kills() == 0:
            return False
        peak = self.peak_mib()
        with open_output(log_path, append=True) as log:
            log.write(OOM_LINE.format(limit=self.limit_mib, peak=f"{peak:,.0f} MiB" if peak else "unknown") + "\n")
        return True

    def remove(self, timeout_s: float = 5) -> None:
        """Remove the group once its processes are gone (the caller has ended them)."""
        if self.path is None:
            return
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self.path.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                if time.monotonic() > deadline:
                    break  # a process still in it: left for the kernel, named nowhere else
                time.sleep(0.05)
        self.path = None
