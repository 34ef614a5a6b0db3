"""Do runs of the embedded default agree (#41 item 2)? Runs the README's main command (`snakemake --cores 1 report`) in
fresh copies of the workflow, one after another, and compares each model's answer.

    python bench/default_agreement.py run OUT [--runs 3]   # OUT/run-K/: console, recommendation.json, report.md,
                                                           # tables/, load.jsonl (the host's load every 5 s)
    python bench/default_agreement.py analyse OUT          # OUT/agreement.json

Agreement per model, the rule fixed before the runs (PLAN.md beside the results): every run's winner is the same, or
each run's winner is named in every other run's answer, as its winner or among the configurations it calls tied
(recommendation.json's ``tied_with``) or cannot judge for others' load (``inconclusive_with``, counted apart): the same
answer or the same named tie.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
KEPT = ("recommendation.json", "report.md", "summary.md")


def _load(path: Path, stop: threading.Event) -> None:
    """The host's load average and the cores busy, every 5 s, while a run lasts: the load beside it."""
    with path.open("w") as out:
        last = None
        while not stop.wait(5.0):
            fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
            idle, total = fields[3] + fields[4], sum(fields)
            busy = None if last is None else 1 - (idle - last[0]) / max(1, total - last[1])
            last = (idle, total)
            load = Path("/proc/loadavg").read_text().split()[:3]
            out.write(json.dumps({"t": time.time(), "loadavg": [float(x) for x in load], "busy_share": busy}) + "\n")
            out.flush()


def run(out: Path, runs: int) -> None:
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    for k in range(1, runs + 1):
        work = out / f"work-{k}"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        for name in ("Snakefile", "rules", "scripts", "config", "profiles", "envs"):
            (shutil.copytree if (REPO / name).is_dir() else shutil.copy)(REPO / name, work / name)
        kept = out / f"run-{k}"
        kept.mkdir(parents=True, exist_ok=True)
        stop = threading.Event()
        sampler = threading.Thread(target=_load, args=(kept / "load.jsonl", stop), daemon=True)
        sampler.start()
        began = time.time()
        proc = subprocess.run(
            [sys.executable, "-m", "snakemake", "--cores", "1", "report"], cwd=work, capture_output=True, text=True
        )
        ended = time.time()
        stop.set()
        sampler.join()
        (kept / "console-stdout.txt").write_text(proc.stdout)
        (kept / "console-stderr-tail.txt").write_text("\n".join(proc.stderr.splitlines()[-200:]) + "\n")
        results = work / "results"
        for name in KEPT:
            if (results / name).exists():
                shutil.copy(results / name, kept / name)
        if (results / "tables").is_dir():
            shutil.copytree(results / "tables", kept / "tables", dirs_exist_ok=True)
        meta = {"commit": commit, "returncode": proc.returncode, "began": began, "wall_s": round(ended - began, 1)}
        (kept / "run.json").write_text(json.dumps(meta, indent=1) + "\n")
        shutil.rmtree(work)
        print(f"run {k}: exit {proc.returncode}, {ended - began:.0f} s", flush=True)


def analyse(out: Path) -> dict:
    answers: dict[str, list[dict]] = {}
    for kept in sorted(out.glob("run-*")):
        for r in json.loads((kept / "recommendation.json").read_text()):
            answers.setdefault(r["model"], []).append(
                {
                    "run": kept.name,
                    "winner": r["winner"],
                    "use": r["use"],
                    "tied_with": r.get("tied_with") or [],
                    "speed": round(r["speed"], 1),
                    "inconclusive_with": r.get("inconclusive_with") or [],
                    "tie": r.get("tie"),
                }
            )
    verdict = {}
    for model, runs in answers.items():
        named = [{a["winner"], *a["tied_with"], *a["inconclusive_with"]} for a in runs]
        same = len({a["winner"] for a in runs}) == 1
        tie = all(a["winner"] in other for a in runs for other in named)
        unsure = any(a["inconclusive_with"] for a in runs)
        verdict[model] = {"runs": runs, "same_winner": same, "agree": same or tie, "inconclusive_in_a_run": unsure}
    loads = []
    for kept in sorted(out.glob("run-*")):
        rows = [json.loads(line) for line in (kept / "load.jsonl").read_text().splitlines() if line]
        busy = sorted(r["busy_share"] for r in rows if r["busy_share"] is not None)
        meta = json.loads((kept / "run.json").read_text())
        loads.append(
            {
                "run": kept.name,
                "wall_s": meta["wall_s"],
                "returncode": meta["returncode"],
                "busy_share_median": busy[len(busy) // 2] if busy else None,
                "loadavg1_max": max((r["loadavg"][0] for r in rows), default=None),
            }
        )
    result = {"models": verdict, "runs": loads, "all_agree": all(v["agree"] for v in verdict.values())}
    (out / "agreement.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="step", required=True)
    r = sub.add_parser("run")
    r.add_argument("out", type=Path)
    r.add_argument("--runs", type=int, default=3)
    a = sub.add_parser("analyse")
    a.add_argument("out", type=Path)
    args = parser.parse_args()
    if args.step == "run":
        run(args.out, args.runs)
    print(json.dumps(analyse(args.out), indent=1))


if __name__ == "__main__":
    main()
