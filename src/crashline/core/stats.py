"""The statistics every stage states the same way: median, min, max, n, stdev and spread of a list of values,
and the end-to-end speed of one request."""

from __future__ import annotations

import statistics


def stats(values: list[float]) -> dict | None:
    if not values:
        return None
    med = statistics.median(values)
    return {
        "median": med,
        "min": min(values),
        "max": max(values),
        "n": len(values),
        "stdev": statistics.stdev(values) if len(values) > 1 else 0.0,
        "spread_pct": (max(values) - min(values)) / med * 100 if med else None,
    }


def resent_seconds(request: dict) -> float | None:
    """A re-sent request's time as a fresh one (``workloads.resent_run``): the fresh request's time to first token
    (``first_s``), then this one's own from its first token to its last."""
    if request.get("first_s") is None or request.get("ttft_s") is None or request.get("end_s") is None:
        return None
    return request["first_s"] + request["end_s"] - request["ttft_s"]


def end_to_end_tps(request: dict) -> float | None:
    """A request's prompt and generated tokens over the whole time it took, from sending it to its last token (the
    client's clock, ``end_s``): how fast a user is served, prefill and decode together. A request recorded before
    crashline kept the client's times has only the server's (``prompt_ms`` + ``predicted_ms``): those stand in."""
    tokens = (request.get("prompt_n") or 0) + (request.get("predicted_n") or 0)
    seconds = request.get("end_s")
    if request.get("first_s") is not None:  # a re-sent prompt (workloads.resent_run): as the fresh one it stands on
        tokens += request.get("cache_n") or 0
        seconds = resent_seconds(request)
    if seconds is None and request.get("prompt_ms") is not None and request.get("predicted_ms") is not None:
        seconds = (request["prompt_ms"] + request["predicted_ms"]) / 1000
    return tokens / seconds if tokens and seconds else None
