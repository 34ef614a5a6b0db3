"""How much of a run is left: its server jobs, the server starts each is likely to need, and how long a start has
taken in this run so far.

The workflow writes the run's plan when it starts (``write_plan``, from Snakemake's ``onstart``) and says the whole
run's starts; each server job says what is left when it begins (``say_left``), counting the jobs whose output is
not there yet. A search's starts are the usual course of one (``search_starts``): a calibration, the predicted
value and its neighbour, one for the margin where there is a VRAM limit, the climb and the finalists' further
starts, less the probes it has already recorded. The time is that many starts at the mean time of the server
starts recorded under the plan's paths (measurements and search probes), so it is said only once one is recorded.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from ..config.plan import expand, expand_searches, needle_twin
from ..core import progress
from ..core.atomic import write_json
from ..core.paths import Layout, SearchFolder, measure_records_under
from ..core.settings import fit_aimed
from ..engine import planner

PLAN_ENV = "CRASHLINE_RUN_PLAN"  # where the server jobs of this run find its plan (set by the workflow)
# The starts a --fit on aimed at the margin usually takes: every one of the twelve in the committed leases (sessions
# 16, 17, 23, 24, 30; at 16K and at 100K) left less than the margin at its first target and took two or three. The
# first now ends once loaded where its load peak says serving will leave less (jobs.measure.serving_at_load): a
# load's seconds, so a time limit sets aside one start's worth for it, not two.
AIMED_FIT_STARTS = 2


def search_starts(group: dict, has_limit: bool) -> int:
    """The server starts of a search's usual course (jobs/search.py's steps): its calibration, the predicted value
    and its neighbour, then the rest as the search itself counts it (planner.course_after_boundary)."""
    return (
        1
        + 2
        + planner.course_after_boundary(
            group.get("climb", 0), group.get("starts", 1), has_limit, bool(group.get("partial"))
        )
    )


def search_must(has_limit: bool) -> int:
    """The server starts of a search that a time limit never leaves out, as a typical start's worth: the predicted
    value and its neighbour, and the margin's probe where there is a VRAM limit (its calibration loads and stops in
    seconds). Near a boundary one of them often fails at once, so this errs towards ending within the limit."""
    return 2 + int(has_limit)


def plan(config: dict) -> list[dict]:
    """Every server job of the run: its kind, its output, the server starts it is likely to need (a needle job whose
    twin's recall stands for it needs none) and those a time limit never leaves out (``must``: a configuration's
    first start, one for a --fit on aimed at the margin too, a search's boundary and margin; a needle check's short
    requests count as none); a search also names the folder of its probes."""
    layout = Layout(config["results_dir"])
    has_limit = config["budget"].get("vram_budget_mib") is not None
    jobs = []
    for item in expand(config):
        model, cid = item["model"], item["id"]
        first = AIMED_FIT_STARTS if fit_aimed(item["settings"], item["given"]) else 1
        for k, path in enumerate(layout.start_records(model, cid, item.get("starts", 1)), 1):
            starts = first if k == 1 else 1
            jobs.append({"job": "measure", "out": str(path), "starts": starts, "must": int(k == 1)})
        twin = needle_twin(config, model, cid)
        out = str(layout.needle_record(model, cid))
        jobs.append({"job": "needle", "out": out, "starts": 0 if twin else 1, "must": 0})
    for group in expand_searches(config):
        summary = layout.search(group["model"], group["id"])
        probes = str(SearchFolder(summary.parent).probes())
        starts = search_starts(group, has_limit)
        must = search_must(has_limit)
        jobs.append({"job": "search", "out": str(summary), "starts": starts, "must": must, "probes": probes})
        recall = str(layout.search_recall(group["model"], group["id"]))
        jobs.append({"job": "search_needle", "out": recall, "starts": 1, "must": 0})
    return jobs


def write_plan(config: dict, path: Path) -> list[dict]:
    """The run's plan, and when it started: a run of the same jobs that was stopped (``stop_plan``: SIGTERM to
    ``tune``) and is resumed now goes on counting its time limit from the time it had spent."""
    jobs = plan(config)
    try:
        old = json.loads(path.read_text())
        spent = float(old["spent_s"]) if old.get("jobs") == jobs else 0.0
    except (OSError, ValueError, KeyError, TypeError):
        spent = 0.0
    write_json(path, {"jobs": jobs, "started": time.time() - spent})
    return jobs


def stop_plan(path: Path) -> None:
    """A run stopped: its plan keeps the time spent so far, for the same run resumed (``write_plan``)."""
    try:
        held = json.loads(path.read_text())
        write_json(path, {**held, "spent_s": time.time() - float(held["started"])})
    except (OSError, ValueError, KeyError, TypeError):
        return


def run_started() -> float | None:
    """When this run of the workflow started (``time.time()``, from its plan), None outside one."""
    path = os.environ.get(PLAN_ENV)
    try:
        return float(json.loads(Path(path).read_text())["started"]) if path else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _records(job: dict) -> list[Path]:
    if job["job"] == "measure":
        return [Path(job["out"])] if Path(job["out"]).exists() else []
    if job["job"] == "search":
        return measure_records_under(Path(job["probes"]))
    return []


def left(jobs: list[dict]) -> tuple[int, float | None]:
    """The server starts the jobs whose output is missing are likely to need, and the seconds that many starts take
    at the mean of the starts recorded so far (None before the first)."""
    starts, seconds = 0, []
    for job in jobs:
        records = _records(job)
        for path in records:
            try:
                total = json.loads(path.read_text()).get("time_budget_s", {}).get("total")
            except (OSError, ValueError):  # being written, or left half by a killed job
                continue
            if total:
                seconds.append(float(total))
        if not Path(job["out"]).exists():
            starts += max(1, job["starts"] - len(records)) if job["starts"] else 0
    return starts, (starts * sum(seconds) / len(seconds) if seconds else None)


def text(starts: int, seconds: float | None) -> str:
    if not starts:
        return ""
    took = f", {progress.duration(seconds)} left" if seconds is not None else ""
    return f"run: about {starts} more server start(s){took}"


def reserved(own: Path | None) -> int:
    """The server starts other jobs of this run still owe that a time limit never leaves out (the plan's ``must``,
    less what a job has recorded), for the jobs whose output is missing, other than the one at ``own`` (its output);
    0 outside a workflow."""
    path = os.environ.get(PLAN_ENV)
    try:
        jobs = json.loads(Path(path).read_text())["jobs"] if path else []
    except (OSError, ValueError, KeyError, TypeError):
        return 0
    owed, own = 0, own and Path(own).resolve()
    for job in jobs:
        if job.get("must") and Path(job["out"]).resolve() != own and not Path(job["out"]).exists():
            made = [r for r in _records(job) if r.parent.name != "calibration"]  # a calibration is not owed
            owed += max(0, job["must"] - len(made))
    return owed


def over_time(what: str, limit_s: int | None, took: list[float], since: float, own: Path | None = None) -> str | None:
    """Why ``what``, an optional server start of the job whose output is ``own``, is left out, or None: a typical
    start (the mean of ``took``, the seconds of the job's whole starts so far: those that ran their timed requests)
    would end past the run's time limit
    ``limit_s`` (config key ``time_limit_s``), counted from the run's start (its plan), else from ``since``, once the
    starts the run still owes elsewhere (``reserved``: another search's boundary, a configuration's first start) are
    set aside at that length. As polyserve's --budget: the first start always runs, and what must run goes first."""
    if not limit_s or not took:
        return None
    typical = sum(took) / len(took)
    owed = reserved(own)
    left = (run_started() or since) + limit_s - time.time() - owed * typical
    if typical <= left:
        return None
    kept = f" once {owed} start(s) other jobs must still make are set aside" if owed else ""
    return (
        f"{what} left out: the time limit ({progress.duration(limit_s)}) leaves {progress.duration(max(0.0, left))}"
        f"{kept}, and a server start takes about {progress.duration(typical)}"
    )


def limit_text(config: dict) -> str:
    """The run's time limit (config key ``time_limit_s``, ``tune --time``) and what it may leave out, or ""."""
    limit = config.get("time_limit_s")
    if not limit:
        return ""
    if not expand_searches(config) and all(item.get("starts", 1) == 1 for item in expand(config)):
        return f"time limit {progress.duration(limit)}: this run has no search and no later start to leave out"
    return (
        f"time limit {progress.duration(limit)}: each search measures its boundary and margin, then climbs and starts "
        "its finalists again (and a configuration asked for several starts starts again) only while a start of its "
        "typical length still ends within it, and says what it left out"
    )


def say_left() -> None:
    """What is left of the run, said by a server job as it begins, where the workflow wrote a plan."""
    path = os.environ.get(PLAN_ENV)
    if not path or not Path(path).exists():
        return
    try:
        jobs = json.loads(Path(path).read_text())["jobs"]
    except (OSError, ValueError, KeyError):
        return
    said = text(*left(jobs))
    if said:
        progress.say(said)
