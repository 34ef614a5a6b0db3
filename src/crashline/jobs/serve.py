"""The server job's lifecycle, one place for every job that serves a model (a measurement, a search's probe, a
needle recall check): lease → ballast → start → the job's work → classify → stop, whatever happens, with the
record's head filled on the way (the lease, the GPUs, the ballast, the command, the load time) and one failure
(the budget refused, the load failed, the server ended on its own, a crashline fault). The job's work runs only
on a server that is ready."""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..core import host, progress
from ..core.atomic import open_output
from ..core.locks import Lease, LeaseError, UnsafeLockError, lease_for
from ..core.records import Outcome
from ..engine import logparse
from ..engine.ballast import Ballast, BudgetError
from ..engine.server import ForeignSettings, ServerProcess
from ..engine.telemetry import Sampler
from .contract import Budget, Item, JobInputs, ServerLimits

SERVER_FIELDS = ("binary", "obtained", "sha256", "version", "backend", "source", "build_flags")  # of provenance


def model_summary(name: str, fetch_record: dict, manifest: dict) -> dict:
    return {
        "name": name,
        "source": fetch_record["source"],
        "path": fetch_record["files"][0]["path"],
        "sha256": fetch_record["sha256"],
        "files": [{k: f[k] for k in ("name", "bytes", "sha256")} for f in fetch_record["files"]],
        "architecture": manifest.get("architecture"),
        "quantisation": manifest.get("file_type"),
        "total_bytes": manifest.get("total_bytes"),
        "layers": manifest.get("layers"),
        "n_expert": manifest.get("n_expert"),
        "n_expert_used": manifest.get("n_expert_used"),
    }


@dataclass(frozen=True)
class RecordHead:
    """What a measure and a needle record both say of their job: the configuration's id, the model, the settings
    run, the llama-server build, the host as the job began, and how the job ended (``ended``: its outcome, failure,
    phase and message; None while it runs). Each part goes where the records have always had it: ``opening``
    first, ``where`` after the kind's own keys, ``ending`` when the job is done."""

    id: str
    model: dict
    settings: dict
    server: dict
    host: dict
    outcome: str | None = None
    failure: str | None = None
    phase: str | None = None
    message: str | None = None

    @classmethod
    def of(cls, model_name: str, item: Item, inputs: JobInputs) -> RecordHead:
        model = model_summary(model_name, inputs.fetch_record, inputs.manifest or {})
        server = {k: inputs.provenance.get(k) for k in SERVER_FIELDS}
        return cls(item.id, model, item.settings, server, host.describe())

    def ended(self, failure: dict) -> RecordHead:
        """The head of a job that ended so (a failure dict, as ``logparse.classify`` gives it)."""
        return dataclasses.replace(
            self,
            outcome=failure["outcome"],
            failure=failure.get("failure"),
            phase=failure.get("phase"),
            message=failure.get("message"),
        )

    def opening(self) -> dict:
        return {"config_id": self.id, "model": self.model, "settings": self.settings}

    def where(self) -> dict:
        return {"server": self.server, "host": self.host}

    def ending(self) -> dict:
        return {"outcome": self.outcome, "failure": self.failure, "phase": self.phase, "message": self.message}


def outcome_text(failure: dict) -> str:
    """A measurement's outcome in a progress line: "crashed (warmup: killed by SIGSEGV)",
    "load_failed: kv_cache (load: failed to allocate ...)", "ok"."""
    outcome, kind = str(failure["outcome"]), failure.get("failure")
    head = f"{outcome}: {kind}" if kind and kind not in (outcome, "signal", "timeout", "exit_code") else outcome
    message = (failure.get("message") or "").strip().splitlines()
    detail = ": ".join(x for x in (failure.get("phase"), message[0] if message else None) if x)
    return f"{head} ({detail})" if detail else head


def under_lease(held: Lease, record: dict, server: ServerProcess, settings: dict) -> None:
    """What a job's lease changes: the record names the GPUs it holds (and the lease), and the server's command
    gets the lease's arguments (threads for its share of the CPUs)."""
    record.update(host=host.describe(held.uuids or None), lease=held.describe())
    server.base_command = [*server.base_command, *held.server_args(settings)]


def start_refused(exc: BudgetError | LeaseError) -> dict:
    """The failure of a job whose server never started: the budget could not be emulated, or its GPUs not had."""
    kind = "budget" if isinstance(exc, BudgetError) else "gpus"
    return {"outcome": Outcome.BUDGET_REFUSED, "failure": kind, "phase": "start", "message": str(exc)}


def say_start(model_name: str, command: list[str], budget_mib: int | None, what: str = "") -> None:
    """What is started: the model and every llama-server argument after the model's path."""
    budget = f", under a VRAM budget of {budget_mib:,} MiB" if budget_mib else ""
    progress.say(f"starting llama-server{what}: {model_name} {' '.join(command[3:])}{budget}")


def say_loaded(server: ServerProcess, failure: dict | None) -> None:
    if failure is None:
        progress.say(f"llama-server ready in {server.ready_after_s:.1f} s")
    else:
        progress.say(f"llama-server did not start: {outcome_text(failure)}")


def server_failure(server: ServerProcess, phase: str, timed_out: bool = False) -> dict:
    """Classify a server that died (or hung) during ``phase`` from its log and exit status.

    A server that ended on its own is a failure even when its exit looks clean (status 0, or a
    SIGTERM from someone else): only crashline stops a server whose work is done."""
    if timed_out:
        server.stop(timeout_s=5)
    else:
        server.proc.wait(timeout=30)
        server.returncode = server.proc.returncode
    found = logparse.classify(server.log_text(), server.returncode, phase_hint=phase, timed_out=timed_out)
    own = f"the server ended on its own during {phase} (crashline did not stop it)"
    if found["failure"] == "exit_code":  # an exit status after listening: it quit, nothing crashed it
        return {**found, "failure": "exited", "message": f"{found['message']}: {own}"}
    if found["outcome"] != Outcome.OK:
        return found
    code = server.returncode
    how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
    return {
        "outcome": Outcome.LOAD_FAILED if phase == "load" else Outcome.CRASHED,
        "failure": "exited",
        "phase": phase,
        "message": f"{how}: {own}",
    }


class ServerJob:
    """One job's server from its lease to its stop (``run``); ``failure`` is what went wrong, None while nothing has.

    ``limits``: how long its server may take to start and to stop; ``budget``: the card it emulates (a ballast takes
    the rest of the GPU's memory).
    ``record`` gets the lease, the host, the ballast, the command and the load time; ``lap(name)`` is told each step
    (lock_wait, ballast, server_start, stop) for the job's time budget; ``telemetry`` (the interval, or None) samples
    the server from before its start into ``sampler``. ``what`` names the start in its progress line."""

    def __init__(
        self,
        *,
        holder: str,
        server: ServerProcess,
        limits: ServerLimits,
        budget: Budget,
        record: dict,
        telemetry: float | None = None,
        what: str = "",
        lap: Callable[[str], None] = lambda _name: None,
    ):
        self.holder, self.server, self.limits, self.budget, self.record = holder, server, limits, budget, record
        self.telemetry, self.what, self.lap = telemetry, what, lap
        self.failure: dict | None = None
        self.ended: dict | None = None  # the work's own account of the server's end (a claims row's workload)
        self.sampler: Sampler | None = None
        self._phase = "start"

    @property
    def phase(self) -> str:
        """Where the job is: start, load, the sampler's phase (a workload) or the one ``phase`` set, stop."""
        return self.sampler.current if self.sampler and self._phase not in ("start", "stop") else self._phase

    @phase.setter
    def phase(self, name: str) -> None:
        self._phase = name

    def run(self, work: Callable[[ServerJob], None], log_path: Path) -> None:
        """Start the server under the job's lease and budget, ``work(self)`` once it is ready, stop it; a refusal
        or a crashline fault becomes ``failure`` (and the server's log says so where no server wrote one: the job's
        outputs are all there), and no server outlives this call. A lock folder another user could swap
        (UnsafeLockError) is no result of this configuration: it ends the job with its one-line error, as it would
        end every job of the run."""
        try:
            self._serve(work)
        except UnsafeLockError:
            raise
        except (BudgetError, LeaseError) as exc:
            self.failure = start_refused(exc)
            log_path.parent.mkdir(parents=True, exist_ok=True)
            with open_output(log_path) as log:
                log.write(f"crashline: no llama-server started: {exc}\n")
        except ForeignSettings as exc:  # a llama.cpp config file would set what the record cannot show
            self.failure = {
                "outcome": Outcome.ERROR,
                "failure": "foreign_settings",
                "phase": "load",
                "message": str(exc),
            }
            progress.say(f"llama-server refused: {exc}")
        except Exception as exc:  # a crashline fault still leaves a record and no server behind
            message = f"{type(exc).__name__}: {exc}"
            self.failure = {"outcome": Outcome.ERROR, "failure": "crashline", "phase": self.phase, "message": message}
            if not log_path.exists():  # no server wrote it: the job's output says why instead of going missing
                log_path.parent.mkdir(parents=True, exist_ok=True)
                with open_output(log_path) as log:
                    log.write(f"crashline: no llama-server started: {message}\n")
        finally:
            self.server.stop(5)

    def _serve(self, work: Callable[[ServerJob], None]) -> None:
        server, record, limits = self.server, self.record, self.limits
        settings = record["settings"]
        budget_mib = self.budget.vram_budget_mib
        with lease_for(self.holder, settings, record["model"].get("layers")) as held:
            self.lap("lock_wait")
            under_lease(held, record, server, settings)
            with Ballast(budget_mib, held.uuids) if budget_mib else contextlib.nullcontext() as ballast:
                record["ballast"] = ballast.info if ballast else None
                self.lap("ballast")
                if self.telemetry is not None:
                    self.sampler = Sampler(interval_s=self.telemetry, uuids=held.uuids or None)
                with self.sampler or contextlib.nullcontext():
                    self.phase = "load"
                    say_start(record["model"]["name"], server.base_command, budget_mib, self.what)
                    follow = (lambda srv: self.sampler.follow(srv.proc.pid)) if self.sampler else None
                    state = server.start_ready(limits.startup_timeout_s, follow)
                    self.lap("server_start")
                    record["command"] = server.command
                    if state == "ready":
                        record["load_s"] = round(server.ready_after_s, 2)
                        say_loaded(server, None)
                        work(self)
                    else:
                        self.failure = server_failure(server, "load", timed_out=(state == "timeout"))
                        say_loaded(server, self.failure)
                    self.phase = "stop"
                    if self.sampler:
                        self.sampler.phase("stop")
                    if self.failure is None and self.ended is None and not server.alive():  # answered all, then quit
                        self.failure = server_failure(server, "stop")
                    server.stop(limits.stop_timeout_s)
                    self.lap("stop")


class Stopwatch:
    """Where a job's time goes: ``lap(name)`` adds the seconds since the previous lap to ``name``; ``budget()``
    is every lap and the total, rounded to milliseconds."""

    def __init__(self):
        self.started = self.last = time.monotonic()
        self.laps: dict[str, float] = {}

    def lap(self, name: str) -> None:
        now = time.monotonic()
        self.laps[name] = self.laps.get(name, 0.0) + now - self.last
        self.last = now

    def budget(self) -> dict[str, float]:
        return {**{k: round(v, 3) for k, v in self.laps.items()}, "total": round(self.last - self.started, 3)}
