"""When a measured number is not to be trusted as it is: the one place these thresholds live.

The report flags a speed whose range is too wide or that was measured on a shared machine, and a
correction of a published table asks for those rows to be repeated before they are sent upstream.
"""

from __future__ import annotations

HIGH_SPREAD_PCT = 10.0  # (max - min) / median above this, in %: the median alone is not to be trusted
# Other processes busier than this during a workload (in cores): it measured a shared machine. On this project's
# 2-core machine quiet runs read 0.03-0.13 cores (bench/results/contention-threshold/), runs beside a build or a
# browser 0.9-1.4 (issue #41): 0.3 is over twice the quiet maximum and a third of the lowest contended reading.
CONTENTION_CORES = 0.3
# How long a server start waits, at most, for other processes to fall under CONTENTION_CORES before its timed requests
# (telemetry.Sampler.quiet): a burst (a browser tab, an editor's indexer, a test beside it) passes in seconds, a build
# does not; after one wait that found no quiet stretch, the start measures at once and its rows say contended.
QUIET_WAIT_S = 30.0
# The shortest stretch whose CPU use is read as a rate: /proc counts in 10 ms ticks, so a quarter second reads to 0.04
# cores; a warm-up shorter than this (a small model's) is lengthened to it rather than counted as a wait.
QUIET_STRETCH_MIN_S = 0.25


def missing(value) -> bool:
    """No value: None, or a missing number of a table (NaN, pandas' NA)."""
    if value is None:
        return True
    try:
        return bool(value != value)  # NaN is the one value unequal to itself
    except TypeError:  # pandas' NA: "unequal" is NA again, which has no truth value
        return True


def too_wide(spread_pct) -> bool:
    """The range of the repetitions is wider than HIGH_SPREAD_PCT of the median."""
    return not missing(spread_pct) and spread_pct > HIGH_SPREAD_PCT


def shared(other_cores) -> bool:
    """Other processes used more than CONTENTION_CORES cores during the workload: a shared machine."""
    return not missing(other_cores) and other_cores > CONTENTION_CORES


def inconclusive(rows) -> str | None:
    """Why no "faster" or "slower" may be drawn between these measurements (rows with ``cpu_other_cores`` and
    ``cpu_logical_cores``, as the measurements table has them): other processes used more than CONTENTION_CORES
    during one of them. None where every one was measured on a quiet machine."""
    busy = [r for r in rows if shared(r.get("cpu_other_cores"))]
    if not busy:
        return None
    worst = max(busy, key=lambda r: r["cpu_other_cores"])
    cores = worst.get("cpu_logical_cores")
    of = "" if missing(cores) else f" of {int(cores)}"
    return (
        f"inconclusive: other processes used {worst['cpu_other_cores']:.1f}{of} cores during these measurements; "
        "rerun on a quiet machine"
    )


def could_reach(row, speed, best) -> bool:
    """Whether a configuration measured at ``speed`` while other processes used ``cpu_other_cores`` of the host's
    ``cpu_logical_cores`` (``row``) could have reached ``best`` on a quiet machine: with its fair share of the cores
    back, a server using all of them would run at most cores ÷ (cores − others) times as fast. A first-order reach,
    not a bound (threads that wait on a preempted one lose more); it keeps "possible answer" for rivals within it,
    and never for one a quiet machine's share could not lift that far (a 3× gap beside one busy core of 32)."""
    others, cores = row.get("cpu_other_cores"), row.get("cpu_logical_cores")
    if missing(speed) or missing(best) or missing(others):
        return False
    if missing(cores) or others >= cores:
        return True
    return speed * cores / (cores - others) >= best
