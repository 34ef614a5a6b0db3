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

from ..core.atomic import atomic_path, read_json
from ..tables.boundary import crash_lines
from ..core.columns import SETTING_PREFIX, setting
from ..config.plan import expand, expand_searches, objective_workload, resolve_objective
from ..tables.needle import recall_grid, uninformative
from . import correction, html, markdown, sections
from . import figures as figures_mod
from .doc import Figure, Stat
from .compact import distinguishing, runs, split_common, wrapped
from ..tables.recommend import decide, failure_reason
from ..tables import recheck as recheck_mod
from ..core.records import Outcome
from ..core.paths import Layout, recheck_tables
from ..core.thresholds import missing, shared, too_wide

N_CPU_MOE = setting("n_cpu_moe")
FIGURES = "figures"  # the folder of the figures, beside report.md (paths.Layout.figures)


def _fmt_stat(row, prefix: str, digits: int = 1) -> Stat | str:
    med = row.get(f"{prefix}_median")
    if missing(med):
        return "–"
    flag = " ⚠" if too_wide(row.get(f"{prefix}_spread_pct")) else ""
    lo, hi = row[f"{prefix}_min"], row[f"{prefix}_max"]
    return Stat(f"{med:.{digits}f}", f"[{lo:.{digits}f}–{hi:.{digits}f}] n={int(row[f'{prefix}_n'])}{flag}")


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
        fit_speed = speeds.get(fit["config_id"])
        entry = {"fit": _placement_summary(fit, fit_speed), "recommended": None, "ratio": None, "is_fit": False}
        if rec:
            entry["recommended"] = _placement_summary(pd.Series(rec["winner_row"]), rec["winner_speed"])
            entry["is_fit"] = rec["winner"] == fit["config_id"]
            if fit["outcome"] == Outcome.OK and not missing(fit_speed) and fit_speed:
                entry["ratio"] = rec["winner_speed"] / fit_speed  # the bar: llama.cpp's own answer
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


def _bound(w) -> str:
    """The decode bound, with where its placement came from when that is the log alone; else why it is unknown."""
    if missing(w["decode_bound_tps"]):
        return "–" if missing(w.get("decode_bound_unknown")) else f"unknown: {w['decode_bound_unknown']}"
    return _num(w["decode_bound_tps"], 1) + (" (placement from the log)" if w.get("decode_bound_from") == "log" else "")


DECIDING = ("saturated", "busy", "paging", "reading")


def _short_suspect(row: dict) -> str:
    """A suspect in a few words: "GPU busy 96%", "CPU 7.8 of 8 cores", "paging 120 faults/s"."""
    name = row["suspect"].split(" (")[0]
    if row.get("fraction") is not None and row["unit"] == "%":
        return f"{name} {row['fraction']:.0%}"
    if row.get("fraction") is not None:
        return f"{name} {row['measured']:,.1f} of {row['limit']:,.0f} {row['unit']} ({row['fraction']:.0%})"
    return f"{name} {row['measured']:,.1f} {row['unit']}"


def deciding(rows: list[dict]) -> list[str]:
    """The one or two suspects that decide the verdict: those near or at their limit (or paging, reading),
    else the busiest one; the most loaded first."""
    measured = [r for r in rows if r.get("measured") is not None]
    hot = [r for r in measured if r["verdict"] in DECIDING]
    pick = hot or sorted((r for r in measured if r.get("fraction") is not None), key=lambda r: -r["fraction"])[:1]
    pick = sorted(pick, key=lambda r: -(r.get("fraction") or 1))[:2]
    return [_short_suspect(r) for r in pick]


def limits(measurements: pd.DataFrame, configs: pd.DataFrame, workload: str) -> list[dict]:
    """One row per surviving configuration: each suspect during steady decode, the bound, the verdict, and
    the suspects that decide it."""
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
                "bound": _bound(w),
                "ratio": f"{w['measured_over_bound']:.0%}" if not missing(w["measured_over_bound"]) else "–",
                "cells": [_suspect_cell(suspects.get(name), gpu, name) for name in SUSPECT_COLUMNS],
                "deciding": "; ".join(deciding(list(w["bottleneck_rows"]))) or "–",
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
# Refused before any server started: what the config asked of this machine, not the binary.
REFUSED_CAUSE = {
    "budget": (
        "Every configuration of every model was refused before its server started: {message}. The cause is the "
        "config's budget (budget.vram_budget_mib or budget.host_ram_mib), which this machine cannot emulate, not the "
        "llama-server binary or the configurations: remove it, or run where it can be set."
    ),
    "gpus": (
        "Every configuration of every model was refused before its server started: {message}. The cause is the GPUs "
        "the configurations ask for, which this machine cannot lend, not the llama-server binary."
    ),
}


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
    refused = set(configs["failure"]) if common and set(configs["outcome"]) == {Outcome.BUDGET_REFUSED} else set()
    if len(refused) == 1 and (kind := refused.pop()) in REFUSED_CAUSE:
        said = REFUSED_CAUSE[kind].format(message=str(configs["message"].iloc[0]).rstrip("."))
    else:
        said = COMMON_CAUSE.format(way=ways.pop()) if common else None
    return {
        "models": lost,
        "common": said,
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
        blank["draft"] = ""
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
        "aggregate": _fmt_stat(w, "aggregate_tps") if int(w["concurrency"]) > 1 else "–",
        "ttft": _fmt_stat(w, "ttft_s", 3),
        "prefill": _fmt_stat(w, "prefill_tps"),
        "decode": _fmt_stat(w, "decode_tps"),
        "draft": "" if missing(w["draft_acceptance"]) else f"{w['draft_acceptance']:.0%} of {w['draft_drafted']:,}",
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


def memory_text(row: dict, peak) -> str | None:
    """A configuration's memory as the recommendation says it: its peak VRAM (``peak``, at the objective workload)
    and its headroom under the limit; with several GPUs, each one's peak and the room left on the fullest; under a
    host budget, the host peak and its headroom too."""
    vram = _vram_text(row, peak)
    host = None
    if not missing(row.get("host_ram_mib")) and not missing(row.get("host_peak_mib")):
        host = (
            f"host memory peak {row['host_peak_mib']:,.0f} MiB, {row['host_headroom_mib']:,.0f} MiB below the "
            f"{row['host_ram_mib']:,.0f} MiB host budget"
        )
    return "; ".join(t for t in (vram, host) if t) or None


def _vram_text(row: dict, peak) -> str | None:
    if missing(peak) or missing(row.get("vram_limit_mib")):
        return None
    limit = "budget" if row.get("vram_limit_is") == "budget" else "card"
    room, total = row["headroom_mib"], row["vram_limit_mib"]
    each = row.get("peak_gpus_mib")
    if each is not None and len(each) > 1:  # each GPU has its own limit: the fullest one decides
        peaks = " and ".join(f"{x:,.0f}" for x in each)
        budget = row.get("vram_budget_mib")
        of = f"the {budget:,.0f} MiB budget of each" if not missing(budget) else "its card"
        return f"peak VRAM {peaks} MiB on its {len(each)} GPUs, {room:,.0f} MiB below {of} on the fullest"
    return f"peak VRAM {peak:,.0f} MiB, {room:,.0f} MiB below the {total:,.0f} MiB {limit}"


def _answer(r: dict, all_args: list[str], measurements: pd.DataFrame) -> dict:
    """The recommendation as a user acts on it: the settings that set the winner apart from the model's other
    configurations, the whole command (wrapped), and its memory at the objective workload."""
    if not r["winner"]:
        return r
    row = r["winner_row"]
    at = measurements[(measurements["config_id"] == r["winner"]) & (measurements["workload"] == r["workload"])]
    peak = at["workload_peak_gpu_mib"].iloc[0] if len(at) else None
    memory = memory_text(row, peak)
    return {
        **r,
        "use": distinguishing(row["server_args"], all_args) or row["server_args"],
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
                    "over_fit_on": 1.0 if fits and fits[0]["is_fit"] else (fits[0]["ratio"] if fits else None),
                    "use": r["use"],
                    "command": reproduce_command(r["winner_row"]["command_argv"]),
                    "speed": r["winner_speed"],
                    "metric_label": r["metric_label"],
                    "measured": r["winner_measured"],
                    "memory": r["memory"],
                    "headroom_mib": None if missing(h := r["winner_row"].get("headroom_mib")) else float(h),
                }
            else:
                entry["why"] = r["no_winner"]
            out.append(entry)
    return out


def conversation_rows(conversations: pd.DataFrame, model: str, differs: dict[str, str]) -> list[dict]:
    """The conversations table's rows of one model, as the report says them."""
    if conversations.empty:
        return []
    out = []
    for r in conversations[conversations["model"] == model].to_dict("records"):
        survived = r["conversation_outcome"] == Outcome.OK
        restart = r["restart_ttft_s"]
        out.append(
            {
                "config_id": r["config_id"],
                "differs": differs.get(r["config_id"], ""),
                "shape": f"{r['conversation']}: {r['turn_tokens']:,} + {r['reply_tokens']:,} tokens a turn to "
                f"{r['depth_tokens']:,}, {r['at_once']} at once"
                + (f"; soak of {r['soak_s']:,.0f} s: {r['soak_sets']} more sets" if r["soak_s"] else ""),
                "survived": survived,
                "outcome_text": "survived"
                if survived
                else f"{r['conversation_outcome']} at {r['failed_at']}: {r['conversation_message']}",
                "turns": f"{r['turns_done']} of {r['turns_planned']}",
                "depth": f"{r['depth_reached']:,}",
                "reused": "" if missing(r["reused_median"]) else f"{r['reused_median']:.0%}",
                "gpu_per_1k": "" if missing(r["gpu_mib_per_1k"]) else f"{r['gpu_mib_per_1k']:.1f}",
                "rss_per_1k": "" if missing(r["rss_mib_per_1k"]) else f"{r['rss_mib_per_1k']:.1f}",
                "rss_per_hour": ""
                if missing(r["rss_mib_per_hour"]) or not r["soak_s"]
                else f"{r['rss_mib_per_hour']:,.0f}",
                "checkpoints": _checkpoints_text(r),
                "restart": "not asked"
                if not r["restart"]
                else ("" if missing(restart) else f"{restart:.2f} s, {r['restart_prefill_tps']:,.0f} t/s"),
            }
        )
    return out


def soak_rows(configs: pd.DataFrame, differs: dict[str, str]) -> list[dict]:
    """The unique-prompt soak of each configuration of one model that ran one, as the report says it."""
    if "soak_requests" not in configs:
        return []

    def per_request(r: dict, name: str) -> str:
        slope = r[f"soak_{name}_mib_per_request"]
        if missing(slope):
            return ""
        low, high = r[f"soak_{name}_mib_per_request_low"], r[f"soak_{name}_mib_per_request_high"]
        return f"{slope:+.2f} ({low:+.2f} to {high:+.2f})"

    out = []
    for r in configs[configs["soak_requests"].notna()].to_dict("records"):
        survived = r["soak_outcome"] == Outcome.OK
        out.append(
            {
                "config_id": r["config_id"],
                "differs": differs.get(r["config_id"], ""),
                "ran": f"{r['soak_requests']:,.0f} requests in {r['soak_ran_s']:,.0f} s",
                "survived": survived,
                "rss": per_request(r, "rss"),
                "gpu": per_request(r, "gpu"),
                "cache": per_request(r, "cache"),
                "said": r["soak_said"] if survived else f"{r['soak_outcome']}: {r['soak_said']}",
            }
        )
    return out


def _checkpoints_text(row: dict) -> str:
    """ "7, 7, 7.5" (made, most a slot held, the largest's MiB); "none" where the server made none; "" where the
    record predates the counts."""
    made = row.get("checkpoints_created")
    if missing(made):
        return ""
    if not made:
        return "none"
    return f"{made:,.0f}, {row['checkpoints_held']:,.0f}, {row['checkpoint_mib']:,.1f}"


def _others_cpu(row: dict) -> tuple[str, bool]:
    """Other processes' cores during each side of a cross-check row, and whether either side was disturbed."""
    from ..jobs.validity import disturbed

    bench = [(row[f"bench_{k}"] or {}).get("cpu_other_cores") for k in ("prefill", "decode")]
    bench = [b for b in bench if b is not None]
    ours = row.get("crashline_cpu_other_cores")
    if not bench and ours is None:
        return "–", False  # a check recorded before these were sampled
    sides = disturbed(row)
    text = ", ".join(
        (
            f"llama-bench {max(bench):.1f}" if bench else "llama-bench –",
            f"crashline {ours:.1f}" if ours is not None else "crashline –",
        )
    )
    return (f"{text}: {' and '.join(sides)} disturbed, not concluded" if sides else text), bool(sides)


def validity_rows(record: dict, model: str) -> dict:
    """llama-bench beside crashline for one model, as the report says it: each workload of each configuration
    checked, the two speeds and their ratio, flagged past the tolerance; what llama-bench could not express."""
    out = {"tolerance": record.get("tolerance"), "message": record.get("message"), "rows": []}
    for c in record.get("checked") or []:
        if c["model"] != model:
            continue
        if c["outcome"] != Outcome.OK:
            out["rows"].append({"config_id": c["config_id"], "server_args": c["server_args"], "error": c["message"]})
            continue
        for r in c["rows"]:
            cells = {}
            for kind in ("prefill", "decode"):
                ours, theirs, ratio = r[f"crashline_{kind}_tps"], r[f"bench_{kind}"]["mean_tps"], r[f"{kind}_ratio"]
                cells[kind] = (f"{ours:,.1f} / {theirs:,.1f} ({ratio:.2f})", kind in r["flagged"])
            out["rows"].append(
                {
                    "config_id": c["config_id"],
                    "server_args": c["server_args"],
                    "workload": f"{r['workload']} ({r['prompt_tokens']:,} + {r['gen_tokens']:,})",
                    "cells": cells,
                    "others": _others_cpu(r),
                    "left_out": ", ".join(c["left_out"]),
                    "command": " ".join(r["bench_decode"]["command"]),
                }
            )
    return out


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
    model_recs = [_answer(dict(r), list(c["server_args"]), m) for r in recs]
    tradeoff = [{**t, "differs": differs.get(t["config_id"], "")} for r in model_recs for t in r.get("tradeoff", [])]
    rows = _results(c, m, {(r["model"], r["winner"]) for r in recs})
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
        "fit": fit_comparison(c, m, model_recs, metric, workload),
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
            _per_model(model, configs, measurements, conversations, recs, lines, metric, workload, env, machine)
            for model in configs["model"].drop_duplicates()
            for env, machine in machines(configs, model)
        ],
        "recall_uninformative": uninformative(needle),
        "cost": cost(configs, needle, provenance, searches),
        "suspect_columns": SUSPECT_COLUMNS,
        "objective_workload": workload,
    }


SUMMARY_COLUMNS = ("prefill_tps", "decode_tps", "e2e_tps")


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
            speed = {k: _num(w[f"{k}_median"], 1) if w is not None else "–" for k in SUMMARY_COLUMNS}
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
                    "peak": _num(peak),
                }
            )
        blocks.append(
            {
                "title": f"{a['machine']}, at {a['workload']} (★ the recommendation, by {a['metric']})",
                "memory": "peak VRAM MiB" if mine["peak_gpu_mib"].notna().any() else "peak RSS MiB",
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


def _search_starts(searches: pd.DataFrame | None) -> dict:
    """The searches' server starts, and what a grid would take: every value of their ranges, each started as often
    as a finalist is (#22: the starts the planner saves)."""
    if searches is None or searches.empty or "range_lo" not in searches:
        return {}
    values = searches["range_hi"] - searches["range_lo"] + 1
    grid = (values * searches["starts_per_finalist"].fillna(1).clip(lower=1)).sum()
    return {"search_starts": int(searches["server_starts"].sum()), "grid_starts": int(grid)}


def cost(
    configs: pd.DataFrame, needle: pd.DataFrame | None, provenance: dict, searches: pd.DataFrame | None = None
) -> dict | None:
    """What the answer cost, from the jobs' own clocks: server starts, the measurements' time (searches' probes
    and calibration starts included) and the part of it spent starting servers and serving requests, the recall
    checks' time, the GPU minutes where jobs held one, and the llama-server build (once per machine)."""
    if "job_s" not in configs or configs["job_s"].dropna().empty:
        return None  # records written before the jobs' clocks were tabled
    measured = configs.dropna(subset=["job_s"])
    calibrations = (
        searches.dropna(subset=["calibration_job_s"])
        if searches is not None and "calibration_job_s" in searches
        else pd.DataFrame(columns=["calibration_job_s", "calibration_serving_s"])
    )
    measure_s = float(measured["job_s"].sum()) + float(calibrations["calibration_job_s"].sum())
    serving_s = float(measured["serving_s"].sum()) + float(calibrations["calibration_serving_s"].sum())
    recall = pd.DataFrame()
    if needle is not None and not needle.empty and "job_s" in needle:
        recall = needle.drop_duplicates(["model", "config_id", "environment"])
    recall_s = float(recall["job_s"].dropna().sum()) if not recall.empty else 0.0
    recall_starts = int(recall["applicable"].fillna(False).astype(bool).sum()) if not recall.empty else 0
    on_gpu = measured[measured["gpu"] != "no GPU"]["job_s"].sum()
    restarts = int(measured["server_starts"].sum()) - len(measured)
    return {
        "measurements": len(measured),
        "server_starts": int(measured["server_starts"].sum()) + len(calibrations) + recall_starts,
        "calibrations": len(calibrations),
        **_search_starts(searches),
        "restarts": restarts,
        "recall_starts": recall_starts,
        "measure_s": round(measure_s, 1),
        "serving_s": round(serving_s, 1),
        "overhead_ratio": round(measure_s / serving_s, 3) if serving_s else None,
        "recall_s": round(recall_s, 1),
        "gpu_s": round(float(on_gpu), 1) if on_gpu else None,  # measurements only: recall jobs hold it too
        "build_s": provenance.get("build_seconds"),
        "built": str(provenance.get("obtained") or ""),
    }


def _probed(search: pd.Series, configs: pd.DataFrame) -> dict[int, pd.Series]:
    """The configurations a search measured, by n_cpu_moe: its model's, with the search's other settings."""
    c = configs[configs["model"] == search["model"]]
    for col in search.index:
        if col.startswith(SETTING_PREFIX) and col in c:
            c = c[c[col].isna()] if missing(search[col]) else c[c[col] == search[col]]
    return {int(r[N_CPU_MOE]): r for _, r in c.iterrows() if not missing(r[N_CPU_MOE])}


def _probe_word(row, chosen: bool, margin: int) -> str:
    """A measured value in a few words: "✓ chosen", "✓ risky: 14 MiB headroom", "✗ kv_cache at load"."""
    if row is None:
        return "measured"
    if row["outcome"] != "ok":
        what = _or(row["failure"], row["outcome"])
        return f"✗ {what} at {row['phase']}" if not missing(row["phase"]) else f"✗ {what}"
    headroom = row.get("headroom_mib")
    word = "✓ chosen" if chosen else "✓"
    if not missing(headroom) and headroom < margin:
        return f"{word} risky: {headroom:,.0f} MiB headroom, under the {margin:,} MiB margin"
    return f"{word} ({headroom:,.0f} MiB headroom)" if not missing(headroom) else word


def _or(value, other):
    return other if missing(value) else value


def planner_ranges(values: list[dict], probed: dict, limit, chosen, margin: int) -> list[str]:
    """Every value of a search in runs: "0–15 skipped: predicted 846–12,996 MiB over the budget", "16 ✗ oom at
    warmup", "18 ✓ chosen", "19–47 fit by the same prediction (not measured)"."""

    def kind(v):
        if v["status"] == "measured":
            return None
        return "over" if v["status"].startswith("skipped: predicted") else v["status"]

    out = []
    for first, last, k in runs(values, kind):
        lo, hi = values[first]["n_cpu_moe"], values[last]["n_cpu_moe"]
        span = f"{lo}" if lo == hi else f"{lo}–{hi}"
        if k is None:
            out.append(f"{span} {_probe_word(probed.get(lo), lo == chosen, margin)}")
        elif k == "over" and limit:
            over = sorted(values[i]["predicted_mib"] - limit for i in range(first, last + 1))
            amount = f"{over[0]:,.0f}" if len(over) == 1 else f"{over[0]:,.0f}–{over[-1]:,.0f}"
            out.append(f"{span} skipped: predicted {amount} MiB over the budget")
        elif k.startswith("not measured"):
            out.append(f"{span} fit by the same prediction (not measured)")
        else:
            out.append(f"{span} {k}")
    return out


def _speed(entry: dict) -> str:
    return f"{entry['median']:,.1f} [{entry['min']:,.1f}–{entry['max']:,.1f}]" if not missing(entry["median"]) else "–"


def climb_text(row) -> str | None:
    """The climb above the lowest value with the margin, in a sentence."""
    climbed = list(row.get("climbed") if row.get("climbed") is not None else [])
    if not climbed:
        return None
    steps = "; ".join(f"{c['n_cpu_moe']} {_speed(c)} {c['verdict']}" for c in climbed)
    stop = f" ({row['climb_stop']})" if not missing(row.get("climb_stop")) else ""
    metric = (row.get("objective_metric") or "decode_tps").removesuffix("_tps")
    return (
        f"Climb from n_cpu_moe {row['lowest_with_margin']}, the lowest with the margin, {metric} t/s at "
        f"{row.get('objective_workload')}: {steps}{stop}."
    )


def finalists_text(row) -> str | None:
    """The finalists' interleaved server starts and how long the winner's lead held."""
    finalists = list(row.get("finalists") if row.get("finalists") is not None else [])
    if not finalists:
        return None
    each = "; ".join(
        f"{f['n_cpu_moe']}: {f['starts']} starts, medians {', '.join(f'{m:,.1f}' for m in f['start_medians'])}, "
        f"pooled {_speed(f)}" + ("" if f["survived"] else ", failed a start")
        for f in finalists
    )
    lead = f" {row['lead_held']}." if not missing(row.get("lead_held")) else ""
    return f"Finalists, started again interleaved: {each}.{lead}"


def what_if_table(row, manifest: dict | None) -> dict | None:
    """Predicted lowest safe n_cpu_moe for other cards and contexts, from this search's calibration."""
    from ..engine.suggest import SuggestError, what_if

    compute = row.get("compute_rows")
    if manifest is None or compute is None or not len(compute) or missing(row.get("rest_mib")):
        return None
    calibration = {
        "compute_mib": {int(c["ubatch"]): c["mib"] for c in compute},
        "rest_mib": row["rest_mib"],
        "ctx": row["s_ctx"],
        "model": row["model"],
        "group": row["group"],
    }
    try:
        table = what_if(
            manifest,
            calibration,
            ubatches=(int(row["s_ubatch"]),),
            cache_type_k=row["s_cache_type_k"],
            cache_type_v=row["s_cache_type_v"],
            parallel=int(row["s_parallel"]) if not missing(row.get("s_parallel")) else 1,
            margin_mib=int(row["margin_mib"]),
        )
    except SuggestError:
        return None
    return table


def searches(table: pd.DataFrame, model: str, configs: pd.DataFrame, manifest: dict | None = None) -> list[dict]:
    out = []
    for _, row in table[table["model"] == model].iterrows() if not table.empty else []:
        probed = _probed(row, configs)
        chosen = None if missing(row["recommended_n_cpu_moe"]) else int(row["recommended_n_cpu_moe"])
        values = [dict(v) for v in row["value_rows"]]
        for v in values:
            if v["status"] == "measured":
                v["status"] = _probe_word(probed.get(v["n_cpu_moe"]), v["n_cpu_moe"] == chosen, row["margin_mib"])
        out.append(
            {
                **row.to_dict(),
                "probes": list(row["probe_rows"]),
                "value_rows": values,
                "ranges": planner_ranges(list(row["value_rows"]), probed, row["limit_mib"], chosen, row["margin_mib"]),
                "range": f"[{row['range_lo']}, {row['range_hi']}]",
                "climb": climb_text(row),
                "finalists_text": finalists_text(row),
                "what_if": what_if_table(row, manifest),
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
    results_dir: Path | None = None,
    conversations_path: Path | None = None,
    validity_path: Path | None = None,
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
        m["searches"] = searches(search_table, m["name"], configs, manifest)
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
