"""When two configurations are tied on the objective and which way a tie goes: each one's spread (the medians of
its server starts where it had several, else every request of its repetitions), the tie rule (overlapping spreads;
a configuration started once cannot tie one that won interleaved starts), and the tie-break (never one another tied
configuration beats or equals on every measured column; then ahead on every other metric, the most VRAM headroom, the
smallest peak memory, the higher median)."""

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
    medians: tuple[float, ...] = ()  # each server start's median, where it had several


def spread_of(row, metric: str) -> Spread:
    listed = row.get(cols.start_medians(metric))
    starts = [float(v) for v in (listed if listed is not None and not np.isscalar(listed) else []) if v == v]
    if len(starts) >= 2:
        what = f"the medians of its {len(starts)} server starts"
        return Spread(min(starts), max(starts), what, len(starts), tuple(starts))
    low, high = row[cols.stat(metric, "min")], row[cols.stat(metric, "max")]
    return Spread(float(low), float(high), "every request of its repetitions")


def overlap(a: Spread, b: Spread) -> bool:
    """Tied: neither range lies wholly above the other (as the search's climb and finalists judge noise)."""
    return a.low <= b.high and b.low <= a.high


# Student's t, two-sided 95%, by degrees of freedom (pyperf's table, as its compare_to judges "significant")
T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131)


def apart(a: Spread, b: Spread) -> bool:
    """Whether the starts' medians of ``a`` and ``b`` differ by Student's two-sample t-test at 95% (pooled variance,
    pyperf's rule): where each had several server starts, their ranges lying wholly apart is not enough, since two
    starts each of configurations that do not differ at all lie wholly apart one time in three
    (bench/results/default-agreement-cpu-s24/). Without several starts on both sides: their ranges decide."""
    if len(a.medians) < 2 or len(b.medians) < 2:
        return not overlap(a, b)
    n, m = len(a.medians), len(b.medians)
    mean_a, mean_b = sum(a.medians) / n, sum(b.medians) / m
    pooled = (sum((x - mean_a) ** 2 for x in a.medians) + sum((x - mean_b) ** 2 for x in b.medians)) / (n + m - 2)
    if pooled == 0:
        return mean_a != mean_b
    t = abs(mean_a - mean_b) / (pooled * (1 / n + 1 / m)) ** 0.5
    return t > (T95[n + m - 3] if n + m - 3 < len(T95) else 1.96)


def same_speed(a: Spread, b: Spread) -> bool:
    """Neither is faster: their ranges overlap, or the t-test cannot tell their starts apart (``apart``). The one rule
    ranking, ``compare`` and ``recheck`` say "tied" by."""
    return overlap(a, b) or not apart(a, b)


def ties(a: Spread, b: Spread) -> bool:
    """``a`` is tied with the fastest, ``b``: their ranges overlap, or, where both were started several times, the
    t-test cannot tell their starts apart (``apart``); and where the fastest was started several times (the search's
    finalists, interleaved), ``a`` was too: between-start variance decides, and one start's range of requests holds
    only the noise within that start. A value the search left out of its finalists, measured in one start, cannot tie
    one that won interleaved starts (on the H200 it made a value the climb found slowest the answer, for its
    headroom)."""
    return same_speed(a, b) and (b.starts < 2 or a.starts >= 2)


# the metrics that break a tie on the objective, each with whether higher is better
TIE_METRICS = (("prefill_tps", True), ("decode_tps", True), ("ttft_s", False))
TIE_WORDS = {"prefill_tps": "prefill", "decode_tps": "decode", "ttft_s": "time to first token"}
HIGHER_IS_BETTER = {"prefill_tps": True, "decode_tps": True, "e2e_tps": True, "aggregate_tps": True, "ttft_s": False}
# a configuration's peak memory: less is better (the host's on a machine without a GPU, the card's on one)
HOST_MEMORY = "peak_rss_mib"
MEMORY_COLUMNS = (HOST_MEMORY, "peak_gpu_mib")


def dominates(a: dict, b: dict) -> bool:
    """``a`` is at least as good as ``b`` on every column both have a value for and better on one. Columns map a name
    to (value, higher is better); a column either lacks (None or NaN) is left out."""
    known = [k for k in a if k in b and not pd.isna(a[k][0]) and not pd.isna(b[k][0])]
    as_good = all((a[k][0] >= b[k][0]) if a[k][1] else (a[k][0] <= b[k][0]) for k in known)
    return bool(known) and as_good and any(a[k][0] != b[k][0] for k in known)


def measured_columns(measurements: pd.DataFrame, config, tied_on: tuple[str, str]) -> dict:
    """Every column a configuration was measured on, for ``dominates``: each workload's median of each metric but the
    one the configurations are tied on (``tied_on``: the objective's workload and metric, where the speeds cannot tell
    them apart), and its peak memory (``config``: its row of the configs table; ``measurements``: its rows of the
    measurements table)."""
    out = {
        (row["workload"], m): (row.get(cols.stat(m, "median")), higher)
        for _, row in measurements.drop_duplicates("workload").iterrows()
        for m, higher in HIGHER_IS_BETTER.items()
        if (row["workload"], m) != tied_on
    }
    return out | {(name,): (config.get(name), False) for name in MEMORY_COLUMNS}


def _ahead_elsewhere(a, b, metric: str) -> bool:
    """``a``'s medians at the objective's workload are at least as good as ``b``'s on every metric but ``metric``, and
    better on one."""

    def columns(row) -> dict:
        return {m: (row.get(cols.stat(m, "median")), higher) for m, higher in TIE_METRICS if m != metric}

    return dominates(columns(a), columns(b))


def break_tie(
    tied: list[str], headroom: dict, rows: dict, metric: str, measured: dict, memory: dict, spreads: dict
) -> tuple[str, str | None]:
    """Among configurations tied with the fastest (``tied``, fastest first), only those whose spread (``spreads``)
    overlaps the fastest's may be chosen: one tied only because the t-test cannot tell its few starts apart, its
    starts all below the fastest's, stays named in the tie but does not win it for its headroom (on the H200 that
    would have answered n_cpu_moe 30 for 29, 15% slower over two starts each). Among those, never one that another
    beats or equals on every measured column (``measured``: ``measured_columns`` per configuration). Of those left:
    the one better than every other on every other metric (prefill, decode, time to first token; ``rows``: their
    measurement rows at the objective's workload) where one is; else the one with the most VRAM headroom, since the
    speeds cannot tell them apart and room is what survives the next longer prompt; on a machine without a GPU
    (no headroom known), the smallest peak memory (``memory``: host peak RSS in MiB); where neither is known, the
    fastest median. Returns (winner, why, in words; None without a tie)."""
    if len(tied) == 1:
        return tied[0], None
    said = f"tied with {len(tied) - 1} other(s) on speed"
    below = [c for c in tied[1:] if not overlap(spreads[c], spreads[tied[0]])]
    if below:
        names = ", ".join(f"`{c}`" for c in below)
        said += f" ({names}: every start below, but too few starts to tell apart by Student's t at 95%)"
        tied = [c for c in tied if c not in below]
        if len(tied) == 1:
            return tied[0], f"{said}; chosen for every start above theirs"
    kept = [c for c in tied if not any(dominates(measured[o], measured[c]) for o in tied if o != c)]
    if len(kept) == 1:
        others = ", ".join(f"`{o}`" for o in tied if o != kept[0])
        return kept[0], f"{said}; chosen for being as good as {others} on every measured column and better on one"
    best = [c for c in kept if all(_ahead_elsewhere(rows[c], rows[o], metric) for o in kept if o != c)]
    if best:
        others = ", ".join(f"`{o}`" for o in kept if o != best[0])
        words = [TIE_WORDS[m] for m, _ in TIE_METRICS if m != metric]
        named = " and ".join([", ".join(words[:-1]), words[-1]] if len(words) > 2 else words)
        return best[0], f"{said}; chosen for being ahead of {others} on {named}"
    for values, more_wins, what in (
        (headroom, True, "the most VRAM headroom"),
        (memory, False, "the smallest peak memory"),
    ):
        known = {cid: v for cid in kept if (v := values.get(cid)) is not None and v == v}  # NaN: not known
        if len(known) < len(kept):
            continue
        leaders = [cid for cid in kept if known[cid] == (max if more_wins else min)(known.values())]
        if len(leaders) > 1:  # it cannot tell these apart: the next one decides among them
            kept = leaders
            continue
        runner = next(cid for cid in kept if cid != leaders[0])
        return leaders[
            0
        ], f"{said}; chosen for {what} ({known[leaders[0]] - known[runner]:+,.0f} MiB against `{runner}`)"
    return kept[0], f"{said}; chosen for the higher median"
