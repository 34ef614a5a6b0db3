"""Why ``snakemake --report FILE`` cannot pack a finished run's report (rules/common.smk asks before Snakemake
does): Snakemake itself names only the first file it misses ("File results/tables/configs.csv marked for report
but does not exist"), not that the last run failed, in which job, and where that job's log is.

The last run is the newest of Snakemake's own logs (``.snakemake/log/*.snakemake.log``) that executed jobs (a
``--report`` or a dry run executes none). A job's header there names its rule, its wildcards, its jobid and its
log; a failure names its rule and jobid ("Error in rule measure:", "MissingOutputException in rule measure in
file ..."); a crashline job's last log line is its one-line error (scripts/job.py)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

HEADER_RE = re.compile(r"^(?:local)?(?:rule|checkpoint) (?P<rule>\S+):\s*$")
ERROR_RE = re.compile(r"^Error in rule (?P<rule>\S+):\s*$")
EXCEPTION_RE = re.compile(r"^(?P<what>\w+(?:Exception|Error)) in rule (?P<rule>\S+) in file")
FIELD_RE = re.compile(r"^\s+(?P<key>\w+): (?P<value>.*)$")
JOB_RE = re.compile(r"\bJob (?P<id>\d+)\b")
DONE_RE = re.compile(r"\(100%\) done|Nothing to be done")
# Rules the report does not wait for: their failure leaves the report as it was.
NOT_THE_REPORTS = {"publish_claim", "publish"}
TAIL_BYTES = 4096


@dataclass
class Failed:
    rule: str
    jobid: str | None
    wildcards: str | None
    log: str | None
    what: str | None  # Snakemake's exception, where it named one (MissingOutputException)

    def job(self) -> str:
        return f"{self.rule} ({self.wildcards})" if self.wildcards else self.rule


def executed_runs(log_dir: Path) -> list[Path]:
    """Snakemake's logs of runs that executed jobs, oldest first."""
    logs = sorted(Path(log_dir).glob("*.snakemake.log"), key=lambda p: p.stat().st_mtime)
    return [p for p in logs if "Job stats:" in p.read_text(errors="replace")]


def _fields(lines: list[str], start: int) -> dict[str, str]:
    """The indented ``key: value`` lines after ``lines[start]``."""
    out = {}
    for line in lines[start + 1 :]:
        m = FIELD_RE.match(line)
        if not m:
            break
        out[m["key"]] = m["value"].strip()
    return out


def _first_log(value: str | None) -> str | None:
    if not value:
        return None
    return value.split(" (check log file")[0].split(", ")[0].strip() or None


def failures(text: str) -> list[Failed]:
    """The jobs a run's Snakemake log says failed, in order, with what their headers say of them."""
    lines = text.splitlines()
    headers: dict[str, dict[str, str]] = {}
    for i, line in enumerate(lines):
        if m := HEADER_RE.match(line):
            fields = _fields(lines, i)
            if "jobid" in fields:
                headers[fields["jobid"]] = {"rule": m["rule"], **fields}
    out: list[Failed] = []
    for i, line in enumerate(lines):
        if m := ERROR_RE.match(line):
            fields = _fields(lines, i)
            jobid, what = fields.get("jobid"), None
        elif m := EXCEPTION_RE.match(line):
            found = next((j for j in map(JOB_RE.search, lines[i + 1 : i + 3]) if j), None)
            jobid, what, fields = (found["id"] if found else None), m["what"], {}
        else:
            continue
        head = headers.get(jobid or "", {})
        failed = Failed(
            rule=m["rule"],
            jobid=jobid,
            wildcards=head.get("wildcards"),
            log=_first_log(fields.get("log") or head.get("log")),
            what=what,
        )
        if not any(f.rule == failed.rule and f.jobid == failed.jobid for f in out):
            out.append(failed)
    return out


def last_line(path: str | Path) -> str | None:
    """The last non-empty line of a job's log (a crashline job's one-line error), read from its tail alone."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - TAIL_BYTES))
            lines = f.read().decode(errors="replace").strip().splitlines()
    except OSError:
        return None
    return lines[-1].strip() if lines else None


def _said(failed: Failed, run_log: Path) -> str:
    """One failed job in words: which, why (its log's last line), and where its log is."""
    why = last_line(failed.log) if failed.log else None
    if failed.what:
        why = f"{failed.what}" + (f" after its last log line {why!r}" if why else "")
    where = f"its log is {failed.log}" if failed.log else f"see {run_log}"
    return f"job {failed.job()} failed" + (f": {why}" if why else "") + f"; {where}"


def why_not_made(report_md: Path, packed: list[Path], log_dir: Path) -> str | None:
    """Why ``snakemake --report`` cannot pack the run's report now, in one line naming the fix; None when it can.

    It cannot while the report or a file it packs (``packed``: the tables beside it) is missing, and not when the
    last run failed in a job the report needs after the report was made: the report there is an earlier run's."""
    report_md = Path(report_md)
    missing = [p for p in [report_md, *map(Path, packed)] if not p.exists()]
    runs = executed_runs(log_dir)
    head = "snakemake --report packs a finished run's report"
    again = "run `snakemake --cores 1 report` again"
    if not runs:
        if not missing:
            return None
        return (
            f"{head}, and there is none: {missing[0]} does not exist and no run is logged here; "
            "run `snakemake --cores 1 report` first"
        )
    run_log = runs[-1]
    text = run_log.read_text(errors="replace")
    failed = [f for f in failures(text) if f.rule not in NOT_THE_REPORTS]
    stale = report_md.exists() and run_log.stat().st_mtime > report_md.stat().st_mtime
    if not missing and not (failed and stale):
        return None
    gap = f"{missing[0]} does not exist" if missing else f"{report_md} is an earlier run's"
    if failed:
        more = f" (and {len(failed) - 1} more job(s))" if len(failed) > 1 else ""
        return f"{head}, and {gap}: the last run failed: {_said(failed[0], run_log)}{more}; fix that and {again}"
    if DONE_RE.search(text):
        return f"{head}, and {gap}: the last run finished without it ({run_log}); {again} to make it"
    return f"{head}, and {gap}: the last run stopped before the report (see {run_log}); {again}"
