"""When a measured number is not to be trusted as it is: the one place these thresholds live.

The report flags a speed whose range is too wide or that was measured on a shared machine, and a
correction of a published table asks for those rows to be repeated before they are sent upstream.
"""

from __future__ import annotations

HIGH_SPREAD_PCT = 10.0  # (max - min) / median above this, in %: the median alone is not to be trusted
CONTENTION_CORES = 0.3  # other processes busier than this during a workload: it measured a shared machine


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
