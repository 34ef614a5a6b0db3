"""A run where nothing survived, in the report's words: the failures' common cause (the binary, the machine, the
config's budget) and the server check that says which."""

from __future__ import annotations

import json
import signal

import pandas as pd

from ..core.records import Outcome
from ..tables.recommend import failure_reason


SERVER_FIELDS = {
    "binary": "binary",
    "obtained": "how obtained",
    "version": "version",
    "backend": "backend",
    "build_flags": "build flags",
    "sha256": "sha256",
}


COMMON_CAUSE = (
    "Every configuration of every model failed the same way ({way}). The cause is common to all of them: "
    "the llama-server binary or this machine, not the configurations."
)
# Refused before any server started: what the config asked of this machine, not the binary.


# Refused before any server started: what the config asked of this machine, not the binary.
REFUSED_CAUSE = {
    "budget": (
        "Every configuration of every model was refused before its server started: {message}. The cause is the "
        "config's budget (budget.vram_budget_mib or budget.host_ram_mib), which this machine cannot emulate, not the "
        "llama-server binary or the configurations: remove it, or run where it can be set."
    ),
    "gpus": (
        "Every configuration of every model was refused before its server started: {message}. The cause is the GPUs "
        "the configurations ask for, which this machine cannot lend, not the llama-server binary."
    ),
}


def _signal_name(returncode) -> str:
    number = -int(returncode)
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _way(row) -> str:
    """How a configuration failed, less what is particular to it: the signal, or else the kind of failure."""
    what = f"killed by {_signal_name(row['returncode'])}" if row["failure"] == "signal" else f"failure {row['failure']}"
    return failure_reason(row["outcome"], row["phase"], what)


def _text(value) -> str:
    """A provenance value as one text: "–" when absent, a list of words joined, other non-strings as JSON."""
    if value in (None, "", []):
        return "–"
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return " ".join(value)
    return value if isinstance(value, str) else json.dumps(value)


def check_text(check) -> str | None:
    """The binary's verification run (provenance "check": a dict, or a list of them), as key: value lines."""
    if not check:
        return None
    runs = check if isinstance(check, list) else [check]
    return "\n\n".join("\n".join(f"{k}: {_text(v)}".replace("\n", "\n  ") for k, v in run.items()) for run in runs)


def nothing_survived(configs: pd.DataFrame, measurements: pd.DataFrame, models: list[str], provenance: dict) -> dict:
    """The top of the report: each model of which no workload survived, with how each of its configurations
    failed; and, when every configuration of every model failed the same way, that the cause is common to
    all of them (the binary or the machine), with the binary's provenance."""
    survived = set(measurements.loc[measurements["workload_outcome"] == "ok", "model"])
    lost = []
    for model in (m for m in models if m not in survived):
        failed = configs[(configs["model"] == model) & (configs["outcome"] != "ok")]
        lost.append(
            {
                "title": f"No configuration of {model} survived"
                + ("" if len(failed) else ": there is no record of any"),
                "failures": [
                    {
                        "config_id": row["config_id"],
                        "server_args": row["server_args"],
                        "reason": failure_reason(row["outcome"], row["phase"], row["message"]),
                    }
                    for _, row in failed.iterrows()
                ],
            }
        )
    ways = {_way(row) for _, row in configs.iterrows()}
    common = len(lost) == len(models) and all(m["failures"] for m in lost) and len(configs) > 1 and len(ways) == 1
    refused = set(configs["failure"]) if common and set(configs["outcome"]) == {Outcome.BUDGET_REFUSED} else set()
    if len(refused) == 1 and (kind := refused.pop()) in REFUSED_CAUSE:
        said = REFUSED_CAUSE[kind].format(message=str(configs["message"].iloc[0]).rstrip("."))
    else:
        said = COMMON_CAUSE.format(way=ways.pop()) if common else None
    return {
        "models": lost,
        "common": said,
        "server": [{"label": label, "value": _text(provenance.get(key))} for key, label in SERVER_FIELDS.items()],
        "check": check_text(provenance.get("check")),
    }
