"""The planner in the workflow: for one combination of the other settings, find the lowest
n_cpu_moe that survives every workload with headroom, with a few server starts instead of one per
value.

1. Calibrate: measure the highest n_cpu_moe of the range (every expert on the CPU: the load most
   likely to fit). Its log gives the compute buffer at this ubatch; its peak VRAM less its
   buffers gives the rest (CUDA context, small buffers).
2. Predict every value's VRAM from the manifest (planner.predict) and start at the lowest value
   predicted to fit the budget.
3. Search: gallop from the prediction and bisect (planner.search_lowest), each probe a full
   measurement with every workload.
4. Step up from the boundary until the headroom clears the margin: that is the value to use.

Values below the boundary that were never started are reported as skipped with the arithmetic
("predicted to need X MiB more than the budget"), never silently dropped.
"""

from __future__ import annotations

from pathlib import Path

from . import planner, progress, records
from . import settings as settings_mod
from .measure import job_key, measure, outcome_text
from .records import Outcome


def _headroom_ok(rec: dict, margin_mib: int) -> bool:
    headroom = (rec.get("memory") or {}).get("headroom_mib")
    return rec["outcome"] == Outcome.OK and (headroom is None or headroom >= margin_mib)


def calibration(rec: dict, ubatch: int) -> tuple[planner.ComputeModel, float]:
    """Compute buffer (GPU) and the rest, from a measured record."""
    bufs = rec["placement"].get("buffers_mib") or {}
    gpu = {k: v for k, v in bufs.items() if k.startswith("CUDA")}
    compute = sum(v for k, v in gpu.items() if k.endswith(":compute"))
    load_peak = ((rec.get("memory") or {}).get("per_phase") or {}).get("load", {}).get("gpu_mib")
    rest = max(0.0, load_peak - sum(gpu.values())) if load_peak is not None else 0.0
    return planner.ComputeModel({ubatch: compute}), rest


def bound_text(results: dict[int, bool], lo: int, hi: int) -> str:
    """What the probes so far leave open, survival being monotonic in n_cpu_moe: "boundary in 16..19",
    "boundary at 17", "boundary in 4..7, if any" (no survivor yet), "no survivor up to 7"."""
    low = max((n for n, ok in results.items() if not ok), default=lo - 1) + 1
    high = min((n for n, ok in results.items() if ok), default=None)
    if high is None:
        return f"boundary in {low}..{hi}, if any" if low <= hi else f"no survivor up to n_cpu_moe {hi}"
    return f"boundary at {high}" if low >= high else f"boundary in {low}..{high}"


def run_search(
    *, model_name: str, group: dict, config: dict, fetch_record: dict, manifest: dict, provenance: dict, out_dir: Path
) -> dict:
    """Run the search for one group; records of every probe go under ``out_dir/records``."""
    with progress.job(f"search {model_name} {group['id']}"):
        summary = _run_search(model_name, group, config, fetch_record, manifest, provenance, out_dir)
        progress.say(
            f"search done: boundary n_cpu_moe {summary['boundary']}, use {summary['recommended_n_cpu_moe']}, "
            f"{summary['server_starts']} server starts"
        )
        return summary


def _run_search(
    model_name: str, group: dict, config: dict, fetch_record: dict, manifest: dict, provenance: dict, out_dir: Path
) -> dict:
    lo, hi = group["range"]
    hi = min(hi, manifest["layers"])
    budget = config["budget"].get("vram_budget_mib")
    margin = config["budget"]["margin_mib"]
    base = group["given"]
    measured: dict[int, str] = {}  # n_cpu_moe -> the probe's configuration id
    seen: dict[int, dict] = {}  # n_cpu_moe -> its record
    results: dict[int, bool] = {}  # n_cpu_moe -> survived every workload
    clipped = f" (the model has {manifest['layers']} layers)" if hi < group["range"][1] else ""
    progress.say(f"search for the lowest n_cpu_moe that survives, in {lo}..{hi}{clipped}")

    def probe(n: int, why: str) -> dict:
        """Measure n_cpu_moe ``n`` once (``why``: what the probe is for), saying how it went."""
        if n not in seen:
            given = {**base, "n_cpu_moe": n}
            resolved = settings_mod.resolve(given)
            cid = measured[n] = settings_mod.config_id(model_name, resolved)
            progress.say(f"probe {len(seen) + 1}: n_cpu_moe {n}, configuration {cid} ({why})")
            seen[n] = rec = _probe(n, cid, given, resolved)
            results[n] = rec["outcome"] == Outcome.OK
            said = "ok" if results[n] else outcome_text(rec)
            progress.say(f"probe {len(seen)}: n_cpu_moe {n} {said}; {bound_text(results, lo, hi)}")
        return seen[n]

    def _probe(n: int, cid: str, given: dict, resolved: dict) -> dict:
        folder = out_dir / "records" / cid
        record_path = folder / "measure.json"
        earlier = records.load(record_path, "measure") if record_path.exists() else {}
        if earlier.get("job_key") == job_key(config, provenance):
            progress.say(f"n_cpu_moe {n}: measured by this search before ({cid}), record reused")
            return earlier  # measured by this search before, under the same workloads, budget, build
        return measure(
            model_name=model_name,
            item={"id": cid, "settings": resolved, "given": given},
            config=config,
            fetch_record=fetch_record,
            manifest=manifest,
            provenance=provenance,
            record_path=record_path,
            log_path=folder / "server.log",
            telemetry_path=folder / "telemetry.parquet",
        )

    calib = probe(hi, "calibration: the most expert layers on the CPU")
    resolved = settings_mod.resolve({**base, "n_cpu_moe": hi})
    compute, rest = calibration(calib, resolved["ubatch"])
    limit = budget or ((calib.get("memory") or {}).get("vram_limit_mib"))
    predictions = {n: planner.predict(manifest, {**resolved, "n_cpu_moe": n}, compute, rest) for n in range(lo, hi + 1)}
    if limit:
        start = next((n for n in range(lo, hi + 1) if predictions[n]["total_mib"] <= limit), hi)
        progress.say(
            f"calibrated: compute buffer {compute(resolved['ubatch']):,.0f} MiB, rest {rest:,.0f} MiB; "
            f"lowest n_cpu_moe predicted to fit {limit:,.0f} MiB: {start}"
        )
    else:
        start = lo  # no GPU limit known (CPU only): every value fits in VRAM terms
        progress.say(f"no VRAM limit (no GPU, no budget): every n_cpu_moe fits; searching from {start}")
    boundary, probes = planner.search_lowest(lambda n: probe(n, "search")["outcome"] == Outcome.OK, start, lo, hi)
    recommended = None
    if boundary is not None:
        for n in range(boundary, hi + 1):
            if _headroom_ok(probe(n, f"headroom: the margin is {margin:,} MiB"), margin):
                recommended = n
                break
    values = []
    for n in range(lo, hi + 1):
        p = predictions[n]
        entry = {"n_cpu_moe": n, "predicted_mib": p["total_mib"]}
        if n in measured:
            entry["status"] = "measured"
        elif boundary is not None and n < boundary and limit and p["total_mib"] > limit:
            entry["status"] = f"skipped: predicted to need {p['total_mib'] - limit:,.0f} MiB more than the budget"
        elif boundary is not None and n < boundary:
            entry["status"] = "skipped: below the measured boundary"
        else:
            entry["status"] = "not measured: above the boundary, fits by the same prediction"
        values.append(entry)
    summary = {
        "model": model_name,
        "group": group["id"],
        "settings": {k: v for k, v in resolved.items() if k != "n_cpu_moe"},
        "range": [lo, hi],
        "limit_mib": limit,
        "margin_mib": margin,
        "compute_mib": compute.measured,
        "rest_mib": round(rest, 1),
        "predicted_lowest": start,
        "arithmetic": planner.arithmetic(predictions[start], limit, margin) if limit else None,
        "full_residency": planner.arithmetic(predictions[lo], limit, margin) if limit else None,
        "probes": [{"n_cpu_moe": n, "survived": ok} for n, ok in probes],
        "boundary": boundary,
        "recommended_n_cpu_moe": recommended,
        "server_starts": len(measured),
        "records": sorted(measured.values()),
        "values": values,
    }
    return records.write(out_dir / "search.json", "search", summary)
