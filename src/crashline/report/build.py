"""The report from the Parquet tables: what each part of it says is worked out here, from the tables
(and the provenance and the config it was measured under); ``report.sections`` lays it out once and
``report.markdown`` / ``report.html`` print it."""

from __future__ import annotations

import datetime as dt
import json
import shlex
from pathlib import Path

import pandas as pd

from ..core.atomic import atomic_path, read_json
from ..tables.boundary import crash_lines
from ..config.plan import expand, expand_searches, objective_workload, resolve_objective
from ..tables.needle import recall_grid, uninformative
from . import correction, html, markdown, sections
from . import cost as cost_mod
from . import figures as figures_mod
from . import searches as searches_mod
from .failed import nothing_survived
from .rows import conversation_rows, fmt_stat, memory_text, num, result_rows, size_text, soak_rows, validity_rows
from .suspects import SUSPECT_COLUMNS, bandwidth_text, limits
from .doc import Figure
from .compact import distinguishing, split_common, wrapped
from ..tables.recommend import METRIC_LABEL, decide
from ..tables import kvquality
from ..tables import recheck as recheck_mod
from ..core.records import Outcome
from ..core.paths import Layout, recheck_tables
from ..core.thresholds import inconclusive, missing

FIGURES = "figures"  # the folder of the figures, beside report.md (paths.Layout.figures)


def reproduce_command(command) -> str:
    """The recorded server command, as a user would type it: default port, no crashline logging or key."""
    args = list(command) if command is not None else []
    out, skip = [], 0
    for i, arg in enumerate(args):
        if skip:
            skip -= 1
            continue
        if arg in ("--host", "--port", "-lv", "--api-key-file"):
            skip = 1
            continue
        out.append(arg)
    out[0] = Path(out[0]).name
    return shlex.join(out + ["--host", "127.0.0.1", "--port", "8080"])


def _placement_summary(row, speed) -> dict:
    return {
        "config_id": row["config_id"],
        "server_args": row["server_args"],
        "outcome": row["outcome"],
        "speed": num(speed, 1),
        "peak": num(row["peak_gpu_mib"]),
        "peak_pct": num(row["peak_pct_of_limit"], 1),
        "headroom": num(row["headroom_mib"]),
        "gpu_weights": num(
            next((b["mib"] for b in row["buffers"] if (b["device"], b["kind"]) == ("CUDA0", "model")), None)
        ),
    }


def fit_comparison(
    configs: pd.DataFrame, measurements: pd.DataFrame, recs: list[dict], metric: str, workload: str, margin_mib: int
) -> list[dict]:
    """llama.cpp's own placement (--fit on) beside crashline's recommendation, per fit run, each named by
    ``--fit on`` and the settings that set it apart from the other fit runs (``label``: "--fit on --cache-ram 0")."""
    out = []
    col = f"{metric}_median"
    speeds = measurements[measurements["workload"] == workload].set_index("config_id")[col]
    fits = configs[configs["s_fit"] == "on"]
    _, apart = split_common(list(fits["server_args"]))
    for (_, fit), rest in zip(fits.iterrows(), apart):
        rec = next((r for r in recs if r["environment"] == fit["environment"] and r["winner"]), None)
        fit_speed = speeds.get(fit["config_id"])
        entry = {
            "label": " ".join(["--fit on", rest]).strip() if len(fits) > 1 else "--fit on",
            "fit": _placement_summary(fit, fit_speed),
            "speed": None if fit["outcome"] != Outcome.OK or missing(fit_speed) else float(fit_speed),
            # it survived with less headroom than the margin: faster or not, it could not be the recommendation
            "headroom_mib": None if missing(h := fit["headroom_mib"]) else float(h),
            "under_margin": None if missing(h) or h >= margin_mib else margin_mib,
            # aimed at the margin over several starts (jobs.measure.measure_aimed): each target and what it left
            "aimed": None if missing(aim := fit.get("fit_aim")) else aim,
            "starts": int(fit.get("starts") or 1),
            "recommended": None,
            "ratio": None,
            "is_fit": False,
            "tied": False,  # with the recommendation, by the spread between starts (tables.ties)
        }
        if rec:
            entry["recommended"] = _placement_summary(pd.Series(rec["winner_row"]), rec["winner_speed"])
            entry["is_fit"] = rec["winner"] == fit["config_id"]
            entry["tied"] = any(v["config_id"] == fit["config_id"] and v.get("tied") for v in rec["others"])
            if fit["outcome"] == Outcome.OK and not missing(fit_speed) and fit_speed:
                entry["ratio"] = rec["winner_speed"] / fit_speed  # the bar: llama.cpp's own answer
        out.append(entry)
    return out


def cold_warm(configs: pd.DataFrame, measurements: pd.DataFrame) -> list[dict]:
    """Configurations measured both cold and warm, side by side, never mixed into one figure."""
    if "s_page_cache" not in configs:
        return []
    others = [c for c in configs.columns if c.startswith("s_") and c != "s_page_cache"]
    out = []
    for _, group in configs.groupby(["model", "environment", *others], dropna=False):
        states = {r["s_page_cache"]: r for _, r in group.iterrows()}
        if set(states) != {"cold", "warm"}:
            continue
        for _, w in measurements[measurements["config_id"] == states["warm"]["config_id"]].iterrows():
            cold_w = measurements[
                (measurements["config_id"] == states["cold"]["config_id"]) & (measurements["workload"] == w["workload"])
            ]
            cold_row = cold_w.iloc[0] if len(cold_w) else {}
            out.append(
                {
                    "model": w["model"],
                    "server_args": w["server_args"],
                    "workload": w["workload"],
                    "cold_resident": num(states["cold"]["page_cache_resident_at_start"] * 100, 0),
                    "warm_resident": num(states["warm"]["page_cache_resident_at_start"] * 100, 0),
                    "cold_load": num(states["cold"]["load_s"], 1),
                    "warm_load": num(states["warm"]["load_s"], 1),
                    "cold_prefill": fmt_stat(cold_row, "prefill_tps") if len(cold_w) else "–",
                    "warm_prefill": fmt_stat(w, "prefill_tps"),
                    "cold_decode": fmt_stat(cold_row, "decode_tps") if len(cold_w) else "–",
                    "warm_decode": fmt_stat(w, "decode_tps"),
                    # other processes competed on a side: the two cannot be set against each other
                    "inconclusive": inconclusive([cold_row, w]) if len(cold_w) else None,
                }
            )
    return out


def measured_models(configs: pd.DataFrame, config: dict) -> list[str]:
    """The models of the tables, then any other the config measures (with no record, nothing of it survived)."""
    asked = [item["model"] for item in expand(config) + expand_searches(config)]
    return list(dict.fromkeys([*configs["model"], *asked]))


def _answer(r: dict, configs: pd.DataFrame, measurements: pd.DataFrame) -> dict:
    """The recommendation as a user acts on it: the settings that set the winner apart from the model's other
    configurations (and those of each rival others' processes made unjudgeable against it and a quiet machine could
    lift past it: a possible answer as well), the whole command (wrapped), and its memory at the objective workload."""
    if not r["winner"]:
        return r
    row = r["winner_row"]
    all_args = list(configs["server_args"])
    args = dict(zip(configs["config_id"], configs["server_args"], strict=True))
    at = measurements[(measurements["config_id"] == r["winner"]) & (measurements["workload"] == r["workload"])]
    peak = at["workload_peak_gpu_mib"].iloc[0] if len(at) else None
    memory = memory_text(row, peak)
    rivals = [o["config_id"] for o in r["others"] if o.get("possible") and o["config_id"] in args]
    return {
        **r,
        "use": distinguishing(row["server_args"], all_args) or row["server_args"],
        "or_use": [distinguishing(args[cid], all_args) or args[cid] for cid in rivals],
        "command": wrapped(reproduce_command(row["command_argv"])),
        "memory": memory,
    }


def answers(ctx: dict) -> list[dict]:
    """recommendation.json: per model (and kind of machine) the answer as the report's headline gives it, with the
    whole command, the figures at the objective and why, or why nothing is recommended."""
    out = []
    for m in ctx["per_model"]:
        for r in m["recommendations"]:
            entry = {
                "model": m["name"],
                "environment": r["environment"],
                "machine": m.get("title", m["name"]),
                "objective": r["objective_text"],
                "metric": r["metric"],
                "workload": r["workload"],
                "winner": r["winner"],
                "cost": ctx.get("cost"),
            }
            fits = [f for f in m["fit"] if f["ratio"] is not None or f["is_fit"]]
            if r["winner"]:
                entry |= {
                    # against the fastest --fit on measured: the strongest of llama.cpp's own placements
                    "over_fit_on": 1.0
                    if any(f["is_fit"] for f in fits)
                    else min((f["ratio"] for f in fits), default=None),
                    "fit_on": [
                        {
                            "label": f["label"],
                            "config_id": f["fit"]["config_id"],
                            "ratio": f["ratio"],
                            "headroom_mib": f["headroom_mib"],
                            "under_margin": f["under_margin"],  # the margin it fell under, where it did
                            "aimed": f["aimed"],  # the --fit-target of each start, where one was raised
                            "starts": f["starts"],
                            "tied": f["tied"],  # with the answer, by the spread between starts
                        }
                        for f in fits
                    ],
                    "tie": r.get("tie"),  # tied with others on the objective: why this one (None: no tie)
                    # the configurations the speeds cannot tell from it, and those others' processes made unjudgeable
                    "tied_with": [o["config_id"] for o in r["others"] if o.get("tied")],
                    "inconclusive_with": [o["config_id"] for o in r["others"] if o.get("inconclusive")],
                    "inconclusive": r.get("inconclusive"),  # others' processes competed: no faster or slower
                    # where another configuration would finish a request first as the reply grows or shrinks
                    "reply_length": r.get("reply_length"),
                    "use": r["use"],
                    # the inconclusive rivals' settings: possible answers too, until a quiet machine decides
                    "or_use": r["or_use"],
                    "command": reproduce_command(r["winner_row"]["command_argv"]),
                    "speed": r["winner_speed"],
                    "metric_label": r["metric_label"],
                    "measured": r["winner_measured"],
                    "memory": r["memory"],
                    "headroom_mib": None if missing(h := r["winner_row"].get("headroom_mib")) else float(h),
                    # what its quantised KV cache costs against f16 (None: f16, or not measured)
                    "kv_quality": _kv_of_answer(ctx, m["name"], r["winner_row"]),
                }
            else:
                entry["why"] = r["no_winner"]
            out.append(entry)
    return out


def kv_quality(
    kv: pd.DataFrame, configs: pd.DataFrame, measurements: pd.DataFrame, needle: pd.DataFrame, config: dict
) -> dict:
    """Per model, its KV types' speed, KL divergence and recall side by side (``tables.kvquality.side_by_side``),
    with what the section says them against: the threshold, the metric and the workload."""
    objective = resolve_objective(config)
    metric, workload, max_kld = objective["metric"], objective["workload"], config["kv_quality"]["max_kld"]
    models = {
        model: kvquality.side_by_side(model, kv, configs, measurements, needle, metric, workload, max_kld)
        for model in configs["model"].drop_duplicates()
    }
    return {
        "models": {m: rows for m, rows in models.items() if rows},
        "max_kld": max_kld,
        "metric_label": METRIC_LABEL[metric],
        "workload": workload,
    }


def _kv_of_answer(ctx: dict, model: str, winner_row: dict) -> dict | None:
    """The KV quality row of the answer's KV type, where it is a quantised one (None for f16 or without a figure)."""
    label = kvquality.label_of(winner_row)
    rows = (ctx.get("kv_quality") or {}).get("models", {}).get(model, [])
    return next((r for r in rows if r["kv"] == label and label != kvquality.F16), None)


def environments(configs: pd.DataFrame) -> list[dict]:
    """Each kind of machine the records ran on: CPU and GPU, and the hosts' names where there are several kinds."""
    envs = configs.drop_duplicates("environment")[["environment", "cpu_model", "gpu"]].to_dict("records")
    if len(envs) > 1:
        for e in envs:
            e["hosts"] = ", ".join(
                sorted(configs[configs["environment"] == e["environment"]]["hostname"].dropna().unique())
            )
    return envs


def machines(configs: pd.DataFrame, model: str) -> list[tuple[str | None, dict]]:
    """The kinds of machine (environments) a model was measured on, the one with the most configurations first:
    [(None, {})] for one (the report as for a single machine), else each environment and how the report names it."""
    rows = configs[configs["model"] == model]
    envs = rows["environment"].value_counts(sort=True).index.tolist()
    if len(envs) < 2:
        return [(None, {})]
    out = []
    for i, env in enumerate(envs):
        on = rows[rows["environment"] == env]
        hosts = ", ".join(sorted(on["hostname"].dropna().unique())) or "unknown host"
        budget = on["vram_budget_mib"].dropna()
        card = f" at a {int(budget.iloc[0]):,} MiB budget" if len(budget) else ""
        label = f"{hosts}: {on['cpu_model'].iloc[0]}; {on['gpu'].iloc[0]}{card}"
        out.append((env, {"title": f"{model} on {label}", "anchor": f"model-{model}-{i + 1}", "machine": label}))
    return out


def _per_model(
    model: str,
    configs,
    measurements,
    conversations,
    recs: list[dict],
    lines: list[dict],
    metric: str,
    workload: str,
    margin_mib: int,
    environment: str | None = None,
    machine: dict | None = None,
):
    """Everything the report says about one model (on one kind of machine, ``environment``, where it ran on
    several): the settings its configurations share are said once, and each configuration is named by the rest."""

    def mine(frame: pd.DataFrame) -> pd.DataFrame:
        if frame.empty:
            return frame
        keep = frame["model"] == model
        return frame[keep & (frame["environment"] == environment)] if environment else frame[keep]

    c, m, talks = mine(configs), mine(measurements), mine(conversations)
    recs = [r for r in recs if r["model"] == model and environment in (None, r["environment"])]
    lines = [e for e in lines if e["model"] == model and environment in (None, e["environment"])]
    common, rest = split_common(list(c["server_args"]))
    differs = dict(zip(c["config_id"], rest, strict=True))
    model_recs = [_answer(dict(r), c, m) for r in recs]
    tradeoff = [{**t, "differs": differs.get(t["config_id"], "")} for r in model_recs for t in r.get("tradeoff", [])]
    rows = result_rows(c, m, {(r["model"], r["winner"]) for r in recs})
    for row in [*rows, *(lim := limits(m, c, workload))]:
        row["differs"] = differs[row["config_id"]]
    return {
        "name": model,
        "title": model,
        "anchor": f"model-{model}",
        **(machine or {}),
        "common_args": common,
        "rows": rows,
        "failures": [{**f, "differs": differs[f["config_id"]]} for f in c[c["outcome"] != "ok"].to_dict("records")],
        "recommendations": model_recs,
        "crash_lines": lines,
        "fit": fit_comparison(c, m, model_recs, metric, workload, margin_mib),
        "limits": lim,
        "tradeoff": tradeoff,
        "cold_warm": cold_warm(c, m),
        "conversations": conversation_rows(talks, model, differs),
        "soaks": soak_rows(c, differs),
        "searches": [],
    }


def _models(configs: pd.DataFrame) -> list[dict]:
    columns = ["model", "model_source", "model_sha256", "architecture", "quantisation", "model_bytes"]
    models = configs.drop_duplicates("model")[columns]
    return models.assign(size=lambda d: d["model_bytes"].map(size_text)).to_dict("records")


def _workloads(measurements: pd.DataFrame, config: dict) -> list[dict]:
    if measurements.empty:
        return [
            {
                "workload": w["name"],
                "prompt_tokens": w["prompt_tokens"],
                "gen_tokens": w["gen_tokens"],
                "repetitions": config["repetitions"],
            }
            for w in config["workloads"]
        ]
    measured = measurements.drop_duplicates("workload")[["workload", "prompt_tokens", "gen_tokens"]]
    return measured.assign(repetitions=config["repetitions"]).to_dict("records")


def context(
    configs: pd.DataFrame,
    measurements: pd.DataFrame,
    provenance: dict,
    config: dict,
    needle: pd.DataFrame | None = None,
    conversations: pd.DataFrame | None = None,
    searches: pd.DataFrame | None = None,
) -> dict:
    """What the report says, section by section, as data (``report.sections`` lays it out)."""
    conversations = conversations if conversations is not None else pd.DataFrame()
    objective = resolve_objective(config)
    metric, workload = objective["metric"], objective["workload"]
    margin = config["budget"]["margin_mib"]
    recs = decide(configs, measurements, config, needle)
    everyones = [w for w in config["workloads"] if "configs" not in w] or config["workloads"]  # what all ran
    short = min(everyones, key=lambda w: (w["prompt_tokens"], w["gen_tokens"]))["name"]
    lines = crash_lines(configs, measurements, short, margin)
    residency = configs["page_cache_resident_at_start"].dropna()
    return {
        "generated": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "n_configs": len(configs),
        "environments": environments(configs),
        "server": provenance,
        "nothing_survived": nothing_survived(configs, measurements, measured_models(configs, config), provenance),
        "budget": config["budget"],
        "residency": f"{residency.min():.0%}–{residency.max():.0%}" if len(residency) else "–",
        "workloads": _workloads(measurements, config),
        "models": _models(configs),
        "per_model": [
            _per_model(model, configs, measurements, conversations, recs, lines, metric, workload, margin, env, machine)
            for model in configs["model"].drop_duplicates()
            for env, machine in machines(configs, model)
        ],
        "recall_uninformative": uninformative(needle),
        "cost": cost_mod.cost(configs, needle, provenance, searches),
        "suspect_columns": SUSPECT_COLUMNS,
        "bandwidth": bandwidth_text(provenance),  # the host's bandwidth behind each decode bound: source, spread
        "objective_workload": workload,
    }


SUMMARY_COLUMNS = ("prefill_tps", "decode_tps", "e2e_tps")


def standing_mark(cid: str, answer: dict) -> str:
    """What a summary row's deciding speed cannot be told from: " (tied)" for the answer and the configurations tied
    with it, " (inconclusive)" for one that others' processes made unjudgeable against it; "" otherwise."""
    tied = answer.get("tied_with") or []
    if cid in tied or (cid == answer.get("winner") and tied):
        return " (tied)"
    return " (inconclusive)" if cid in (answer.get("inconclusive_with") or []) else ""


def summary(answers_: list[dict], configs: pd.DataFrame, measurements: pd.DataFrame) -> list[dict]:
    """The answer as a short table per model (and kind of machine), as llama-bench prints one: every configuration
    at the objective's workload, best first, with the settings that set it apart, how it ended, its medians and its
    peak memory; the recommendation marked. The report opens with it (``sections.summary``), and ``summary.md``,
    which ``report`` and ``tune`` print, is it alone. Each: ``title``, ``memory`` (the column's name) and ``rows``
    ({config_id, winner, differs, outcome, prefill, decode, e2e, peak})."""
    blocks = []
    for a in answers_:
        mine = configs[(configs["model"] == a["model"]) & (configs["environment"] == a["environment"])]
        load = (a.get("measured") or {}).get("concurrency") or 1
        at = (
            measurements[
                (measurements["model"] == a["model"])
                & (measurements["environment"] == a["environment"])
                & (measurements["workload"] == a["workload"])
                & (measurements["concurrency"] == load)
            ]
            .drop_duplicates("config_id", keep="last")
            .set_index("config_id")
        )
        all_args = list(mine["server_args"])
        metric = f"{a['metric']}_median"
        rows = []
        for _, c in mine.iterrows():
            w = at.loc[c["config_id"]] if c["config_id"] in at.index else None
            speed = {k: num(w[f"{k}_median"], 1) if w is not None else "–" for k in SUMMARY_COLUMNS}
            if a["metric"] in speed and w is not None:  # beside the deciding speed: what it cannot be told from
                speed[a["metric"]] += standing_mark(c["config_id"], a)
            peak = c["peak_gpu_mib"] if not missing(c.get("peak_gpu_mib")) else c["peak_rss_mib"]
            rows.append(
                {
                    # a cold page cache is a state at load, never ranked against its warm twin: it follows the rest
                    "rank": (
                        c.get("s_page_cache") == "cold",
                        -(w[metric] if w is not None and not missing(w.get(metric)) else -1),
                    ),
                    "config_id": c["config_id"],
                    "winner": c["config_id"] == a["winner"],
                    "differs": distinguishing(c["server_args"], all_args) or "(the same)",
                    "outcome": c["outcome"],
                    "prefill": speed["prefill_tps"],
                    "decode": speed["decode_tps"],
                    "e2e": speed["e2e_tps"],
                    "peak": num(peak),
                }
            )
        blocks.append(
            {
                "title": f"{a['machine']}, at {a['workload']} (★ the recommendation, by {a['metric']})",
                "memory": f"peak {'VRAM' if mine['peak_gpu_mib'].notna().any() else 'RSS'} MiB (whole run)",
                "rows": sorted(rows, key=lambda r: r["rank"]),
            }
        )
    return blocks


def rechecked(config: dict, configs: pd.DataFrame, measurements: pd.DataFrame) -> dict | None:
    """This run beside the earlier one ``recheck.against`` names (its tables), at the objective; None without one."""
    against = config["recheck"].get("against")
    if not against:
        return None
    then_configs, then_measurements = recheck_tables(config)
    objective = resolve_objective(config)
    rows = recheck_mod.compare(
        pd.read_parquet(then_configs),
        pd.read_parquet(then_measurements),
        configs,
        measurements,
        objective["metric"],
        objective["workload"],
    )
    return {"against": str(against), "rows": rows, "headline": recheck_mod.headline(rows)}


def _table(path: Path | None) -> pd.DataFrame:
    return pd.read_parquet(path) if path and Path(path).exists() else pd.DataFrame()


def _write(path: Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def render(
    configs_path: Path,
    measurements_path: Path,
    provenance_path: Path,
    config: dict,
    md_path: Path,
    html_path: Path,
    searches_path: Path | None = None,
    needle_path: Path | None = None,
    results_dir: Path | None = None,
    conversations_path: Path | None = None,
    validity_path: Path | None = None,
    kv_quality_path: Path | None = None,
    recommendation_path: Path | None = None,
    summary_path: Path | None = None,
) -> None:
    """Both reports from the tables: the same document, printed as Markdown and as HTML, and its figures as
    SVG files in ``figures/`` beside the Markdown (the recommended configurations' time series are read from
    ``results_dir``, by default the Markdown's folder)."""
    configs = pd.read_parquet(configs_path)
    measurements = pd.read_parquet(measurements_path)
    needle_table = _table(needle_path)
    talks = _table(conversations_path)
    checked = read_json(validity_path) if validity_path and Path(validity_path).exists() else {}
    search_table = _table(searches_path)
    ctx = context(configs, measurements, read_json(provenance_path), config, needle_table, talks, search_table)
    ctx["recheck"] = rechecked(config, configs, measurements)
    ctx["kv_quality"] = kv_quality(_table(kv_quality_path), configs, measurements, needle_table, config)
    winners: dict[str, list[str]] = {}  # a model measured on several machines: every section's winners
    for m in ctx["per_model"]:
        winners.setdefault(m["name"], []).extend(r["winner"] for r in m["recommendations"] if r["winner"])
    telemetry = {}
    for model, ids in winners.items():
        telemetry.update(figures_mod.read_telemetry(results_dir or md_path.parent, model, ids))
    drawn = figures_mod.figures(
        configs,
        measurements,
        search_table,
        config["budget"],
        objective_workload(config),
        telemetry,
        [cid for ids in winners.values() for cid in ids],
        talks,
    )
    figures_dir = md_path.parent / FIGURES
    figures_mod.write(drawn, figures_dir)
    said = set()
    for m in ctx["per_model"]:  # a model measured on several machines: its searches and figures once, in the first
        if m["name"] in said:
            m["figures"], m["validity"] = [], {}
            continue
        said.add(m["name"])
        manifest_path = Layout(results_dir or md_path.parent).manifest(m["name"])
        manifest = read_json(manifest_path) if manifest_path.exists() else None
        m["searches"] = searches_mod.searches(search_table, m["name"], configs, manifest)
        m["figures"] = [Figure(f.title, f.svg, f"{FIGURES}/{f.file}", f.series) for f in drawn.get(m["name"], [])]
        m["validity"] = validity_rows(checked, m["name"])
    found = answers(ctx)
    ctx["summary"] = summary(found, configs, measurements)
    doc = sections.document(ctx, recall_grid(needle_table), correction.report_section(config, configs, measurements))
    _write(md_path, markdown.page(doc))
    _write(html_path, html.page(doc))
    with atomic_path(recommendation_path or Layout(md_path.parent).recommendation()) as tmp:
        tmp.write_text(json.dumps(found, indent=1, default=str) + "\n")
    with atomic_path(summary_path or Layout(md_path.parent).summary_md()) as tmp:
        tmp.write_text("\n\n".join(markdown.block(b) for b in sections.summary(ctx["summary"])) + "\n")
