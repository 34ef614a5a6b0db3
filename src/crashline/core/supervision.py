"""A job started by Snakemake ends with its workflow.

After ``kill -9`` of ``snakemake`` its running job goes on unsupervised: it would keep its server
(and the GPU) and later write a record that a rerun may already have written. A job that finds its
workflow among its ancestors watches it: a ``snakemake`` process, or the process ``crashline tune`` names in
``CRASHLINE_WORKFLOW_PID`` (it runs Snakemake inside itself, so no ancestor is called snakemake). Once that
process is gone, the job sends itself SIGTERM, which unwinds like Ctrl-C (the server is stopped, no record is
written).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import psutil

_watching = False
WORKFLOW_PID = "CRASHLINE_WORKFLOW_PID"  # set by a process that runs the workflow inside itself (crashline tune)


def _is_workflow(proc: psutil.Process) -> bool:
    if str(proc.pid) == os.environ.get(WORKFLOW_PID):
        return True
    try:
        argv = proc.cmdline()
    except psutil.Error:
        return False
    return any(Path(arg).name == "snakemake" for arg in argv[:3])


def workflow_process() -> psutil.Process | None:
    """The nearest ancestor of this process that runs the workflow (``snakemake``, or ``crashline tune``), if any."""
    proc = psutil.Process().parent()
    while proc is not None and proc.pid > 1:
        if _is_workflow(proc):
            return proc
        try:
            proc = proc.parent()
        except psutil.Error:
            return None
    return None


def exit_with_workflow(interval_s: float = 1.0) -> psutil.Process | None:
    """Watch the workflow that started this job (once per process); returns it, or None if there is none."""
    global _watching
    workflow = workflow_process()
    if workflow is None or _watching:
        return workflow
    _watching = True

    def alive() -> bool:
        try:  # is_running compares the start time too: a reused pid is not our workflow
            return workflow.is_running() and workflow.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    def watch() -> None:
        while alive():
            time.sleep(interval_s)
        print(
            f"crashline: the workflow (pid {workflow.pid}) that started this job is gone: "
            "stopping the server; no record is written",
            file=sys.stderr,
            flush=True,
        )
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, daemon=True, name="crashline-workflow-watch").start()
    return workflow
