"""The rows of the report's tables, each a dict of the texts a section prints: every configuration's results per
workload with its speeds, memory, CPU and limits; the conversations, the soak, the llama-bench cross-check."""

from __future__ import annotations

import pandas as pd

from ..core.records import Outcome
from ..core.thresholds import missing, shared, too_wide
from .doc import Stat


def fmt_stat(row, prefix: str, digits: int = 1) -> Stat | str:
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


def num(value, digits: int = 0) -> str:
    return "–" if missing(value) else f"{value:.{digits}f}"


def size_text(nbytes) -> str:
    return "–" if missing(nbytes) else f"{nbytes / (1 << 20):,.0f} MiB"


def _result_row(cfg, w, recommended: bool) -> dict:
    """One row of the results table: a configuration at a workload (``w`` None: it reached none)."""
    used = cfg.get("settings_used")
    row = {
        "config_id": cfg["config_id"],
        "server_args": cfg["server_args"],
        "used": None if missing(used) else used,
        "recommended": recommended,
        "load_s": num(cfg["load_s"], 1),
        "slots": _slots(cfg),
        "load_vram": num(cfg["load_peak_gpu_mib"]),
    }
    if w is None:
        blank = dict.fromkeys(("workload", "prefill", "decode", "concurrency", "aggregate", "ttft", "cpu"), "–")
        blank["draft"] = ""
        return {
            **row,
            **blank,
            "outcome": cfg["outcome"],
            "rss": num(cfg["peak_rss_mib"]),
            "vram": num(cfg["peak_gpu_mib"]),
        }
    return {
        **row,
        "workload": w["workload"],
        "outcome": w["workload_outcome"],
        "concurrency": int(w["concurrency"]),
        "aggregate": fmt_stat(w, "aggregate_tps") if int(w["concurrency"]) > 1 else "–",
        "ttft": fmt_stat(w, "ttft_s", 3),
        "prefill": fmt_stat(w, "prefill_tps"),
        "decode": fmt_stat(w, "decode_tps"),
        "draft": draft_cell(w, cfg),
        "rss": num(w["workload_peak_rss_mib"]),
        "vram": num(w["workload_peak_gpu_mib"]),
        "cpu": _cpu(w),
    }


def result_rows(c: pd.DataFrame, m: pd.DataFrame, winners: set) -> list[dict]:
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
    from ..crosscheck.validity import disturbed

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


def draft_cell(w, cfg) -> str:
    """A speculative draft's share of its tokens the model accepted, and the VRAM the draft's own buffers took where
    they were on the card."""
    if missing(w["draft_acceptance"]):
        return ""
    vram = cfg.get("draft_vram_mib")
    on_card = "" if missing(vram) or not vram else f" · draft {vram:,.0f} MiB VRAM"
    return f"{w['draft_acceptance']:.0%} of {int(w['draft_drafted']):,}{on_card}"
