"""The report from the Parquet tables: what each part of it says is worked out here, from the tables
(and the provenance and the config it was measured under); ``present.sections`` lays it out once and
``present.markdown`` / ``present.html`` print it."""

from __future__ import annotations

import datetime as dt
import json
import shlex
import signal
from pathlib import Path

import pandas as pd

from .atomic import atomic_path, read_json
from .boundary import crash_lines
from .config import expand, expand_searches, objective_workload
from .needle_table import recall_failures, recall_grid
from .present import correction, html, markdown, sections
from .recommend import failure_reason, recommend
from .thresholds import missing, shared, too_wide


def _fmt_stat(row, prefix: str, digits: int = 1) -> str:
    med = row.get(f"{prefix}_median")
    if missing(med):
        return "–"
    flag = " ⚠" if too_wide(row.get(f"{prefix}_spread_pct")) else ""
    lo, hi = row[f"{prefix}_min"], row[f"{prefix}_max"]
    return f"{med:.{digits}f} [{lo:.{digits}f}–{hi:.{digits}f}] n={int(row[f'{prefix}_n'])}{flag}"


def _slots(cfg) -> str:
    """How the server's slots were set up: -np, the per-slot context it reported, unified KV."""
    unified = {True: ", unified KV", False: ", per-slot KV"}.get(cfg["s_kv_unified"], "")
    ctx_slot = f", {int(cfg['n_ctx_slot'])} ctx/slot" if not missing(cfg["n_ctx_slot"]) else ""
    return f"np {cfg['s_parallel']}{ctx_slot}{unified}"


def _cpu(w) -> str:
    """Cores used by the server and by everything else during the workload; ⚠ when others competed."""
    server, other = w.get("cpu_server_cores"), w.get("cpu_other_cores")
    if missing(server):
        return "–"
    return f"{server:.1f} / {other:.1f}" + (" ⚠" if shared(other) else "")


def _num(value, digits: int = 0) -> str:
    return "–" if missing(value) else f"{value:.{digits}f}"


def _size(nbytes) -> str:
    return "–" if missing(nbytes) else f"{nbytes / (1 << 20):,.0f} MiB"


def reproduce_command(command) -> str:
    """The recorded server command, as a user would type it: default port, no crashline logging."""
    args = list(command) if command is not None else []
    out, skip = [], 0
    for i, arg in enumerate(args):
        if skip:
            skip -= 1
            continue
        if arg in ("--host", "--port", "-lv"):
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
        "speed": _num(speed, 1),
        "peak": _num(row["peak_gpu_mib"]),
        "peak_pct": _num(row["peak_pct_of_limit"], 1),
        "headroom": _num(row["headroom_mib"]),
        "gpu_weights": _num(
            next((b["mib"] for b in row["buffers"] if (b["device"], b["kind"]) == ("CUDA0", "model")), None)
        ),
    }


def fit_comparison(
    configs: pd.DataFrame, measurements: pd.DataFrame, recs: list[dict], metric: str, workload: str
) -> list[dict]:
    """llama.cpp's own placement (--fit on) beside crashline's recommendation, per fit run."""
    out = []
    col = f"{metric}_median"
    speeds = measurements[measurements["workload"] == workload].set_index("config_id")[col]
    for _, fit in configs[configs["s_fit"] == "on"].iterrows():
        rec = next((r for r in recs if r["environment"] == fit["environment"] and r["winner"]), None)
        entry = {"fit": _placement_summary(fit, speeds.get(fit["config_id"])), "recommended": None}
        if rec:
            entry["recommended"] = _placement_summary(pd.Series(rec["winner_row"]), rec["winner_speed"])
        out.append(entry)
    return out


GPU_SUSPECTS = ("PCIe", "GPU memory bandwidth", "GPU busy", "GPU SMs busy")
SUSPECT_COLUMNS = (*GPU_SUSPECTS, "CPU", "paging", "disk reads")


def _suspect_cell(row: dict | None, gpu: bool, name: str) -> str:
    if row is None:
        if name in GPU_SUSPECTS and not gpu:
            return "no GPU"
        return "not measured: needs GPM (Hopper or later)" if name == "GPU SMs busy" else "–"
    value = row["measured"]
    text = "–" if value is None else f"{value:,.1f} {row['unit']}"
    if row.get("fraction") is not None:
        text += f" ({row['fraction']:.0%} of {row['limit']:,.0f})"
    if row.get("per_token"):
        text += f", {row['per_token']}"
    return f"{text}: {row['verdict']}"


def limits(measurements: pd.DataFrame, configs: pd.DataFrame, workload: str) -> list[dict]:
    """One row per surviving configuration: each suspect during steady decode, the bound, the verdict."""
    out = []
    rows = measurements[(measurements["workload"] == workload) & (measurements["workload_outcome"] == "ok")]
    for _, w in rows.iterrows():
        gpu = w["gpu"] != "no GPU"
        suspects = {r["suspect"].split(" (")[0]: r for r in w["bottleneck_rows"]}
        out.append(
            {
                "config_id": w["config_id"],
                "server_args": w["server_args"],
                "decode": _num(w["decode_tps_median"], 1),
                "bound": _num(w["decode_bound_tps"], 1),
                "ratio": f"{w['measured_over_bound']:.0%}" if not missing(w["measured_over_bound"]) else "–",
                "cells": [_suspect_cell(suspects.get(name), gpu, name) for name in SUSPECT_COLUMNS],
                "verdict": "–" if missing(w["bottleneck_verdict"]) else w["bottleneck_verdict"],
            }
        )
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
                    "cold_resident": _num(states["cold"]["page_cache_resident_at_start"] * 100, 0),
                    "warm_resident": _num(states["warm"]["page_cache_resident_at_start"] * 100, 0),
                    "cold_load": _num(states["cold"]["load_s"], 1),
                    "warm_load": _num(states["warm"]["load_s"], 1),
                    "cold_prefill": _fmt_stat(cold_row, "prefill_tps") if len(cold_w) else "–",
                    "warm_prefill": _fmt_stat(w, "prefill_tps"),
                    "cold_decode": _fmt_stat(cold_row, "decode_tps") if len(cold_w) else "–",
                    "warm_decode": _fmt_stat(w, "decode_tps"),
                }
            )
    return out


SERVER_FIELDS = {
    "binary": "binary",
    "obtained": "how obtained",
    "version": "version",
    "backend": "backend",
    "build_flags": "build flags",
    "sha256": "sha256",
}
COMMON_CAUSE = (
    "Every configuration of every model failed the same way ({way}). The cause is common to all of them: "
    "the llama-server binary or this machine, not the configurations."
)


def _signal_name(returncode) -> str:
    number = -int(returncode)
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _way(row) -> str:
    """How a configuration failed, less what is particular to it: the signal, or else the kind of failure."""
    what = f"killed by {_signal_name(row['returncode'])}" if row["failure"] == "signal" else f"failure {row['failure']}"
    return failure_reason(row["outcome"], row["phase"], what)


def _text(value) -> str:
    """A provenance value as one text: "–" when absent, a list of words joined, other non-strings as JSON."""
    if value in (None, "", []):
        return "–"
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return " ".join(value)
    return value if isinstance(value, str) else json.dumps(value)


def check_text(check) -> str | None:
    """The binary's verification run (provenance "check": a dict, or a list of them), as key: value lines."""
    if not check:
        return None
    runs = check if isinstance(check, list) else [check]
    return "\n\n".join("\n".join(f"{k}: {_text(v)}".replace("\n", "\n  ") for k, v in run.items()) for run in runs)


def measured_models(configs: pd.DataFrame, config: dict) -> list[str]:
    """The models of the tables, then any other the config measures (with no record, nothing of it survived)."""
    asked = [item["model"] for item in expand(config) + expand_searches(config)]
    return list(dict.fromkeys([*configs["model"], *asked]))


def nothing_survived(configs: pd.DataFrame, measurements: pd.DataFrame, models: list[str], provenance: dict) -> dict:
    """The top of the report: each model of which no workload survived, with how each of its configurations
    failed; and, when every configuration of every model failed the same way, that the cause is common to
    all of them (the binary or the machine), with the binary's provenance."""
    survived = set(measurements.loc[measurements["workload_outcome"] == "ok", "model"])
    lost = []
    for model in (m for m in models if m not in survived):
        failed = configs[(configs["model"] == model) & (configs["outcome"] != "ok")]
        lost.append(
            {
                "title": f"No configuration of {model} survived"
                + ("" if len(failed) else ": there is no record of any"),
                "failures": [
                    {
                        "config_id": row["config_id"],
                        "server_args": row["server_args"],
                        "reason": failure_reason(row["outcome"], row["phase"], row["message"]),
                    }
                    for _, row in failed.iterrows()
                ],
            }
        )
    ways = {_way(row) for _, row in configs.iterrows()}
    common = len(lost) == len(models) and all(m["failures"] for m in lost) and len(configs) > 1 and len(ways) == 1
    return {
        "models": lost,
        "common": COMMON_CAUSE.format(way=ways.pop()) if common else None,
        "server": [{"label": label, "value": _text(provenance.get(key))} for key, label in SERVER_FIELDS.items()],
        "check": check_text(provenance.get("check")),
    }


def _result_row(cfg, w, recommended: bool) -> dict:
    """One row of the results table: a configuration at a workload (``w`` None: it reached none)."""
    used = cfg.get("settings_used")
    row = {
        "config_id": cfg["config_id"],
        "server_args": cfg["server_args"],
        "used": None if missing(used) else used,
        "recommended": recommended,
        "load_s": _num(cfg["load_s"], 1),
        "slots": _slots(cfg),
        "load_vram": _num(cfg["load_peak_gpu_mib"]),
    }
    if w is None:
        blank = dict.fromkeys(("workload", "prefill", "decode", "concurrency", "aggregate", "ttft", "cpu"), "–")
        return {
            **row,
            **blank,
            "outcome": cfg["outcome"],
            "rss": _num(cfg["peak_rss_mib"]),
            "vram": _num(cfg["peak_gpu_mib"]),
        }
    return {
        **row,
        "workload": w["workload"],
        "outcome": w["workload_outcome"],
        "concurrency": int(w["concurrency"]),
        "aggregate": _fmt_stat(w, "aggregate_tps"),
        "ttft": _fmt_stat(w, "ttft_s", 3),
        "prefill": _fmt_stat(w, "prefill_tps"),
        "decode": _fmt_stat(w, "decode_tps"),
        "rss": _num(w["workload_peak_rss_mib"]),
        "vram": _num(w["workload_peak_gpu_mib"]),
        "cpu": _cpu(w),
    }


def _results(c: pd.DataFrame, m: pd.DataFrame, winners: set) -> list[dict]:
    rows = []
    for _, cfg in c.iterrows():
        recommended = (cfg["model"], cfg["config_id"]) in winners
        wl = m[m["config_id"] == cfg["config_id"]]
        rows += [_result_row(cfg, w, recommended) for _, w in wl.iterrows()] or [_result_row(cfg, None, recommended)]
    return rows


def _per_model(model: str, configs, measurements, recs: list[dict], lines: list[dict], metric: str, workload: str):
    """Everything the report says about one model."""
    c = configs[configs["model"] == model]
    m = measurements[measurements["model"] == model]
    model_recs = [dict(r) for r in recs if r["model"] == model]
    for r in model_recs:
        r["command"] = reproduce_command(r["winner_row"]["command_argv"]) if r["winner"] else None
    return {
        "name": model,
        "rows": _results(c, m, {(r["model"], r["winner"]) for r in recs}),
        "failures": c[c["outcome"] != "ok"].to_dict("records"),
        "recommendations": model_recs,
        "crash_lines": [e for e in lines if e["model"] == model],
        "fit": fit_comparison(c, m, model_recs, metric, workload),
        "limits": limits(m, c, workload),
        "cold_warm": cold_warm(c, m),
        "searches": [],
    }


def _models(configs: pd.DataFrame) -> list[dict]:
    columns = ["model", "model_source", "model_sha256", "architecture", "quantisation", "model_bytes"]
    models = configs.drop_duplicates("model")[columns]
    return models.assign(size=lambda d: d["model_bytes"].map(_size)).to_dict("records")


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
    recall_failures: dict | None = None,
) -> dict:
    """What the report says, section by section, as data (``present.sections`` lays it out)."""
    metric, workload = config["objective"]["metric"], objective_workload(config)
    margin = config["budget"]["margin_mib"]
    recs = recommend(configs, measurements, metric, workload, margin, recall_failures or {})
    short = min(config["workloads"], key=lambda w: (w["prompt_tokens"], w["gen_tokens"]))["name"]
    lines = crash_lines(configs, measurements, short, margin)
    residency = configs["page_cache_resident_at_start"].dropna()
    return {
        "generated": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "n_configs": len(configs),
        "environments": configs.drop_duplicates("environment")[["cpu_model", "gpu"]].to_dict("records"),
        "server": provenance,
        "nothing_survived": nothing_survived(configs, measurements, measured_models(configs, config), provenance),
        "budget": config["budget"],
        "residency": f"{residency.min():.0%}–{residency.max():.0%}" if len(residency) else "–",
        "workloads": _workloads(measurements, config),
        "models": _models(configs),
        "per_model": [
            _per_model(model, configs, measurements, recs, lines, metric, workload)
            for model in configs["model"].drop_duplicates()
        ],
        "suspect_columns": SUSPECT_COLUMNS,
        "objective_workload": workload,
        "objective_concurrency": next(
            (w.get("concurrency", 1) for w in config["workloads"] if w["name"] == workload), 1
        ),
    }


def searches(table: pd.DataFrame, model: str) -> list[dict]:
    out = []
    for _, row in table[table["model"] == model].iterrows() if not table.empty else []:
        out.append(
            {
                **row.to_dict(),
                "probes": list(row["probe_rows"]),
                "value_rows": list(row["value_rows"]),
                "range": f"[{row['range_lo']}, {row['range_hi']}]",
            }
        )
    return out


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
) -> None:
    """Both reports from the tables: the same document, printed as Markdown and as HTML."""
    configs = pd.read_parquet(configs_path)
    measurements = pd.read_parquet(measurements_path)
    needle_table = _table(needle_path)
    ctx = context(configs, measurements, read_json(provenance_path), config, recall_failures(needle_table))
    search_table = _table(searches_path)
    for m in ctx["per_model"]:
        m["searches"] = searches(search_table, m["name"])
    doc = sections.document(ctx, recall_grid(needle_table), correction.report_section(config, configs, measurements))
    _write(md_path, markdown.page(doc))
    _write(html_path, html.page(doc))
