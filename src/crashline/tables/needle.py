"""The needle table (``results/tables/needle.parquet``): one row per needle trial, from the records
``jobs.needle`` writes, and what the report and the recommendation read from it."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pyarrow as pa

from ..core import columns as cols
from ..core import settings as settings_mod
from ..core import records
from . import files
from ..core.host import environment_key
from ..config.needle import baseline_failed, length_label
from ..core.thresholds import missing

TRIAL_COLUMNS = (
    "length_target",
    "length_fraction",
    "depth",
    "depth_actual",
    "trial",
    "value",
    "answer",
    "passed",
    "prompt_n",
    "predicted_n",
    "prompt_ms",
    "reason",
)


def length_key(spec) -> str:
    """A needle length as the table keeps it (``columns.LENGTHS``): 2048 -> "2048", 0.9 -> "0.9", 1.0 -> "1.0"."""
    return json.dumps(spec)


def _config_columns(rec: dict) -> dict:
    """What every row of one record shares: the configuration, the environment, the verdict."""
    ns = rec.get("needle") or {}
    budget = (rec.get("budget") or {}).get("vram_budget_mib") or "none"
    return {
        "model": rec["model"]["name"],
        "config_id": rec["config_id"],
        "server_args": settings_mod.label(rec["settings"]),
        "environment": environment_key(rec["host"]) + f"|budget {budget}",
        "server_version": rec["server"].get("version"),
        "server_sha256": rec["server"].get("sha256"),
        "prompt_style": rec.get("prompt_style"),
        "needle_kind": ns.get("kind"),
        "applicable": rec["applicable"],
        "recall": rec["recall"],
        "failed_required": [length_key(s) for s in rec.get("failed_required") or []],
        "required": [length_key(s) for s in ns.get("required") or []],
        "outcome": rec["outcome"],
        "failure": rec.get("failure"),
        "phase": rec.get("phase"),
        "message": rec.get("message"),
        "slot_ctx": rec.get("slot_ctx"),
        "started_at": rec.get("started_at"),
        "job_s": _seconds_between(rec.get("started_at"), rec.get("finished_at")),
    }


def _seconds_between(start: str | None, end: str | None) -> float | None:
    """The seconds from one ISO time to another (a needle job's whole time), None where either is missing."""
    from datetime import datetime

    if not start or not end:
        return None
    return (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()


def table(record_paths) -> pa.Table:
    """Needle records into one row per trial of the registry's columns (``columns.NEEDLE``; a configuration
    without trials gets one row with empty trial columns)."""
    rows = []
    for path in record_paths:
        rec = records.load(path, "needle")
        base = _config_columns(rec)
        trials = rec.get("trials") or []
        if not trials:
            rows.append({**base, "length": None})
        for t in trials:
            rows.append({**base, "length": length_key(t["length"]), **{k: t.get(k) for k in TRIAL_COLUMNS}})
    return files.typed_table(rows, cols.NEEDLE)


def write_table(record_paths, path: Path) -> pd.DataFrame:
    """``table`` written atomically as Parquet, CSV and JSON."""
    arrow = table([Path(p) for p in record_paths])
    files.write(arrow, path)
    return arrow.to_pandas()


def _value(value):
    """A table value, None where the table has none."""
    return None if missing(value) else value


def _int(value) -> int | None:
    return None if missing(value) else int(value)


# --------------------------------------------------------------------------- read back


def recall_grid(frame: pd.DataFrame | None) -> list[dict]:
    """Per model, per configuration, a grid of lengths x depths: {"name", "applicable", "message",
    "configs": [{"config_id", "server_args", "prompt_style", "applicable", "recall", "failed_required",
    "outcome", "message", "slot_ctx", "depths", "rows": [{"length", "length_target", "required",
    "cells": [None | {"depth", "passed", "n", "n_passed", "value", "answer", "reason"}]}]}]}."""
    out = []
    if frame is None or frame.empty:
        return out
    for model, by_model in frame.groupby("model", sort=False):
        configs = [_config_grid(cid, rows) for cid, rows in by_model.groupby("config_id", sort=False)]
        applicable = any(c["applicable"] for c in configs)
        message = None if applicable else configs[0]["message"]
        out.append({"name": model, "applicable": applicable, "message": message, "configs": configs})
    return out


def _config_grid(cid: str, rows: pd.DataFrame) -> dict:
    first = rows.iloc[0]
    trials = rows[rows["length"].notna()]
    depths = list(dict.fromkeys(float(d) for d in trials["depth"])) if not trials.empty else []
    required = list(first["required"])
    return {
        "config_id": cid,
        "server_args": first["server_args"],
        "prompt_style": first["prompt_style"],
        "applicable": bool(first["applicable"]),
        "recall": first["recall"],
        "failed_required": [length_label(json.loads(s)) for s in first["failed_required"]],
        "outcome": first["outcome"],
        "message": _value(first["message"]),
        "slot_ctx": _int(first["slot_ctx"]),
        "depths": depths,
        "rows": [
            _length_row(length, at_length, depths, required)
            for length, at_length in trials.groupby("length", sort=False)
        ],
    }


def _length_row(length: str, at_length: pd.DataFrame, depths: list[float], required: list[str]) -> dict:
    return {
        "length": length_label(json.loads(length)),
        "length_target": _int(at_length["length_target"].iloc[0]),
        "required": length in required,
        "cells": [_grid_cell(at_length[at_length["depth"] == depth], depth) for depth in depths],
    }


def _grid_cell(here: pd.DataFrame, depth: float) -> dict | None:
    """One length x depth: passed only if every trial there passed; a failed trial is the one shown."""
    if here.empty:
        return None
    passed = here["passed"].astype(bool)
    shown = (here[~passed] if not passed.all() else here).iloc[0]
    return {
        "depth": depth,
        "passed": bool(passed.all()),
        "n": len(here),
        "n_passed": int(passed.sum()),
        "value": _value(shown["value"]),
        "answer": _value(shown["answer"]),
        "reason": _value(shown["reason"]),
    }


def uninformative(frame: pd.DataFrame | None) -> dict[str, str]:
    """model -> why recall cannot rank its configurations: the baseline failed, no trial at the shortest length any
    configuration tried passed, in any configuration. A failure even there is the model's (random weights, a model
    too small for the task), not a configuration's, which would recall short needles and lose long ones."""
    out: dict[str, str] = {}
    if frame is None or frame.empty or "length_target" not in frame:  # no trial ran (a model recall does not apply to)
        return out
    trials = frame[frame["length_target"].notna() & frame["applicable"].fillna(False).astype(bool)]
    for model, rows in trials.groupby("model", sort=False):
        shortest = baseline_failed(zip(rows["length_target"], rows["passed"].fillna(False)))
        if shortest is not None:
            on = ", ".join(f"`{cid}`" for cid in dict.fromkeys(rows[rows["length_target"] == shortest]["config_id"]))
            out[model] = (
                f"the model does not recall a needle even at {shortest:,.0f} tokens (on {on}): recall cannot rank "
                "its configurations, and no configuration is refused for it"
            )
    return out


def recall_failures(frame: pd.DataFrame | None) -> dict[tuple[str, str], str]:
    """(model, config_id) -> why the recommendation must skip it: recall failed at a required length. A model whose
    recall is ``uninformative`` has none: its failures say nothing about a configuration."""
    out: dict[tuple[str, str], str] = {}
    if frame is None or frame.empty:
        return out
    exempt = uninformative(frame)
    for (model, cid), rows in frame.groupby(["model", "config_id"], sort=False):
        if model in exempt:
            continue
        failed = list(rows.iloc[0]["failed_required"])
        if not failed:
            continue
        bad = rows[rows["length"].isin(failed) & ~rows["passed"].fillna(False).astype(bool)]
        detail = ""
        if not bad.empty:
            t = bad.iloc[0]
            where = "" if missing(t["length_target"]) else f"at {t['length_target']:.0f} tokens, depth {t['depth']:g}: "
            detail = f" ({where}{t['reason']})"
        labels = ", ".join(length_label(json.loads(s)) for s in failed)
        out[(model, cid)] = f"needle recall failed at required length {labels}{detail}"
    return out
