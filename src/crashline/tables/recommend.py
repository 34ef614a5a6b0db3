"""The recommendation: the fastest configuration that survived every workload, and why each other
configuration lost (it failed, with its phase, missed a limit of the objective, or it was slower, by how much).

Like is ranked with like: the objective names the load it is measured under (requests at once), and only
configurations whose objective workload ran at that load are ranked; one whose workload ran at another
(a ``concurrency: slots`` workload on ``-np 4`` sends 4 at once) is "not measured at N requests at once".
An objective may also set limits per request, as a service level: the most aggregate throughput at 4
requests at once with at least 20 t/s decode per request and a time to first token under 2 s.

The page cache is a state at load, not a server setting: configurations measured cold are ranked
only when no warm run survived, and otherwise point to the cold-versus-warm comparison."""

from __future__ import annotations

import re

import pandas as pd

from ..core import columns as cols
from ..core.records import Outcome
from ..core.thresholds import could_reach, inconclusive
from .difference import difference, shown_value
from .reply import reply_lengths
from .ties import HOST_MEMORY, break_tie, dominates, measured_columns, overlap, spread_of, ties

METRIC_LABEL = {"e2e_tps": "end to end", "decode_tps": "decode", "prefill_tps": "prefill", "aggregate_tps": "aggregate"}
PER_REQUEST = {"e2e_tps": True, "decode_tps": True, "prefill_tps": True, "aggregate_tps": False}


def _natural(text: str) -> list:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", text)]


TIGHT = (("headroom_mib", "VRAM"), ("host_headroom_mib", "host memory"))  # each budget's headroom column


def below_margin(row, margin_mib: int) -> list[str]:
    """The budgets (VRAM, host memory) a survivor's headroom to is below the margin, as "N MiB VRAM headroom"."""
    out = []
    for column, what in TIGHT:
        headroom = row.get(column)
        if headroom is not None and not pd.isna(headroom) and headroom < margin_mib:
            out.append(f"{headroom:.0f} MiB {what} headroom")
    return out


def _short_lived(row, must_survive_h: float | None, margin_mib: int = 0) -> str | None:
    """Why a survivor's soak says it would not last ``must_survive_h`` hours at the soak's rate (None if it would,
    or ran no soak): what grew, the limit and when, and the --cache-ram that leaves the margin where the host
    prompt cache is what grew."""
    hours = row.get("soak_hours_to_limit")
    if must_survive_h is None or hours is None or pd.isna(hours) or hours >= must_survive_h:
        return None
    first = row["soak_limit_first"]
    what = {"host": "RSS", "vram": "VRAM"}[first]
    slope = row[f"soak_{'rss' if first == 'host' else 'gpu'}_mib_per_request"]
    text = (
        f"would not last: {what} {slope:+.1f} MiB a request under unique prompts reaches the "
        f"{'host' if first == 'host' else 'VRAM'} limit of {row['soak_limit_mib']:,.0f} MiB after about {hours:,.1f} h "
        f"at the soak's rate, less than soak.must_survive_h ({must_survive_h:g} h)"
    )
    cache = row.get("soak_cache_mib_per_request")
    if first == "host" and cache is not None and not pd.isna(cache) and cache >= 0.5 * slope:
        rest = row["soak_rss_mib_last"] - row["soak_cache_mib_last"]
        room = int(row["soak_limit_mib"] - rest - margin_mib)
        text += (
            f"; the host prompt cache grew {cache:+.1f} MiB a request: --cache-ram {max(0, room)} (cache_ram: "
            f"{max(0, room)}) keeps it within the limit less the margin"
            if room > 0
            else "; the host prompt cache grew with it and no --cache-ram leaves the margin: turn it off (cache_ram: 0)"
        )
    return text


def _too_tight(row, margin_mib: int) -> bool:
    return bool(below_margin(row, margin_mib))


def _cold(row) -> bool:
    return row.get(cols.setting("page_cache")) == "cold"


def failure_reason(outcome: str, phase: str | None, message: str | None) -> str:
    """How a configuration failed, in words: "crashed at warmup: killed by SIGILL"."""
    where = f" at {phase}" if phase else ""
    return f"{outcome}{where}: {message or 'no message'}"


COLD_NOT_RANKED = "measured from a cold page cache: compared with its warm twin under Cold versus warm, not ranked"

TRADEOFF_STATS = ("decode_tps_median", "aggregate_tps_median", "ttft_s_median")


def at_once(n: int) -> str:
    """ "1 request at once", "4 requests at once"."""
    return f"{n} request{'' if n == 1 else 's'} at once"


def objective_text(
    metric: str, workload: str, concurrency: int, min_decode_tps: float | None = None, max_ttft_s: float | None = None
) -> str:
    """The objective in words: "aggregate t/s of all requests together at workload chat, 4 requests at once,
    with at least 20 t/s decode per request and a time to first token under 2 s"."""
    what = f"{METRIC_LABEL[metric]} t/s " + ("per request" if PER_REQUEST[metric] else "of all requests together")
    text = f"{what} at workload {workload}, {at_once(concurrency)}"
    limits = []
    if min_decode_tps is not None:
        limits.append(f"at least {min_decode_tps:g} t/s decode per request")
    if max_ttft_s is not None:
        limits.append(f"a time to first token under {max_ttft_s:g} s")
    return text + (", with " + " and ".join(limits) if limits else "")


def _value(row, column: str) -> float | None:
    value = row.get(column) if row is not None else None
    return None if value is None or pd.isna(value) else float(value)


def _load(row) -> int:
    """Requests at once a measurement row ran (tables written before the column: 1)."""
    value = _value(row, "concurrency")
    return 1 if value is None else int(value)


def _default_concurrency(rows: pd.DataFrame) -> int:
    """Without an objective concurrency: the load every row ran, else 1 request at once, else the lightest."""
    loads = sorted({_load(r) for _, r in rows.iterrows()}) or [1]
    return loads[0] if len(loads) == 1 or 1 not in loads else 1


def missed_limits(row, min_decode_tps: float | None, max_ttft_s: float | None) -> list[tuple[str, str]]:
    """(limit key, why in words) for each limit of the objective a measurement row misses (medians)."""
    missed = []
    if min_decode_tps is not None:
        decode = _value(row, "decode_tps_median")
        if decode is None:
            missed.append(
                ("min_decode_tps", f"decode per request not measured (at least {min_decode_tps:g} t/s asked)")
            )
        elif decode < min_decode_tps:
            missed.append(
                ("min_decode_tps", f"decode {decode:.1f} t/s per request, under the {min_decode_tps:g} t/s asked")
            )
    if max_ttft_s is not None:
        ttft = _value(row, "ttft_s_median")
        if ttft is None:
            missed.append(("max_ttft_s", f"time to first token not measured (under {max_ttft_s:g} s asked)"))
        elif ttft > max_ttft_s:
            missed.append(("max_ttft_s", f"time to first token {ttft:.2f} s, over the {max_ttft_s:g} s asked"))
    return missed


def decision_inputs(config: dict) -> dict:
    """What the one decision reads from the config besides the tables: the objective, the margin and the hours a
    soak must last. The report and llama-bench rules pass it as params, so an edit of any reruns them alone."""
    return {
        "objective": config["objective"],
        "margin_mib": config["budget"]["margin_mib"],
        "must_survive_h": config["soak"]["must_survive_h"],
    }


def decide(configs: pd.DataFrame, measurements: pd.DataFrame, config: dict, needle: pd.DataFrame | None = None):
    """The recommendation per (model, environment) from the tables and the config (its objective and margin) and
    the needle table's recall failures: the one decision behind the report, recommendation.json, ``tune``'s answer
    and the llama-bench check."""
    from ..config.plan import resolve_objective
    from .needle import recall_failures

    return recommend(
        configs,
        measurements,
        margin_mib=config["budget"]["margin_mib"],
        recall_failures=recall_failures(needle),
        must_survive_h=config["soak"]["must_survive_h"],
        **resolve_objective(config),
    )


def recommend(
    configs: pd.DataFrame,
    measurements: pd.DataFrame,
    metric: str,
    workload: str,
    margin_mib: int = 0,
    recall_failures: dict | None = None,
    *,
    concurrency: int | None = None,
    min_decode_tps: float | None = None,
    max_ttft_s: float | None = None,
    must_survive_h: float | None = None,
) -> list[dict]:
    """One entry per (model, environment): the winner and the verdict on every other configuration.

    A survivor whose VRAM headroom is below the margin is not eligible: it survived this run, but
    with less room than a longer prompt or another driver may need. Nor is one whose needle recall
    failed at a required length (``recall_failures``: (model, config_id) -> why).

    Only configurations whose ``workload`` ran ``concurrency`` requests at once are ranked (None: the load
    every row of the workload ran, else 1). ``min_decode_tps`` and ``max_ttft_s`` are limits on the medians
    at that workload: a configuration that misses one is not ranked, with a reason naming it.
    ``config.plan.resolve_objective(config)`` gives these arguments from a config's ``objective:`` block. A survivor
    whose unique-prompt soak projects a limit within ``must_survive_h`` hours is not eligible either."""
    recall_failures = recall_failures or {}
    out = []
    if configs.empty:
        return out
    col = cols.stat(metric, "median")
    for (model, env), group in configs.groupby(["model", "environment"], sort=True):
        ours = measurements[(measurements["model"] == model) & (measurements["environment"] == env)]
        at_workload = ours[ours["workload"] == workload]
        speeds = at_workload[~at_workload["config_id"].duplicated()].set_index("config_id")
        load = concurrency if concurrency is not None else _default_concurrency(speeds)
        survivors = group[
            (group["outcome"] == Outcome.OK)
            & ~group.apply(_too_tight, axis=1, margin_mib=margin_mib)
            & ~group["config_id"].map(lambda c: (model, c) in recall_failures)
            & ~group.apply(lambda row: bool(_short_lived(row, must_survive_h)), axis=1)
        ]
        warm = survivors[[not _cold(row) for _, row in survivors.iterrows()]]
        rank_cold = warm.empty  # only cold runs survived: rank them among themselves
        pool = [cid for cid in (survivors if rank_cold else warm)["config_id"] if cid in speeds.index]
        at_load = [cid for cid in pool if _load(speeds.loc[cid]) == load]
        limits = {cid: missed_limits(speeds.loc[cid], min_decode_tps, max_ttft_s) for cid in speeds.index}
        ranked = sorted(
            ((speeds.loc[cid, col], cid) for cid in at_load if not limits[cid] and not pd.isna(speeds.loc[cid, col])),
            reverse=True,
        )
        spread = {cid: spread_of(speeds.loc[cid], metric) for _, cid in ranked}
        fastest = spread[ranked[0][1]] if ranked else None
        tied = [cid for _, cid in ranked if ties(spread[cid], fastest)] if ranked else []
        headroom = dict(zip(group["config_id"], group["headroom_mib"]))
        rows = {cid: speeds.loc[cid] for cid in tied}
        config_rows = {r["config_id"]: r for _, r in group.iterrows()}
        measured = {
            cid: measured_columns(ours[ours["config_id"] == cid], config_rows[cid], (workload, metric)) for cid in tied
        }
        memory = {cid: config_rows[cid].get(HOST_MEMORY) for cid in tied}
        winner, tie = break_tie(tied, headroom, rows, metric, measured, memory, spread) if tied else (None, None)
        best = float(speeds.loc[winner, col]) if winner else None
        verdicts = []
        reference = group[group["config_id"] == winner].iloc[0] if winner else group.iloc[0]
        for _, row in group.iterrows():
            cid = row["config_id"]
            if cid == winner:
                continue
            label = difference(row, reference)
            measured = speeds.loc[cid] if cid in speeds.index else None
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
                        "reason": f"risky: survived with {' and '.join(below_margin(row, margin_mib))}, "
                        f"less than the {margin_mib} MiB margin",
                    }
                )
            elif row["outcome"] == Outcome.OK and _short_lived(row, must_survive_h):
                verdicts.append(
                    {
                        "config_id": cid,
                        "label": label,
                        "failed": True,
                        "reason": _short_lived(row, must_survive_h, margin_mib),
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
            elif measured is not None and _load(measured) != load:
                verdicts.append(
                    {
                        "config_id": cid,
                        "label": label,
                        "failed": False,
                        "unranked": True,
                        "reason": f"not measured at {at_once(load)}: its workload {workload} ran "
                        f"{at_once(_load(measured))}",
                    }
                )
            elif limits.get(cid):
                verdicts.append(
                    {
                        "config_id": cid,
                        "label": label,
                        "failed": False,
                        "missed": [key for key, _ in limits[cid]],
                        "speed": _value(measured, col),
                        "reason": "; ".join(why for _, why in limits[cid]),
                    }
                )
            elif doubt := inconclusive([measured, speeds.loc[winner]]) if winner and measured is not None else None:
                speed = _value(measured, col)
                verdicts.append(
                    {"config_id": cid, "label": label, "failed": False, "tied": False, "inconclusive": True,
                     "possible": could_reach(measured, speed, best),  # a possible answer on a quiet machine
                     "speed": speed, "reason": f"{doubt} ({_tps(speed)} against {_tps(best)})"}
                )  # fmt: skip
            else:
                speed = _value(measured, col)
                pct = (speed - best) / best * 100 if speed and best else None
                if cid in tied:
                    reason = (
                        f"tied: {speed:.1f} t/s ({pct:+.1f}%), its range over {spread[cid].what} overlaps the winner's"
                    )
                else:
                    reason = f"slower: {speed:.1f} t/s ({pct:+.1f}%)" if pct is not None else "no speed"
                    if pct is not None and cid in spread and overlap(spread[cid], fastest):
                        # within the fastest one's range, yet not tied: ties() lets only as many starts tie
                        reason += (
                            f", in one server start: only configurations started as often as the fastest "
                            f"({fastest.starts} interleaved starts) can tie it"
                        )
                    elif pct is not None and cid in spread and spread[cid].starts == fastest.starts == 1:
                        # apart by the requests of one start each: what starts differ by was never measured (a
                        # --time that left the finalists' further starts out; session 31's 100K run read the
                        # runner-up 1.5% slower, and another start of each, with fresh prompts, put it 1.4% ahead)
                        reason += ", in one server start each: the spread between starts, which decides a tie, was "
                        reason += "not measured"
                verdicts.append(
                    {"config_id": cid, "label": label, "failed": False, "tied": cid in tied, "speed": speed,
                     "reason": reason}
                )  # fmt: skip
        eligible = set(survivors["config_id"])
        shown = set((survivors if rank_cold else warm)["config_id"])
        # a whole request's time at other reply lengths: where another ranked configuration would finish first
        reply = (
            reply_lengths(
                winner, {cid: speeds.loc[cid] for _, cid in ranked}, {v["config_id"]: v["label"] for v in verdicts}
            )
            if winner and metric == "e2e_tps" and load == 1
            else None
        )
        out.append(
            {
                "model": model,
                "environment": env,
                "metric": metric,
                "metric_label": METRIC_LABEL[metric],
                "per_request": PER_REQUEST[metric],
                "workload": workload,
                "concurrency": load,
                "min_decode_tps": min_decode_tps,
                "max_ttft_s": max_ttft_s,
                "objective_text": objective_text(metric, workload, load, min_decode_tps, max_ttft_s),
                "winner": winner,
                "winner_speed": best,
                "winner_row": group[group["config_id"] == winner].iloc[0].to_dict() if winner else None,
                "winner_measured": _medians(speeds.loc[winner]) if winner else None,
                "tie": tie,
                # other processes competed during the ranked measurements: no faster or slower among them
                "inconclusive": inconclusive([speeds.loc[cid] for _, cid in ranked]) if len(ranked) > 1 else None,
                "reply_length": reply,
                "no_winner": None
                if winner
                else _no_winner(
                    survivors,
                    pool,
                    at_load,
                    load,
                    workload,
                    _not_surviving(group, margin_mib, recall_failures, must_survive_h) if survivors.empty else "",
                ),
                "others": sorted(verdicts, key=lambda v: (v["failed"], -(v.get("speed") or 0), _natural(v["label"]))),
                "tradeoff": tradeoff(group, ours, shown, eligible, winner),
            }
        )
    return out


def _tps(speed) -> str:
    return "no speed" if speed is None else f"{speed:.1f} t/s"


def _medians(row) -> dict:
    """What a measurement row says at the objective workload: its load and every metric's median."""
    return {
        "concurrency": _load(row),
        **{cols.stat(m, "median"): _value(row, cols.stat(m, "median")) for m in cols.METRICS},
    }


def _not_surviving(group: pd.DataFrame, margin_mib: int, recall_failures: dict, must_survive_h) -> str:
    """Why no configuration of ``group`` survived, counted by reason: "every configuration failed the same way
    (context_exceeded at prompt-16000: ...)", or "2 failed (oom at load), 1 with less than the 1,024 MiB margin"."""
    failed = group[group["outcome"] != Outcome.OK]
    ways = failed.groupby(["outcome", "phase"], dropna=False, sort=False)
    if len(failed) == len(group) and ways.ngroups == 1:
        row = failed.iloc[0]
        how = failure_reason(row["outcome"], None if pd.isna(row["phase"]) else row["phase"], row["message"])
        return f"every configuration failed the same way ({how})"
    parts = []
    for (outcome, phase), part in ways:
        parts.append(f"{len(part)} {outcome}" + (f" at {phase}" if not pd.isna(phase) else ""))
    ok = group[group["outcome"] == Outcome.OK]
    model = group["model"].iloc[0] if len(group) else None
    counts = (
        (
            ok.apply(_too_tight, axis=1, margin_mib=margin_mib).sum() if len(ok) else 0,
            f"under the {margin_mib:,} MiB margin",
        ),
        (ok["config_id"].map(lambda c: (model, c) in recall_failures).sum() if len(ok) else 0, "failed needle recall"),
        (
            ok.apply(lambda row: bool(_short_lived(row, must_survive_h)), axis=1).sum() if len(ok) else 0,
            f"would not last {must_survive_h:g} h" if must_survive_h is not None else "would not last",
        ),
    )
    parts += [f"{int(n)} {what}" for n, what in counts if n]
    return "no configuration survived every workload with the margin: " + ", ".join(parts)


def _no_winner(survivors: pd.DataFrame, pool: list, at_load: list, load: int, workload: str, why_none: str) -> str:
    """Why no configuration is recommended, in words (``why_none``: why none survived, ``_not_surviving``)."""
    if survivors.empty:
        return why_none
    if not pool:
        return f"no configuration that survived has a speed at workload {workload}"
    if not at_load:
        return f"no configuration that survived was measured at {at_once(load)} at workload {workload}"
    return f"no configuration that survived met the objective's limits at {at_once(load)} at workload {workload}"


def tradeoff(
    group: pd.DataFrame, measurements: pd.DataFrame, shown: set, eligible: set, winner: str | None
) -> list[dict]:
    """Per request against aggregate, for every workload of a model where some configuration ran several
    requests at once (a ``concurrency: slots`` workload over an -np sweep, or a fixed concurrency above 1).

    One row per configuration that survived every workload (cold runs only where no warm one survived) and
    workload it ran: ``config_id``, ``parallel`` (its -np, None where unset), ``workload``, ``concurrency``
    (requests at once), ``decode_tps_median`` (per request), ``aggregate_tps_median`` (all requests together),
    ``ttft_s_median``, ``eligible`` (recommendable: VRAM margin and needle recall kept), ``winner``, and
    ``frontier`` (an eligible row no other eligible row of the workload beats on both decode per request and
    aggregate). Ordered by workload, requests at once, then aggregate from the highest."""
    rows = measurements[
        measurements["config_id"].isin(shown) & (measurements["workload_outcome"].fillna(Outcome.OK) == Outcome.OK)
    ]
    rows = rows[~rows[["config_id", "workload"]].duplicated()]
    several = [w for w, part in rows.groupby("workload", sort=False) if any(_load(r) > 1 for _, r in part.iterrows())]
    parallel = dict(zip(group["config_id"], group.get(cols.setting("parallel"), pd.Series(dtype=object))))
    out = []
    for name in several:
        part = [
            {
                "config_id": r["config_id"],
                "parallel": shown_value(parallel.get(r["config_id"])),
                "workload": name,
                "concurrency": _load(r),
                **{k: _value(r, k) for k in TRADEOFF_STATS},
                "eligible": r["config_id"] in eligible,
                "winner": r["config_id"] == winner,
            }
            for _, r in rows[rows["workload"] == name].iterrows()
        ]
        for row in part:
            row["frontier"] = row["eligible"] and _undominated(row, [o for o in part if o["eligible"] and o is not row])
        out += sorted(part, key=lambda r: (r["concurrency"], -(r["aggregate_tps_median"] or 0), r["config_id"]))
    return out


def _undominated(row: dict, others: list[dict]) -> bool:
    """No other row beats or equals ``row`` on both decode per request and aggregate."""

    def columns(r: dict) -> dict:
        return {k: (r[k], True) for k in ("decode_tps_median", "aggregate_tps_median")}

    known = row["decode_tps_median"] is not None and row["aggregate_tps_median"] is not None
    return known and not any(dominates(columns(o), columns(row)) for o in others)
