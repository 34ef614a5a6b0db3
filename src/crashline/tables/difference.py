"""What one configuration's row says apart from another's (the winner): the llama-server arguments it differs in,
and, for a setting it left to llama.cpp, what the server's log says llama.cpp chose in its place."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..core import columns as cols
from ..core.settings import SETTINGS
from ..engine.logparse import on_host


# Settings left to llama.cpp (unset) and the configs column where its log says what it chose.
CHOSEN_COLUMNS = {"n_gpu_layers": "layers_offloaded", "threads": "n_threads", "threads_batch": "n_threads_batch"}
# Settings whose absence llama.cpp fills with nothing of its own: unset, the row is "without" them (a partial
# placement's winner beside its whole layers reads "without -ot", not "-ot left to llama.cpp").
ABSENT_WITHOUT = {"override_tensor"}


def difference(row, reference) -> str:
    """The llama-server arguments in which ``row`` differs from ``reference`` (the winner).

    A setting ``row`` leaves unset (None, or NaN in a table) is not an argument: it is left out, and what
    llama.cpp chose in its place, where the log says it (layers offloaded, threads, the weights it put on
    each GPU for --n-cpu-moe), follows in brackets."""
    parts, chosen, unset = [], [], []
    for col in row.index:
        if not col.startswith(cols.SETTING_PREFIX) or shown_value(row[col]) == shown_value(reference[col]):
            continue
        name = col.removeprefix(cols.SETTING_PREFIX)
        flag = SETTINGS[name].flag or name
        if shown_value(row[col]) is not None:
            parts.append(f"{flag} {shown_value(row[col])}")
        elif name in ABSENT_WITHOUT:
            parts.append(f"without {flag}")
        elif (said := _chosen(row, name, flag)) is not None:
            chosen.append(said)
        else:
            unset.append(flag)
    if chosen:
        parts.append(f"(llama.cpp chose {', '.join(chosen)})")
    if not parts and unset:  # differs only in what it leaves to llama.cpp, which the log does not say
        parts.append(f"{', '.join(unset)} left to llama.cpp")
    return " ".join(parts) or "same settings"


def _chosen(row, name: str, flag: str) -> str | None:
    """What llama.cpp's log says it chose for a setting the row left unset, or None."""
    if name in CHOSEN_COLUMNS:
        value = shown_value(row.get(CHOSEN_COLUMNS[name]))
        return f"{flag} {value}" if value is not None else None
    if name == "n_cpu_moe":
        gpus = {}
        for b in _listed(row.get("buffers")):
            if b.get("kind") == "model" and not on_host(b["device"]):
                gpus[b["device"]] = gpus.get(b["device"], 0) + b["mib"]
        return ", ".join(f"{mib:,.0f} MiB of weights on {device}" for device, mib in gpus.items()) or None
    return None


def _listed(value) -> list:
    """A list column's value (a list, an array, or nothing)."""
    return [] if value is None or (pd.api.types.is_scalar(value) and pd.isna(value)) else list(value)


def shown_value(value):
    """A setting's value as a label shows it: None for unset (None, NaN or NA in a table), 999 not 999.0."""
    if value is None or (pd.api.types.is_scalar(value) and pd.isna(value)):
        return None
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, (float, np.floating)) and float(value).is_integer():
        return int(value)
    return value
