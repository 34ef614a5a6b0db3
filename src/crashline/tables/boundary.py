"""The crash line: for each combination of the other settings, the lowest n_cpu_moe that loads,
the lowest that survives the short workload, and the lowest that survives every workload."""

from __future__ import annotations

import pandas as pd

from ..core import columns as cols
from ..core.records import Outcome
from ..core.settings import SETTINGS

N_CPU_MOE = cols.setting("n_cpu_moe")
DID_NOT_LOAD = (Outcome.LOAD_FAILED, Outcome.BUDGET_REFUSED)

FLAG = {name: s.flag for name, s in SETTINGS.items()}


def _label(key: dict, varying: list[str]) -> str:
    parts = []
    for name in varying:
        value = key[cols.setting(name)]
        parts.append(f"{FLAG.get(name) or name} {value}")
    return ", ".join(parts) if parts else "all configurations"


def _lowest(rows: pd.DataFrame, mask: pd.Series) -> int | None:
    hits = rows.loc[mask, N_CPU_MOE]
    return int(hits.min()) if len(hits) else None


def crash_lines(configs: pd.DataFrame, measurements: pd.DataFrame, short_workload: str, margin_mib: int) -> list[dict]:
    """One entry per (model, environment, other settings) with at least two n_cpu_moe values."""
    if configs.empty or N_CPU_MOE not in configs:
        return []
    swept = configs[configs[N_CPU_MOE].notna()]
    others = [c for c in swept.columns if c.startswith(cols.SETTING_PREFIX) and c != N_CPU_MOE]
    varying = [c.removeprefix(cols.SETTING_PREFIX) for c in others if swept[c].astype(str).nunique() > 1]
    out = []
    for key_values, rows in swept.groupby(["model", "environment", *others], dropna=False, sort=True):
        if rows[N_CPU_MOE].nunique() < 2:
            continue
        key = dict(zip(["model", "environment", *others], key_values))
        rows = rows.sort_values(N_CPU_MOE)
        short_ok = measurements[
            (measurements["environment"] == key["environment"])
            & (measurements["workload"] == short_workload)
            & (measurements["workload_outcome"] == Outcome.OK)
        ]["config_id"]
        loads = _lowest(rows, ~rows["outcome"].isin(DID_NOT_LOAD))
        short = _lowest(rows, rows["config_id"].isin(short_ok))
        survives = _lowest(rows, rows["outcome"] == Outcome.OK)
        at = rows[rows[N_CPU_MOE] == survives].iloc[0] if survives is not None else None
        survivors = rows[rows["outcome"] == Outcome.OK][N_CPU_MOE]
        monotonic = survives is None or bool((rows[rows[N_CPU_MOE] >= survives]["outcome"] == Outcome.OK).all())
        headroom = at["headroom_mib"] if at is not None else None
        entry = {
            "model": key["model"],
            "environment": key["environment"],
            "label": _label(key, varying),
            "tested": [int(n) for n in rows[N_CPU_MOE]],
            "loads_from": loads,
            "short_from": short,
            "survives_from": survives,
            "peak_pct": at["peak_pct_of_limit"] if at is not None else None,
            "headroom_mib": headroom,
            "risky": headroom is not None and not pd.isna(headroom) and headroom < margin_mib,
            "monotonic": monotonic,
            "survivors": [int(n) for n in survivors],
        }
        entry["sentence"] = sentence(entry)
        out.append(entry)
    return out


def sentence(e: dict) -> str:
    def at(n):
        return f"n_cpu_moe {n}" if n is not None else "no tested value"

    text = f"{e['label']}: loads from {at(e['loads_from'])}, survives the short workload from {at(e['short_from'])}, "
    text += f"survives every workload from {at(e['survives_from'])}"
    if e["peak_pct"] is not None and not pd.isna(e["peak_pct"]):
        text += f" (peak {e['peak_pct']:.1f}% of the VRAM limit, headroom {e['headroom_mib']:.0f} MiB"
        text += ", less than the margin: risky)" if e["risky"] else ")"
    if not e["monotonic"]:
        text += "; not monotonic: a higher n_cpu_moe failed again"
    return text + f". Tested: {', '.join(map(str, e['tested']))}."
