"""The recommendation: the fastest configuration that survived every workload, and why each other
configuration lost (it failed, with its phase, or it was slower, by how much).

The page cache is a state at load, not a server setting: configurations measured cold are ranked
only when no warm run survived, and otherwise point to the cold-versus-warm comparison."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from . import columns as cols
from .logparse import on_host
from .records import Outcome
from .settings import SETTINGS

METRIC_LABEL = {"decode_tps": "decode", "prefill_tps": "prefill"}


# Settings left to llama.cpp (unset) and the configs column where its log says what it chose.
CHOSEN_COLUMNS = {"n_gpu_layers": "layers_offloaded", "threads": "n_threads", "threads_batch": "n_threads_batch"}


def difference(row, reference) -> str:
    """The llama-server arguments in which ``row`` differs from ``reference`` (the winner).

    A setting ``row`` leaves unset (None, or NaN in a table) is not an argument: it is left out, and what
    llama.cpp chose in its place, where the log says it (layers offloaded, threads, the weights it put on
    each GPU for --n-cpu-moe), follows in brackets."""
    parts, chosen, unset = [], [], []
    for col in row.index:
        if not col.startswith(cols.SETTING_PREFIX) or _shown(row[col]) == _shown(reference[col]):
            continue
        name = col.removeprefix(cols.SETTING_PREFIX)
        flag = SETTINGS[name].flag or name
        if _shown(row[col]) is not None:
            parts.append(f"{flag} {_shown(row[col])}")
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
        value = _shown(row.get(CHOSEN_COLUMNS[name]))
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


def _shown(value):
    """A setting's value as a label shows it: None for unset (None, NaN or NA in a table), 999 not 999.0."""
    if value is None or (pd.api.types.is_scalar(value) and pd.isna(value)):
        return None
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, (float, np.floating)) and float(value).is_integer():
        return int(value)
    return value


def _natural(text: str) -> list:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", text)]


def _too_tight(row, margin_mib: int) -> bool:
    headroom = row.get("headroom_mib")
    return headroom is not None and not pd.isna(headroom) and headroom < margin_mib


def _cold(row) -> bool:
    return row.get(cols.setting("page_cache")) == "cold"


def failure_reason(outcome: str, phase: str | None, message: str | None) -> str:
    """How a configuration failed, in words: "crashed at warmup: killed by SIGILL"."""
    where = f" at {phase}" if phase else ""
    return f"{outcome}{where}: {message or 'no message'}"


COLD_NOT_RANKED = "measured from a cold page cache: compared with its warm twin under Cold versus warm, not ranked"


def recommend(
    configs: pd.DataFrame,
    measurements: pd.DataFrame,
    metric: str,
    workload: str,
    margin_mib: int = 0,
    recall_failures: dict | None = None,
) -> list[dict]:
    """One entry per (model, environment): the winner and the verdict on every other configuration.

    A survivor whose VRAM headroom is below the margin is not eligible: it survived this run, but
    with less room than a longer prompt or another driver may need. Nor is one whose needle recall
    failed at a required length (``recall_failures``: (model, config_id) -> why)."""
    recall_failures = recall_failures or {}
    out = []
    if configs.empty:
        return out
    for (model, env), group in configs.groupby(["model", "environment"], sort=True):
        speeds = measurements[
            (measurements["model"] == model)
            & (measurements["environment"] == env)
            & (measurements["workload"] == workload)
        ].set_index("config_id")
        col, low, high = (cols.stat(metric, k) for k in ("median", "min", "max"))
        survivors = group[
            (group["outcome"] == Outcome.OK)
            & ~group.apply(_too_tight, axis=1, margin_mib=margin_mib)
            & ~group["config_id"].map(lambda c: (model, c) in recall_failures)
        ]
        warm = survivors[[not _cold(row) for _, row in survivors.iterrows()]]
        rank_cold = warm.empty  # only cold runs survived: rank them among themselves
        ranked = sorted(
            (
                (speeds.loc[cid, col], cid)
                for cid in (survivors if rank_cold else warm)["config_id"]
                if cid in speeds.index
            ),
            reverse=True,
        )
        winner = ranked[0][1] if ranked else None
        best = ranked[0][0] if ranked else None
        verdicts = []
        reference = group[group["config_id"] == winner].iloc[0] if winner else group.iloc[0]
        for _, row in group.iterrows():
            cid = row["config_id"]
            if cid == winner:
                continue
            label = difference(row, reference)
            if row["outcome"] == Outcome.OK and (model, cid) in recall_failures:
                verdicts.append(
                    {"config_id": cid, "label": label, "failed": True, "reason": recall_failures[(model, cid)]}
                )
            elif row["outcome"] == Outcome.OK and _too_tight(row, margin_mib):
                verdicts.append(
                    {
                        "config_id": cid,
                        "label": label,
                        "failed": True,
                        "risky": True,  # not eligible, yet it survived: no failure colour
                        "reason": f"risky: survived with {row['headroom_mib']:.0f} MiB VRAM headroom, "
                        f"less than the {margin_mib} MiB margin",
                    }
                )
            elif row["outcome"] != Outcome.OK:
                verdicts.append(
                    {
                        "config_id": cid,
                        "label": label,
                        "failed": True,
                        "reason": failure_reason(row["outcome"], row["phase"], row["message"]),
                    }
                )
            elif _cold(row) and not rank_cold:
                verdicts.append({"config_id": cid, "label": label, "failed": False, "reason": COLD_NOT_RANKED})
            else:
                speed = speeds.loc[cid, col] if cid in speeds.index else None
                pct = (speed - best) / best * 100 if speed and best else None
                reason = f"slower: {speed:.1f} t/s ({pct:+.1f}%)" if pct is not None else "no speed"
                if pct is not None and speeds.loc[cid, high] >= speeds.loc[winner, low]:
                    reason += ", within the spread of the repetitions: not a real difference yet"
                verdicts.append({"config_id": cid, "label": label, "failed": False, "speed": speed, "reason": reason})
        out.append(
            {
                "model": model,
                "environment": env,
                "metric": metric,
                "metric_label": METRIC_LABEL[metric],
                "workload": workload,
                "winner": winner,
                "winner_speed": best,
                "winner_row": group[group["config_id"] == winner].iloc[0].to_dict() if winner else None,
                "others": sorted(verdicts, key=lambda v: (v["failed"], -(v.get("speed") or 0), _natural(v["label"]))),
            }
        )
    return out
