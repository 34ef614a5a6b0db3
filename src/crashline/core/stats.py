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


def end_to_end_tps(request: dict) -> float | None:
    """A request's prompt and generated tokens over the whole time it took, from sending it to its last token (the
    client's clock, ``end_s``): how fast a user is served, prefill and decode together. A request recorded before
    crashline kept the client's times has only the server's (``prompt_ms`` + ``predicted_ms``): those stand in."""
    tokens = (request.get("prompt_n") or 0) + (request.get("predicted_n") or 0)
    seconds = request.get("end_s")
    if seconds is None and request.get("prompt_ms") is not None and request.get("predicted_ms") is not None:
        seconds = (request["prompt_ms"] + request["predicted_ms"]) / 1000
    return tokens / seconds if tokens and seconds else None
