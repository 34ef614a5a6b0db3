"""Finished runs side by side (``crashline compare``): per model, each run's answer at its objective, as vLLM's
benchmark folders are compared. The first run is the reference: every other run's speed is its ratio to it, tied
where the recommendation would tie them (``ties.same_speed``: the ranges overlap, or Student's t cannot tell the
medians of the server starts apart where both have several), "cannot tell" where a side measured it once. Runs that
rank by different objectives cannot be compared and are refused. Pure: each run's recommendation and tables in, rows
out."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from ..core import columns as cols
from ..core.thresholds import inconclusive
from .recheck import build_of, number
from .ties import same_speed, spread_of
from ..core.errors import CrashlineError

# What a row shows of the answer at its objective's workload, besides the metric itself.
SHOWN = ("prefill_tps", "decode_tps", "ttft_s")


class CompareError(CrashlineError, ValueError):
    pass


@dataclass(frozen=True)
class Run:
    """One finished run: its name (the folder, or NAME= given), its answers and its measurements table."""

    name: str
    answers: list[dict]
    measurements: pd.DataFrame


def _objective(answer: dict) -> tuple:
    return answer.get("metric"), answer.get("workload"), answer.get("objective")


def compare(runs: list[Run]) -> list[dict]:
    """One row per model and run, models in the first run's order then any others; the first run with an answer
    for a model is its reference."""
    models = list(dict.fromkeys(a["model"] for run in runs for a in run.answers))
    rows = []
    for model in models:
        answered = [(run, a) for run in runs for a in run.answers if a["model"] == model]
        objectives = {_objective(a) for _, a in answered}
        if len(objectives) > 1:
            said = "; ".join(f"{run.name}: {a.get('objective')}" for run, a in answered)
            raise CompareError(
                f"{model}: the runs rank by different objectives ({said}), so their answers cannot be compared; "
                "compare runs of one objective (the config's objective: block)"
            )
        reference = None
        for run, answer in answered:
            row = _row(run, answer)
            if reference is None and row["median"] is not None:
                reference = row
            row["ratio"], row["verdict"] = _against(row, reference)
            rows.append(row)
    return rows


def regressed(rows: list[dict]) -> list[dict]:
    """Per model, the runs after its reference that are slower beyond the noise or have no answer where the
    reference has one (``compare`` exits REGRESSED with any); a run before the reference had none either."""
    worse, seen = [], set()
    for row in rows:
        if row["verdict"] == "reference":
            seen.add(row["model"])
        elif row["model"] in seen and row["verdict"] in ("slower", None):
            worse.append(row)
    return worse


def _row(run: Run, answer: dict) -> dict:
    metric, workload, objective = _objective(answer)
    winner = answer.get("winner")
    at = winner_rows(run, answer)
    at = at[(at["workload"] == workload) & (at["concurrency"] == answer.get("measured", {}).get("concurrency", 1))]
    measured = at.iloc[0] if len(at) else None
    row = {
        "model": answer["model"],
        "run": run.name,
        "environment": answer.get("environment"),
        "objective": objective,
        "metric": metric,
        "workload": workload,
        "winner": winner,
        "use": answer.get("use"),
        "server_args": measured.get("server_args") if measured is not None else None,
        "metric_label": answer.get("metric_label"),
        "why_none": None if winner else answer.get("why"),
        "build": build_of(measured) if measured is not None else None,
        "median": number(measured[cols.stat(metric, "median")]) if measured is not None else None,
        "spread": spread_of(measured, metric) if measured is not None else None,
        "n": number(measured[cols.stat(metric, "n")]) if measured is not None else None,
        "headroom_mib": number(answer.get("headroom_mib")),
        "peak_gpu_mib": number(measured.get("peak_gpu_mib")) if measured is not None else None,
        "peak_rss_mib": number(measured.get("peak_rss_mib")) if measured is not None else None,
        # what other processes used while it was measured, of the host's cores (thresholds.inconclusive)
        "cpu_other_cores": number(measured.get("cpu_other_cores")) if measured is not None else None,
        "cpu_logical_cores": number(measured.get("cpu_logical_cores")) if measured is not None else None,
    }
    for name in SHOWN:
        row[name] = number(measured[cols.stat(name, "median")]) if measured is not None else None
    return row


def winner_rows(run: Run, answer: dict) -> pd.DataFrame:
    """The measurements of the configuration a run recommended for a model, on its machine (every workload)."""
    m = run.measurements
    if not answer.get("winner") or m.empty:
        return m.iloc[:0]
    mine = (m["model"] == answer["model"]) & (m["config_id"] == answer["winner"])
    if "environment" in m and answer.get("environment") is not None:
        mine &= m["environment"] == answer["environment"]
    return m[mine]


def _against(row: dict, reference: dict | None) -> tuple[float | None, str | None]:
    """This run's speed over the reference's, and whether it is faster, slower, tied or cannot be told."""
    if reference is None or row is reference or row["median"] is None:
        return (None, "reference") if row is reference else (None, None)
    ratio = round(row["median"] / reference["median"], 3)
    if min(row["n"] or 0, reference["n"] or 0) < 2:
        return ratio, "cannot tell"  # one request on a side: no range to judge the noise by
    if inconclusive([row, reference]):
        return ratio, "inconclusive"  # other processes competed on one side: neither faster nor slower
    if same_speed(row["spread"], reference["spread"]):
        return ratio, "tied"
    return ratio, "faster" if ratio > 1 else "slower"
