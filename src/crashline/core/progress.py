"""Progress lines on the user's console while a job runs: one line at a time, flushed, prefixed by
the job ("[measure tiny 9893f4ee63] ready in 1.4 s").

Every line goes to stderr, which is the job's log under Snakemake (``scripts/job.py`` points fd 2
at the rule's log file). ``scripts/job.py`` first keeps a duplicate of the terminal's fd 2 and
hands it to ``to_console``: lines then go to the log and to the console. A verb run by hand
(``python -m crashline measure ...``) has its stderr on the console already and writes each line
once. A console that went away (a closed pipe) is dropped silently; the job goes on.

``Meter`` reports a long task (bytes read, build steps) at most once every ``EVERY_S`` seconds,
so a short task says nothing and a long one never floods the console.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator

EVERY_S = 10.0  # at most one Meter line this often
HEARTBEAT_S = 30.0  # at least one line this often from a step that prints nothing by itself
MAX_CHARS = 1000  # a line longer than this is cut (progress lines are one line, not a log tail)

_lock = threading.Lock()
_console: int | None = None  # a duplicate of the terminal's stderr (Snakemake jobs only)
_label: str | None = None


def to_console(fd: int, label: str | None = None) -> None:
    """Also write every line to ``fd`` (the console), besides stderr; ``label`` names the job."""
    global _console
    _console = fd
    if label:
        set_label(label)


def set_label(label: str | None) -> None:
    global _label
    _label = label


@contextlib.contextmanager
def job(name: str) -> Iterator[None]:
    """Name the lines of a job, unless an outer job named them already (a search's probes keep the
    search's name; a job under Snakemake keeps the rule's)."""
    if _label is not None:
        yield
        return
    set_label(name)
    try:
        yield
    finally:
        set_label(None)


def line(text: str) -> str:
    """The line as written: the job's name, the text on one line, at most MAX_CHARS characters."""
    text = " ".join(str(text).split("\n")).rstrip()
    if len(text) > MAX_CHARS:
        text = text[: MAX_CHARS - 1] + "…"
    return f"[{_label or 'crashline'}] {text}"


def _same_file(fd: int, stream) -> bool:
    try:
        a, b = os.fstat(fd), os.fstat(stream.fileno())
    except (OSError, ValueError, AttributeError):
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def say(text: str, log: bool = True) -> None:
    """Write one progress line to stderr (the log under Snakemake) and to the console; ``log=False``:
    to the console alone (a line the log has already)."""
    global _console
    out = line(text) + "\n"
    with _lock:
        stderr = sys.stderr
        if log:
            with contextlib.suppress(OSError, ValueError, AttributeError):
                stderr.write(out)
                stderr.flush()
        if _console is not None and not _same_file(_console, stderr):
            try:
                os.write(_console, out.encode("utf-8", errors="replace"))
            except OSError:  # the console is gone (snakemake killed, pipe closed): keep the job going
                _console = None


# --------------------------------------------------------------------------- amounts and rates


def size(n: float) -> str:
    """Bytes as people read them: 512 B, 3.4 MiB, 40.1 GiB."""
    if abs(n) < 1024:
        return f"{n:.0f} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        n /= 1024
        if abs(n) < 1024 or unit == "TiB":
            break
    return f"{n:.1f} {unit}"


def duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 10 * 60:
        return f"{seconds / 60:.1f} min"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


class Meter:
    """Progress of one long task: ``update(done)`` with the amount done so far; a line at most every
    ``every_s`` seconds (none for a task shorter than that), and ``finish()`` says it ended when any
    line was shown. ``unit`` "bytes" shows sizes and a rate, "steps" shows "123/456", "%" a share.
    ``start``: the amount done before (a resumed download), left out of the rate."""

    def __init__(
        self,
        what: str,
        total: float | None = None,
        unit: str = "bytes",
        every_s: float = EVERY_S,
        clock: Callable[[], float] = time.monotonic,
        start: float = 0,
    ):
        self.what, self.total, self.unit, self.every_s, self.clock = what, total, unit, every_s, clock
        self.started = self.last = clock()
        self.done = self.start = start
        self.shown = 0

    def update(self, done: float, total: float | None = None) -> None:
        self.done = done
        if total is not None:
            self.total = total
        now = self.clock()
        if now - self.last >= self.every_s:
            self.last = now
            self.shown += 1
            say(self.text(now))

    def add(self, amount: float) -> None:
        self.update(self.done + amount)

    def _amount(self) -> str:
        if self.unit == "bytes":
            return size(self.done) + (f" of {size(self.total)}" if self.total else "")
        if self.unit == "%":
            return f"{self.done:.0f}%"
        return f"{self.done:.0f}" + (f"/{self.total:.0f}" if self.total else "")

    def text(self, now: float | None = None) -> str:
        """The progress line: amount, share of the total, rate and time left (or spent so far)."""
        elapsed = (self.clock() if now is None else now) - self.started
        total = 100 if self.unit == "%" else self.total
        line = f"{self.what}: {self._amount()}"
        if self.total and self.unit != "%":
            line += f" ({min(100.0, self.done / self.total * 100):.0f}%)"
        rate = (self.done - self.start) / elapsed if elapsed > 0 else 0
        if self.unit == "bytes" and elapsed > 0:
            line += f", {size(rate)}/s"
        if total and rate > 0 and self.done < total:
            return line + f", about {duration((total - self.done) / rate)} left"
        return line + f", {duration(elapsed)} so far"

    def finish(self, note: str = "") -> None:
        """Say the task ended (only when a progress line was shown: a short task stays quiet)."""
        if self.shown:
            amount = size(self.done) if self.unit == "bytes" else ""
            said = ", ".join(x for x in (amount, f"in {duration(self.clock() - self.started)}", note) if x)
            say(f"{self.what}: done, {said}")


@contextlib.contextmanager
def heartbeat(what: str, every_s: float | None = None, clock: Callable[[], float] = time.monotonic):
    """Say "WHAT: still running, T so far" every ``every_s`` seconds (HEARTBEAT_S) from a thread while the block
    runs (a child process that prints nothing until it ends, as llama-bench; a user sees a line that often)."""
    every_s = HEARTBEAT_S if every_s is None else every_s
    stop, started = threading.Event(), clock()

    def run() -> None:
        while not stop.wait(every_s):
            say(f"{what}: still running, {duration(clock() - started)} so far")

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


@contextlib.contextmanager
def watching(what: str, measure: Callable[[], float], total: float | None = None, every_s: float = EVERY_S):
    """Report ``measure()`` (bytes so far, e.g. the size of a file another library downloads) every
    ``every_s`` seconds from a thread while the block runs."""
    meter = Meter(what, total, every_s=0)  # the thread keeps the pace
    stop = threading.Event()

    def run() -> None:
        while not stop.wait(every_s):
            with contextlib.suppress(OSError):
                meter.update(measure())

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield meter
    finally:
        stop.set()
        thread.join()
        with contextlib.suppress(OSError):
            meter.done = measure()  # the end, whenever it came
        meter.finish()
