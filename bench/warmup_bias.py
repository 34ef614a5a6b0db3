"""Is the first timed request at each depth slow, and does a warm-up at that depth fix it (#22 item 3)?

The same configuration is measured under ``warmup_requests: 0`` and ``warmup_requests: 1`` in interleaved server
starts (0, 1, 0, 1, ...), each start a real ``python -m crashline measure`` of the config's one configuration.
The statistic, chosen before running: per start and workload, repetition 1's decode t/s over the median of
repetitions 2..R (``first_over_rest``); per warm-up setting and workload, the median of that ratio over the
starts with its min and max. A value of 1.00 means the first timed request is as fast as the rest.

    python bench/warmup_bias.py CONFIG --starts 2 --out DIR

CONFIG is an ordinary crashline config with one configuration and R >= 3 repetitions (its ``warmup_requests`` is
overridden). Every start's record is copied to DIR/records/ (raw, with its settings), DIR/warmup-bias.json holds
the ratios and DIR/console.txt what the jobs printed.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

from crashline.config import plan as C
from crashline.core.paths import Layout


def crashline(config_path: Path | None, *args: str, log) -> None:
    """``python -m crashline ARGS --config CONFIG`` (without --config where ``config_path`` is None), to ``log``."""
    started = time.monotonic()
    argv = [*args, *(["--config", str(config_path)] if config_path else [])]
    print(f"$ python -m crashline {' '.join(argv)}", file=log, flush=True)
    proc = subprocess.run([sys.executable, "-m", "crashline", *argv], stderr=log)
    print(f"  ({args[0]}: exit {proc.returncode} after {time.monotonic() - started:.1f} s)", file=log, flush=True)
    if proc.returncode != 0:
        raise SystemExit(f"{args[0]} failed (exit {proc.returncode}); see the console log")


def first_over_rest(workload: dict) -> float | None:
    """Repetition 1's decode over the median of the later repetitions (every request of a run: its median)."""
    per_run = [statistics.median(r["decode_tps"] for r in run["requests"]) for run in workload.get("runs") or []]
    if len(per_run) < 3:
        return None
    return per_run[0] / statistics.median(per_run[1:])


def summary(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config")
    parser.add_argument("--starts", type=int, default=2, help="server starts per warm-up setting")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    out = Path(args.out)
    (out / "records").mkdir(parents=True, exist_ok=True)
    raw = yaml.safe_load(Path(args.config).read_text())
    base = C.validate(raw, C.load_schema())
    (item,) = C.expand(base)
    layout = Layout(base["results_dir"])
    ratios: dict[int, dict[str, list[float]]] = {0: {}, 1: {}}
    with open(out / "console.txt", "a") as log:
        configs = {}
        for warmups in (0, 1):
            path = out / f"config-warmup{warmups}.yaml"
            path.write_text(yaml.safe_dump({**raw, "warmup_requests": warmups}, sort_keys=False))
            configs[warmups] = path
        model = item["model"]
        crashline(configs[0], "fetch", "--model", model, log=log)
        crashline(
            None, "inspect", "--fetch-record", str(layout.fetch(model)), "--out", str(layout.manifest(model)), log=log
        )
        crashline(configs[0], "provision", log=log)
        for start in range(args.starts):
            for warmups in (0, 1):  # interleaved, so that a drift of the machine reaches both alike
                crashline(configs[warmups], "measure", "--model", model, "--id", item["id"], log=log)
                record_path = out / "records" / f"warmup{warmups}-start{start + 1}.json"
                shutil.copy(layout.record(model, item["id"]), record_path)
                record = json.loads(record_path.read_text())
                if record["outcome"] != "ok":
                    raise SystemExit(f"{record_path}: {record['outcome']} ({record['message']})")
                for w in record["workloads"]:
                    if (r := first_over_rest(w)) is not None:
                        ratios[warmups].setdefault(w["name"], []).append(r)
                (out / "warmup-bias.json").write_text(json.dumps(result(base, item, ratios), indent=1) + "\n")
    print(json.dumps(result(base, item, ratios)["first_over_rest"], indent=1))


def result(cfg: dict, item: dict, ratios: dict) -> dict:
    return {
        "statistic": "per start and workload: decode t/s of timed repetition 1 / median of repetitions 2..R; "
        "per warm-up setting: the median, min and max of that over the starts",
        "model": item["model"],
        "settings": item["settings"],
        "workloads": cfg["workloads"],
        "repetitions": cfg["repetitions"],
        "budget": cfg["budget"],
        "first_over_rest": {
            f"warmup_requests={w}": {name: {**summary(v), "each": v} for name, v in by_workload.items()}
            for w, by_workload in ratios.items()
        },
    }


if __name__ == "__main__":
    main()
