"""When two configurations are tied on the objective and which way a tie goes: each one's spread (the medians of
its server starts where it had several, else every request of its repetitions), the tie rule (overlapping spreads;
a configuration started once cannot tie one that won interleaved starts), and the tie-break (ahead on every other
metric, then the most VRAM headroom, then the higher median)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..core import columns as cols


@dataclass(frozen=True)
class Spread:
    """Where a configuration's speed lies: [low, high], and what that range is (the medians of its server starts
    where it had several, as between-start variance decides; else every request of its repetitions)."""

    low: float
    high: float
    what: str
    starts: int = 1


def spread_of(row, metric: str) -> Spread:
    listed = row.get(cols.start_medians(metric))
    starts = [float(v) for v in (listed if listed is not None and not np.isscalar(listed) else []) if v == v]
    if len(starts) >= 2:
        return Spread(min(starts), max(starts), f"the medians of its {len(starts)} server starts", len(starts))
    low, high = row[cols.stat(metric, "min")], row[cols.stat(metric, "max")]
    return Spread(float(low), float(high), "every request of its repetitions")


def overlap(a: Spread, b: Spread) -> bool:
    """Tied: neither range lies wholly above the other (as the search's climb and finalists judge noise)."""
    return a.low <= b.high and b.low <= a.high


def ties(a: Spread, b: Spread) -> bool:
    """``a`` is tied with the fastest, ``b``: their ranges overlap, and where the fastest was started several times
    (the search's finalists, interleaved), ``a`` was too: between-start variance decides, and one start's range
    of requests holds only the noise within that start. A value the search left out of its finalists, measured in
    one start, cannot tie one that won interleaved starts (on the H200 it made a value the climb found slowest the
    answer, for its headroom)."""
    return overlap(a, b) and (b.starts < 2 or a.starts >= 2)


# the metrics that break a tie on the objective, each with whether higher is better
TIE_METRICS = (("prefill_tps", True), ("decode_tps", True), ("ttft_s", False))
TIE_WORDS = {"prefill_tps": "prefill", "decode_tps": "decode", "ttft_s": "time to first token"}


def _dominates(a, b, metric: str) -> bool:
    """``a``'s medians are at least as good as ``b``'s on every other metric and better on one."""
    pairs = [
        (float(a[cols.stat(m, "median")]), float(b[cols.stat(m, "median")]), higher)
        for m, higher in TIE_METRICS
        if m != metric and not pd.isna(a.get(cols.stat(m, "median"))) and not pd.isna(b.get(cols.stat(m, "median")))
    ]
    as_good = all((x >= y) if higher else (x <= y) for x, y, higher in pairs)
    return bool(pairs) and as_good and any(x != y for x, y, _ in pairs)


def break_tie(tied: list[str], headroom: dict, rows: dict, metric: str) -> tuple[str, str | None]:
    """Among configurations tied with the fastest (``tied``, fastest first): the one better than every other on
    every other metric (prefill, decode, time to first token; ``rows``: their measurement rows) where one is; else
    the one with the most VRAM headroom, since the speeds cannot tell them apart and room is what survives the next
    longer prompt; where no headroom is known, the fastest median. Returns (winner, why, in words; None without a
    tie)."""
    if len(tied) == 1:
        return tied[0], None
    best = [c for c in tied if all(_dominates(rows[c], rows[o], metric) for o in tied if o != c)]
    if best:
        others = ", ".join(f"`{o}`" for o in tied if o != best[0])
        words = [TIE_WORDS[m] for m, _ in TIE_METRICS if m != metric]
        named = " and ".join([", ".join(words[:-1]), words[-1]] if len(words) > 2 else words)
        return best[0], f"tied with {len(tied) - 1} other(s) on speed; chosen for being ahead of {others} on {named}"
    known = {cid: h for cid in tied if (h := headroom.get(cid)) is not None and h == h}  # NaN: no GPU, no headroom
    if len(known) == len(tied):
        winner = max(tied, key=lambda cid: (known[cid], -tied.index(cid)))
        runner = next(cid for cid in tied if cid != winner)
        more = known[winner] - known[runner]
        why = (
            f"tied with {len(tied) - 1} other(s) on speed; chosen for the most VRAM headroom ({more:+,.0f} MiB against "
            f"`{runner}`)"
            if more
            else f"tied with {len(tied) - 1} other(s) on speed and headroom; chosen for the higher median"
        )
        return winner, why
    return tied[0], f"tied with {len(tied) - 1} other(s) on speed; chosen for the higher median"
