"""The recommendation: the fastest configuration that survived every workload, and why each other
configuration lost (it failed, with its phase, or it was slower, by how much)."""

from __future__ import annotations

import pandas as pd

METRIC_LABEL = {"decode_tps": "decode", "prefill_tps": "prefill"}


def _too_tight(row, margin_mib: int) -> bool:
    headroom = row.get("headroom_mib")
    return headroom is not None and not pd.isna(headroom) and headroom < margin_mib


def recommend(configs: pd.DataFrame, measurements: pd.DataFrame, metric: str, workload: str,
              margin_mib: int = 0) -> list[dict]:
    """One entry per (model, environment): the winner and the verdict on every other configuration.

    A survivor whose VRAM headroom is below the margin is not eligible: it survived this run, but
    with less room than a longer prompt or another driver may need."""
    out = []
    if configs.empty:
        return out
    for (model, env), group in configs.groupby(["model", "environment"], sort=True):
        speeds = measurements[
            (measurements["model"] == model)
            & (measurements["environment"] == env)
            & (measurements["workload"] == workload)
        ].set_index("config_id")
        col = f"{metric}_median"
        low, high = f"{metric}_min", f"{metric}_max"
        survivors = group[(group["outcome"] == "ok") & ~group.apply(_too_tight, axis=1, margin_mib=margin_mib)]
        ranked = sorted(
            ((speeds.loc[cid, col], cid) for cid in survivors["config_id"] if cid in speeds.index),
            reverse=True,
        )
        winner = ranked[0][1] if ranked else None
        best = ranked[0][0] if ranked else None
        verdicts = []
        for _, row in group.iterrows():
            cid = row["config_id"]
            if cid == winner:
                continue
            if row["outcome"] == "ok" and _too_tight(row, margin_mib):
                verdicts.append({"config_id": cid, "failed": True,
                                 "reason": f"risky: survived with {row['headroom_mib']:.0f} MiB VRAM headroom, "
                                           f"less than the {margin_mib} MiB margin"})
            elif row["outcome"] != "ok":
                where = f" at {row['phase']}" if row["phase"] else ""
                verdicts.append({"config_id": cid, "reason": f"{row['outcome']}{where}: {row['message'] or 'no message'}",
                                 "failed": True})
            else:
                speed = speeds.loc[cid, col] if cid in speeds.index else None
                pct = (speed - best) / best * 100 if speed and best else None
                reason = f"slower: {speed:.1f} t/s ({pct:+.1f}%)" if pct is not None else "no speed"
                if pct is not None and speeds.loc[cid, high] >= speeds.loc[winner, low]:
                    reason += ", within the spread of the repetitions: not a real difference yet"
                verdicts.append({"config_id": cid, "failed": False, "speed": speed, "reason": reason})
        out.append({
            "model": model,
            "environment": env,
            "metric": metric,
            "metric_label": METRIC_LABEL[metric],
            "workload": workload,
            "winner": winner,
            "winner_speed": best,
            "winner_row": group[group["config_id"] == winner].iloc[0].to_dict() if winner else None,
            "others": sorted(verdicts, key=lambda v: (v["failed"], -(v.get("speed") or 0))),
        })
    return out
