"""What a measurement sends to its ready server: each workload's untimed warm-up and timed repetitions (several
requests at once where it asks), the conversations that grow turn by turn and the restart case, the soak; a line per
repetition; and what a failed request says of the server (timed out, refused, or the server gone)."""

from __future__ import annotations

import contextlib
import statistics
import subprocess
import time

import requests

from ..config.expand import from_claims
from ..engine import logparse
from . import conversations as conv
from . import soak as soak_mod
from ..core import progress
from ..core.records import Outcome
from ..core.thresholds import QUIET_WAIT_S, shared
from ..engine.server import ServerProcess
from ..engine.telemetry import Sampler
from ..engine.workloads import (
    Client,
    PromptSource,
    RequestFailed,
    check_run,
    concurrency,
    one_run,
    resent_run,
    summarize,
    windows,
)
from .serve import Stopwatch, outcome_text, server_failure
from .contract import Measurement, ServerLimits

# a workload that failed
# a workload that failed
NO_SPEEDS = {
    **dict.fromkeys(("prefill_tps", "decode_tps", "e2e_tps", "ttft_s", "aggregate_tps")),
    "draft": None,
}


ENDING_S = 3  # how long a server that refused or dropped a request may take to die of it


def _rate(values: list) -> str:
    values = [v for v in values if v]
    return f"{statistics.median(values):,.1f} t/s" if values else "n/a"


def say_run(workload: dict, index: int, repetitions: int, run: dict, peak_gpu_mib, limit_mib) -> None:
    """One repetition of a workload: its speeds (the median request when several ran at once) and,
    with a GPU, peak VRAM so far in the workload and the headroom to the limit. A negative ``index`` is a warm-up."""
    reqs = run["requests"]
    which = "warm-up (not counted)" if index < 0 else f"{index + 1}/{repetitions}"
    prefill = (
        f"prompt re-sent ({reqs[0].get('cache_n') or 0:,} tokens from the cache)"
        if run.get("fresh")
        else f"prefill {_rate([r.get('prefill_tps') for r in reqs])}"
    )
    text = f"{workload['name']} {which}: {prefill}, decode {_rate([r.get('decode_tps') for r in reqs])}"
    if len(reqs) > 1 and run.get("aggregate_tps"):
        text += f" per request ({len(reqs)} at once, {run['aggregate_tps']:,.1f} t/s generated in all)"
    if peak_gpu_mib is not None:
        text += f", peak VRAM {peak_gpu_mib:,.0f} MiB"
        if limit_mib:
            text += f", headroom {limit_mib - peak_gpu_mib:,.0f} MiB of {limit_mib:,.0f}"
    progress.say(text)


def _ended(server: ServerProcess, within_s: float = ENDING_S) -> bool:
    """Whether the server is dead or dies within a moment (a failed request can come first)."""
    with contextlib.suppress(subprocess.TimeoutExpired):
        server.proc.wait(timeout=within_s)
    return not server.alive()


def run_workloads(
    server: ServerProcess,
    sampler: Sampler,
    measurement: Measurement,
    settings: dict,
    limit_mib: float | None = None,
    clock: Stopwatch | None = None,
) -> tuple[list[dict], list[dict], dict | None, dict | None, dict | None]:
    """Every workload R times, then every conversation, then the soak, then the workloads claims files added (their
    rows as published, ``claims_workloads``). Returns per-workload results (the claims' last), per-conversation
    results, the soak's result (None without one), the server-level failure of what the config asks, if any, and
    that of the claims' workloads, if any: a row's workload that ended the server tells of the row, and what the
    config asks ran before it. Each repetition and turn says its speeds (and VRAM against ``limit_mib``) on the
    console; ``clock`` gets the untimed warm-up request apart, and the workloads (prompts sized on the way),
    conversations and soak as the rest."""
    clock = clock or Stopwatch()
    workloads, request_timeout_s = list(measurement.workloads), measurement.server.request_timeout_s
    claimed = claims_workloads(workloads)
    own = [w for w in workloads if w not in claimed]
    client = Client.of(server, request_timeout_s)
    sampler.phase("prepare")
    prompts = PromptSource(client)
    # One untimed request first: the first request after a load pays for page faults and lazy
    # allocations, which would otherwise land in the first repetition of the first workload.
    client.complete(prompts.prompt(min(64, workloads[0]["prompt_tokens"]), 0), 4, timeout_s=client.setup_timeout_s)
    clock.lap("warmup_request")
    runs = (measurement.warmup_requests, measurement.repetitions)
    each = (request_timeout_s, settings, limit_mib, measurement.timed_with_margin_mib)
    try:
        results, failure = _run_each(server, sampler, client, prompts, own, runs, *each)
    finally:
        clock.lap("workloads")
    talks: list[dict] = []
    try:
        for spec in measurement.conversations:
            if failure is not None:
                break
            result, failure = run_conversation(server, sampler, prompts, spec, settings, measurement.server)
            talks.append(result)
    finally:
        clock.lap("conversations")
    soaked = None
    try:
        if failure is None and measurement.soak is not None:
            soaked, failure = soak_mod.run(
                server,
                sampler,
                prompts,
                measurement.soak,
                soak_mod.limits(measurement.budget.host_ram_mib, limit_mib, settings.get("cache_ram")),
                request_timeout_s,
                lambda exc: request_failure(server, exc, soak_mod.PHASE, request_timeout_s),
            )
            progress.say(f"soak of {soaked['requests_done']:,} unique prompts: {soaked['said']}")
    finally:
        clock.lap("soak")
    claims_failure = None
    if failure is None and claimed:
        try:
            rows, claims_failure = _run_each(server, sampler, client, prompts, claimed, runs, *each)
            results += rows
        finally:
            clock.lap("workloads")
    return results, talks, soaked, failure, claims_failure


def claims_workloads(workloads: list[dict]) -> list[dict]:
    """The workloads a claims file added (config.claims.claim_workloads names them): its rows as published, run
    after everything the config asks, and no part of whether the configuration survived (a row's 100K-token or
    4-users workload that fails tells of the row; the configuration still survived the config's workloads)."""
    return [w for w in workloads if from_claims(w)]


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
    server: ServerProcess, sampler: Sampler, prompts: PromptSource, spec: dict, settings: dict, limits: ServerLimits
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
        failure = _rounds(server, sampler, prompts, spec, group, range(1, conv.planned_turns(spec, depth) + 1), limits)
        if failure or any(c.outcome != Outcome.OK for c in group):
            return conv.summary(spec, talks), failure
    if spec["restart"]:
        longest = max(group, key=lambda c: len(c.history))
        failure = _restart(server, sampler, limits, conv.phase(spec, "restart-load"))
        if failure:
            longest.fail(failure["phase"], "restart", longest.history, failure["outcome"], failure["message"])
            return conv.summary(spec, talks), failure
        failure = _rounds(server, sampler, prompts, spec, [longest], ["restart"], limits)
        return conv.summary(spec, talks), failure
    return conv.summary(spec, talks), None


def _rounds(server, sampler, prompts, spec: dict, group: list, turns, limits: ServerLimits) -> dict | None:
    """The turns of a group of conversations, each round sent together; the server's failure, if any. A
    conversation that fails a turn (the server living on) takes no further turns."""
    timeout_s = limits.request_timeout_s
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


def _restart(server: ServerProcess, sampler: Sampler, limits: ServerLimits, where: str) -> dict | None:
    """crashline stops the server and starts it again on the same command (its log goes on in the same file);
    the failure of the new start, or None once it is ready."""
    sampler.phase(where)
    server.stop(limits.stop_timeout_s)
    state = server.start_ready(limits.startup_timeout_s, lambda srv: sampler.follow(srv.proc.pid), append=True)
    if state == "ready":
        progress.say(f"llama-server started again for the restart case, ready in {server.ready_after_s:.1f} s")
        return None
    return server_failure(server, where, timed_out=(state == "timeout"))


def _under_margin(sampler, workload: dict, limit_mib: float | None, margin_mib: int | None) -> str | None:
    """Why a workload's timed repetitions are skipped (its warm-up's headroom is under the margin), or None."""
    peak = sampler.peaks.get(workload["name"], {}).get("gpu_mib")
    if margin_mib is None or limit_mib is None or peak is None or limit_mib - peak >= margin_mib:
        return None
    return (
        f"timed repetitions skipped: the warm-up left {limit_mib - peak:,.0f} MiB of headroom, under the "
        f"{margin_mib:,} MiB margin, so this configuration cannot be recommended"
    )


def _redo_contended(sampler, result: dict, quiet_left: float) -> dict | None:
    """Whether a workload's timed requests, all served, are to run again: other processes used more than
    CONTENTION_CORES while they ran, and a wait (``quiet_left`` s at most, what the start has left) found a quiet
    stretch, from which the phase's CPU figures then count. What the wait found, with the contended cores, or None."""
    if result["outcome"] != Outcome.OK or not result["runs"] or quiet_left <= 0:
        return None
    busy = sampler.others_so_far()
    if not shared(busy):
        return None
    found = sampler.quiet(quiet_left)
    if not found or not found["quiet"]:
        return None
    return {**found, "contended_cores": busy}


def redo_text(redo: dict) -> str:
    """What the console says when a workload's timed requests run again (``_redo_contended``)."""
    return (
        f"other processes used {redo['contended_cores']:.1f} cores during the timed requests: "
        f"{quiet_text(redo)}, timing them again"
    )


def quiet_text(found: dict) -> str:
    """What a wait for a quiet machine found (``telemetry.Sampler.quiet``), as the console says it."""
    if found["quiet"]:
        return f"waited {found['waited_s']:.0f} s for other processes to quieten ({found['other_cores']:.1f} cores now)"
    return (
        f"other processes still used {found['other_cores']:.1f} cores after {found['waited_s']:.0f} s: measuring now, "
        "marked contended"
    )


def _run_each(server, sampler, client, prompts, workloads, runs, request_timeout_s, settings, limit_mib, margin_mib):
    """The workloads of ``run_workloads``: ``runs`` is (W, R), each workload W times untimed at its own depth, then R
    times timed. A warm-up that fails is the workload's failure (the server met that depth then). A workload with
    ``decode_from: resent`` sends its warm-up's prompt again for each timed repetition (``workloads.resent_run``;
    without a warm-up, repetition 1 is fresh and the rest re-send it): one prefill at depth per server start.

    With ``margin_mib`` (a search's probes) and a VRAM limit, a workload whose warm-up already left less headroom
    than the margin skips its timed repetitions: the configuration met that depth (its peak is recorded) but cannot
    be recommended, so timing it would decide nothing. The next workload still runs its warm-up: survival of every
    depth is still tested.

    Timed requests during which other processes used more than CONTENTION_CORES run again, once per server start,
    where a wait finds a quiet stretch (``_redo_contended``); the contended ones are kept in ``contended_runs``."""
    warmups, repetitions = runs
    results = []
    quiet_left = QUIET_WAIT_S  # this start's wait for a quiet machine, spent before the timed requests
    redo_left = 1  # this start's repeat of a workload's timed requests that other processes competed with
    for workload in workloads:
        fresh = None  # (prompt, request) of the last fresh request, which a re-sent repetition sends again
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
        i = -warmups - 1
        while (i := i + 1) < repetitions or (
            i == repetitions and redo_left and (redo := _redo_contended(sampler, result, quiet_left))
        ):
            if i == repetitions:  # the timed requests again, in the quiet stretch the wait found
                redo_left, quiet_left, i = redo_left - 1, quiet_left - redo["waited_s"], 0
                result["contended_runs"], result["runs"] = result["runs"], []
                progress.say(f"{workload['name']}: {redo_text(redo)}")
            warmup = i < 0
            if i == 0 and warmups and (short := _under_margin(sampler, workload, limit_mib, margin_mib)):
                result.update(timed_skipped=short, message=short)  # the tables carry the message
                progress.say(f"{workload['name']}: {short}")
                break
            if i == 0 and quiet_left > 0 and not result.get("contended_runs") and (found := sampler.quiet(quiet_left)):
                result["quiet_wait"] = found
                quiet_left = quiet_left - found["waited_s"] if found["quiet"] else 0.0
                if found["waited_s"]:
                    progress.say(f"{workload['name']}: {quiet_text(found)}")
            try:
                if fresh and not warmup:
                    run = resent_run(client, fresh[0], workload, fresh[1])
                else:
                    index = repetitions - 1 - i if warmup else i
                    run = one_run(client, prompts, workload, index, n_requests)
                    if workload.get("decode_from") == "resent":
                        fresh = (prompts.prompt(workload["prompt_tokens"], index), run["requests"][0])
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
