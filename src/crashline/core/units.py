"""Units every stage counts in."""

import math

MIB = 1 << 20  # bytes in a MiB: memory is said in MiB throughout

DURATION_UNITS = {"": 1, "s": 1, "m": 60, "min": 60, "h": 3600}


def seconds_of(text: str, what: str) -> int:
    """A duration as typed (``900``, ``900s``, ``15m``, ``1.5h``) in whole seconds; ValueError naming ``what``, the
    value and the forms it takes."""
    raw = str(text).strip().lower()
    number = raw.rstrip("smhin")
    unit = raw[len(number) :]
    try:
        value = float(number) * DURATION_UNITS[unit]
    except (ValueError, KeyError):
        value = None
    if value is None or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{what} {text!r}: not a duration; write seconds or a unit, e.g. 900, 900s, 15m or 1.5h")
    return round(value)
