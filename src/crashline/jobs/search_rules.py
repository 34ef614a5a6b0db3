"""What a search decides by, without starting anything: the calibration a start gives, the objective and the speed
it ranks by (every request of every start, pooled), where the margin is predicted to hold, what the probes leave
open, and a rival search's best winner (``prune``). ``jobs.search`` runs the probes and says what happens."""

from __future__ import annotations

from ..core.records import Outcome
from ..engine import logparse, planner
from ..engine.workloads import summarize
from .contract import Objective


def headroom_ok(rec: dict, margin_mib: int) -> bool:
    headroom = (rec.get("memory") or {}).get("headroom_mib")
    return rec["outcome"] == Outcome.OK and (headroom is None or headroom >= margin_mib)


def calibration(rec: dict, ubatch: int) -> tuple[planner.ComputeModel, float]:
    """Compute buffer (GPU) and the rest, from a measured record. Pinned host buffers (``CUDA_Host``) are the
    machine's RAM, not the card's: counted as GPU they made the compute buffer 192 MiB too big and the rest as
    much too small on the H200, which only cancels at the ubatch measured."""
    bufs = rec["placement"].get("buffers_mib") or {}
    gpu = {k: v for k, v in bufs.items() if not logparse.on_host(k.split(":", 1)[0])}
    compute = sum(v for k, v in gpu.items() if k.endswith(":compute"))
    load_peak = ((rec.get("memory") or {}).get("per_phase") or {}).get("load", {}).get("gpu_mib")
    rest = max(0.0, load_peak - sum(gpu.values())) if load_peak is not None else 0.0
    return planner.ComputeModel({ubatch: compute}), rest


def _workload(rec: dict, name: str) -> dict | None:
    return next((w for w in rec.get("workloads") or [] if w["name"] == name), None)


# The objective's limits per request that a configuration's median must meet to be recommended.
LIMITS = {
    "min_decode_tps": ("decode_tps", lambda median, limit: median >= limit),
    "max_ttft_s": ("ttft_s", lambda median, limit: median <= limit),
}


def _pooled(recs: list[dict], objective: Objective, margin_mib: int) -> dict | None:
    """The objective workload's statistics over every request of every repetition of these starts of one
    configuration (pooled as ``aggregate`` pools them: ``workloads.summarize`` over every run of every start). None
    unless every start survived every workload with the margin and the pooled medians meet the objective's limits
    per request."""
    if not recs or not all(headroom_ok(r, margin_mib) for r in recs):
        return None
    found = [_workload(r, objective.workload) for r in recs]
    if any(w is None or w["outcome"] != Outcome.OK for w in found):
        return None
    stats = found[0] if len(found) == 1 else summarize([run for w in found for run in w["runs"]])
    for key, (metric, meets) in LIMITS.items():
        median = (stats.get(metric) or {}).get("median")
        limit = getattr(objective, key)
        if limit is not None and (median is None or not meets(median, limit)):
            return None
    return stats


def speed_of(recs: list[dict], objective: Objective, margin_mib: int) -> planner.Speed | None:
    """The objective's speed over these starts (``_pooled``), or None."""
    return planner.Speed.of((_pooled(recs, objective, margin_mib) or {}).get(objective.metric))


def request_of(recs: list[dict], objective: Objective, margin_mib: int) -> planner.Request | None:
    """A request's time to first token and decode over these starts (``_pooled``), or None."""
    return planner.Request.of(_pooled(recs, objective, margin_mib))


def longest_reply(objective: Objective, recs: list[dict]) -> int | None:
    """The replies a request-time objective is asked about run from 1 to this many tokens (MAX_REPLY, or what the
    context leaves after the prompt); None where the objective does not depend on the reply (a decode or prefill
    objective, several requests at once)."""
    if objective.metric != "e2e_tps" or (objective.concurrency or 1) != 1:
        return None
    prompt = next((w["prompt_tokens"] for r in recs if (w := _workload(r, objective.workload))), None)
    ctx = next((r["settings"].get("ctx") for r in recs if r.get("settings")), None)
    room = ctx - prompt if ctx and prompt else planner.MAX_REPLY
    return max(1, min(planner.MAX_REPLY, room))


def margin_guess(at_boundary: dict, boundary: int, predictions: dict, limit, margin: int, hi: int) -> int:
    """The lowest n_cpu_moe predicted to keep the margin: the planner's prediction of each value, moved by what it
    missed at the boundary (its measured headroom against the predicted one). Without a limit: the boundary."""
    headroom = (at_boundary.get("memory") or {}).get("headroom_mib")
    if not limit or headroom is None:
        return boundary
    missed = (limit - predictions[boundary]["total_mib"]) - headroom  # MiB the prediction was short at the boundary
    return next((n for n in range(boundary, hi + 1) if limit - predictions[n]["total_mib"] - missed >= margin), hi)


def bound_text(results: dict[int, bool], lo: int, hi: int) -> str:
    """What the probes so far leave open, survival being monotonic in n_cpu_moe: "boundary in 16..19",
    "boundary at 17", "boundary in 4..7, if any" (no survivor yet), "no survivor up to 7"."""
    low = max((n for n, ok in results.items() if not ok), default=lo - 1) + 1
    high = min((n for n, ok in results.items() if ok), default=None)
    if high is None:
        return f"boundary in {low}..{hi}, if any" if low <= hi else f"no survivor up to n_cpu_moe {hi}"
    return f"boundary at {high}" if low >= high else f"boundary in {low}..{high}"


def best_rival(
    rivals: list[dict], objective: Objective
) -> tuple[str, int, planner.Speed, planner.Request | None] | None:
    """The fastest winner of the rival searches by ``objective`` (their search id, its n_cpu_moe, its speed over
    every request of every start, and its request's first token and decode where the summary has them): from each
    summary's finalist that won and survived every start. Rivals ranked by another objective, or without finalists
    (no climb), give none."""
    best = None
    for summary in rivals:
        if summary.get("objective") != objective.as_dict():
            continue
        won = summary.get("recommended_n_cpu_moe")
        for final in summary.get("finalists") or []:
            if (
                final["n_cpu_moe"] == won
                and final.get("override_tensor") == summary.get("recommended_override_tensor")
                and final["survived"]
                and final.get("median") is not None
            ):
                speed = planner.Speed(final["median"], final["min"], final["max"], final["n"])
                if best is None or speed.median > best[2].median:
                    best = (summary["group"], won, speed, planner.Request.of(final.get("request")))
    return best


def cut_short_text(n: int, speed: planner.Speed, gid: str, rival_n: int, rival: planner.Speed, words: str) -> str:
    return (
        f"cut short: n_cpu_moe {n}, the lowest with the margin, {words} {speed.text()}, lies wholly below the "
        f"winner of search {gid}, n_cpu_moe {rival_n} ({rival.text()} over every request of its starts); the values "
        "above keep more experts on the CPU, so no climb and no further starts"
    )


def stat(speed: planner.Speed | None) -> dict:
    if speed is None:
        return dict.fromkeys(("median", "min", "max", "n"))
    return {"median": speed.median, "min": speed.low, "max": speed.high, "n": speed.n}
