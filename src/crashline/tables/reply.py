"""Where the answer changes with the reply length (issue #40): one request of a configuration takes its time to
first token plus the reply over its decode speed, t(n) = first + n / decode, so a configuration that prefills
slower but decodes faster finishes first once the reply is long enough. From the measured medians of the answer
and of every other configuration ranked with it, the reply length at which another one would finish first, with
its range from the spread between server starts (each start's medians, paired start by start) where both had
several, else from the spread of the requests of their repetitions; or "never" within the range of replies.

The one computation behind the report's answer, recommendation.json and ``tune``'s line (``recommend`` calls it)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd

from ..core import columns as cols
from ..engine.planner import MAX_REPLY


def crossover(first_a: float, decode_a: float, first_b: float, decode_b: float) -> float | None:
    """The reply length (tokens) at which a request of B takes as long as one of A: (first_B - first_A) ÷
    (1/decode_A - 1/decode_B), where ``first`` is the time to the first token (s) and ``decode`` t/s. B finishes
    first for longer replies when it decodes faster, for shorter ones when it decodes slower; None when the two
    decode alike (they never meet, or always)."""
    gap = 1 / decode_a - 1 / decode_b
    return None if gap == 0 else (first_b - first_a) / gap


def _floats(value) -> list[float]:
    if value is None or np.isscalar(value):
        return []
    return [float(v) for v in value if v is not None and v == v]


def _first(ttft, prefill, prompt) -> float | None:
    """The time to the first token: measured, else the prompt over the prefill speed."""
    if ttft is not None and ttft == ttft:
        return float(ttft)
    if prefill and prefill == prefill and prompt:
        return float(prompt) / float(prefill)
    return None


def points(row) -> tuple[list[tuple[float, float]], str]:
    """(time to first token, decode) of a measurement row: each server start's medians where it had several, else
    the corners of its requests' ranges (the best and worst of each); and what they are, in words."""
    prompt = row.get("prompt_tokens")
    ttfts = _floats(row.get(cols.start_medians("ttft_s")))
    prefills = _floats(row.get(cols.start_medians("prefill_tps")))
    decodes = _floats(row.get(cols.start_medians("decode_tps")))
    if len(decodes) >= 2 and (len(ttfts) == len(decodes) or len(prefills) == len(decodes)):
        firsts = [
            _first(ttfts[i] if ttfts else None, prefills[i] if prefills else None, prompt) for i in range(len(decodes))
        ]
        pairs = [(f, d) for f, d in zip(firsts, decodes) if f is not None and d > 0]
        if len(pairs) >= 2:
            return pairs, "server starts"

    def stat(metric, name):
        value = row.get(cols.stat(metric, name))
        return None if value is None or pd.isna(value) else float(value)

    lo = _first(stat("ttft_s", "min"), stat("prefill_tps", "max"), prompt)
    hi = _first(stat("ttft_s", "max"), stat("prefill_tps", "min"), prompt)
    slow, fast = stat("decode_tps", "min"), stat("decode_tps", "max")
    firsts = [f for f in (lo, hi) if f is not None]
    decodes = [d for d in (slow, fast) if d]
    return [(f, d) for f in firsts for d in decodes], "requests"


def _median_point(row) -> tuple[float, float] | None:
    first = _first(row.get("ttft_s_median"), row.get("prefill_tps_median"), row.get("prompt_tokens"))
    decode = row.get("decode_tps_median")
    return None if first is None or decode is None or pd.isna(decode) or decode <= 0 else (first, float(decode))


def max_reply(row) -> int:
    """The longest reply asked about: MAX_REPLY, or what the context leaves after the prompt where that is less."""
    ctx = next(
        (int(v) for v in (row.get("n_ctx_slot"), row.get(cols.setting("ctx"))) if v is not None and not pd.isna(v)),
        None,
    )
    prompt = row.get("prompt_tokens")
    room = ctx - int(prompt) if ctx and prompt is not None and not pd.isna(prompt) else MAX_REPLY
    return max(1, min(MAX_REPLY, room))


def reply_lengths(winner: str, rows: dict, labels: dict) -> dict | None:
    """Where another configuration would finish a request first, from the medians of ``rows`` (config id ->
    measurement row at the objective workload; the winner's among them) and ``labels`` (config id -> how it
    differs from the winner). ``longer``: the configuration that takes over first as replies grow past the
    objective's (the smallest reply length), ``shorter`` as they shrink below it; each with ``tokens`` (from the
    medians), ``low``/``high`` (over ``tokens`` and the pairings of server starts, or the corners of the requests'
    ranges; ``high`` None where some pairing never crosses within the range), ``from`` and ``label``. None without
    the winner's medians."""
    ours = rows[winner]
    mine = _median_point(ours)
    if mine is None:
        return None
    gen = ours.get("gen_tokens")
    gen = None if gen is None or pd.isna(gen) else int(gen)
    top = max_reply(ours)
    found = {"gen_tokens": gen, "range": [1, top], "longer": None, "shorter": None}
    my_points, my_from = points(ours)
    for cid, row in rows.items():
        theirs = _median_point(row) if cid != winner else None
        if theirs is None:
            continue
        n = crossover(*mine, *theirs)
        if n is None or not 1 <= n <= top:
            continue
        side = "longer" if theirs[1] > mine[1] else "shorter"
        if gen is not None and (n <= gen if side == "longer" else n >= gen):
            continue  # ahead by these medians at the reply asked too: ranked (or tied) by the end to end median
        their_points, their_from = points(row)
        both = "server starts" if my_from == their_from == "server starts" else "requests"
        if my_from != their_from:  # one start each way: compare like with like, the requests' ranges of both
            my_pts, their_pts = points({**ours, **_no_starts()})[0], points({**row, **_no_starts()})[0]
        else:
            my_pts, their_pts = my_points, their_points
        pairs = list(itertools.product(my_pts, their_pts))  # every start of one against every start of the other
        ends = [crossover(*a, *b) for a, b in pairs]
        same_side = [
            e
            for e, (a, b) in zip(ends, pairs)
            if e is not None and 1 <= e <= top and (b[1] > a[1]) == (side == "longer")
        ]
        # the range holds the medians' own crossing too: pooled over every request, the medians may lie outside
        # what each start's medians give (the demo's tiny-moe read "~106 tokens (~249 to never)")
        entry = {
            "config_id": cid,
            "label": labels.get(cid, cid),
            "tokens": round(n, 1),
            "low": round(min([*same_side, n]), 1),
            "high": round(max([*same_side, n]), 1) if len(same_side) == len(ends) else None,
            "from": both,
        }
        best = found[side]
        if best is None or (n < best["tokens"] if side == "longer" else n > best["tokens"]):
            found[side] = entry
    found["text"] = reply_text(found)
    return found


def _no_starts() -> dict:
    return {cols.start_medians(m): None for m in cols.METRICS}


def _tokens(n: float) -> str:
    return f"{math.floor(n) + 1 if n != int(n) else int(n):,}"


def reply_text(found: dict) -> str:
    """Where the answer changes with the reply length, in words: "for replies longer than ~144 tokens (~120–190
    over each server start's medians), `--n-cpu-moe 17 -ub 1024` finishes a request first", or that none does
    within 1–4,096 tokens."""
    low, top = found["range"]
    gen = found.get("gen_tokens")
    said = []
    for side in ("shorter", "longer"):
        e = found.get(side)
        if not e:
            continue
        which = "each server start's medians" if e["from"] == "server starts" else "the range of its requests"
        if e["low"] is None:
            span = ""
        elif e["high"] is None:
            span = f" (~{_tokens(e['low'])} to never within {top:,} over {which})"
        elif _tokens(e["low"]) == _tokens(e["high"]):
            span = ""
        else:
            span = f" (~{_tokens(e['low'])}–{_tokens(e['high'])} over {which})"
        said.append(
            f"for replies {side} than ~{_tokens(e['tokens'])} tokens{span}, `{e['label']}` finishes a request first"
        )
    asked = f"the {gen:,}-token reply asked" if gen is not None else "the reply asked"
    if not said:
        return (
            f"Reply length: the answer for {asked} stays the answer at every reply of {low}–{top:,} tokens: no other "
            "configuration finishes a request first (time to first token + reply ÷ decode, medians)"
        )
    return "Reply length: " + "; ".join(said) + f"; the answer is for {asked} (time to first token + reply ÷ decode)"
