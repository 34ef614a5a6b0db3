"""The unique-prompt soak: many different prompts, as agents and chat clients send them (the prompt cache on, no two
sharing more than the model's special prefix), one round after another, for a number of requests or a time,
whichever ends first; ``at_once`` requests a round.

After each round: the server's RSS and VRAM at that moment, llama.cpp's host prompt cache (entries, MiB; from its
log) and the context checkpoints made. Growth per request and per hour is fitted by least squares with its 95%
interval, and projected to the host budget (``budget.host_ram_mib``, else the machine's RAM) and to the VRAM
limit: the hours until the first is reached at this rate. Growth whose interval holds zero is flat: no projection.
Whether that is long enough (``soak.must_survive_h``) is the recommendation's to decide (tables.recommend), so an
edit of it measures nothing again.

This module is the protocol and the arithmetic; jobs/serving.py runs it against its server."""

from __future__ import annotations

import math
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

from ..core.records import Outcome
from ..engine import logparse
from ..engine.planner import DEFAULT_CACHE_RAM_MIB
from ..engine.workloads import Client, PromptSource
from .contract import Soak

SEED = 100_000  # prompt offsets of the soak: index SEED + k for its k-th request, apart from workloads' and turns'
PHASE = "soak"
Z95 = 1.96
HOURS_A_YEAR = 24 * 365


def fit(xs: list[float], ys: list[float]) -> dict | None:
    """Least-squares slope of ys over xs with its 95% interval (normal approximation); None with fewer than three
    points or no spread in xs."""
    if len(xs) < 3 or len(set(xs)) < 2:
        return None
    slope, intercept = statistics.linear_regression(xs, ys)
    mean = statistics.fmean(xs)
    sxx = sum((x - mean) ** 2 for x in xs)
    residual = sum((y - (intercept + slope * x)) ** 2 for x, y in zip(xs, ys))
    se = math.sqrt(residual / (len(xs) - 2) / sxx)
    return {"slope": slope, "low": slope - Z95 * se, "high": slope + Z95 * se, "n": len(xs)}


def _round(fitted: dict | None, scale: float = 1.0) -> dict | None:
    return None if fitted is None else {k: (round(v * scale, 4) if k != "n" else v) for k, v in fitted.items()}


def growth(points: list[dict], key: str) -> dict | None:
    """The growth of ``key`` (rss_mib, gpu_mib, cache_mib) per request and per hour over the soak's points."""
    have = [p for p in points if p.get(key) is not None]
    per_request = fit([p["requests"] for p in have], [p[key] for p in have])
    per_second = fit([p["t_s"] for p in have], [p[key] for p in have])
    if per_request is None or per_second is None:
        return None
    return {
        "per_request": _round(per_request),
        "per_hour": _round(per_second, 3600.0),
        "last": have[-1][key],
        "grows": per_request["low"] > 0,  # the whole 95% interval above zero
    }


def projection(
    grown: dict | None,
    limit_mib: float | None,
    requests_per_hour: float,
    cache: dict | None = None,
    rest: dict | None = None,
    cache_limit_mib: float | None = None,
) -> dict | None:
    """When growth that is real reaches ``limit_mib`` at this rate: requests and hours from the soak's end.

    RSS that grows with llama.cpp's host prompt cache (``cache``, its growth) stops growing once the cache is full
    at ``cache_limit_mib`` (--cache-ram; llama.cpp enforces it after adding a prompt, so one prompt past it): then
    only the rest grows (``rest``, RSS less the cache). Where the rest is flat, RSS levels off there, and reaches
    the limit only if that level is past it (``levels_at_mib``)."""
    if not grown or not grown["grows"] or not limit_mib:
        return None
    per_request = grown["per_request"]["slope"]
    out = {"limit_mib": limit_mib}
    if cache and cache["grows"] and cache_limit_mib is not None and cache_limit_mib >= 0:
        room = max(0.0, cache_limit_mib + cache["per_request"]["slope"] - cache["last"])
        levels = grown["last"] + room
        if levels < limit_mib:
            after = rest["per_request"]["slope"] if rest and rest["grows"] else 0.0
            if after <= 0:
                return {**out, "requests": None, "hours": None, "levels_at_mib": round(levels)}
            requests = room / cache["per_request"]["slope"] + (limit_mib - levels) / after
            return {
                **out,
                "requests": round(requests),
                "hours": round(requests / requests_per_hour, 2) if requests_per_hour else None,
                "levels_at_mib": None,
            }
    requests = max(0.0, (limit_mib - grown["last"]) / per_request)
    return {
        **out,
        "requests": round(requests),
        "hours": round(requests / requests_per_hour, 2) if requests_per_hour else None,
    }


def summary(spec: dict, points: list[dict], limits: dict, outcome=Outcome.OK, message=None, failed_at=None) -> dict:
    """The soak's result: what ran, each point, the growth of each quantity and where it leads, in words too."""
    ran_s = points[-1]["t_s"] if points else 0.0
    done = points[-1]["requests"] if points else 0
    rate = done / ran_s * 3600 if ran_s > 0 else 0.0
    grown = {key: growth(points, key) for key in ("rss_mib", "gpu_mib", "cache_mib")}
    rest = growth(
        [
            {**p, "rest_mib": p["rss_mib"] - p["cache_mib"]}
            for p in points
            if None not in (p.get("rss_mib"), p.get("cache_mib"))
        ],
        "rest_mib",
    )
    host = projection(grown["rss_mib"], limits.get("host_mib"), rate, grown["cache_mib"], rest, limits.get("cache_mib"))
    vram = projection(grown["gpu_mib"], limits.get("vram_mib"), rate)
    first = min(
        (p for p in ((host, "host"), (vram, "vram")) if p[0] and p[0].get("hours") is not None),
        key=lambda p: p[0]["hours"],
        default=None,
    )
    result = {
        **spec,
        "outcome": outcome,
        "message": message,
        "failed_at": failed_at,
        "requests_done": done,
        "ran_s": round(ran_s, 1),
        "requests_per_hour": round(rate, 1),
        "limits": limits,
        "growth": grown,
        "projection": {"host": host, "vram": vram},
        "hours_to_limit": first[0]["hours"] if first else None,  # None: nothing grows toward a limit
        "limit_reached_first": first[1] if first else None,
        "points": points,
    }
    return {**result, "said": text(result)}


def text(result: dict) -> str:
    """The soak in words: "RSS +21.0 MiB/request (95%: 19.8 to 22.2), VRAM flat: the host budget (4,096 MiB) is
    reached after about 600 requests (2.1 h at this rate)"."""
    parts = []
    for key, what in (("rss_mib", "RSS"), ("gpu_mib", "VRAM")):
        g = result["growth"].get(key)
        if g is None:
            continue
        r = g["per_request"]
        parts.append(
            f"{what} {r['slope']:+.2f} MiB/request (95%: {r['low']:+.2f} to {r['high']:+.2f})"
            if g["grows"]
            else f"{what} flat ({r['slope']:+.2f} MiB/request, 95%: {r['low']:+.2f} to {r['high']:+.2f})"
        )
    said = ", ".join(parts) or "no memory samples"
    first = result["limit_reached_first"]
    if first:
        p = result["projection"][first]
        what = (
            "the host budget"
            if first == "host" and result["limits"].get("host_is") == "budget"
            else ("the machine's RAM" if first == "host" else "the VRAM limit")
        )
        said += (
            f": {what} ({p['limit_mib']:,.0f} MiB) is reached after about {p['requests']:,} more requests "
            f"({p['hours']:,.1f} h at this rate)"
            if p["hours"] < HOURS_A_YEAR
            else f": {what} ({p['limit_mib']:,.0f} MiB) is not reached within a year at this rate"
        )
    elif (host := result["projection"].get("host")) and host.get("levels_at_mib"):
        what = "the host budget" if result["limits"].get("host_is") == "budget" else "the machine's RAM"
        said += (
            f": the growth is llama.cpp's prompt cache, which stops at its limit ({result['limits']['cache_mib']:,.0f} "
            f"MiB, --cache-ram): RSS levels off at about {host['levels_at_mib']:,} MiB, under {what} "
            f"({host['limit_mib']:,.0f} MiB)"
        )
    else:
        said += ": nothing grows toward a limit"
    return said


def _mean(values: list) -> float | None:
    have = [v for v in values if v]
    return round(statistics.fmean(have), 2) if have else None


def limits(host_ram_mib: int | None, vram_limit_mib: float | None, cache_ram: int | None = None) -> dict:
    """What the soak's growth is projected to: the host budget, else this machine's RAM; the VRAM limit (the
    budget, or the card), where there is a GPU; and where the prompt cache stops (``cache_ram``, the setting:
    llama.cpp's 8192 MiB when unset, None for -1, no limit)."""
    import psutil

    host = host_ram_mib or round(psutil.virtual_memory().total / (1 << 20))
    cache = DEFAULT_CACHE_RAM_MIB if cache_ram is None else (None if cache_ram < 0 else cache_ram)
    return {
        "host_mib": host,
        "host_is": "budget" if host_ram_mib else "machine",
        "vram_mib": vram_limit_mib,
        "cache_mib": cache,
    }


def run(server, sampler, prompts: PromptSource, spec: Soak, limits: dict, timeout_s: float, on_failure) -> dict:
    """The soak against ``server``: rounds of ``at_once`` unique prompts until ``requests`` or ``duration_s``.
    ``on_failure(exc)`` says what a failed request means: (the server's failure or None, outcome, message).
    Returns (result, the server's failure or None)."""
    client = Client.of(server, timeout_s)
    sampler.phase(PHASE)
    started = time.monotonic()
    points: list[dict] = []
    sent = 0
    while sent < spec.requests and (not spec.duration_s or time.monotonic() - started < spec.duration_s):
        n = min(spec.at_once, spec.requests - sent)
        batch = [prompts.prompt(spec.prompt_tokens, SEED + sent + i) for i in range(n)]
        offset = server.log_size()

        def go(prompt):
            try:
                return client.stream(prompt, spec.gen_tokens, cache_prompt=True)
            except Exception as exc:  # noqa: BLE001 - classified against the server's state below
                return exc

        with ThreadPoolExecutor(max_workers=n) as pool:
            answers = list(pool.map(go, batch))
        sent += n
        failed = next((a for a in answers if isinstance(a, Exception)), None)
        if failed is not None:
            failure, outcome, message = on_failure(failed)
            where = f"{PHASE}:request-{sent}"
            return summary(spec.as_dict(), points, limits, outcome, message, where), failure
        log = server.log_since(offset)[0]
        cache = logparse.prompt_cache_state(log)
        now = sampler.now()
        points.append(
            {
                "requests": sent,
                "t_s": round(time.monotonic() - started, 2),
                "rss_mib": now["rss_mib"],
                "gpu_mib": now["gpu_mib"],
                "cache_entries": cache["entries"] if cache else None,
                "cache_mib": cache["mib"] if cache else None,
                "checkpoints_created": sum(e["action"] == "created" for e in logparse.checkpoint_events(log)),
                "decode_tps": _mean([a.get("decode_tps") for a in answers]),
            }
        )
    return summary(spec.as_dict(), points, limits), None
