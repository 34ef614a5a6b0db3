"""A search in the report's words, from the searches table and the configurations it measured: every value of its
range in runs (measured, skipped by the prediction, fit by it), the climb and the finalists in a sentence each, and
what its calibration predicts for other cards."""

from __future__ import annotations

import pandas as pd

from ..core.columns import SETTING_PREFIX, setting
from ..core.thresholds import missing
from .compact import runs

N_CPU_MOE = setting("n_cpu_moe")


def _probed(search: pd.Series, configs: pd.DataFrame) -> dict[int, pd.Series]:
    """The configurations a search measured, by n_cpu_moe: its model's, with the search's other settings."""
    c = configs[configs["model"] == search["model"]]
    for col in search.index:
        if col.startswith(SETTING_PREFIX) and col in c:
            c = c[c[col].isna()] if missing(search[col]) else c[c[col] == search[col]]
    return {int(r[N_CPU_MOE]): r for _, r in c.iterrows() if not missing(r[N_CPU_MOE])}


def _probe_word(row, chosen: bool, margin: int) -> str:
    """A measured value in a few words: "✓ chosen", "✓ risky: 14 MiB headroom", "✗ kv_cache at load"."""
    if row is None:
        return "measured"
    if row["outcome"] != "ok":
        what = _or(row["failure"], row["outcome"])
        return f"✗ {what} at {row['phase']}" if not missing(row["phase"]) else f"✗ {what}"
    headroom = row.get("headroom_mib")
    word = "✓ chosen" if chosen else "✓"
    if not missing(headroom) and headroom < margin:
        return f"{word} risky: {headroom:,.0f} MiB headroom, under the {margin:,} MiB margin"
    return f"{word} ({headroom:,.0f} MiB headroom)" if not missing(headroom) else word


def _or(value, other):
    return other if missing(value) else value


def planner_ranges(values: list[dict], probed: dict, limit, chosen, margin: int) -> list[str]:
    """Every value of a search in runs: "0–15 skipped: predicted 846–12,996 MiB over the budget", "16 ✗ oom at
    warmup", "18 ✓ chosen", "19–47 fit by the same prediction (not measured)"."""

    def kind(v):
        if v["status"] == "measured":
            return None
        return "over" if v["status"].startswith("skipped: predicted") else v["status"]

    out = []
    for first, last, k in runs(values, kind):
        lo, hi = values[first]["n_cpu_moe"], values[last]["n_cpu_moe"]
        span = f"{lo}" if lo == hi else f"{lo}–{hi}"
        if k is None:
            out.append(f"{span} {_probe_word(probed.get(lo), lo == chosen, margin)}")
        elif k == "over" and limit:
            over = sorted(values[i]["predicted_mib"] - limit for i in range(first, last + 1))
            amount = f"{over[0]:,.0f}" if len(over) == 1 else f"{over[0]:,.0f}–{over[-1]:,.0f}"
            out.append(f"{span} skipped: predicted {amount} MiB over the budget")
        elif k.startswith("not measured"):
            out.append(f"{span} fit by the same prediction (not measured)")
        else:
            out.append(f"{span} {k}")
    return out


def _speed(entry: dict) -> str:
    return f"{entry['median']:,.1f} [{entry['min']:,.1f}–{entry['max']:,.1f}]" if not missing(entry["median"]) else "–"


def climb_text(row) -> str | None:
    """The climb above the lowest value with the margin, in a sentence."""
    climbed = list(row.get("climbed") if row.get("climbed") is not None else [])
    if not climbed:  # no climb, or a search cut short by its rivals (``prune``), which says why
        return f"No climb: {row['climb_stop']}." if not missing(row.get("climb_stop")) else None
    steps = "; ".join(f"{c['n_cpu_moe']} {_speed(c)} {c['verdict']}" for c in climbed)
    stop = f" ({row['climb_stop']})" if not missing(row.get("climb_stop")) else ""
    metric = (row.get("objective_metric") or "decode_tps").removesuffix("_tps")
    return (
        f"Climb from n_cpu_moe {row['lowest_with_margin']}, the lowest with the margin, {metric} t/s at "
        f"{row.get('objective_workload')}: {steps}{stop}."
    )


def _partial(override) -> str:
    """A finalist's partial placement, as its -ot (nothing for whole layers)."""
    return "" if missing(override) else f" with -ot {override}"


def partial_text(row) -> str | None:
    """The boundary layer's partial placements: what each would bring to the card, the headroom predicted, and what
    was done (skipped under the margin, or started and what it left)."""
    tried = list(row.get("partial") if row.get("partial") is not None else [])
    if not tried:
        return None
    each = []
    for p in tried:
        left = "" if missing(p.get("headroom_mib")) else f", left {p['headroom_mib']:,.0f} MiB"
        each.append(
            f"-ot {p['override_tensor']} ({p['moved_mib']:,.0f} MiB more on the card, predicted to leave "
            f"{p['predicted_headroom_mib']:,.0f} MiB{left}): {p['status'].split(': ', 1)[0]}"
        )
    layer = tried[0]["n_cpu_moe"]
    return f"Layer {layer} in part on the card, with --n-cpu-moe {layer}: {'; '.join(each)}."


def finalists_text(row) -> str | None:
    """The finalists' interleaved server starts and how long the winner's lead held."""
    finalists = list(row.get("finalists") if row.get("finalists") is not None else [])
    if not finalists:
        return None
    each = "; ".join(
        f"{f['n_cpu_moe']}{_partial(f.get('override_tensor'))}: {f['starts']} starts, "
        f"medians {', '.join(f'{m:,.1f}' for m in f['start_medians'])}, "
        f"pooled {_speed(f)}" + ("" if f["survived"] else ", failed a start")
        for f in finalists
    )
    lead = f" {row['lead_held']}." if not missing(row.get("lead_held")) else ""
    return f"Finalists, started again interleaved: {each}.{lead}"


def what_if_table(row, manifest: dict | None) -> dict | None:
    """Predicted lowest safe n_cpu_moe for other cards and contexts, from this search's calibration."""
    from ..engine.suggest import what_if
    from ..engine.suggest_inputs import SuggestError

    compute = row.get("compute_rows")
    if manifest is None or compute is None or not len(compute) or missing(row.get("rest_mib")):
        return None
    calibration = {
        "compute_mib": {int(c["ubatch"]): c["mib"] for c in compute},
        "rest_mib": row["rest_mib"],
        "ctx": row["s_ctx"],
        "model": row["model"],
        "group": row["group"],
    }
    try:
        table = what_if(
            manifest,
            calibration,
            ubatches=(int(row["s_ubatch"]),),
            cache_type_k=row["s_cache_type_k"],
            cache_type_v=row["s_cache_type_v"],
            parallel=int(row["s_parallel"]) if not missing(row.get("s_parallel")) else 1,
            margin_mib=int(row["margin_mib"]),
        )
    except SuggestError:
        return None
    return table


def searches(table: pd.DataFrame, model: str, configs: pd.DataFrame, manifest: dict | None = None) -> list[dict]:
    out = []
    for _, row in table[table["model"] == model].iterrows() if not table.empty else []:
        probed = _probed(row, configs)
        chosen = None if missing(row["recommended_n_cpu_moe"]) else int(row["recommended_n_cpu_moe"])
        values = [dict(v) for v in row["value_rows"]]
        for v in values:
            if v["status"] == "measured":
                v["status"] = _probe_word(probed.get(v["n_cpu_moe"]), v["n_cpu_moe"] == chosen, row["margin_mib"])
        out.append(
            {
                **row.to_dict(),
                "probes": list(row["probe_rows"]),
                "value_rows": values,
                "ranges": planner_ranges(list(row["value_rows"]), probed, row["limit_mib"], chosen, row["margin_mib"]),
                "range": f"[{row['range_lo']}, {row['range_hi']}]",
                "climb": climb_text(row),
                "finalists_text": finalists_text(row),
                "partial_text": partial_text(row),
                "what_if": what_if_table(row, manifest),
            }
        )
    return out
