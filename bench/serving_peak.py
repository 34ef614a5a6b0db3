"""How far is the planner's predicted peak while serving from the measured one? (#40 item 4)

    python bench/serving_peak.py [--today] RESULTS_DIR [RESULTS_DIR ...] > serving-peak.json

For every search of every results folder given (a ``tune``'s ``results/``), each probe that served its workloads or
ran out of memory while serving is predicted as the search predicts it (``planner.predict`` with the compute buffer
and rest of the search's own calibration start) and set beside its measured peak. The statistic, fixed before the
runs: per probe, predicted − measured peak while serving (MiB; positive: the planner errs high, the safe side), and
per search the largest absolute error; the goal is within 64 MiB.

With ``--today`` each probe is predicted from the start a search calibrates on now (``today``): runs made before
session 33 calibrated with every expert on the CPU, whose compute buffer can be smaller than any probe's.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from crashline.core import records
from crashline.core.paths import SearchFolder, measure_records_under
from crashline.engine import planner
from crashline.jobs.search_rules import calibration as calibrated


def today(probe: dict, calibration: dict, probes: list[dict], manifest: dict) -> dict | None:
    """The start a search calibrates on today (``planner.calibration_value``: the most experts on the CPU with one
    layer's on the card): the search's own calibration where it was such a start; for a search calibrated with every
    expert on the CPU (before session 33), the whole-layer probe of the same search with the most experts on the CPU
    that still has one layer's on the card and a compute buffer on it, never ``probe`` itself (None if none)."""
    layers = manifest["layers"]
    on_card = planner.calibration_value(manifest, 0, layers)  # the highest value with an expert layer on the card
    if calibration["settings"]["n_cpu_moe"] <= on_card:
        return calibration
    others = [
        p
        for p in probes
        if p is not probe
        and p["settings"]["n_cpu_moe"] <= on_card
        and not p["settings"].get("override_tensor")
        and ((p.get("memory") or {}).get("per_phase") or {}).get("load")
        and calibrated(p, p["settings"]["ubatch"])[0](p["settings"]["ubatch"]) > 0
    ]
    return max(others, key=lambda p: p["settings"]["n_cpu_moe"], default=None)


def search_errors(search_dir: Path, manifest: dict, own: bool = True) -> dict:
    found = measure_records_under(SearchFolder(search_dir).probes())
    probes = [records.load(p, "measure") for p in sorted(found) if p.parent.parent == SearchFolder(search_dir).probes()]
    calibration = [records.load(p, "measure") for p in found if p.parent.name == "calibration"]
    if not calibration:
        return {"search": str(search_dir), "probes": [], "why": "no calibration start"}
    rows = []
    for record in probes:
        peak = (record.get("memory") or {}).get("peak_gpu_mib")
        if record.get("load_only") or peak is None or not record.get("workloads"):
            continue
        on = calibration[0] if own else today(record, calibration[0], probes, manifest)
        if on is None:
            continue
        compute, rest = calibrated(on, on["settings"]["ubatch"])
        predicted = planner.predict(manifest, record["settings"], compute, rest)
        rows.append(
            {
                "calibrated_on": {k: on["settings"].get(k) for k in ("n_cpu_moe", "override_tensor")},
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="+", type=Path)
    parser.add_argument("--today", action="store_true", help="calibrate as a search does today (see today())")
    args = parser.parse_args()
    out = []
    for folder in args.folders:
        for manifest_path in folder.glob("models/*/manifest.json"):
            model = manifest_path.parent.name
            manifest = json.loads(manifest_path.read_text())
            for search_dir in sorted((folder / "search" / model).glob("*")):
                errors = search_errors(search_dir, manifest, not args.today)
                out.append({"model": model, "prompt_tokens": _depth(search_dir), **errors})
    print(json.dumps(out, indent=2))


def _depth(search_dir: Path) -> list[int]:
    for path in measure_records_under(SearchFolder(search_dir).probes()):
        workloads = records.load(path, "measure").get("workloads") or []
        if workloads:
            return sorted({w["prompt_tokens"] for w in workloads if w.get("prompt_tokens")})
    return []


if __name__ == "__main__":
    main()
