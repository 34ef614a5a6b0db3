"""Records (JSON, one per job) into Parquet tables; reports read only these tables.

``configs``: one row per model × configuration (outcome, failure phase, placement, memory).
``measurements``: one row per model × configuration × workload, every setting a column.
``conversations``: one row per model × configuration × conversation workload, its turns a nested list.
``searches``: one row per n_cpu_moe search.

A search's finalist has several server starts (``records/ID/`` and ``records/ID/start-K/``), and so has a
configuration whose entry asks for ``starts`` (its later starts' records, ``start-K/`` beside its first): its starts
are one row in ``configs`` and ``measurements`` (``pool_starts``), with ``starts`` the number of starts,
each statistic over every request of every start, and ``*_start_medians`` each start's own median.
Other records are one row each, as they are.

Every table has the columns ``columns`` names, of the types it gives, with rows or without.
"""

from __future__ import annotations

import functools
import statistics
from pathlib import Path

import pandas as pd
import pyarrow as pa

from ..core import columns as cols
from ..core import host as host_mod
from ..core.paths import SearchFolder, first_start_of
from ..core.records import Outcome
from ..core import records
from ..core import settings as settings_mod
from . import files
from ..engine import logparse
from ..engine.workloads import summarize


def _settings_columns(resolved: dict) -> dict:
    return {cols.setting(k): (" ".join(v) if isinstance(v, list) else v) for k, v in resolved.items()}


# laps of the job's clock (jobs/serve.py, jobs/serving.py)
SERVING_LAPS = ("server_start", "warmup_request", "workloads", "conversations", "soak")


def fit_aim_text(aim: dict | None) -> str | None:
    """A --fit on aimed at the margin (jobs.measure.measure_aimed), in words: "--fit-target 1024 left 832 MiB, under
    the 1,024 MiB margin; --fit-target 1216 left 1,041 MiB"; None where it was not aimed or needed one start."""
    attempts = (aim or {}).get("attempts") or []
    if len(attempts) < 2:
        return None
    said = []
    for a in attempts:
        predicted = a.get("predicted_headroom_mib")  # stopped once loaded (jobs.measure.serving_at_load)
        if predicted is not None:
            left, room = f"stopped once loaded, serving predicted to leave {predicted:,.0f} MiB", predicted
        elif a["outcome"] == Outcome.OK and a["headroom_mib"] is not None:
            left, room = f"left {a['headroom_mib']:,.0f} MiB", a["headroom_mib"]
        else:
            left, room = f"ended {a['outcome']}", None
        short = room is None or room < aim["margin_mib"]
        said.append(
            f"--fit-target {a['fit_target']} {left}"
            + (f", under the {aim['margin_mib']:,} MiB margin" if short else "")
        )
    return "; ".join(said)


def _time_columns(rec: dict) -> dict:
    """What the job cost (its Stopwatch, time_budget_s): its whole time, and the part spent starting the server and
    serving requests; the rest is crashline's (setup, lock waits, ballast, stopping, telemetry, analysis)."""
    laps = rec.get("time_budget_s") or {}
    # a --fit on aimed at the margin (jobs.measure.measure_aimed): the starts before the one recorded count too
    before = [a["time_budget_s"] for a in ((rec.get("fit_aim") or {}).get("attempts") or [])[:-1]]
    return {
        "job_s": round(sum(b.get("total", 0.0) for b in [laps, *before]), 3) if laps else None,
        "serving_s": round(sum(b.get(k, 0.0) for b in [laps, *before] for k in SERVING_LAPS), 3) if laps else None,
        "first_request_s": laps.get("warmup_request"),  # lapped only once it answered
        "server_starts": 0  # refused before its server started (a budget or GPUs this machine cannot give)
        if rec.get("outcome") == Outcome.BUDGET_REFUSED
        else (rec.get("starts") or 1) + rec.get("restart_cases", restart_cases(rec)) + len(before),
    }


def restart_cases(rec: dict) -> int:
    """The servers one start started again for its conversations' restart cases."""
    return sum(bool(t.get("restart_turn")) for t in rec.get("conversations") or [])


def _soak_columns(result: dict | None) -> dict:
    """The unique-prompt soak's columns (jobs.soak): what ran, the growth per request with its 95% interval, and
    the hours until the first limit at that rate; empty without a soak."""
    result = result or {}
    growth = result.get("growth") or {}
    out = {
        "soak_requests": result.get("requests_done"),
        "soak_ran_s": result.get("ran_s"),
        "soak_outcome": result.get("outcome"),
        "soak_said": result.get("said"),
        "soak_hours_to_limit": result.get("hours_to_limit"),
        "soak_limit_first": result.get("limit_reached_first"),
        "soak_limit_mib": ((result.get("projection") or {}).get(result.get("limit_reached_first")) or {}).get(
            "limit_mib"
        ),
    }
    for key, name in (("rss_mib", "rss"), ("gpu_mib", "gpu"), ("cache_mib", "cache")):
        fitted = (growth.get(key) or {}).get("per_request") or {}
        out |= {
            f"soak_{name}_mib_per_request": fitted.get("slope"),
            f"soak_{name}_mib_per_request_low": fitted.get("low"),
            f"soak_{name}_mib_per_request_high": fitted.get("high"),
            f"soak_{name}_mib_last": (growth.get(key) or {}).get("last"),
        }
    return out


def _config_row(rec: dict) -> dict:
    placement = rec.get("placement") or {}
    memory = rec.get("memory") or {}
    budget = rec.get("budget") or {}
    gpu = rec["host"]["gpu"]
    return {
        "model": rec["model"]["name"],
        "config_id": rec["config_id"],
        "model_source": rec["model"]["source"],
        "model_sha256": rec["model"]["sha256"],
        "architecture": rec["model"].get("architecture"),
        "quantisation": rec["model"].get("quantisation"),
        "model_bytes": rec["model"].get("total_bytes"),
        **_settings_columns(rec["settings"]),
        "server_args": settings_mod.label(rec["settings"]),
        "command_argv": rec.get("command"),
        "server_version": rec["server"].get("version"),
        "server_sha256": rec["server"].get("sha256"),
        "server_backend": rec["server"].get("backend"),
        "server_obtained": rec["server"].get("obtained"),
        # A different VRAM budget is a different card: never ranked or averaged together.
        "environment": host_mod.environment_key(rec["host"]) + f"|budget {budget.get('vram_budget_mib') or 'none'}",
        "hostname": rec["host"].get("hostname"),
        "cpu_model": rec["host"].get("cpu_model"),
        "cpu_logical_cores": rec["host"].get("cpu_logical_cores"),
        "gpu": ", ".join(d["name"] for d in gpu.get("devices", [])) or "no GPU",
        "gpu_uuids": ",".join(d["uuid"] for d in gpu.get("devices", []) if d.get("uuid")) or None,
        "gpu_driver": gpu.get("driver"),
        "vram_budget_mib": budget.get("vram_budget_mib"),
        "margin_mib": budget.get("margin_mib"),
        "repetitions": rec.get("repetitions"),
        "outcome": rec["outcome"],
        "failure": rec.get("failure"),
        "phase": rec.get("phase"),
        "message": rec.get("message"),
        "returncode": rec.get("returncode"),
        "load_s": rec.get("load_s"),
        "page_cache_resident_at_start": rec.get("page_cache_resident_at_start"),
        "page_cache_verified": (rec.get("page_cache") or {}).get("verified"),
        "peak_rss_mib": memory.get("peak_rss_mib"),
        "peak_gpu_mib": memory.get("peak_gpu_mib"),
        "peak_gpus_mib": memory.get("peak_gpus_mib"),
        "load_peak_gpu_mib": ((memory.get("per_phase") or {}).get("load") or {}).get("gpu_mib"),
        "vram_limit_mib": memory.get("vram_limit_mib"),
        "vram_limit_is": memory.get("vram_limit_is"),
        "headroom_mib": memory.get("headroom_mib"),
        "peak_pct_of_limit": memory.get("peak_pct_of_limit"),
        **_soak_columns(rec.get("soak")),
        **_time_columns(rec),
        "host_ram_mib": budget.get("host_ram_mib"),
        "host_peak_mib": memory.get("host_peak_mib"),
        "host_headroom_mib": memory.get("host_headroom_mib"),
        "log_tail": rec.get("log_tail"),
        "n_ctx": placement.get("n_ctx"),
        "n_threads": placement.get("n_threads"),
        "n_parallel": placement.get("n_parallel"),
        "n_ctx_slot": placement.get("n_ctx_slot"),
        "settings_used": ", ".join(
            f"{k} {v['used']} (asked {v['asked']})" for k, v in (rec.get("settings_used") or {}).items()
        )
        or None,
        "fit_aim": fit_aim_text(rec.get("fit_aim")),
        "n_threads_batch": placement.get("n_threads_batch"),
        "layers_offloaded": placement.get("layers_offloaded"),
        "buffers": placement.get("buffers") or [],
        "draft_vram_mib": draft_vram_mib(placement),
        "started_at": rec.get("started_at"),
        "starts": rec.get("starts", 1),
    }


def draft_vram_mib(placement: dict) -> float | None:
    """The VRAM a speculative draft's own buffers took (weights, KV cache, compute), from the log's lines of its load;
    None without a draft (or a record from before its lines were read apart)."""
    draft = placement.get("draft_buffers") or []
    return sum(b["mib"] for b in draft if not logparse.on_host(b["device"])) if draft else None


def _stat_columns(w: dict) -> dict:
    """Each statistic of each metric of a workload (None for a workload that failed)."""
    return {cols.stat(metric, k): (w.get(metric) or {}).get(k) for metric in cols.METRICS for k in cols.STATS}


def _start_medians(w: dict) -> dict:
    """Each metric's median in each server start (one start: its own median); None for a workload that failed."""
    pooled = w.get("start_medians") or {m: [(w.get(m) or {}).get("median")] for m in cols.METRICS}
    return {cols.start_medians(m): v if any(x is not None for x in v) else None for m, v in pooled.items()}


def _workload_columns(w: dict, peak: dict) -> dict:
    """The columns a workload adds to its configuration's row in ``measurements``."""
    rows = (w.get("bottleneck") or {}).get("rows") or []
    return {
        "workload": w["name"],
        "prompt_tokens": w["prompt_tokens"],
        "gen_tokens": w["gen_tokens"],
        "concurrency": w.get("concurrency", 1),
        "workload_outcome": w["outcome"],
        "workload_message": w.get("message"),
        **_stat_columns(w),
        **_start_medians(w),
        **{f"draft_{k}": (w.get("draft") or {}).get(k) for k in ("drafted", "accepted", "acceptance")},
        "workload_peak_rss_mib": peak.get("rss_mib"),
        "workload_peak_gpu_mib": peak.get("gpu_mib"),
        "cpu_server_cores": peak.get("cpu_server_cores"),
        "cpu_other_cores": peak.get("cpu_other_cores"),
        "decode_bound_tps": (w.get("decode_bound") or {}).get("bound_tps"),
        "measured_over_bound": (w.get("decode_bound") or {}).get("measured_over_bound"),
        "decode_bound_from": (w.get("decode_bound") or {}).get("placement_from"),
        "decode_bound_unknown": (w.get("decode_bound") or {}).get("unknown"),
        "bottleneck_verdict": (w.get("bottleneck") or {}).get("verdict"),
        "bottleneck_rows": rows,
    }


def _conversation_columns(talk: dict) -> dict:
    """The columns a conversation workload adds to its configuration's row in ``conversations``."""
    restart = talk.get("restart_turn") or {}
    return {
        "conversation": talk["name"],
        **{k: talk[k] for k in ("turn_tokens", "reply_tokens", "depth_tokens", "restart")},
        "soak_s": talk.get("soak_s", 0),
        "soak_sets": talk.get("soak_sets", 0),
        "ran_s": talk.get("ran_s"),
        "at_once": talk["conversations"],
        "conversation_outcome": talk["outcome"],
        "conversation_message": talk.get("message"),
        **{k: talk.get(k) for k in ("failed_at", "turns_planned", "turns_done", "depth_reached", "reused_median")},
        **{k: talk.get(k) for k in ("gpu_mib_per_1k", "rss_mib_per_1k", "rss_mib_per_hour")},
        **{k: talk.get(k) for k in (*cols.CHECKPOINT_KEYS, "checkpoint_mib")},
        "restart_ttft_s": restart.get("ttft_s"),
        "restart_prefill_tps": restart.get("prefill_tps"),
        "restart_gpu_mib": restart.get("gpu_mib"),
        "restart_rss_mib": restart.get("rss_mib"),
        "turn_rows": [{**t, "turn": str(t["turn"])} for t in talk["turns"]],
    }


# -- server starts of one configuration, pooled into one row --------------------------------------------------------


def _pool_memory(memories: list[dict | None]) -> dict | None:
    """The peaks over every start: the highest peak, the least headroom; per phase the highest of each peak."""
    found = [m for m in memories if m]
    if not found:
        return None
    out = dict(found[0])
    for key in ("peak_rss_mib", "peak_gpu_mib", "peak_pct_of_limit", "host_peak_mib"):
        values = [m[key] for m in found if m.get(key) is not None]
        out[key] = max(values) if values else None
    for key in ("headroom_mib", "headroom_pct", "host_headroom_mib"):
        values = [m[key] for m in found if m.get(key) is not None]
        out[key] = min(values) if values else None
    each = [m["peak_gpus_mib"] for m in found if m.get("peak_gpus_mib")]
    out["peak_gpus_mib"] = [max(x) for x in zip(*each)] if each else None
    phases: dict[str, dict] = {}
    for m in found:
        for phase, peaks in (m.get("per_phase") or {}).items():
            into = phases.setdefault(phase, dict(peaks))
            for key, value in peaks.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool) and into.get(key) is not None:
                    into[key] = into[key] + value if key == "samples" else max(into[key], value)
    out["per_phase"] = phases
    return out


def _pool_workload(ws: list[dict]) -> dict:
    """One workload over several starts: every run of every start, its statistics over every request of them
    (``workloads.summarize``, as each start's own), each start's medians; the first start's telemetry analysis."""
    out = dict(ws[0])
    bad = next((w for w in ws if w["outcome"] != "ok"), None)
    if bad is not None:
        out.update(outcome=bad["outcome"], message=bad.get("message"))
        out.update(dict.fromkeys([*cols.METRICS, "draft"]))
    else:
        out.update(summarize([run for w in ws for run in w.get("runs") or []]))
        bound = dict(out.get("decode_bound") or {})
        if bound.get("bound_tps") and (out.get("decode_tps") or {}).get("median"):
            out["decode_bound"] = {**bound, "measured_over_bound": out["decode_tps"]["median"] / bound["bound_tps"]}
    out["runs"] = [run for w in ws for run in w.get("runs") or []]
    out["start_medians"] = {m: [(w.get(m) or {}).get("median") for w in ws] for m in cols.METRICS}
    return out


def pool_starts(recs: list[dict]) -> dict:
    """Server starts of one configuration as one record (a search's finalists): the first start's record with
    ``starts``; the outcome of the first start that failed, if one did; the peaks over every start
    (``_pool_memory``); per workload, the statistics over every request of every start (``_pool_workload``); per
    conversation workload, the first start's, or the first that failed, and every start's restart cases
    (``restart_cases``: a later start of an entry runs no conversation); the soak of the start that would reach a
    limit soonest."""
    if len(recs) == 1:
        return recs[0]
    out = {**recs[0], "starts": len(recs), "restart_cases": sum(map(restart_cases, recs))}
    bad = next((r for r in recs if r["outcome"] != "ok"), None)
    if bad is not None:
        out.update({k: bad.get(k) for k in ("outcome", "failure", "phase", "message", "log_tail", "returncode")})
    out["memory"] = _pool_memory([r.get("memory") for r in recs])
    loads = [r["load_s"] for r in recs if r.get("load_s") is not None]
    out["load_s"] = statistics.median(loads) if loads else None
    out["finished_at"] = recs[-1].get("finished_at")
    names = [w["name"] for w in recs[0].get("workloads") or []]
    out["workloads"] = [
        _pool_workload([w for r in recs for w in r.get("workloads") or [] if w["name"] == name]) for name in names
    ]
    talks = [r.get("conversations") or [] for r in recs]
    out["conversations"] = [
        next((t[i] for t in talks if i < len(t) and t[i]["outcome"] != "ok"), first) for i, first in enumerate(talks[0])
    ]
    laps = [r.get("time_budget_s") or {} for r in recs]  # what every start cost, together
    out["time_budget_s"] = {k: round(sum(lap.get(k, 0.0) for lap in laps), 3) for k in set().union(*laps)}
    soaks = [r["soak"] for r in recs if r.get("soak")]  # the start that would reach a limit soonest
    out["soak"] = min(soaks, key=lambda s: s.get("hours_to_limit") or float("inf"), default=None)
    return out


def start_groups(search_paths: list[Path]) -> list[list[Path]]:
    """The records that are server starts of one configuration, as each search lists them (its ``finalists``)."""
    groups = []
    for path in map(Path, search_paths):
        for final in records.load(path, "search").get("finalists") or []:
            if len(final["records"]) > 1:
                groups.append([SearchFolder.of(path).probe(rid).measure for rid in final["records"]])
    return groups


def _pooled_records(record_paths: list[Path], starts: list[list[Path]]):
    """Each record path's record, the starts of one configuration (``starts``) pooled into one, at the place of
    the first of them given; the later starts of an entry's configuration (``starts``: ``start-K/`` beside its first
    record, its ``start`` in it) given beside their first pooled with it, those left out (``left_out``) dropped; a
    search probe's later starts only as its search lists them."""
    group_of = {Path(p).absolute(): group for group in starts for p in group}
    load = functools.cache(lambda path: records.load(path, "measure"))  # each record read once
    given = {Path(p).absolute() for p in record_paths}
    later_of: dict[Path, list[Path]] = {}  # an entry's later starts (their record says which: ``start``)
    for path in record_paths:
        first = first_start_of(path)
        if first is None or first.absolute() not in given:
            continue
        # runs before the later starts were jobs of their own listed them in the first's record (start_records)
        listed = Path(path).relative_to(first.parent).as_posix() in load(first).get("start_records", [])
        if listed or load(Path(path)).get("start"):
            later_of.setdefault(first.absolute(), []).append(Path(path))
    pooled_later = {p.absolute() for paths in later_of.values() for p in paths}
    done = set()
    for path in record_paths:
        if Path(path).absolute() in pooled_later:
            continue  # pooled with its first
        group = group_of.get(Path(path).absolute())
        if group is None:
            later = sorted(later_of.get(Path(path).absolute(), []), key=lambda p: int(p.parent.name.rsplit("-", 1)[1]))
            yield pool_starts([load(Path(path)), *(r for r in map(load, later) if not r.get("left_out"))])
        elif id(group) not in done:
            done.add(id(group))
            yield pool_starts([records.load(p, "measure") for p in group if Path(p).absolute() in given])


def latest_of_each_host_kind(recs) -> list[dict]:
    """The records, but where two hosts of the same kind (the same environment: identical nodes, runs merged with
    merge_results) measured the same configuration, only the later one: a ranking holds each configuration once.
    Records of one host are all kept."""
    kept: dict[tuple, dict] = {}
    out: list[dict] = []
    for rec in recs:
        key = (rec["model"]["name"], rec["config_id"], _config_row(rec)["environment"])
        other = kept.get(key)
        if other is None or other["host"].get("hostname") == rec["host"].get("hostname"):
            kept[key] = rec
            out.append(rec)
        elif (rec.get("finished_at") or "") > (other.get("finished_at") or ""):
            out[out.index(other)] = kept[key] = rec
    return out


def arrow_tables(record_paths: list[Path], starts: list[list[Path]] = ()) -> dict[str, pa.Table]:
    """``configs``, ``measurements`` and ``conversations`` from measure records; the records in one list of
    ``starts`` (server starts of one configuration, ``start_groups``) become one row, pooled (``pool_starts``)."""
    rows: dict[str, list[dict]] = {"configs": [], "measurements": [], "conversations": []}
    for rec in latest_of_each_host_kind(_pooled_records(record_paths, list(starts))):
        row = _config_row(rec)
        rows["configs"].append(row)
        per_phase = (rec.get("memory") or {}).get("per_phase") or {}
        rows["measurements"] += [
            {**row, **_workload_columns(w, per_phase.get(w["name"], {}))} for w in rec.get("workloads", [])
        ]
        rows["conversations"] += [{**row, **_conversation_columns(t)} for t in rec.get("conversations") or []]
    types = {"configs": cols.CONFIGS, "measurements": cols.MEASUREMENTS, "conversations": cols.CONVERSATIONS}
    return {name: files.typed_table(table_rows, types[name]) for name, table_rows in rows.items()}


def tables(record_paths: list[Path], search_paths: list[Path] = ()) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``configs`` and ``measurements`` as a reader of the Parquet files sees them (starts pooled as the searches
    given list them)."""
    found = arrow_tables(record_paths, start_groups(list(search_paths)))
    return found["configs"].to_pandas(), found["measurements"].to_pandas()


def _finalist_row(f: dict) -> dict:
    return {k: f.get(k) for k in cols.FINALISTS.value_type.names}


def _calibration_time(laps: dict | None) -> dict:
    """A search's calibration start (no record in the configs table): its whole time and its server start."""
    if not laps:
        return {"calibration_job_s": None, "calibration_serving_s": None}
    spent = _time_columns({"time_budget_s": laps})
    return {"calibration_job_s": spent["job_s"], "calibration_serving_s": spent["serving_s"]}


def _search_row(s: dict) -> dict:
    """One search; the keys a search from before the climb lacks are empty (its recommendation was the lowest
    value with the margin)."""
    lo, hi = s["range"]
    objective = s.get("objective") or {}
    return {
        "model": s["model"],
        "group": s["group"],
        **dict.fromkeys(cols.settings_columns(leave_out=("n_cpu_moe",))),  # a setting added since: unset
        **_settings_columns(s["settings"]),
        "server_args": settings_mod.label({**s["settings"], "n_cpu_moe": None}),
        "range_lo": lo,
        "range_hi": hi,
        "limit_mib": s["limit_mib"],
        "compute_rows": [{"ubatch": int(u), "mib": m} for u, m in (s.get("compute_mib") or {}).items()],
        "rest_mib": s.get("rest_mib"),
        "margin_mib": s["margin_mib"],
        "predicted_lowest": s["predicted_lowest"],
        "arithmetic": s["arithmetic"],
        "full_residency": s["full_residency"],
        "boundary": s["boundary"],
        "lowest_with_margin": s.get("lowest_with_margin", s["recommended_n_cpu_moe"]),
        "recommended_n_cpu_moe": s["recommended_n_cpu_moe"],
        "recommended_override_tensor": s.get("recommended_override_tensor"),
        "server_starts": s["server_starts"],
        **_calibration_time(s.get("calibration_time_budget_s")),
        "probe_rows": s["probes"],
        "value_rows": s["values"],
        "objective_metric": objective.get("metric"),
        "objective_workload": objective.get("workload"),
        "climb_limit": s.get("climb", 0),
        "climbed": s.get("climbed") or [],
        "climb_stop": s.get("climb_stop"),
        "starts_per_finalist": s.get("starts", 1),
        "finalists": [_finalist_row(f) for f in s.get("finalists") or []],
        "start_order": s.get("start_order") or [],
        "partial": [{k: p.get(k) for k in cols.PARTIAL.value_type.names} for p in s.get("partial") or []],
        "runner_up": s.get("runner_up"),
        "lead_won": s.get("lead_won"),
        "lead_pairs": s.get("lead_pairs"),
        "lead_held": s.get("lead_held"),
    }


def arrow_search_table(summary_paths: list[Path]) -> pa.Table:
    return files.typed_table([_search_row(records.load(p, "search")) for p in summary_paths], cols.SEARCHES)


def search_table(summary_paths: list[Path]) -> pd.DataFrame:
    """One row per n_cpu_moe search: what was predicted, probed, skipped, and where the line is."""
    return arrow_search_table(summary_paths).to_pandas()


def write(
    record_paths: list[Path],
    configs_path: Path,
    measurements_path: Path,
    search_paths: list[Path] = (),
    searches_path: Path | None = None,
    conversations_path: Path | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    search_paths = [Path(p) for p in search_paths]
    found = arrow_tables([Path(p) for p in record_paths], start_groups(search_paths))
    outputs = [(found["configs"], configs_path), (found["measurements"], measurements_path)]
    if searches_path is not None:
        outputs.append((arrow_search_table(search_paths), searches_path))
    if conversations_path is not None:
        outputs.append((found["conversations"], conversations_path))
    for table, path in outputs:
        files.write(table, path)
    return found["configs"].to_pandas(), found["measurements"].to_pandas()
