"""The crash line: for each combination of the other settings, the lowest n_cpu_moe that loads,
the lowest that survives the short workload, and the lowest that survives every workload."""

from __future__ import annotations

import pandas as pd

from .settings import SETTINGS

FLAG = {name: s.flag for name, s in SETTINGS.items()}


def _label(key: dict, varying: list[str]) -> str:
    parts = []
    for name in varying:
        value = key[f"s_{name}"]
        parts.append(f"{FLAG.get(name) or name} {value}")
    return ", ".join(parts) if parts else "all configurations"


def _lowest(rows: pd.DataFrame, mask: pd.Series) -> int | None:
    hits = rows.loc[mask, "s_n_cpu_moe"]
    return int(hits.min()) if len(hits) else None


def crash_lines(configs: pd.DataFrame, measurements: pd.DataFrame, short_workload: str, margin_mib: int) -> list[dict]:
    """One entry per (model, environment, other settings) with at least two n_cpu_moe values."""
    if configs.empty or "s_n_cpu_moe" not in configs:
        return []
    swept = configs[configs["s_n_cpu_moe"].notna()]
    others = [c for c in swept.columns if c.startswith("s_") and c != "s_n_cpu_moe"]
    varying = [c[2:] for c in others if swept[c].astype(str).nunique() > 1]
    out = []
    for key_values, rows in swept.groupby(["model", "environment", *others], dropna=False, sort=True):
        if rows["s_n_cpu_moe"].nunique() < 2:
            continue
        key = dict(zip(["model", "environment", *others], key_values))
        rows = rows.sort_values("s_n_cpu_moe")
        short_ok = measurements[
            (measurements["workload"] == short_workload) & (measurements["workload_outcome"] == "ok")
        ]["config_id"]
        loads = _lowest(rows, ~rows["outcome"].isin(["load_failed", "budget_refused"]))
        short = _lowest(rows, rows["config_id"].isin(short_ok))
        survives = _lowest(rows, rows["outcome"] == "ok")
        at = rows[rows["s_n_cpu_moe"] == survives].iloc[0] if survives is not None else None
        survivors = rows[rows["outcome"] == "ok"]["s_n_cpu_moe"]
        monotonic = survives is None or bool((rows[rows["s_n_cpu_moe"] >= survives]["outcome"] == "ok").all())
        headroom = at["headroom_mib"] if at is not None else None
        entry = {
            "model": key["model"],
            "label": _label(key, varying),
            "tested": [int(n) for n in rows["s_n_cpu_moe"]],
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
