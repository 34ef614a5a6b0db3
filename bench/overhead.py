"""Where a run's time goes (#18): every job's wall time against what it measured, side by side in one run.

    python bench/overhead.py results/ [--out bench/results/overhead-cpu.md]

For each measurement record (plain configurations and search probes, a finalist's later starts
included) it reads ``time_budget_s`` (setup, waiting for the lock, ballast, server start to ready,
the untimed warm-up request, the workloads, stop, telemetry written, analysis) and the requests' own
wall times, and for each search job Snakemake's benchmark file (its wall time as a process). It
prints the statistic chosen before running: Σ job wall time / Σ (server load + measured request
wall time), for the records, and for the search jobs as processes; then where the rest went.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

from crashline.core.paths import measure_records_under

LAPS = ("setup", "lock_wait", "ballast", "server_start", "warmup_request", "workloads", "stop", "telemetry", "analysis")


def _requests_s(rec: dict) -> float:
    return sum(run.get("wall_s") or 0.0 for w in rec.get("workloads") or [] for run in w.get("runs") or [])


def records(results: Path) -> list[dict]:
    out = []
    for path in measure_records_under(results):
        rec = json.loads(path.read_text())
        if "time_budget_s" in rec:
            out.append({"path": path, **rec})
    return out


def summary(results: Path) -> list[str]:
    recs = records(results)
    if not recs:
        return [f"no record with a time budget under {results}"]
    total = sum(r["time_budget_s"]["total"] for r in recs)
    load = sum(r.get("load_s") or 0.0 for r in recs)
    requests = sum(_requests_s(r) for r in recs)
    lines = [
        f"records: {len(recs)} measurements under {results}",
        f"Σ job wall time (records) / Σ (load + requests) = {total:.1f} / {load + requests:.1f} s "
        f"= {total / (load + requests):.2f}",
        "",
        "| where | seconds | share of the records' wall time |",
        "| --- | ---: | ---: |",
    ]
    rest = {lap: sum(r["time_budget_s"].get(lap, 0.0) for r in recs) for lap in LAPS}
    rest["server_start"] -= load  # start to ready, less the load the server itself reported
    rest["workloads"] -= requests  # the workloads' lap, less the requests' own wall time: prompt sizing, gaps
    rows = [("server load (load_s)", load), ("measured requests", requests), *rest.items()]
    lines += [f"| {name} | {s:.1f} | {s / total:.1%} |" for name, s in rows]
    jobs = []
    for bench in sorted(results.glob("benchmarks/search/*/*.tsv")):
        with open(bench) as f:
            wall = float(next(csv.DictReader(f, delimiter="\t"))["s"])
        folder = results / "search" / bench.parent.name / bench.stem
        probe = [r for r in recs if folder in r["path"].parents]
        jobs.append((bench.parent.name, bench.stem, wall, probe))
    if jobs:
        lines += ["", "| search job | wall s (process) | Σ records' wall s | Σ (load + requests) s | ratio |"]
        lines.append("| --- | ---: | ---: | ---: | ---: |")
        for model, gid, wall, probe in jobs:
            inner = sum(r["time_budget_s"]["total"] for r in probe)
            measured = sum((r.get("load_s") or 0.0) + _requests_s(r) for r in probe)
            ratio = f"{wall / measured:.2f}" if measured else "–"
            lines.append(f"| {model}/{gid} | {wall:.1f} | {inner:.1f} | {measured:.1f} | {ratio} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("results", type=Path)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    text = "\n".join(summary(args.results)) + "\n"
    if args.out:
        args.out.write_text(text)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
