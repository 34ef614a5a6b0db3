"""``crashline recheck RESULTS --binary NEW``: the configurations an earlier run recommended, measured again on
another llama-server build with the same models, workloads, conversations, soak, budget and objective, into a
run of its own whose report sets each beside the earlier figures (``recheck.against``): survived then and now,
the first request after /health, the speed ratio and the change in peak memory."""

from __future__ import annotations

from pathlib import Path

from ..config import plan
from ..config.plan import ConfigError
from ..core.atomic import read_json
from ..core.owned import outside_inputs, own_folder
from ..core.paths import Layout
from .exits import Said, of_recheck

# What is not the earlier run's to keep: where this one writes, what it merges, its own claims and publishing.
FRESH = {"merge_results": [], "claims": [], "publish": {}}


def _winner_settings(earlier: Layout, model: str, cid: str) -> dict:
    found = earlier.measure_records(model, cid)
    if not found:
        raise ConfigError(f"{earlier.root}: the recommended configuration {model} {cid} has no record there")
    return {k: v for k, v in read_json(found[0])["settings"].items() if v is not None}


def config(results: str | Path, binary: str | Path, out: Path) -> dict:
    """The run ``recheck`` makes: the earlier run's config with its recommended configurations alone, on
    ``binary``, into ``out``/results, compared with ``results``."""
    earlier = Layout(Path(results).expanduser().resolve())
    saved = earlier.root / ".crashline" / "config.json"
    answers = earlier.recommendation()
    for path, what in ((saved, "its config"), (answers, "its recommendation")):
        if not path.is_file():
            raise ConfigError(
                f"{results}: not the results folder of a finished crashline run ({what}, {path}, is missing); "
                "give the results_dir of a run whose report was made"
            )
    cfg = read_json(saved)
    winners = list(dict.fromkeys((a["model"], a["winner"]) for a in read_json(answers) if a.get("winner")))
    if not winners:
        raise ConfigError(f"{results}: the earlier run recommended no configuration, so there is nothing to recheck")
    raw = {
        **cfg,
        **FRESH,
        "results_dir": str(out / "results"),
        "server": {**cfg["server"], "binary": str(Path(binary).expanduser().resolve())},
        "configurations": [
            {"models": [model], "settings": _winner_settings(earlier, model, cid)} for model, cid in winners
        ],
        "recheck": {"against": str(earlier.root)},
    }
    plan.validate(raw, plan.load_schema())  # a binary that cannot run is named before anything runs
    return raw


def answer(cfg: dict) -> Said:
    """What ``recheck`` prints: the report's headline on the new build and each configuration's verdict; its status
    REGRESSED where a configuration fails now or is slower (exits)."""
    from ..report.build import rechecked
    import pandas as pd

    layout = Layout(cfg["results_dir"])
    found = rechecked(cfg, pd.read_parquet(layout.configs_table()), pd.read_parquet(layout.measurements_table()))
    lines = [found["headline"] or "no configuration was measured in both runs"]
    for r in found["rows"]:
        ratio = "" if r["ratio"] is None else f", {r['metric']} {r['ratio']:.2f}x"
        lines.append(f"  {r['model']} {r['config_id']}: {r['verdict']}{ratio}")
    return Said([*lines, f"report: {layout.report_md()} and {layout.report_html()}"], of_recheck(found["rows"]))


def recheck(results: str | Path, binary: str | Path, out: str | Path = "recheck") -> Said:
    from .tune import run_folder

    outside_inputs(out, "--out", [results])  # its results would land in the earlier run's, or hold it
    out = own_folder(out, "--out", create=False)  # refused before anything runs; its real path
    raw = config(results, binary, out)
    path = run_folder(raw, out, "recheck")
    return answer(plan.validate(raw, plan.load_schema())).after(f"config: {path}")
