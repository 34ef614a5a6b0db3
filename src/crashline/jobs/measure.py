"""One measurement job: a model × configuration, every workload, one record whatever happens."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pandas as pd

from ..engine import bottleneck, eta, logparse, planner
from . import conversations as conv
from ..core import host, progress, records
from ..models import pagecache
from ..engine.provision import supported_flags
from ..core import settings as settings_mod
from ..core.records import Outcome
from ..engine.server import ServerProcess
from ..models.sources import SourceError, check_unchanged
from ..core.supervision import exit_with_workflow
from ..engine.telemetry import window_summary, write_frame
from ..core.records import utc_now
from ..core.paths import RecordFolder, first_start_of
from .serve import RecordHead, ServerJob, Stopwatch, outcome_text
from .serving import claims_workloads, run_workloads
from .contract import Item, JobInputs, Measurement


def vram_limit_mib(budget_mib: int | None, host_info: dict) -> float | None:
    """The VRAM a configuration may use: the budget on each of its GPUs, else the whole card(s), else None."""
    limits = gpu_limits_mib(budget_mib, host_info)
    return sum(limits) if limits else None


def gpu_limits_mib(budget_mib: int | None, host_info: dict) -> list[float]:
    """Each GPU's limit: the budget (an emulated card of that size, each), else the card's memory."""
    devices = host_info["gpu"].get("devices", [])
    return [budget_mib or d["memory_total_mib"] for d in devices]


def memory_summary(
    sampled: dict, budget_mib: int | None, host_info: dict, host_ram_mib: int | None = None, host_peak_mib=None
) -> dict:
    """Peaks per phase plus headroom against the budget (or the whole card when none is set). With several GPUs
    each has its own limit: ``per_gpu`` holds each one's peak and headroom, and the headroom and share of the
    limit are those of the GPU with the least room (where that configuration's crash line is). Under a host-memory
    budget, its peak (the cgroup's, page cache it charged included; else the sampled RSS) and headroom beside."""
    devices = host_info["gpu"].get("devices", [])
    limits = gpu_limits_mib(budget_mib, host_info)
    limit = sum(limits) if limits else None
    peak = sampled.get("peak_gpu_mib")
    per_gpu, tightest = None, None
    each = sampled.get("peak_gpus_mib")
    if each and len(each) == len(limits):
        per_gpu = [
            {
                "uuid": d.get("uuid"),
                "name": d["name"],
                "limit_mib": lim,
                "peak_mib": mib,
                "headroom_mib": round(lim - mib, 1),
            }
            for d, lim, mib in zip(devices, limits, each)
        ]
        tightest = min(per_gpu, key=lambda g: g["headroom_mib"])
    if tightest:
        headroom, room_of, used = tightest["headroom_mib"], tightest["limit_mib"], tightest["peak_mib"]
    else:
        headroom = limit - peak if limit is not None and peak is not None else None
        room_of, used = limit, peak
    return {
        **sampled,
        "vram_limit_mib": limit,
        "vram_limit_is": "budget" if budget_mib else ("card" if devices else None),
        "headroom_mib": round(headroom, 1) if headroom is not None else None,
        "headroom_pct": round(headroom / room_of * 100, 2) if headroom is not None else None,
        "peak_pct_of_limit": round(used / room_of * 100, 2) if headroom is not None else None,
        **({"per_gpu": per_gpu, "tightest_gpu": per_gpu.index(tightest)} if per_gpu else {}),
        **host_memory(sampled, host_ram_mib, host_peak_mib),
    }


def host_memory(sampled: dict, host_ram_mib: int | None, host_peak_mib: float | None) -> dict:
    """The host-memory budget's figures: its limit, the peak under it and the headroom (none without a budget)."""
    if not host_ram_mib:
        return {}
    peak = host_peak_mib if host_peak_mib is not None else sampled.get("peak_rss_mib")
    return {
        "host_ram_limit_mib": host_ram_mib,
        "host_peak_mib": peak,
        "host_peak_is": "cgroup" if host_peak_mib is not None else "rss",
        "host_headroom_mib": round(host_ram_mib - peak, 1) if peak is not None else None,
    }


def page_cache_state(fetch_record: dict, draft_path: str | None, wanted: str) -> dict:
    """For a cold run, evict the model's files from the page cache (no server of ours is using them
    now) and verify with mincore; a warm run reads them in. Either way, record the residency."""
    paths = [f["path"] for f in fetch_record["files"]] + ([draft_path] if draft_path else [])
    if wanted == "cold":
        remaining = {p: pagecache.evict(p) for p in paths}
    else:
        remaining = {p: pagecache.warm(p)["resident_after"] for p in paths}
    return {
        "wanted": wanted,
        "resident": remaining,
        "verified": all((v < 0.05) if wanted == "cold" else (v > 0.95) for v in remaining.values()),
    }


def add_bottlenecks(workloads: list[dict], record: dict, manifest: dict, resolved: dict) -> None:
    """Per workload: the suspects during steady decode, and decode speed against its bandwidth bound."""
    memory = record.get("memory") or {}
    gpu = bool(memory.get("gpu_present"))
    for w in workloads:
        decode_tps = (w.get("decode_tps") or {}).get("median")
        w["bottleneck"] = bottleneck.table(
            (w.get("telemetry") or {}).get("decode"), decode_tps, record["placement"].get("n_threads"), gpu
        )
        if manifest.get("per_layer"):
            bound = bottleneck.decode_bound(
                manifest,
                resolved,
                w["prompt_tokens"] + w["gen_tokens"] // 2,
                memory.get("gpu_memory_bandwidth_gbs") if gpu else None,
                record.get("cpu_memory_bandwidth_gbs"),
                record.get("placement"),
            )
            bound["measured_over_bound"] = (
                decode_tps / bound["bound_tps"] if decode_tps and bound["bound_tps"] else None
            )
            w["decode_bound"] = bound


def reanalyse(record_path: Path, telemetry_path: Path, manifest: dict) -> dict:
    """Derive the telemetry summaries and bottleneck tables again from a record's saved time series,
    without measuring again (for records written before the analysis changed); rewrites the record."""
    record = records.load(record_path, "measure")
    frame = pd.read_parquet(telemetry_path)
    for w in record["workloads"]:
        w["telemetry"] = {k: window_summary(frame, v) for k, v in w.get("windows", {}).items()}
    add_bottlenecks(record["workloads"], record, manifest, record["settings"])
    return records.write(record_path, "measure", record)


def server_command(provenance: dict, model_path: str, item: Item, draft_path: str | None) -> tuple[list[str], dict]:
    """The llama-server command for a configuration, with only the flags this build knows, and the
    flags left out (settings at their default that the build lacks)."""
    resolved = item.settings
    if resolved.get("draft_model") and not draft_path:
        raise ValueError(f"configuration {item.id} names draft model {resolved['draft_model']!r}; its file is needed")
    runnable, left_out = settings_mod.for_binary(
        resolved, item.given, supported_flags(provenance), provenance.get("version") or provenance["binary"]
    )
    return settings_mod.command_line(provenance["binary"], model_path, runnable, lambda _name: draft_path), left_out


# A setting and what llama.cpp's log says it ran with (read back: it may clamp or round what it is given).
READ_BACK = {
    "ctx": "n_ctx",
    "batch": "n_batch",
    "ubatch": "n_ubatch",
    "parallel": "n_parallel",
    "threads": "n_threads",
    "threads_batch": "n_threads_batch",
    "cache_type_k": "type_k",
    "cache_type_v": "type_v",
}


def settings_used(resolved: dict, placement: dict) -> dict:
    """The settings llama.cpp ran with where they differ from what was asked: {name: {asked, used}}."""
    out = {}
    for name, key in READ_BACK.items():
        asked, used = resolved.get(name), placement.get(key)
        if asked is not None and used is not None and str(asked) != str(used):
            out[name] = {"asked": asked, "used": used}
    # The server may give each slot less context than the KV cache holds per sequence: it cuts a slot to the
    # model's trained context (-c 32768 on an 8K model allocates 32768 and serves 8192).
    seq, slot = placement.get("n_ctx_seq"), placement.get("n_ctx_slot")
    if seq and slot and seq != slot:
        out["ctx_per_slot"] = {"asked": seq, "used": slot}
    return out


def job_key(measurement: Measurement, provenance: dict, fetch_record: dict) -> str:
    """What a measurement's result depends on besides its settings: the workloads, repetitions, budget,
    limits and telemetry of its job config, the llama-server build and the model file (its sha256: another file
    under the same name is another model). A search reuses a probe record only under the same key."""
    model = fetch_record.get("sha256") or [f.get("sha256") for f in fetch_record.get("files") or []]
    job_config = measurement.as_dict()
    text = json.dumps({"config": job_config, "server_sha256": provenance.get("sha256"), "model": model}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def require_unchanged(model_name: str, fetch_record: dict) -> None:
    """The model file must be the one fetched and verified: truncated or replaced since, it is an error."""
    changed = check_unchanged(fetch_record)
    if changed:
        raise SourceError(
            f"{changed} (delete results/models/{model_name}/fetch.json, or run snakemake with --forcerun fetch_model)"
        )


def said_why_again(record_path: Path, spec: MeasureSpec) -> None:
    """Before a job measures again over its record: what changed since, in a line (``core.changes``)."""
    from ..core.changes import what_changed

    try:
        old = json.loads(Path(record_path).read_text())
    except (OSError, ValueError):
        return  # none yet, or unreadable: nothing to compare
    settings = old.get("settings")
    if old.get("fit_aim") and isinstance(settings, dict):  # aimed at the margin: the target asked, not the one run
        settings = {**settings, "fit_target": old["fit_aim"]["asked_fit_target"]}
    before = {"item": {"id": old.get("id"), "settings": settings}, "config": old.get("job_config")}
    if before["config"] is None:
        return  # a record from before the job config was kept
    now = {"item": {"id": spec.item.id, "settings": spec.item.settings}, "config": spec.measurement.as_dict()}
    changed = what_changed(before, now)
    if changed:
        progress.say(f"measuring again, since the record was made: {'; '.join(changed)}")


@dataclass(frozen=True)
class MeasureSpec:
    """What a measurement reads: the configuration and how its server runs."""

    model: str
    item: Item
    measurement: Measurement
    start: int = 1  # which of the configuration's server starts (item.starts) this job is
    job: ClassVar[str] = "measure"
    KEYS: ClassVar[tuple[str, ...]] = ("model", "item", "config")

    @property
    def id(self) -> str:
        return self.item.id

    @property
    def draft_model(self) -> str | None:
        return self.item.settings.get("draft_model")

    def to_dict(self) -> dict:
        start = {"start": self.start} if self.start != 1 else {}
        return {
            "model": self.model,
            "item": self.item.as_dict(self.model),
            "config": self.measurement.as_dict(),
            **start,
        }

    @classmethod
    def from_dict(cls, raw: dict) -> MeasureSpec:
        return cls(raw["model"], Item.of(raw["item"]), Measurement.of(raw["config"]), raw.get("start", 1))

    def run(self, inputs: JobInputs, outputs: dict) -> str:
        """Measure; ``outputs``: record, server_log, telemetry. Returns the line it prints."""
        paths = MeasurePaths(Path(outputs["record"]), Path(outputs["server_log"]), Path(outputs["telemetry"]))
        rec = measure(self, inputs, paths)
        if rec.get("left_out"):
            return f"{self.model} {rec['config_id']}: {_final_text(rec)}"
        return f"{self.model} {rec['config_id']}: {rec['outcome']}" + (
            f" ({rec['phase']}: {rec['message']})" if rec["message"] else ""
        )


@dataclass(frozen=True)
class MeasurePaths:
    """Where one server start's outputs go: its record, its server log and its telemetry (None: beside the
    record)."""

    record: Path
    server_log: Path
    telemetry: Path | None = None

    @classmethod
    def of(cls, folder: RecordFolder) -> MeasurePaths:
        """A measurement's outputs in a record folder (a later start's, a search's probe's)."""
        return cls(folder.measure, folder.server_log, folder.telemetry)

    @property
    def telemetry_file(self) -> Path:
        return telemetry_file(self.record, self.telemetry)


def measure(spec: MeasureSpec, inputs: JobInputs, paths: MeasurePaths, load_only: bool = False) -> dict:
    """Start the server for one configuration, run the workloads, stop it, write the record (``load_only``: start
    it and stop it once ready, for a search's calibration), saying its outcome on the console. A ``--fit on`` whose
    target crashline chose is aimed at the margin (``measure_aimed``); a later start of a configuration (``spec.start``
    > 1) is ``later_start``."""
    item = spec.item
    with progress.job(f"measure {spec.model} {item.id}" + (f" start {spec.start}" if spec.start > 1 else "")):
        if spec.start > 1:
            record = later_start(spec, inputs, paths)
        else:
            said_why_again(paths.record, spec)
            # a job's config holds no margin (it does not decide what a server measures): the target crashline chose
            # is the margin (settings.aim_fit); the H200 lease of session 14 ran unaimed while this read the budget's
            if not load_only and settings_mod.fit_aimed(item.settings, item.given):
                record = measure_aimed(item.settings["fit_target"], spec, inputs, paths)
            else:
                record = _measure(spec, inputs, paths, load_only=load_only)
        progress.say(_final_text(record))
        return record


def later_start(spec: MeasureSpec, inputs: JobInputs, paths: MeasurePaths) -> dict:
    """Server start ``spec.start`` (k > 1) of a configuration whose entry asks for ``item.starts``: a whole
    measurement at the settings its first start ran (an aimed --fit on at the target it settled on), recorded in
    ``start-K/`` beside the first's record (``paths.record``). The workflow runs start k of a model's configurations
    only once each has made start k - 1 (A B, A B: drift between starts hits every configuration alike), and the
    tables pool the starts as a search's finalist's, so that the spread between starts decides a tie (tables.ties).
    Left out, in a record that says why (``left_out``), after a start of it that failed or was left out, or a --fit on
    whose last aim still left less than the margin: it cannot be the answer; and where the start would end past the
    run's time limit (``eta.over_time``; also ``time_cut``)."""
    k = spec.start
    first_path = first_start_of(paths.record)
    if first_path is None:
        raise ValueError(f"{paths.record}: start {k} of a configuration is recorded in start-{k}/ beside its first")
    first = records.load(first_path, "measure")
    earlier = [
        first,
        *(records.load(RecordFolder.of(first_path).later_start(j).measure, "measure") for j in range(2, k)),
    ]
    last = earlier[-1]
    head = {"model": first["model"], "config_id": first["config_id"], "start": k}
    why = last.get("left_out") or _no_more_starts(last, k - 1, first)
    cut = (
        None
        if why
        else eta.over_time(
            f"start {k} of {spec.item.starts}",
            spec.item.time_limit_s,
            [_seconds(r) for r in earlier],
            time.time(),
            paths.record,
        )
    )
    if why or cut:
        return records.write(
            paths.record, "measure", {**head, "left_out": why or cut, **({"time_cut": cut} if cut else {})}
        )
    progress.say(f"start {k}/{spec.item.starts} of {spec.item.id}, as the first ran (its timed workloads)")
    paths.record.parent.mkdir(parents=True, exist_ok=True)
    timed = dataclasses.replace(spec.measurement, **FIRST_START_ONLY)
    as_first = dataclasses.replace(
        spec, measurement=timed, item=dataclasses.replace(spec.item, settings=first["settings"])
    )
    return records.write(paths.record, "measure", {**_measure(as_first, inputs, paths), "start": k})


# What a later start of an entry's configuration leaves to its first, each with its value when left out: the checks of
# survival over time. A later start repeats the timed workloads, whose spread between starts decides a tie; a
# conversation's turns and restart, and the soak, are checks run once per configuration, as its needle check is (in
# every start they took 35 of a default gemma start's 80 s: bench/results/user-check-2026-12-07-s32/).
FIRST_START_ONLY = {"conversations": (), "soak": None}


def _seconds(record: dict) -> float:
    """A later start's seconds, as a start's record's clock says (``time_budget_s``) less the laps a later start
    does not run (``FIRST_START_ONLY``), for the time the next start takes."""
    laps = record.get("time_budget_s") or {}
    return float(laps.get("total") or 0.0) - sum(float(laps.get(name) or 0.0) for name in FIRST_START_ONLY)


def _no_more_starts(last: dict, k: int, first: dict) -> str | None:
    """Why a configuration is not started again: its last start (``k``) failed, or its --fit on could not be aimed."""
    if last["outcome"] != Outcome.OK:
        return f"start {k} ended {outcome_text(last)}, so it cannot be the answer"
    aim = first.get("fit_aim")
    if aim and fit_shortfall(first, aim["margin_mib"]) is not None:
        margin = f"{aim['margin_mib']:,} MiB margin"
        return f"--fit on left less than the {margin} at every target, so it cannot be the answer"
    return None


FIT_AIM_STARTS = 3  # server starts at most for one --fit on aimed at the margin
FIT_AIM_STEP_MIB = 64  # each raise of --fit-target is rounded up to this


def serving_at_load(job: ServerJob, budget_mib: int | None, host_info: dict) -> dict | None:
    """A loaded server's headroom while serving, predicted before any request: its peak so far (the load's) against
    the VRAM limit, less ``planner.SERVING_MIB``, what serving adds beyond the load (measured within 46 MiB at 16K and
    100K, on the safe side: bench/results/lease-2026-12-07-s30/serving-peak.json). None without a limit, a sampler or
    a peak."""
    if job.sampler is None:
        return None
    job.sampler.now()
    load = memory_summary(job.sampler.result(), budget_mib, host_info)["headroom_mib"]
    if load is None:
        return None
    return {"load_headroom_mib": load, "headroom_mib": round(load - planner.SERVING_MIB, 1)}


def stopped_at_load(record: dict) -> float | None:
    """The headroom predicted while serving of a start stopped once loaded (``serving_at_load``), else None."""
    if record["outcome"] != Outcome.OK or not record.get("stopped_at_load"):
        return None
    return record["serving_predicted_at_load"]["headroom_mib"]


def fit_shortfall(record: dict, margin_mib: int) -> int | None:
    """How many MiB a ``--fit on`` start fell short of the margin: the margin less its headroom where it served and
    its peak left less, or less its headroom predicted at load where it was stopped there (``serving_at_load``); the
    whole margin where it ran out of memory after load (by how much is unknown). None where it left the margin, had
    no VRAM limit, or failed otherwise (a higher target cannot mend that)."""
    if (predicted := stopped_at_load(record)) is not None:
        return math.ceil(margin_mib - predicted) if predicted < margin_mib else None
    headroom = (record.get("memory") or {}).get("headroom_mib")
    if headroom is None:
        return None
    if record["outcome"] == Outcome.OK:
        return math.ceil(margin_mib - headroom) if headroom < margin_mib else None
    return margin_mib if record["outcome"] == Outcome.OOM else None


def fit_target_after(target: int, short: int, record: dict) -> tuple[int, int]:
    """The next --fit-target of an aimed start that fell ``short`` MiB of the margin, and what it was raised from.
    --fit keeps a placement for every target up to what it projected to leave free with it (it moves whole expert
    tensors, hundreds of MiB each on a large MoE), so the raise starts there, not at the target: on the H200 the
    seed-scale shape projected 1,184 MiB free at targets 1,024 to 1,152 and left 979 at each, three starts of one
    placement (bench/results/lease-2026-12-05-s23). The shortfall is added, rounded up to FIT_AIM_STEP_MIB."""
    projected = ((record.get("placement") or {}).get("fit_free_mib") or {}).values()
    base = max(target, min(projected, default=target))
    return base + math.ceil(short / FIT_AIM_STEP_MIB) * FIT_AIM_STEP_MIB, base


def measure_aimed(margin_mib: int, spec: MeasureSpec, inputs: JobInputs, paths: MeasurePaths) -> dict:
    """``--fit on`` aimed at the margin. llama.cpp's --fit leaves --fit-target MiB free by its own estimate at load;
    serving the workloads takes more (on the H200 the 30B-A3B at 12 GiB left 832 and 918 MiB with a 1,024 MiB target:
    bench/results/lease-2026-12-02-s13). A start that leaves less than the margin, or runs out of memory, is kept
    under ``fit-target-T/`` beside the record and the next start raises the target by what it fell short
    (``fit_target_after``), FIT_AIM_STARTS starts at most; each start but the last skips its timed repetitions once a
    warm-up is under the margin (it cannot be the answer). The record is the last start's: its settings hold the
    target it ran, ``fit_aim`` every start's target, outcome, headroom and time (the tables count every start's)."""
    item = spec.item
    asked = item.settings["fit_target"]
    target, attempts = asked, []
    for k in range(1, FIT_AIM_STARTS + 1):
        last = k == FIT_AIM_STARTS
        aimed = dataclasses.replace(
            spec, item=dataclasses.replace(item, settings={**item.settings, "fit_target": target})
        )
        record = None if last else kept_attempt(paths, target, spec, inputs)
        reused = record is not None
        if not reused:
            record = _measure(aimed, inputs, paths, skip_under_margin=None if last else margin_mib)
        short = fit_shortfall(record, margin_mib)
        headroom = (record.get("memory") or {}).get("headroom_mib")
        predicted = stopped_at_load(record)  # the headroom serving was predicted to leave, where stopped once loaded
        attempts.append(
            {
                "fit_target": target,
                "outcome": record["outcome"],
                "headroom_mib": headroom,
                **({"predicted_headroom_mib": predicted} if predicted is not None else {}),
                "time_budget_s": record["time_budget_s"],
            }
        )
        if short is None or last:
            break
        kept = RecordFolder.of(paths.record).fit_attempt(target).folder if reused else keep_attempt(paths, target)
        raised, base = fit_target_after(target, short, record)
        if predicted is not None:
            why = f"serving would leave about {predicted:,.0f} MiB, {short:,} MiB short of the {margin_mib:,} MiB"
            why += " margin"
        elif record["outcome"] == Outcome.OK:
            why = f"its peak left {headroom:,.0f} MiB, {short:,} MiB short of the {margin_mib:,} MiB margin"
        else:
            why = f"{outcome_text(record)}, so the target goes up by the {margin_mib:,} MiB margin"
        if base > target:
            why += f"; --fit projected {base:,} MiB free with this placement, so no target up to that changes it"
        progress.say(f"--fit on --fit-target {target}: {why} (kept in {kept}); again with --fit-target {raised}")
        target = raised
    record["fit_aim"] = {"margin_mib": margin_mib, "asked_fit_target": asked, "attempts": attempts}
    return records.write(paths.record, "measure", record)


def telemetry_file(record_path: Path, telemetry_path: Path | None) -> Path:
    """Where a measurement's telemetry goes: the path its job names, else beside its record."""
    return Path(telemetry_path or RecordFolder.of(record_path).telemetry)


def kept_attempt(paths: MeasurePaths, target: int, spec: MeasureSpec, inputs: JobInputs) -> dict | None:
    """An aimed start at ``target`` kept by an earlier run of this job that was stopped before it ended (a resumed
    ``tune``): reused where it measured the same configuration under the same job key (workloads, budget, build,
    model), as a search reuses its probes; else None. On the H200 a stop between two calls cost a 100K-token start."""
    path = RecordFolder.of(paths.record).fit_attempt(target).folder / paths.record.name
    if not path.exists():
        return None
    earlier = records.load(path, "measure")
    same = earlier.get("config_id") == spec.item.id and (earlier.get("settings") or {}).get("fit_target") == target
    if not same or earlier.get("job_key") != job_key(spec.measurement, inputs.provenance, inputs.fetch_record):
        return None
    progress.say(f"--fit on --fit-target {target}: measured before the run was stopped ({path}), record reused")
    return earlier


def keep_attempt(paths: MeasurePaths, target: int) -> Path:
    """Move one aimed start's record, server log and telemetry into ``fit-target-T/`` beside the record."""
    kept = RecordFolder.of(paths.record).fit_attempt(target).folder
    kept.mkdir(exist_ok=True)
    for path in (paths.record, paths.server_log, paths.telemetry_file):
        if path.exists():
            path.replace(kept / path.name)
    return kept


def _final_text(record: dict) -> str:
    if record.get("left_out"):
        return f"start {record['start']} left out: {record['left_out']}"
    if record["outcome"] != Outcome.OK:
        return f"measurement {outcome_text(record)}"
    if record.get("load_only"):
        return "loaded and stopped (no workloads: a calibration)"
    names = ", ".join(w["name"] for w in [*record["workloads"], *record["conversations"]])
    return f"measurement ok: every workload survived ({names})"


def _measure(
    spec: MeasureSpec,
    inputs: JobInputs,
    paths: MeasurePaths,
    load_only: bool = False,
    skip_under_margin: int | None = None,
) -> dict:
    clock = Stopwatch()
    item, measurement, budget = spec.item, spec.measurement, spec.measurement.budget
    fetch_record, provenance = inputs.fetch_record, inputs.provenance
    resolved = item.settings
    model_path = fetch_record["files"][0]["path"]
    require_unchanged(spec.model, fetch_record)
    command, left_out = server_command(provenance, model_path, item, inputs.draft_path)
    head = RecordHead.of(spec.model, item, inputs)
    record = {
        **head.opening(),
        "given": item.given,
        "flags_left_out": left_out,
        "job_key": job_key(measurement, provenance, fetch_record),
        "job_config": measurement.as_dict(),  # what the job read besides its settings: what changed is said on a rerun
        **head.where(),
        "budget": budget.as_dict(),
        "repetitions": measurement.repetitions,
        "page_cache": page_cache_state(fetch_record, inputs.draft_path, resolved["page_cache"]),
        "cpu_memory_bandwidth_gbs": host.memory_bandwidth_from(provenance),
        "started_at": utc_now(),
        **({"load_only": True} if load_only else {}),
    }
    record["page_cache_resident_at_start"] = record["page_cache"]["resident"][model_path]
    server = ServerProcess(command, paths.server_log, host_ram_mib=budget.host_ram_mib)
    budget_mib = budget.vram_budget_mib
    job = ServerJob(
        holder=f"measure {spec.model} {item.id}",
        server=server,
        limits=measurement.server,
        budget=budget,
        record=record,
        telemetry=measurement.telemetry.interval_s,
        lap=clock.lap,
    )
    done: dict = {"workloads": [], "talks": [], "soaked": None, "claims_failure": None}

    def work(job: ServerJob) -> None:
        if not load_only and skip_under_margin is not None:
            record["serving_predicted_at_load"] = at_load = serving_at_load(job, budget_mib, record["host"])
            if at_load and at_load["headroom_mib"] < skip_under_margin:
                record["stopped_at_load"] = True
                progress.say(
                    f"stopped once loaded: its load peak left {at_load['load_headroom_mib']:,.0f} MiB, so serving "
                    f"would leave about {at_load['headroom_mib']:,.0f} (the planner's {planner.SERVING_MIB:,.0f} MiB "
                    f"of serving growth), under the {skip_under_margin:,} MiB margin: no request can make it the answer"
                )
                return
        if not load_only:
            limit = vram_limit_mib(budget_mib, record["host"])
            served = (
                measurement
                if skip_under_margin is None
                else dataclasses.replace(measurement, timed_with_margin_mib=skip_under_margin)
            )
            done["workloads"], done["talks"], done["soaked"], job.failure, done["claims_failure"] = run_workloads(
                server, job.sampler, served, resolved, limit, clock
            )
            # a claims row's workload that ended the server: its workload says so; the configuration's own ran
            job.ended = done["claims_failure"]

    exit_with_workflow()
    clock.lap("setup")
    job.run(work, paths.server_log)
    workloads, talks, soaked = done["workloads"], done["talks"], done["soaked"]
    failure, sampler = job.failure, job.sampler
    record["memory"] = (
        memory_summary(sampler.result(), budget_mib, record["host"], budget.host_ram_mib, server.host_peak_mib)
        if sampler
        else None
    )
    talks = [conv.with_memory(t, (record["memory"] or {}).get("per_phase") or {}) for t in talks]
    frame = sampler.frame() if sampler else pd.DataFrame()
    if sampler:
        sampler.close()
    write_frame(frame, paths.telemetry_file)
    clock.lap("telemetry")
    for w in workloads:
        w["telemetry"] = {k: window_summary(frame, v) for k, v in w.get("windows", {}).items()}
    log = server.log_text()
    record["returncode"] = server.returncode
    record["placement"] = logparse.parse_log(log)
    record["settings_used"] = settings_used(resolved, record["placement"])
    if failure is None and done["claims_failure"]:  # the server ended at a claims row's workload, after the rest
        failure = {"outcome": Outcome.OK, "failure": None, "phase": None, "message": None}
        record["claims_failure"] = done["claims_failure"]
    if failure is None:
        failure = logparse.classify(log, server.returncode, phase_hint="stop")
    if failure["outcome"] == Outcome.OK:
        # what the config asks decides whether the configuration survived; a claims row's workload that failed (a
        # prompt past its context, more users than slots) tells of the row, in the correction (tables.claims)
        own = [w for w in workloads if w not in claims_workloads(workloads)]
        bad = next((w for w in [*own, *talks, *([soaked] if soaked else [])] if w["outcome"] != Outcome.OK), None)
        if bad:
            failure = {
                "outcome": bad["outcome"],
                "failure": bad["outcome"],
                "phase": bad.get("failed_at") or bad["name"],
                "message": bad["message"],
            }
    add_bottlenecks(workloads, record, inputs.manifest, resolved)
    record.update(
        **head.ended(failure).ending(),
        log_tail=record["placement"].get("tail") if failure["outcome"] != Outcome.OK else None,
        workloads=workloads,
        conversations=talks,
        soak=soaked,
        finished_at=utc_now(),
    )
    clock.lap("analysis")
    record["time_budget_s"] = clock.budget()
    return records.write(paths.record, "measure", record)
