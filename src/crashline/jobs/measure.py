"""One measurement job: a model × configuration, every workload, one record whatever happens."""

from __future__ import annotations

import contextlib
import json
import hashlib
import statistics
import subprocess
import time
from pathlib import Path

import pandas as pd
import requests

from ..engine import bottleneck, logparse
from . import conversations as conv
from . import soak as soak_mod
from ..core import host, progress, records
from ..models import pagecache
from ..engine.provision import supported_flags
from ..core import settings as settings_mod
from ..core.records import Outcome
from ..engine.server import ServerProcess
from ..models.sources import SourceError, check_unchanged
from ..core.supervision import exit_with_workflow
from ..engine.telemetry import Sampler, window_summary, write_frame
from ..engine.workloads import Client, PromptSource, RequestFailed, check_run, concurrency, one_run, summarize, windows
from ..core.records import utc_now
from .serve import ServerJob, outcome_text, server_failure

# a workload that failed
NO_SPEEDS = {
    **dict.fromkeys(("prefill_tps", "decode_tps", "e2e_tps", "ttft_s", "aggregate_tps")),
    "draft": None,
}
SERVER_FIELDS = ("binary", "obtained", "sha256", "version", "backend", "source", "build_flags")  # of provenance
ENDING_S = 3  # how long a server that refused or dropped a request may take to die of it


def _rate(values: list) -> str:
    values = [v for v in values if v]
    return f"{statistics.median(values):,.1f} t/s" if values else "n/a"


def say_run(workload: dict, index: int, repetitions: int, run: dict, peak_gpu_mib, limit_mib) -> None:
    """One repetition of a workload: its speeds (the median request when several ran at once) and,
    with a GPU, peak VRAM so far in the workload and the headroom to the limit. A negative ``index`` is a warm-up."""
    reqs = run["requests"]
    which = "warm-up (not counted)" if index < 0 else f"{index + 1}/{repetitions}"
    text = (
        f"{workload['name']} {which}: prefill {_rate([r.get('prefill_tps') for r in reqs])}, "
        f"decode {_rate([r.get('decode_tps') for r in reqs])}"
    )
    if len(reqs) > 1 and run.get("aggregate_tps"):
        text += f" per request ({len(reqs)} at once, {run['aggregate_tps']:,.1f} t/s generated in all)"
    if peak_gpu_mib is not None:
        text += f", peak VRAM {peak_gpu_mib:,.0f} MiB"
        if limit_mib:
            text += f", headroom {limit_mib - peak_gpu_mib:,.0f} MiB of {limit_mib:,.0f}"
    progress.say(text)


def vram_limit_mib(budget_mib: int | None, host_info: dict) -> float | None:
    """The VRAM a configuration may use: the budget on each of its GPUs, else the whole card(s), else None."""
    limits = gpu_limits_mib(budget_mib, host_info)
    return sum(limits) if limits else None


def gpu_limits_mib(budget_mib: int | None, host_info: dict) -> list[float]:
    """Each GPU's limit: the budget (an emulated card of that size, each), else the card's memory."""
    devices = host_info["gpu"].get("devices", [])
    return [budget_mib or d["memory_total_mib"] for d in devices]


def model_summary(name: str, fetch_record: dict, manifest: dict) -> dict:
    return {
        "name": name,
        "source": fetch_record["source"],
        "path": fetch_record["files"][0]["path"],
        "sha256": fetch_record["sha256"],
        "files": [{k: f[k] for k in ("name", "bytes", "sha256")} for f in fetch_record["files"]],
        "architecture": manifest.get("architecture"),
        "quantisation": manifest.get("file_type"),
        "total_bytes": manifest.get("total_bytes"),
        "layers": manifest.get("layers"),
        "n_expert": manifest.get("n_expert"),
        "n_expert_used": manifest.get("n_expert_used"),
    }


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


def server_command(provenance: dict, model_path: str, item: dict, draft_path: str | None) -> tuple[list[str], dict]:
    """The llama-server command for a configuration, with only the flags this build knows, and the
    flags left out (settings at their default that the build lacks)."""
    resolved = item["settings"]
    if resolved.get("draft_model") and not draft_path:
        raise ValueError(
            f"configuration {item['id']} names draft model {resolved['draft_model']!r}; its file is needed"
        )
    runnable, left_out = settings_mod.for_binary(
        resolved, item["given"], supported_flags(provenance), provenance.get("version") or provenance["binary"]
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


def job_key(job_config: dict, provenance: dict, fetch_record: dict) -> str:
    """What a measurement's result depends on besides its settings: the workloads, repetitions, budget,
    limits and telemetry of its job config, the llama-server build and the model file (its sha256: another file
    under the same name is another model). A search reuses a probe record only under the same key."""
    model = fetch_record.get("sha256") or [f.get("sha256") for f in fetch_record.get("files") or []]
    text = json.dumps({"config": job_config, "server_sha256": provenance.get("sha256"), "model": model}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def require_unchanged(model_name: str, fetch_record: dict) -> None:
    """The model file must be the one fetched and verified: truncated or replaced since, it is an error."""
    changed = check_unchanged(fetch_record)
    if changed:
        raise SourceError(
            f"{changed} (delete results/models/{model_name}/fetch.json, or run snakemake with --forcerun fetch_model)"
        )


def _ended(server: ServerProcess, within_s: float = ENDING_S) -> bool:
    """Whether the server is dead or dies within a moment (a failed request can come first)."""
    with contextlib.suppress(subprocess.TimeoutExpired):
        server.proc.wait(timeout=within_s)
    return not server.alive()


class Stopwatch:
    """Where a job's time goes: ``lap(name)`` adds the seconds since the previous lap to ``name``; ``budget()``
    is every lap and the total, rounded to milliseconds."""

    def __init__(self):
        self.started = self.last = time.monotonic()
        self.laps: dict[str, float] = {}

    def lap(self, name: str) -> None:
        now = time.monotonic()
        self.laps[name] = self.laps.get(name, 0.0) + now - self.last
        self.last = now

    def budget(self) -> dict[str, float]:
        return {**{k: round(v, 3) for k, v in self.laps.items()}, "total": round(self.last - self.started, 3)}


def run_workloads(
    server: ServerProcess,
    sampler: Sampler,
    config: dict,
    settings: dict,
    limit_mib: float | None = None,
    clock: Stopwatch | None = None,
) -> tuple[list[dict], list[dict], dict | None, dict | None]:
    """Every workload R times, then every conversation, then the soak. Returns per-workload results,
    per-conversation results, the soak's result (None without one) and the server-level failure, if any. Each
    repetition and turn says its speeds (and VRAM against ``limit_mib``) on the console; ``clock`` gets the untimed
    warm-up request apart, and the workloads (prompts sized on the way), conversations and soak as the rest."""
    clock = clock or Stopwatch()
    workloads, request_timeout_s = config["workloads"], config["server"]["request_timeout_s"]
    client = Client.of(server, request_timeout_s)
    sampler.phase("prepare")
    prompts = PromptSource(client)
    # One untimed request first: the first request after a load pays for page faults and lazy
    # allocations, which would otherwise land in the first repetition of the first workload.
    client.complete(prompts.prompt(min(64, workloads[0]["prompt_tokens"]), 0), 4, timeout_s=client.setup_timeout_s)
    clock.lap("warmup_request")
    try:
        results, failure = _run_each(
            server,
            sampler,
            client,
            prompts,
            workloads,
            (config.get("warmup_requests", 0), config["repetitions"]),
            request_timeout_s,
            settings,
            limit_mib,
        )
    finally:
        clock.lap("workloads")
    talks: list[dict] = []
    try:
        for spec in config.get("conversations") or []:
            if failure is not None:
                break
            result, failure = run_conversation(server, sampler, prompts, spec, settings, config["server"])
            talks.append(result)
    finally:
        clock.lap("conversations")
    soaked = None
    try:
        if failure is None and (config.get("soak") or {}).get("requests"):
            soaked, failure = soak_mod.run(
                server,
                sampler,
                prompts,
                config["soak"],
                soak_mod.limits(config["budget"].get("host_ram_mib"), limit_mib, settings.get("cache_ram")),
                request_timeout_s,
                lambda exc: request_failure(server, exc, soak_mod.PHASE, request_timeout_s),
            )
            progress.say(f"soak of {soaked['requests_done']:,} unique prompts: {soaked['said']}")
    finally:
        clock.lap("soak")
    return results, talks, soaked, failure


def request_failure(server: ServerProcess, exc: Exception, phase: str, request_timeout_s: float):
    """What a failed request means: (the server's failure, or None while it lives on; the outcome; the message)."""
    if isinstance(exc, requests.Timeout):
        return server_failure(server, phase, timed_out=True), Outcome.TIMEOUT, f"no answer within {request_timeout_s} s"
    if not isinstance(exc, (RequestFailed, requests.ConnectionError)):
        raise exc
    if _ended(server):
        failure = server_failure(server, phase)
        return failure, failure["outcome"], failure["message"]
    message = exc.message if isinstance(exc, RequestFailed) else str(exc)[:300]
    return None, Outcome.CONTEXT_EXCEEDED if "context" in message.lower() else Outcome.REQUEST_FAILED, message


def run_conversation(
    server: ServerProcess, sampler: Sampler, prompts: PromptSource, spec: dict, settings: dict, server_cfg: dict
) -> tuple[dict, dict | None]:
    """One conversation workload (crashline.jobs.conversations): its conversations' rounds of turns, the soak's sets
    while its time lasts, then the restart case. Returns its summary (per-turn memory is added from the record's
    phases) and the server's failure, if any."""
    n = concurrency({"concurrency": spec["at_once"]}, settings)
    started = time.monotonic()
    talks: list[conv.Conversation] = []
    for soak, depth in conv.depths(spec):
        if soak and time.monotonic() - started >= spec["soak_s"]:
            break
        group = [conv.Conversation(spec, len(talks) + i, soak, depth, started) for i in range(n)]
        talks += group
        failure = _rounds(
            server, sampler, prompts, spec, group, range(1, conv.planned_turns(spec, depth) + 1), server_cfg
        )
        if failure or any(c.outcome != Outcome.OK for c in group):
            return conv.summary(spec, talks), failure
    if spec["restart"]:
        longest = max(group, key=lambda c: len(c.history))
        failure = _restart(server, sampler, server_cfg, conv.phase(spec, "restart-load"))
        if failure:
            longest.fail(failure["phase"], "restart", longest.history, failure["outcome"], failure["message"])
            return conv.summary(spec, talks), failure
        failure = _rounds(server, sampler, prompts, spec, [longest], ["restart"], server_cfg)
        return conv.summary(spec, talks), failure
    return conv.summary(spec, talks), None


def _rounds(server, sampler, prompts, spec: dict, group: list, turns, server_cfg: dict) -> dict | None:
    """The turns of a group of conversations, each round sent together; the server's failure, if any. A
    conversation that fails a turn (the server living on) takes no further turns."""
    timeout_s = server_cfg["request_timeout_s"]
    for turn in turns:
        live = [c for c in group if c.outcome == Outcome.OK]
        if not live:
            return None
        where = conv.phase(spec, turn, live[0].soak)
        sampler.phase(where)
        offset = server.log_size()
        answered = conv.send_round(Client.of(server, timeout_s), live, prompts, turn)
        events = logparse.checkpoint_events(server.log_since(offset)[0])
        for c, prompt, answer in answered:
            if isinstance(answer, Exception):
                failure, outcome, message = request_failure(server, answer, where, timeout_s)
                c.fail(where, turn, prompt, outcome, message)
                progress.say(f"{where} ({c.index + 1} of {len(group)}): {outcome} ({message})")
                if failure:
                    return failure
                continue
            problem = c.add(where, turn, prompt, answer)
            c.turns[-1].update(conv.checkpoints(events, answer.get("id_slot") if len(live) > 1 else None))
            progress.say(_turn_text(where, c.index % len(group), len(group), c.turns[-1], problem))
    return None


def _turn_text(where: str, index: int, n: int, turn: dict, problem: str | None) -> str:
    """A turn on the console: its history, what the cache held, the speeds of the new part."""
    who = f" ({index + 1} of {n})" if n > 1 else ""
    text = (
        f"{where}{who}: history {turn['history_tokens']:,} tokens, {turn['cache_n'] or 0:,} from the cache; "
        f"prefill {_rate([turn['prefill_tps']])}, decode {_rate([turn['decode_tps']])}"
    )
    if turn.get("checkpoints_created"):
        text += f"; {turn['checkpoints_created']} context checkpoint(s) made ({turn['checkpoint_mib']:,.1f} MiB each)"
    return f"{text}; {problem}" if problem else text


def _restart(server: ServerProcess, sampler: Sampler, server_cfg: dict, where: str) -> dict | None:
    """crashline stops the server and starts it again on the same command (its log goes on in the same file);
    the failure of the new start, or None once it is ready."""
    sampler.phase(where)
    server.stop(server_cfg["stop_timeout_s"])
    state = server.start_ready(server_cfg["startup_timeout_s"], lambda srv: sampler.follow(srv.proc.pid), append=True)
    if state == "ready":
        progress.say(f"llama-server started again for the restart case, ready in {server.ready_after_s:.1f} s")
        return None
    return server_failure(server, where, timed_out=(state == "timeout"))


def _run_each(server, sampler, client, prompts, workloads, runs, request_timeout_s, settings, limit_mib):
    """The workloads of ``run_workloads``: ``runs`` is (W, R), each workload W times untimed at its own depth, then R
    times timed. A warm-up that fails is the workload's failure (the server met that depth then)."""
    warmups, repetitions = runs
    results = []
    for workload in workloads:
        sampler.phase(workload["name"])
        n_requests = concurrency(workload, settings)
        result = {
            **workload,
            "concurrency": n_requests,
            "repetitions": repetitions,
            "runs": [],
            "warmup_runs": [],
            "outcome": Outcome.OK,
            "message": None,
            **NO_SPEEDS,
            "windows": {},
        }
        results.append(result)
        for i in range(-warmups, repetitions):
            warmup = i < 0
            try:
                run = one_run(client, prompts, workload, repetitions - 1 - i if warmup else i, n_requests)
            except (requests.Timeout, RequestFailed, requests.ConnectionError) as exc:
                failure, outcome, message = request_failure(server, exc, workload["name"], request_timeout_s)
                result.update(outcome=outcome, message=message)
                said = outcome_text(failure) if failure else f"{outcome} ({message})"
                progress.say(f"{workload['name']} {'warm-up' if warmup else f'{i + 1}/{repetitions}'}: {said}")
                if failure:
                    return results, failure
                break
            result["warmup_runs" if warmup else "runs"].append(run)
            say_run(workload, i, repetitions, run, sampler.peaks.get(workload["name"], {}).get("gpu_mib"), limit_mib)
            problem = check_run(run, workload)
            if problem:
                result.update(outcome=Outcome.TRUNCATED, message=problem)
                progress.say(f"{workload['name']} {i + 1}/{repetitions}: truncated ({problem})")
                break
        if result["outcome"] == Outcome.OK:
            result.update(summarize(result["runs"]))
        result["windows"] = windows(result["runs"])
    return results, None


def said_why_again(record_path: Path, inputs: dict) -> None:
    """Before a job measures again over its record: what changed since, in a line (``core.changes``)."""
    from ..core.changes import what_changed

    try:
        old = json.loads(Path(record_path).read_text())
    except (OSError, ValueError):
        return  # none yet, or unreadable: nothing to compare
    before = {"item": {k: old.get(k) for k in ("id", "settings")}, "config": old.get("job_config")}
    if before["config"] is None:
        return  # a record from before the job config was kept
    now = {"item": {k: inputs["item"].get(k) for k in ("id", "settings")}, "config": inputs["config"]}
    changed = what_changed(before, now)
    if changed:
        progress.say(f"measuring again, since the record was made: {'; '.join(changed)}")


def measure(*, model_name: str, item: dict, **job) -> dict:
    """Start the server for one configuration, run the workloads, stop it, write the record (``_measure`` takes
    the job's other inputs and paths, and ``load_only``: start it and stop it once ready, for a search's
    calibration), saying its outcome on the console."""
    with progress.job(f"measure {model_name} {item['id']}"):
        said_why_again(job["record_path"], {"item": item, "config": job["config"]})
        record = _measure(model_name=model_name, item=item, **job)
        progress.say(_final_text(record))
        return record


def _final_text(record: dict) -> str:
    if record["outcome"] != Outcome.OK:
        return f"measurement {outcome_text(record)}"
    if record.get("load_only"):
        return "loaded and stopped (no workloads: a calibration)"
    names = ", ".join(w["name"] for w in [*record["workloads"], *record["conversations"]])
    return f"measurement ok: every workload survived ({names})"


def _measure(
    *,
    model_name: str,
    item: dict,
    config: dict,
    fetch_record: dict,
    manifest: dict,
    provenance: dict,
    record_path: Path,
    log_path: Path,
    draft_path: str | None = None,
    telemetry_path: Path | None = None,
    load_only: bool = False,
) -> dict:
    clock = Stopwatch()
    resolved = item["settings"]
    model_path = fetch_record["files"][0]["path"]
    require_unchanged(model_name, fetch_record)
    command, left_out = server_command(provenance, model_path, item, draft_path)
    record = {
        "config_id": item["id"],
        "model": model_summary(model_name, fetch_record, manifest),
        "settings": resolved,
        "given": item["given"],
        "flags_left_out": left_out,
        "job_key": job_key(config, provenance, fetch_record),
        "job_config": config,  # what the job read besides its settings: what changed is said on a rerun
        "server": {k: provenance.get(k) for k in SERVER_FIELDS},
        "host": host.describe(),
        "budget": config["budget"],
        "repetitions": config["repetitions"],
        "page_cache": page_cache_state(fetch_record, draft_path, resolved["page_cache"]),
        "cpu_memory_bandwidth_gbs": host.memory_bandwidth_from(provenance),
        "started_at": utc_now(),
        **({"load_only": True} if load_only else {}),
    }
    record["page_cache_resident_at_start"] = record["page_cache"]["resident"][model_path]
    server = ServerProcess(command, log_path, host_ram_mib=config["budget"].get("host_ram_mib"))
    budget_mib = config["budget"].get("vram_budget_mib")
    job = ServerJob(
        holder=f"measure {model_name} {item['id']}",
        server=server,
        config=config,
        record=record,
        telemetry=config["telemetry"]["interval_s"],
        lap=clock.lap,
    )
    done: dict = {"workloads": [], "talks": [], "soaked": None}

    def work(job: ServerJob) -> None:
        if not load_only:
            limit = vram_limit_mib(budget_mib, record["host"])
            done["workloads"], done["talks"], done["soaked"], job.failure = run_workloads(
                server, job.sampler, config, resolved, limit, clock
            )

    exit_with_workflow()
    clock.lap("setup")
    job.run(work, log_path)
    workloads, talks, soaked = done["workloads"], done["talks"], done["soaked"]
    failure, sampler = job.failure, job.sampler
    record["memory"] = (
        memory_summary(
            sampler.result(), budget_mib, record["host"], config["budget"].get("host_ram_mib"), server.host_peak_mib
        )
        if sampler
        else None
    )
    talks = [conv.with_memory(t, (record["memory"] or {}).get("per_phase") or {}) for t in talks]
    frame = sampler.frame() if sampler else pd.DataFrame()
    if sampler:
        sampler.close()
    write_frame(frame, telemetry_path or record_path.parent / "telemetry.parquet")
    clock.lap("telemetry")
    for w in workloads:
        w["telemetry"] = {k: window_summary(frame, v) for k, v in w.get("windows", {}).items()}
    log = server.log_text()
    record["returncode"] = server.returncode
    record["placement"] = logparse.parse_log(log)
    record["settings_used"] = settings_used(resolved, record["placement"])
    if failure is None:
        failure = logparse.classify(log, server.returncode, phase_hint="stop")
        bad = next((w for w in [*workloads, *talks, *([soaked] if soaked else [])] if w["outcome"] != Outcome.OK), None)
        if failure["outcome"] == Outcome.OK and bad:
            failure = {
                "outcome": bad["outcome"],
                "failure": bad["outcome"],
                "phase": bad.get("failed_at") or bad["name"],
                "message": bad["message"],
            }
    add_bottlenecks(workloads, record, manifest, resolved)
    record.update(
        outcome=failure["outcome"],
        failure=failure.get("failure"),
        phase=failure.get("phase"),
        message=failure.get("message"),
        log_tail=record["placement"].get("tail") if failure["outcome"] != Outcome.OK else None,
        workloads=workloads,
        conversations=talks,
        soak=soaked,
        finished_at=utc_now(),
    )
    clock.lap("analysis")
    record["time_budget_s"] = clock.budget()
    return records.write(record_path, "measure", record)
