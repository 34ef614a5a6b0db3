"""Placement benchmark for the GPU machine: the planner against the full n_cpu_moe grid.

On a synthetic Qwen3-30B-A3B-shaped model (48 layers, 128 experts / 8 active, Q4_0) under an
emulated VRAM budget, either
  --phase planner : calibrate the compute buffer with one load, predict the boundary, search it
                    (gallop + bisect), then step up until the headroom clears the margin;
  --phase grid    : measure every n_cpu_moe value in --grid;
  --phase fit     : what llama.cpp's own `--fit on` chooses at the same context and ubatch.
Each phase writes one record per server start (the same records the workflow writes) under
--out/records and a summary JSON with server starts and wall time. `--phase report` aggregates
every record found under --out into tables and the Markdown/HTML report, and prints the
planner-vs-grid comparison as ratios.

Runs without Snakemake, through the package only (the GPU machine has no Snakemake).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from crashline.config import plan as config_mod  # noqa: E402
from crashline.config.plan import load_schema  # noqa: E402
from crashline.models import pagecache, sources, synthetic
from crashline.engine import provision  # noqa: E402
from crashline.core.atomic import read_json, write_json  # noqa: E402
from crashline.models.manifest import inspect_gguf  # noqa: E402
from crashline.jobs import spec as jobs  # noqa: E402
from crashline.jobs.measure import MeasurePaths, measure  # noqa: E402
from crashline.core.paths import Layout, RecordFolder  # noqa: E402
from crashline.jobs.search import run_search  # noqa: E402

SHAPES = {"qwen3-30b-a3b": synthetic.QWEN3_30B_A3B, "tiny": synthetic.DEFAULT_TINY}
MODEL = "moe-synthetic"


def make_config(args) -> dict:

    schema = load_schema()
    return config_mod.validate(
        {
            "results_dir": str(Path(args.out) / args.phase),
            "models": {MODEL: {"source": f"synthetic:{args.shape}", "synthetic": SHAPES[args.shape]}},
            "defaults": {"ctx": args.ctx, "ubatch": args.ubatch},
            "configurations": [{"settings": {}}],
            "workloads": [
                {"name": "short", "prompt_tokens": 128, "gen_tokens": 64},
                {"name": f"depth-{args.depth // 1024}k", "prompt_tokens": args.depth, "gen_tokens": args.gen},
            ],
            "repetitions": args.repetitions,
            "budget": {"vram_budget_mib": args.budget_mib or None, "margin_mib": args.margin_mib},
            "server": {"startup_timeout_s": 300, "request_timeout_s": 600},
        },
        schema,
    )


def setup(args, cfg) -> tuple[dict, dict, dict]:
    cache = Path(args.cache)
    layout = Layout(cfg["results_dir"])
    prov = provision.provide({"binary": None, "backend": args.backend}, cache, log=sys.stderr)
    write_json(layout.provenance(), prov)
    model = cfg["models"][MODEL]
    fetch = sources.fetch(model["source"], cache / "models" / args.shape, synthetic=model["synthetic"], cache_dir=cache)
    write_json(layout.fetch(MODEL), fetch)
    manifest = inspect_gguf(Path(fetch["files"][0]["path"]))
    write_json(layout.manifest(MODEL), manifest)
    write_json(layout.warmup(MODEL), {"files": [pagecache.warm(f["path"]) for f in fetch["files"]]})
    return prov, fetch, manifest


class Runner:
    """Measures one configuration per call and counts server starts."""

    def __init__(self, cfg, prov, fetch, manifest):
        self.cfg, self.prov, self.fetch, self.manifest = cfg, prov, fetch, manifest
        self.layout = Layout(cfg["results_dir"])
        self.starts = 0

    def __call__(self, **settings) -> dict:
        given = {**self.cfg["defaults"], **settings}
        from crashline.core.settings import config_id, resolve

        resolved = resolve(given)
        cid = config_id(MODEL, resolved)
        path = self.layout.record(MODEL, cid)
        if path.exists():
            return read_json(path)
        self.starts += 1
        rec = measure(
            jobs.MeasureSpec(MODEL, jobs.Item(cid, resolved, given), jobs.measurement_of(self.cfg)),
            jobs.JobInputs(self.fetch, self.manifest, self.prov),
            MeasurePaths(path, self.layout.server_log(MODEL, cid)),
        )
        mem = rec.get("memory") or {}
        print(
            f"{settings} -> {rec['outcome']} {rec.get('phase') or ''} peak {mem.get('peak_gpu_mib')} MiB "
            f"headroom {mem.get('headroom_mib')} MiB",
            flush=True,
        )
        return rec


def phase_planner(args, run: Runner) -> dict:
    """The workflow's own search (crashline.jobs.search), over the whole n_cpu_moe range."""
    group = jobs.SearchGroup(
        "bench", dict(run.cfg["defaults"]), (0, run.manifest["layers"]), run.cfg["budget"]["margin_mib"]
    )
    spec = jobs.SearchSpec(MODEL, group, jobs.measurement_of(run.cfg))
    summary = run_search(
        spec, jobs.JobInputs(run.fetch, run.manifest, run.prov), Path(run.cfg["results_dir"]) / "search"
    )
    run.starts = summary["server_starts"]
    return summary


def phase_grid(args, run: Runner) -> dict:
    outcomes = {}
    for n in args.grid:
        rec = run(n_cpu_moe=n)
        outcomes[n] = rec["outcome"]
    ok = [n for n, o in outcomes.items() if o == "ok"]
    return {"grid": args.grid, "outcomes": outcomes, "boundary": min(ok) if ok else None}


def phase_fit(args, run: Runner) -> dict:
    rec = run(fit="on")
    return {
        "outcome": rec["outcome"],
        "placement": {k: rec["placement"].get(k) for k in ("buffers_mib", "layers_offloaded")},
    }


def phase_explicit(args, run: Runner) -> dict:
    """Each configuration of --settings (a JSON list of settings mappings), e.g. cold and warm."""
    return {json.dumps(s): run(**s)["outcome"] for s in json.loads(args.settings)}


def phase_report(args) -> None:
    from crashline.tables.aggregate import write
    from crashline.report.build import render

    out = Path(args.out)
    cfg = make_config(args)
    layout = Layout(out)
    records = {}  # one record per configuration: the grid's, else the fit run's, else the planner's
    for phase in ("grid", "fit", "planner", "explicit"):
        for path in sorted(out.glob(f"{phase}/**/records/*/{RecordFolder.MEASURE}")):
            records.setdefault(path.parent.name, path)
    provenance = next(out.glob("*/server/provenance.json"))
    layout.provenance().parent.mkdir(parents=True, exist_ok=True)
    layout.provenance().write_text(provenance.read_text())
    write(list(records.values()), layout.configs_table(), layout.measurements_table())
    render(
        layout.configs_table(),
        layout.measurements_table(),
        layout.provenance(),
        cfg,
        layout.report_md(),
        layout.report_html(),
    )
    summaries = {p.stem: read_json(p) for p in out.glob("*/summary-*.json")}
    if "summary-planner" in summaries and "summary-grid" in summaries:
        p, g = summaries["summary-planner"], summaries["summary-grid"]
        print(
            json.dumps(
                {
                    "same_boundary": p["result"]["boundary"] == g["result"]["boundary"],
                    "planner_boundary": p["result"]["boundary"],
                    "grid_boundary": g["result"]["boundary"],
                    "server_starts": f"{p['starts']} / {g['starts']} = {p['starts'] / g['starts']:.2f}",
                    "wall_s": f"{p['wall_s']:.0f} / {g['wall_s']:.0f} = {p['wall_s'] / g['wall_s']:.2f}",
                },
                indent=2,
            )
        )
    print(layout.report_md())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--phase", choices=["planner", "grid", "fit", "explicit", "report"], required=True)
    ap.add_argument("--settings", default="[]", help="explicit phase: JSON list of settings mappings")
    ap.add_argument("--gen", type=int, default=32, help="tokens generated by the long workload")
    ap.add_argument("--out", required=True)
    ap.add_argument("--cache", default=os.environ.get("CRASHLINE_CACHE", str(Path.home() / ".cache" / "crashline")))
    ap.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-30b-a3b")
    ap.add_argument("--backend", choices=["cuda", "cpu", "auto"], default="cuda")
    ap.add_argument("--budget-mib", type=int, default=12288, help="0: no ballast (CPU smoke runs)")
    ap.add_argument("--margin-mib", type=int, default=1024)
    ap.add_argument("--ctx", type=int, default=32768)
    ap.add_argument("--ubatch", type=int, default=2048)
    ap.add_argument("--depth", type=int, default=16384)
    ap.add_argument("--repetitions", type=int, default=2)
    ap.add_argument("--grid", type=lambda s: [int(x) for x in s.split(",")], default=list(range(0, 49)))
    args = ap.parse_args()
    if args.phase == "report":
        phase_report(args)
        return
    cfg = make_config(args)
    run = Runner(cfg, *setup(args, cfg))
    started = time.monotonic()
    phases = {"planner": phase_planner, "grid": phase_grid, "fit": phase_fit, "explicit": phase_explicit}
    result = phases[args.phase](args, run)
    summary = {"phase": args.phase, "starts": run.starts, "wall_s": time.monotonic() - started, "result": result}
    write_json(Path(args.out) / args.phase / f"summary-{args.phase}.json", summary)
    print(json.dumps(summary, indent=2, default=str))


if __name__ == "__main__":
    main()
