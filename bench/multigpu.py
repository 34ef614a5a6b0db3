"""One GPU against two: the same configurations through the same workflow, admitting one server job at a time
(`--cores 1 --resources gpu=1`) and then two (`--cores 2 --resources gpu=2`, each job holding its own GPU).

    python bench/multigpu.py bench/configs/h200x2-eight.yaml SERVER_BINARY OUT_DIR

Each run gets its own results folder under OUT_DIR (one-gpu/, two-gpus/). The jobs before the measurements (the
model written, the server checked, the model read into the page cache) run first, untimed, in both; the timed
command is `snakemake report` from there. Statistics, chosen before running:

- wall time ratio: the timed command's wall time with two GPUs over that with one (goal <= 0.55); beside it the
  span of the measurements alone (first record's start to last record's end);
- per configuration and workload: the median prefill and decode t/s of the repetitions in each run, their
  [min, max], and whether the two ranges overlap ("equal within their spread").

Writes OUT_DIR/multigpu.json and prints a summary.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import yaml

from crashline.config import plan as C
from crashline.core.paths import Layout

REPO = Path(__file__).resolve().parents[1]
RUNS = {"one-gpu": ["--cores", "1", "--resources", "gpu=1"], "two-gpus": ["--cores", "2", "--resources", "gpu=2"]}


def snakemake(config: Path, args: list[str], targets: list[str], log: Path) -> float:
    # the targets first: --configfile and --resources take every word after them
    command = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), *targets, "--configfile", str(config)]
    command += args
    started = time.monotonic()
    with open(log, "a") as out:
        out.write(f"$ {' '.join(command)}\n")
        out.flush()
        proc = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, cwd=config.parent)
    wall = time.monotonic() - started
    if proc.returncode != 0:
        raise SystemExit(f"snakemake failed ({proc.returncode}); see {log}")
    return wall


def measurement_span(layout: Layout, cfg: dict) -> float:
    """Seconds from the first measurement's start to the last one's end."""
    times = []
    for item in C.expand(cfg):
        rec = json.loads(layout.record(item["model"], item["id"]).read_text())
        times += [dt.datetime.fromisoformat(rec["started_at"]), dt.datetime.fromisoformat(rec["finished_at"])]
    return (max(times) - min(times)).total_seconds()


def speeds(layout: Layout) -> pd.DataFrame:
    m = pd.read_parquet(layout.measurements_table())
    keep = ["config_id", "server_args", "workload", "gpu_uuids", "n_threads"]
    keep += [f"{k}_tps_{s}" for k in ("prefill", "decode") for s in ("median", "min", "max")]
    return m[keep]


def main(config_path: str, server: str, out_dir: str) -> None:
    out = Path(out_dir).resolve()
    base = yaml.safe_load(Path(config_path).read_text())
    result: dict = {"config": base, "server": server, "runs": {}}
    for name, args in RUNS.items():
        folder = out / name
        folder.mkdir(parents=True, exist_ok=True)
        cfg_path = folder / "config.yaml"
        cfg_path.write_text(
            yaml.safe_dump({**base, "results_dir": str(folder / "results"), "server": {"binary": server}})
        )
        cfg = C.load(cfg_path)
        layout = Layout(cfg["results_dir"])
        before = [str(layout.warmup(m)) for m in cfg["models"]] + [str(layout.provenance())]
        log = folder / "console.txt"
        snakemake(cfg_path, ["--cores", "1"], before, log)
        wall = snakemake(cfg_path, args, ["report"], log)
        span = measurement_span(layout, cfg)
        result["runs"][name] = {"args": args, "wall_s": round(wall, 1), "measure_span_s": round(span, 1)}
        speeds(layout).to_csv(folder / "speeds.csv", index=False)
        print(f"{name}: report in {wall:.1f} s, measurements spanning {span:.1f} s", flush=True)
    one, two = (pd.read_csv(out / n / "speeds.csv") for n in RUNS)
    both = one.merge(two, on=["config_id", "server_args", "workload"], suffixes=("_one", "_two"))
    rows = []
    for _, r in both.iterrows():
        row = {"config_id": r["config_id"], "server_args": r["server_args"], "workload": r["workload"]}
        row["gpus"] = {"one": r["gpu_uuids_one"], "two": r["gpu_uuids_two"]}
        row["threads"] = {"one": r["n_threads_one"], "two": r["n_threads_two"]}
        for kind in ("prefill", "decode"):
            a = [r[f"{kind}_tps_{s}_one"] for s in ("median", "min", "max")]
            b = [r[f"{kind}_tps_{s}_two"] for s in ("median", "min", "max")]
            row[kind] = {
                "one": a,
                "two": b,
                "two_over_one": round(b[0] / a[0], 3),
                "overlap": bool(a[1] <= b[2] and b[1] <= a[2]),
            }
        rows.append(row)
    runs = result["runs"]
    result["wall_ratio"] = round(runs["two-gpus"]["wall_s"] / runs["one-gpu"]["wall_s"], 3)
    result["measure_span_ratio"] = round(runs["two-gpus"]["measure_span_s"] / runs["one-gpu"]["measure_span_s"], 3)
    result["rows"] = rows
    (out / "multigpu.json").write_text(json.dumps(result, indent=1))
    print(f"wall time two GPUs / one: {result['wall_ratio']} (measurements alone {result['measure_span_ratio']})")
    for row in rows:
        marks = " ".join(
            f"{k} {row[k]['one'][0]:.1f} vs {row[k]['two'][0]:.1f} ({row[k]['two_over_one']:.3f}"
            f"{', ranges overlap' if row[k]['overlap'] else ', RANGES APART'})"
            for k in ("prefill", "decode")
        )
        print(f"{row['config_id']} {row['workload']}: {marks}")


if __name__ == "__main__":
    if len(sys.argv) != 4:
        raise SystemExit(__doc__)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main(*sys.argv[1:])
