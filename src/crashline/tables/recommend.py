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
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..core import columns as cols
from ..engine.logparse import on_host
from ..core.records import Outcome
from ..core.settings import SETTINGS

METRIC_LABEL = {"e2e_tps": "end to end", "decode_tps": "decode", "prefill_tps": "prefill", "aggregate_tps": "aggregate"}
PER_REQUEST = {"e2e_tps": True, "decode_tps": True, "prefill_tps": True, "aggregate_tps": False}


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


TIGHT = (("headroom_mib", "VRAM"), ("host_headroom_mib", "host memory"))  # each budget's headroom column


def _tight(row, margin_mib: int) -> list[str]:
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
    return bool(_tight(row, margin_mib))


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
    ``config.resolve_objective(config)`` gives these arguments from a config's ``objective:`` block. A survivor
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
        tied = [cid for _, cid in ranked if ties(spread[cid], spread[ranked[0][1]])] if ranked else []
        headroom = dict(zip(group["config_id"], group["headroom_mib"]))
        rows = {cid: speeds.loc[cid] for cid in tied}
        winner, tie = break_tie(tied, headroom, rows, metric) if tied else (None, None)
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
                        "reason": f"risky: survived with {' and '.join(_tight(row, margin_mib))}, "
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
            else:
                speed = _value(measured, col)
                pct = (speed - best) / best * 100 if speed and best else None
                if cid in tied:
                    reason = (
                        f"tied: {speed:.1f} t/s ({pct:+.1f}%), its range over {spread[cid].what} overlaps the winner's"
                    )
                else:
                    reason = f"slower: {speed:.1f} t/s ({pct:+.1f}%)" if pct is not None else "no speed"
                verdicts.append(
                    {"config_id": cid, "label": label, "failed": False, "tied": cid in tied, "speed": speed,
                     "reason": reason}
                )  # fmt: skip
        eligible = set(survivors["config_id"])
        shown = set((survivors if rank_cold else warm)["config_id"])
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


@dataclass(frozen=True)
class Spread:
    """Where a configuration's speed lies: [low, high], and what that range is (the medians of its server starts
    where it had several, as between-start variance decides; else every request of its repetitions)."""

    low: float
    high: float
    what: str
    starts: int = 1


def spread_of(row, metric: str) -> Spread:
    listed = row.get(cols.start_medians(metric))
    starts = [float(v) for v in (listed if listed is not None and not np.isscalar(listed) else []) if v == v]
    if len(starts) >= 2:
        return Spread(min(starts), max(starts), f"the medians of its {len(starts)} server starts", len(starts))
    low, high = row[cols.stat(metric, "min")], row[cols.stat(metric, "max")]
    return Spread(float(low), float(high), "every request of its repetitions")


def overlap(a: Spread, b: Spread) -> bool:
    """Tied: neither range lies wholly above the other (as the search's climb and finalists judge noise)."""
    return a.low <= b.high and b.low <= a.high


def ties(a: Spread, b: Spread) -> bool:
    """``a`` is tied with the fastest, ``b``: their ranges overlap, and where the fastest was started several times
    (the search's finalists, interleaved), ``a`` was too: between-start variance decides, and one start's range
    of requests holds only the noise within that start. A value the search left out of its finalists, measured in
    one start, cannot tie one that won interleaved starts (on the H200 it made a value the climb found slowest the
    answer, for its headroom)."""
    return overlap(a, b) and (b.starts < 2 or a.starts >= 2)


# the metrics that break a tie on the objective, each with whether higher is better
TIE_METRICS = (("prefill_tps", True), ("decode_tps", True), ("ttft_s", False))
TIE_WORDS = {"prefill_tps": "prefill", "decode_tps": "decode", "ttft_s": "time to first token"}


def _dominates(a, b, metric: str) -> bool:
    """``a``'s medians are at least as good as ``b``'s on every other metric and better on one."""
    pairs = [
        (float(a[cols.stat(m, "median")]), float(b[cols.stat(m, "median")]), higher)
        for m, higher in TIE_METRICS
        if m != metric and not pd.isna(a.get(cols.stat(m, "median"))) and not pd.isna(b.get(cols.stat(m, "median")))
    ]
    as_good = all((x >= y) if higher else (x <= y) for x, y, higher in pairs)
    return bool(pairs) and as_good and any(x != y for x, y, _ in pairs)


def break_tie(tied: list[str], headroom: dict, rows: dict, metric: str) -> tuple[str, str | None]:
    """Among configurations tied with the fastest (``tied``, fastest first): the one better than every other on
    every other metric (prefill, decode, time to first token; ``rows``: their measurement rows) where one is; else
    the one with the most VRAM headroom, since the speeds cannot tell them apart and room is what survives the next
    longer prompt; where no headroom is known, the fastest median. Returns (winner, why, in words; None without a
    tie)."""
    if len(tied) == 1:
        return tied[0], None
    best = [c for c in tied if all(_dominates(rows[c], rows[o], metric) for o in tied if o != c)]
    if best:
        others = ", ".join(f"`{o}`" for o in tied if o != best[0])
        words = [TIE_WORDS[m] for m, _ in TIE_METRICS if m != metric]
        named = " and ".join([", ".join(words[:-1]), words[-1]] if len(words) > 2 else words)
        return best[0], f"tied with {len(tied) - 1} other(s) on speed; chosen for being ahead of {others} on {named}"
    known = {cid: h for cid in tied if (h := headroom.get(cid)) is not None and h == h}  # NaN: no GPU, no headroom
    if len(known) == len(tied):
        winner = max(tied, key=lambda cid: (known[cid], -tied.index(cid)))
        runner = next(cid for cid in tied if cid != winner)
        more = known[winner] - known[runner]
        why = (
            f"tied with {len(tied) - 1} other(s) on speed; chosen for the most VRAM headroom ({more:+,.0f} MiB against "
            f"`{runner}`)"
            if more
            else f"tied with {len(tied) - 1} other(s) on speed and headroom; chosen for the higher median"
        )
        return winner, why
    return tied[0], f"tied with {len(tied) - 1} other(s) on speed; chosen for the higher median"


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
                "parallel": _shown(parallel.get(r["config_id"])),
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
    decode, agg = row["decode_tps_median"], row["aggregate_tps_median"]
    if decode is None or agg is None:
        return False
    for o in others:
        d, a = o["decode_tps_median"], o["aggregate_tps_median"]
        if d is not None and a is not None and d >= decode and a >= agg and (d > decode or a > agg):
            return False
    return True
