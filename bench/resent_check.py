"""Does a tune whose deep workload took its decode from re-sent prompts (``decode_from: resent``) give the answer
the full protocol gives (#40 item 3)?

    python bench/resent_check.py run TUNE_YAML --out DIR [--repetitions 2]
    python bench/resent_check.py analyse TUNE_YAML DIR

TUNE_YAML is the config a finished ``crashline tune`` wrote. ``run`` takes each search's winner and runner-up
(the finalists of its summary that are ``recommended_n_cpu_moe`` with ``recommended_override_tensor``, a partial
placement where the search kept one, and ``runner_up``; a search without a runner-up gives its winner only) and
measures each again, once, interleaved (winner, runner-up, next search's winner, ...; the answer's search first),
through the same measure job the search runs, with the same settings, budget, build and workload, but the full
protocol: every timed repetition a fresh prompt at the asked depth (``decode_from`` unset), after the same untimed
warm-up. Records go to DIR/records/MODEL/ID/.

The statistic, fixed before the run: per search, the objective (end-to-end t/s per request at the tune's workload)
of the winner and of the runner-up under each protocol, as the median over every request with its min and max
(the tune's: every request of every start of the search's records, as ``search_rules.speed_of`` pools them; the
check's: its timed requests). The check **agrees** when, under the full protocol, the winner's median is at least
the runner-up's, or the two ranges overlap (a tie, which the tune would also call within noise). It also gives,
per configuration, decode t/s re-sent (tune) over fresh (check), medians, as a second reading of session 19's
check. DIR/check.json holds every figure with the records' paths; the raw records are the check's own.

``run --resent-too`` measures each finalist a second time, right after its fresh start, with the tune's own protocol
(re-sent prompts) into DIR/resent/records/: the re-sent ÷ fresh decode then comes from one machine and one lease, for
a tune measured on an earlier lease's machine (``resent_source`` in check.json says which records it read).
"""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path

from crashline.config import plan as C
from crashline.core import records
from crashline.core import settings as S
from crashline.core.paths import Layout, RecordFolder
from crashline.jobs import spec as jobs
from crashline.jobs.contract import Objective
from crashline.jobs.measure import MeasurePaths, measure
from crashline.jobs.search_rules import speed_of


def _pairs(cfg: dict) -> list[dict]:
    """Per finished search with a winner: its model, group, summary and the finalists to check (the winner, then the
    runner-up), each as its ``n_cpu_moe`` and ``override_tensor`` (a partial placement of one layer's experts)."""
    layout = Layout(cfg["results_dir"])
    out = []
    for group in C.expand_searches(cfg):
        path = Path(layout.search(group["model"], group["id"]))
        if not path.exists():
            continue
        summary = json.loads(path.read_text())
        finals = [f for f in summary.get("finalists") or [] if f.get("median") is not None]
        won = (summary.get("recommended_n_cpu_moe"), summary.get("recommended_override_tensor"))
        winner = [f for f in finals if (f["n_cpu_moe"], f.get("override_tensor")) == won]
        # the runner-up: the summary names its whole layers only; the fastest other finalist with those
        others = sorted(
            (f for f in finals if f not in winner and f["n_cpu_moe"] == summary.get("runner_up")),
            key=lambda f: -f["median"],
        )
        values = [(f["n_cpu_moe"], f.get("override_tensor")) for f in winner + others[:1]]
        if winner:
            out.append({"model": group["model"], "group": group, "summary": summary, "values": values})
    # the search of the answer first: where the check runs out of time, it has checked the answer
    answer = {a.get("winner") for a in json.loads(layout.recommendation().read_text())}
    return sorted(out, key=lambda p: _cid(p["model"], p["group"], p["values"][0]) not in answer)


def _given(group: dict, value: tuple[int, str | None]) -> dict:
    """The settings of one finalist: the search's own, its n_cpu_moe and its partial placement, if any."""
    n, override = value
    return {**group["given"], "n_cpu_moe": n, **({"override_tensor": override} if override else {})}


def _cid(model: str, group: dict, value: tuple[int, str | None]) -> str:
    return S.config_id(model, S.resolve(_given(group, value)))


def _label(value: tuple[int, str | None]) -> str:
    n, override = value
    return f"n_cpu_moe {n}" + (f" -ot {override}" if override else "")


def _fresh(cfg: dict) -> dict:
    """The run's config with every workload's timed repetitions fresh prompts (the full protocol)."""
    fresh = copy.deepcopy(cfg)
    for w in fresh["workloads"]:
        w.pop("decode_from", None)
    return fresh


def _folder(out: Path, model: str, cid: str, protocol: str = "fresh") -> RecordFolder:
    return RecordFolder(out / ("records" if protocol == "fresh" else "resent/records") / model / cid)


def run(args) -> None:
    cfg = C.load(args.config)
    layout = Layout(cfg["results_dir"])
    protocols = {"fresh": _fresh(cfg), **({"resent": copy.deepcopy(cfg)} if args.resent_too else {})}
    for c in protocols.values():
        c["repetitions"] = args.repetitions
    for pair in _pairs(cfg):
        model, group = pair["model"], pair["group"]
        inputs = jobs.inputs(Path(layout.fetch(model)), Path(layout.manifest(model)), Path(layout.provenance()), None)
        for value in pair["values"]:
            given = _given(group, value)
            cid = S.config_id(model, S.resolve(given))
            for protocol, c in protocols.items():
                folder = _folder(Path(args.out), model, cid, protocol)
                if folder.measure.exists():
                    continue
                print(f"check: {model} {group['id']} {_label(value)} ({cid}), {protocol} prompts", flush=True)
                measurement = jobs.search_spec(c, model, group["id"]).measurement
                item = jobs.Item(cid, S.resolve(given), given)
                measure(jobs.MeasureSpec(model, item, measurement), inputs.records(), MeasurePaths.of(folder))


def _stat(speed) -> dict | None:
    return None if speed is None else {"median": speed.median, "min": speed.low, "max": speed.high, "n": speed.n}


def _decode(recs: list[dict], workload: str) -> float | None:
    import statistics

    values = [
        r["decode_tps"]
        for rec in recs
        for w in rec.get("workloads") or []
        if w["name"] == workload
        for run in w["runs"]
        for r in run["requests"]
        if r.get("decode_tps")
    ]
    return statistics.median(values) if values else None


def analyse(args) -> None:
    cfg = C.load(args.config)
    out = Path(args.out)
    found = []
    for pair in _pairs(cfg):
        model, group, summary = pair["model"], pair["group"], pair["summary"]
        objective = Objective(**summary["objective"])
        margin = summary["margin_mib"]
        folder = Layout(cfg["results_dir"]).search_folder(model, group["id"])
        rows = []
        for value in pair["values"]:
            cid = _cid(model, group, value)
            tuned = [
                records.load(folder.probe(rel).measure, "measure")
                for rel in summary["records"]
                if rel == cid or rel.startswith(f"{cid}/")
            ]
            path, again = _folder(out, model, cid).measure, _folder(out, model, cid, "resent").measure
            checked = [records.load(path, "measure")] if path.exists() else []
            # the re-sent decode from this check's own start where it made one (one machine), else the tune's
            resent_recs = [records.load(again, "measure")] if again.exists() else tuned
            resent, full = speed_of(tuned, objective, margin), speed_of(checked, objective, margin)
            decode_resent, decode_fresh = _decode(resent_recs, objective.workload), _decode(checked, objective.workload)
            rows.append(
                {
                    "n_cpu_moe": value[0],
                    "override_tensor": value[1],
                    "config_id": cid,
                    "tune_resent": _stat(resent),
                    "check_fresh": _stat(full),
                    "check_resent": _stat(speed_of(resent_recs, objective, margin)) if again.exists() else None,
                    "resent_source": "check" if again.exists() else "tune",
                    "decode_resent_over_fresh": decode_resent / decode_fresh
                    if decode_resent and decode_fresh
                    else None,
                    "check_record": str(path) if checked else None,
                }
            )
        agrees = None
        if len(rows) == 2 and all(r["check_fresh"] for r in rows):
            win, run_up = rows[0]["check_fresh"], rows[1]["check_fresh"]
            agrees = win["median"] >= run_up["median"] or not (win["max"] < run_up["min"])
        found.append(
            {"model": model, "search": group["id"], "objective": summary["objective"], "rows": rows, "agrees": agrees}
        )
    (out / "check.json").write_text(json.dumps(found, indent=2) + "\n")
    print(json.dumps(found, indent=2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="verb", required=True)
    r = sub.add_parser("run")
    r.add_argument("config")
    r.add_argument("--out", required=True)
    r.add_argument("--repetitions", type=int, default=2)
    r.add_argument("--resent-too", action="store_true", help="each finalist also re-measured with re-sent prompts")
    a = sub.add_parser("analyse")
    a.add_argument("config")
    a.add_argument("out")
    args = parser.parse_args()
    {"run": run, "analyse": analyse}[args.verb](args)


if __name__ == "__main__":
    main()
