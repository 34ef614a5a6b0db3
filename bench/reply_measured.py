"""The answer at each measured reply length (#40 done-when: "the answer at two reply lengths measured, not only
computed"), from a measured results folder whose workloads differ only in their reply:

    python bench/reply_measured.py RESULTS [--metric e2e_tps]

Per workload (reply length), each configuration's median over its timed requests of every start and its starts'
medians; the answer at that length is the one whose every start median lies above the other's (as a tune's tie-break
names it, "chosen for every start above theirs"), else "tied"; ``apart_by_t`` says whether Student's t at 95% also
parts them (``tables.ties.same_speed``, the rule that calls two configurations tied). Beside it the switch crashline
computes (``recommendation.json``'s ``reply_length``, from its objective's workload). Prints JSON.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from crashline.tables.ties import Spread, overlap, same_speed


def answers(rows: list[dict], metric: str) -> list[dict]:
    out = []
    reply = {r["workload"]: r["gen_tokens"] for r in rows}
    for workload in sorted(reply, key=reply.get):
        mine = [r for r in rows if r["workload"] == workload and r.get(f"{metric}_median") is not None]
        found = {
            r["config_id"]: {
                "median": r[f"{metric}_median"],
                "start_medians": r.get(f"{metric}_start_medians") or [],
                "requests": r.get(f"{metric}_n"),
                "decode_tps_median": r.get("decode_tps_median"),
                "prefill_tps_median": r.get("prefill_tps_median"),
                "settings": r.get("server_args"),
            }
            for r in mine
        }
        ranked = sorted(found, key=lambda c: -found[c]["median"])
        verdict = apart = None
        if len(ranked) == 2:
            starts = (found[c]["start_medians"] for c in ranked)
            a, b = (Spread(min(s), max(s), "starts", len(s), tuple(s)) for s in starts)
            verdict, apart = ("tied" if overlap(a, b) else ranked[0]), not same_speed(a, b)
        out.append(
            {
                "workload": workload,
                "gen_tokens": mine[0]["gen_tokens"],
                "prompt_tokens": mine[0]["prompt_tokens"],
                "configurations": found,
                "answer": verdict,
                "apart_by_t": apart,
                "ratio": found[ranked[0]]["median"] / found[ranked[1]]["median"] if len(ranked) == 2 else None,
            }
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results")
    parser.add_argument("--metric", default="e2e_tps")
    args = parser.parse_args()
    results = Path(args.results)
    rows = json.loads((results / "tables" / "measurements.json").read_text())
    recommendation = json.loads((results / "recommendation.json").read_text())
    print(
        json.dumps(
            {
                "by_reply": answers(rows, args.metric),
                "computed": [{"winner": r["winner"], "reply_length": r.get("reply_length")} for r in recommendation],
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
