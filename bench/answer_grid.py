"""Is crashline's pick the grid's best, and what would a random search with as many starts have found (#22)?

    python bench/answer_grid.py run CONFIG --out GRID [--span 4] [--starts 2]
    python bench/answer_grid.py analyse CONFIG GRID [--out FILE.json]

CONFIG is the config a finished run used (``crashline tune`` writes ``tune.yaml``); its results folder holds the
searches (one per ubatch) and ``recommendation.json``.

``run`` measures the grid from each search's boundary to boundary + SPAN (or to the highest value the search measured,
where that is higher: its pick is in the grid), so that every value there has at least
STARTS server starts: the search's own probes and finalist starts count, and the rest are started here through the
same measure job the search runs (same settings, workloads, budget and build), interleaved: pass 1 over every value
that has none, then pass 2 over every value with fewer than two, ... Records go to GRID/records/MODEL/ID/pass-K/.

``analyse`` pools every start of each grid value as the search pools a finalist's (``search_rules.speed_of``: every
request of every start; a value with a start that failed or lacked the margin is out) and writes, with the
statistics chosen before the run:

- the pick (``recommendation.json``) ÷ the grid's best on the objective, each with its start medians (the spread
  between starts decides whether the two are apart);
- the starts the run spent, against the boundary grid and the full grid of its searches;
- a random search with as many starts as the searches spent, drawing distinct (ubatch, n_cpu_moe) values of the
  searches' ranges: exactly (combinatorics, no sampling) the chance that its best value is at least the pick's, and
  its expected best ÷ the grid's best. It is favoured: it is told each value's pooled speed (no noise), values below
  the boundary fail (survival is monotonic in n_cpu_moe), and values above boundary + SPAN are credited with the
  speed at boundary + SPAN (more experts on the CPU only slow it), or, in the second line, drawn from the measured
  grid only;
- the first timed request at each workload against the later ones, before and after a warm-up: per record with a
  warm-up and >= 3 repetitions, the warm-up's decode t/s ÷ the median of repetitions 2..R (what repetition 1 was
  before warm-ups: the first request at that depth) and repetition 1's ÷ the same median (after); the median of
  each over the records, with min and max.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path

from crashline.config import plan as C
from crashline.core import settings as S
from crashline.core.paths import Layout, RecordFolder
from crashline.jobs import spec as jobs
from crashline.jobs.measure import MeasurePaths, measure
from crashline.jobs.search_rules import speed_of


def _searches(cfg: dict) -> list[tuple[str, dict, dict]]:
    """(model, group, search.json) of every search the run finished."""
    layout = Layout(cfg["results_dir"])
    found = []
    for group in C.expand_searches(cfg):
        path = Path(layout.search(group["model"], group["id"]))
        if path.exists():
            found.append((group["model"], group, json.loads(path.read_text())))
    return found


def _probe_records(cfg: dict, model: str, group: dict, summary: dict) -> dict[int, list[dict]]:
    """n_cpu_moe -> the search's records of it (every start)."""
    folder = Layout(cfg["results_dir"]).search_folder(model, group["id"])
    out: dict[int, list[dict]] = {}
    for rel in summary["records"]:
        rec = json.loads(folder.probe(rel).measure.read_text())
        out.setdefault(rec["settings"]["n_cpu_moe"], []).append(rec)
    return out


def _targets(cfg: dict, span: int) -> list[dict]:
    """Every grid value: model, group, n_cpu_moe, its configuration id and given settings, the search's records."""
    targets = []
    for model, group, summary in _searches(cfg):
        if summary["boundary"] is None:
            continue
        have = _probe_records(cfg, model, group, summary)
        lo, hi = summary["range"]
        top = max([summary["boundary"] + span, *have])  # and every value the search measured above (its pick)
        for n in range(summary["boundary"], min(top, hi) + 1):
            given = {**group["given"], "n_cpu_moe": n}
            cid = S.config_id(model, S.resolve(given))
            targets.append({"model": model, "group": group, "n": n, "id": cid, "given": given, "have": have.get(n, [])})
    return targets


def _grid_folder(grid: Path, model: str, cid: str, k: int) -> RecordFolder:
    return RecordFolder(grid / "records" / model / cid / f"pass-{k}")


def _config(args) -> dict:
    """The run's config, its results folder where ``--results`` says (a run copied off the machine it ran on)."""
    cfg = C.load(args.config)
    return {**cfg, "results_dir": args.results} if args.results else cfg


def run(args) -> None:
    cfg = _config(args)
    layout = Layout(cfg["results_dir"])
    grid = Path(args.out)
    targets = _targets(cfg, args.span)
    for k in range(1, args.starts + 1):
        for t in targets:
            if len(t["have"]) >= k:
                continue
            folder = _grid_folder(grid, t["model"], t["id"], k)
            if folder.measure.exists():
                continue
            inputs = jobs.inputs(
                Path(layout.fetch(t["model"])), Path(layout.manifest(t["model"])), Path(layout.provenance()), None
            )
            print(
                f"pass {k}: {t['model']} ubatch {t['given'].get('ubatch')} n_cpu_moe {t['n']} ({t['id']})", flush=True
            )
            item = jobs.Item(t["id"], S.resolve(t["given"]), t["given"])
            measurement = jobs.search_spec(cfg, t["model"], t["group"]["id"]).measurement
            measure(jobs.MeasureSpec(t["model"], item, measurement), inputs.records(), MeasurePaths.of(folder))


def _stat(speed) -> dict | None:
    return None if speed is None else {"median": speed.median, "min": speed.low, "max": speed.high, "n": speed.n}


def _comb(n: int, k: int) -> int:
    return math.comb(n, k) if 0 <= k <= n else 0


def random_search(values: list[float], k: int, pick: float, best: float) -> dict:
    """A random search of ``k`` distinct values out of ``values`` (0 for one that fails), told each value's speed:
    the chance that its best is at least ``pick``, and its expected best over ``best``. Exact."""
    n = len(values)
    k = min(k, n)
    ranked = sorted(values)
    total = _comb(n, k)
    expected = sum(v * _comb(i, k - 1) for i, v in enumerate(ranked)) / total  # rank i (0-based) is the max
    at_least = sum(1 for v in values if v >= pick)
    return {
        "space": n,
        "starts": k,
        "p_at_least_pick": round(1 - _comb(n - at_least, k) / total, 4),
        "expected_best_over_grid_best": round(expected / best, 4) if best else None,
    }


def bias(recs: list[dict]) -> dict:
    """Per workload: the warm-up's decode and repetition 1's, each over the median of repetitions 2..R."""
    found: dict[str, dict[str, list[float]]] = {}
    for rec in recs:
        for w in rec.get("workloads") or []:
            runs, warm = w.get("runs") or [], w.get("warmup_runs") or []
            if w.get("outcome") != "ok" or len(runs) < 3 or not warm:
                continue
            per_run = [statistics.median(r["decode_tps"] for r in run["requests"]) for run in runs]
            rest = statistics.median(per_run[1:])
            first_warm = statistics.median(r["decode_tps"] for r in warm[0]["requests"])
            slot = found.setdefault(w["name"], {"before": [], "after": []})
            slot["before"].append(first_warm / rest)
            slot["after"].append(per_run[0] / rest)

    def summary(xs: list[float]) -> dict:
        return {
            "median": round(statistics.median(xs), 4),
            "min": round(min(xs), 4),
            "max": round(max(xs), 4),
            "n": len(xs),
        }

    return {name: {k: summary(v) for k, v in d.items()} for name, d in found.items()}


def analyse(args) -> None:
    cfg = _config(args)
    layout = Layout(cfg["results_dir"])
    grid = Path(args.grid)
    objective = jobs.search_objective(cfg)
    margin = cfg["budget"]["margin_mib"]
    answers = json.loads(Path(layout.recommendation()).read_text())
    targets = _targets(cfg, args.span)
    rows, all_recs = [], []
    for t in targets:
        extra = sorted(grid.glob(f"records/{t['model']}/{t['id']}/pass-*/{RecordFolder.MEASURE}"))
        recs = t["have"] + [json.loads(p.read_text()) for p in extra]
        all_recs += recs
        pooled = speed_of(recs, objective, margin)
        starts = [speed_of([r], objective, margin) for r in recs]
        rows.append(
            {
                "model": t["model"],
                "ubatch": t["given"].get("ubatch"),
                "n_cpu_moe": t["n"],
                "config_id": t["id"],
                "starts": len(recs),
                "from_search": len(t["have"]),
                "start_medians": [round(s.median, 2) if s else None for s in starts],
                "pooled": _stat(pooled),
            }
        )
    searches = _searches(cfg)
    for model, group, summary in searches:
        probes = _probe_records(cfg, model, group, summary)
        in_grid = {x["n"] for x in targets if x["model"] == model and x["group"]["id"] == group["id"]}
        all_recs += [r for n, rs in probes.items() if n not in in_grid for r in rs]
    out = {"config": str(args.config), "objective": objective, "margin_mib": margin, "grid": rows, "models": {}}
    for answer in answers:
        model = answer["model"]
        mine = [r for r in rows if r["model"] == model]
        ok = [r for r in mine if r["pooled"]]
        best = max(ok, key=lambda r: r["pooled"]["median"]) if ok else None
        pick = next((r for r in mine if r["config_id"] == answer["winner"]), None)
        model_searches = [(g, s) for m, g, s in searches if m == model]
        search_starts = sum(s["server_starts"] for _, s in model_searches)
        values, measured_only = [], []
        for group, summary in model_searches:
            lo, hi = summary["range"]
            b = summary["boundary"]
            by_n = {r["n_cpu_moe"]: r for r in mine if r["ubatch"] == group["given"].get("ubatch")}
            top = max(by_n) if by_n else None
            for n in range(lo, hi + 1):
                row = by_n.get(n if top is None or n <= top else top)
                v = row["pooled"]["median"] if row and row["pooled"] and b is not None and n >= b else 0.0
                values.append(v)
                if n in by_n:
                    measured_only.append(v)
        entry = {
            "winner": answer["winner"],
            "use": answer.get("use"),
            "over_fit_on": answer.get("over_fit_on"),
            "cost": answer.get("cost"),
            "pick": pick,
            "grid_best": best,
            "pick_over_best": round(pick["pooled"]["median"] / best["pooled"]["median"], 4)
            if pick and best and pick["pooled"]
            else None,
            "search_starts": search_starts,
            "boundary_grid_starts": len(mine) * args.starts,
            "full_grid_starts": len(values) * args.starts,
        }
        if best and pick and pick["pooled"]:
            entry["random_search"] = random_search(
                values, search_starts, pick["pooled"]["median"], best["pooled"]["median"]
            )
            entry["random_search_measured_grid_only"] = random_search(
                measured_only, search_starts, pick["pooled"]["median"], best["pooled"]["median"]
            )
        out["models"][model] = entry
    out["warmup_bias"] = bias(all_recs)
    text = json.dumps(out, indent=1)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="verb", required=True)
    for name in ("run", "analyse"):
        p = sub.add_parser(name)
        p.add_argument("config")
        if name == "run":
            p.add_argument("--out", required=True)
        else:
            p.add_argument("grid")
            p.add_argument("--out")
        p.add_argument("--results", help="the run's results folder, where it is not the config's results_dir")
        p.add_argument("--span", type=int, default=4, help="the grid runs from the boundary to the boundary + SPAN")
        p.add_argument("--starts", type=int, default=2, help="server starts per grid value, the search's included")
    args = parser.parse_args()
    run(args) if args.verb == "run" else analyse(args)


if __name__ == "__main__":
    main()
