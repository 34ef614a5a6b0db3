"""A whole crashline run without Snakemake, verb by verb, in the order the workflow runs them: fetch,
inspect, provision, every measure, every search, aggregate, validity, report. For machines without Snakemake
(the GPU machine has none); each verb's console lines pass through, so the output is the run's
console transcript.

    python bench/search_report.py bench/configs/h200-search.yaml

The config is an ordinary crashline config (its `results_dir` says where everything goes).
Needle jobs are left out: the synthetic models this runs have random weights (not applicable).
"""

from __future__ import annotations

import subprocess
import sys
import time

from crashline.config import plan as C
from crashline.core.paths import Layout


def verb(config_path: str, *args: str) -> None:
    started = time.monotonic()
    print(f"$ python -m crashline {' '.join(args)} --config {config_path}", flush=True)
    proc = subprocess.run([sys.executable, "-m", "crashline", *args, "--config", config_path])
    print(f"  ({args[0]}: exit {proc.returncode} after {time.monotonic() - started:.1f} s)", flush=True)
    if proc.returncode != 0:
        raise SystemExit(proc.returncode)


def main(config_path: str) -> None:
    cfg = C.load(config_path)
    layout = Layout(cfg["results_dir"])
    for model in cfg["models"]:
        verb(config_path, "fetch", "--model", model)
        inspect = ["inspect", "--fetch-record", str(layout.fetch(model)), "--out", str(layout.manifest(model))]
        subprocess.run([sys.executable, "-m", "crashline", *inspect], check=True)
    verb(config_path, "provision")
    for item in C.expand(cfg):
        verb(config_path, "measure", "--model", item["model"], "--id", item["id"])
    for group in C.expand_searches(cfg):
        verb(config_path, "search", "--model", group["model"], "--id", group["id"])
    verb(config_path, "aggregate")
    verb(config_path, "validity")
    verb(config_path, "report")


if __name__ == "__main__":
    main(sys.argv[1])
