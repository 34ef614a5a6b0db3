"""How far is the planner's predicted peak while serving from the measured one? (#40 item 4)

    python bench/serving_peak.py RESULTS_DIR [RESULTS_DIR ...] > serving-peak.json

For every search of every results folder given (a ``tune``'s ``results/``), each probe that served its workloads or
ran out of memory while serving is predicted as the search predicts it (``planner.predict`` with the compute buffer
and rest of the search's own calibration start) and set beside its measured peak. The statistic, fixed before the
runs: per probe, predicted − measured peak while serving (MiB; positive: the planner errs high, the safe side), and
per search the largest absolute error; the goal is within 64 MiB.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from crashline.core import records
from crashline.core.paths import SearchFolder, measure_records_under
from crashline.engine import planner
from crashline.jobs.search_rules import calibration as calibrated


def search_errors(search_dir: Path, manifest: dict) -> dict:
    found = measure_records_under(SearchFolder(search_dir).probes())
    probes = [records.load(p, "measure") for p in sorted(found) if p.parent.parent == SearchFolder(search_dir).probes()]
    calibration = [records.load(p, "measure") for p in found if p.parent.name == "calibration"]
    if not calibration:
        return {"search": str(search_dir), "probes": [], "why": "no calibration start"}
    compute, rest = calibrated(calibration[0], calibration[0]["settings"]["ubatch"])
    rows = []
    for record in probes:
        peak = (record.get("memory") or {}).get("peak_gpu_mib")
        if record.get("load_only") or peak is None or not record.get("workloads"):
            continue
        predicted = planner.predict(manifest, record["settings"], compute, rest)
        rows.append(
            {
                "n_cpu_moe": record["settings"]["n_cpu_moe"],
                "override_tensor": record["settings"].get("override_tensor"),
                "ubatch": record["settings"]["ubatch"],
                "outcome": record["outcome"],
                "predicted_serving_mib": predicted["total_mib"],
                "measured_peak_mib": peak,
                "error_mib": round(predicted["total_mib"] - peak, 1),
                "predicted_load_mib": predicted["load_mib"],
                "measured_load_mib": record["memory"]["per_phase"].get("load", {}).get("gpu_mib"),
            }
        )
    worst = max((abs(r["error_mib"]) for r in rows if r["outcome"] == "ok"), default=None)  # an oom peak is cut short
    return {"search": str(search_dir), "probes": rows, "largest_abs_error_mib": worst}


def main(folders: list[str]) -> None:
    out = []
    for folder in map(Path, folders):
        for manifest_path in folder.glob("models/*/manifest.json"):
            model = manifest_path.parent.name
            manifest = json.loads(manifest_path.read_text())
            for search_dir in sorted((folder / "search" / model).glob("*")):
                out.append({"model": model, "prompt_tokens": _depth(search_dir), **search_errors(search_dir, manifest)})
    print(json.dumps(out, indent=2))


def _depth(search_dir: Path) -> list[int]:
    for path in measure_records_under(SearchFolder(search_dir).probes()):
        workloads = records.load(path, "measure").get("workloads") or []
        if workloads:
            return sorted({w["prompt_tokens"] for w in workloads if w.get("prompt_tokens")})
    return []


if __name__ == "__main__":
    main(sys.argv[1:])
