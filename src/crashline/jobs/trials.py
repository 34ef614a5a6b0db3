"""The needle trials of a recall check: which to run (every length and depth, the shortest first, as the
baseline), how each is asked of the server and judged, and the grid and verdict they make. The job that starts
the server and writes the record is ``jobs.needle``."""

from __future__ import annotations

import random
from dataclasses import dataclass


from ..core import progress
from .haystack import Haystack, NeedleClient, frame, pick_value
from ..config.needle import (
    Frame,
    PromptError,
    build_prompt,
    is_fraction,
    new_value,
    not_recalled,
    recalled,
    resolve_length,
    same_length,
    wording,
)
from ..engine.workloads import RequestFailed


def _trial_base(spec, depth, index, slot_ctx) -> dict:
    return {
        "length": spec,
        "length_target": None,
        "length_fraction": None,
        "depth": depth,
        "depth_actual": None,
        "trial": index,
        "value": None,
        "answer": None,
        "passed": False,
        "prompt_n": None,
        "predicted_n": None,
        "prompt_ms": None,
        "slot_ctx": slot_ctx,
        "reason": None,
    }


def planned_trials(ns: dict) -> list[tuple]:
    return [(spec, depth, t) for spec in ns["lengths"] for depth in ns["depths"] for t in range(ns["trials"])]


@dataclass
class _Asker:
    """What every trial against one server shares."""

    client: NeedleClient
    haystack: Haystack
    frame: Frame
    rng: random.Random
    kind: str
    slot_ctx: int | None
    answer_tokens: int


def run_trials(
    client: NeedleClient, style: str, ns: dict, slot_ctx: int, rng: random.Random, trials: list[dict] | None = None
) -> list[dict]:
    """Every length x depth x trial against a running server, appended to ``trials``. A server
    that stops answering (timeout, connection lost) propagates as the exception; the trials so
    far stay in ``trials``."""
    words = wording(ns["kind"])
    haystack = Haystack(client)
    fr = frame(client, style, words)
    sample = client.tokenize(words.needle(new_value(ns["kind"], rng)))
    asker = _Asker(client, haystack, fr, rng, ns["kind"], slot_ctx, max(ns["gen_tokens"], len(sample) + 2))
    trials = [] if trials is None else trials
    shortest = _shortest(ns["lengths"], slot_ctx, asker.answer_tokens)
    planned = sorted(planned_trials(ns), key=lambda p: p[0] != shortest)  # the baseline first, else in order
    for k, (spec, depth, index) in enumerate(planned, 1):
        trial = _trial_base(spec, depth, index, slot_ctx)
        trials.append(trial)
        target = _target(trial, asker)
        if target is not None:
            _ask(asker, trial, target)
        verdict_text = "pass" if trial["passed"] else f"fail ({trial['reason']})"
        length = f"{trial['length_target']:,} tokens" if trial["length_target"] else repr(spec)
        progress.say(f"needle {k}/{len(planned)}: length {length}, depth {depth}: {verdict_text}")
        at_shortest = [t for t in trials if same_length(t["length"], shortest)]
        last_of_shortest = k < len(planned) and not same_length(planned[k][0], shortest)
        if last_of_shortest and all(t.get("answer") is not None and not t["passed"] for t in at_shortest):
            progress.say(
                f"needle: no needle recalled at {length}, the shortest length: the model cannot recall here, so "
                f"the {len(planned) - k} longer trial(s) are not run (recall cannot rank configurations)"
            )
            break
    return trials


def _shortest(lengths: list, slot_ctx: int | None, answer_tokens: int):
    """The length spec that resolves to the fewest tokens (a fraction without the slot's context: last)."""

    def tokens(spec) -> float:
        if is_fraction(spec):
            return resolve_length(spec, slot_ctx, answer_tokens) if slot_ctx else float("inf")
        return int(spec)

    return min(lengths, key=tokens)


def _target(trial: dict, asker: _Asker) -> int | None:
    """The trial's prompt length in tokens, or None with the reason it cannot be sent."""
    spec, slot_ctx, answer_tokens = trial["length"], asker.slot_ctx, asker.answer_tokens
    if not slot_ctx:
        if is_fraction(spec):
            trial["reason"] = "the server did not report its per-slot context, so a fraction of it is unknown"
            return None
        trial["length_target"] = int(spec)
        return int(spec)
    target = resolve_length(spec, slot_ctx, answer_tokens)
    trial.update(length_target=target, length_fraction=round(target / slot_ctx, 4))
    if target > slot_ctx:
        trial["reason"] = f"length {target} exceeds the configuration's context of {slot_ctx} tokens per slot"
        return None
    if target + answer_tokens >= slot_ctx:
        trial["reason"] = (
            f"length {target} leaves no room for the {answer_tokens}-token answer in the "
            f"configuration's context of {slot_ctx} tokens per slot"
        )
        return None
    return target


def _ask(asker: _Asker, trial: dict, target: int) -> None:
    """Send one trial's prompt and judge the answer (or say why it was not sent or refused)."""
    value = pick_value(asker.haystack, asker.frame.wording, asker.rng)
    trial["value"] = value
    needle_ids = asker.client.tokenize(asker.frame.wording.needle(value))
    try:
        start = asker.haystack.start(trial["trial"])
        prompt = build_prompt(asker.haystack, asker.frame, needle_ids, target, trial["depth"], start)
    except PromptError as exc:
        trial["reason"] = str(exc)
        return
    trial["depth_actual"] = prompt.depth_actual
    try:
        answer = asker.client.generate(prompt.ids, asker.answer_tokens)
    except RequestFailed as exc:
        trial["reason"] = _refused(exc, target, asker.slot_ctx)
        return
    timings = answer.get("timings") or {}
    trial.update(
        answer=answer.get("content", ""),
        prompt_n=timings.get("prompt_n"),
        predicted_n=timings.get("predicted_n"),
        prompt_ms=timings.get("prompt_ms"),
    )
    trial["reason"] = _judge(trial, bool(answer.get("truncated")), target, asker.kind)
    trial["passed"] = trial["reason"] is None


def _refused(exc: RequestFailed, target: int, slot_ctx) -> str:
    said = f"HTTP {exc.status}: {exc.message}"
    if "context" in exc.message.lower():
        exceeds = f"length {target} exceeds the configuration's context of {slot_ctx} tokens per slot"
        return f"{exceeds}: the server refused it ({said})"
    return f"the server refused the request ({said})"


def _judge(trial: dict, truncated: bool, target: int, kind: str) -> str | None:
    """Why the answer does not count (None: it passed)."""
    if truncated:
        return (
            f"truncated by the server (prompt_n {trial['prompt_n']} of {target}, "
            f"{trial['predicted_n']} tokens generated)"
        )
    if trial["prompt_n"] != target:
        return f"the server evaluated {trial['prompt_n']} prompt tokens, {target} were sent"
    if not recalled(trial["answer"], trial["value"], kind):
        return not_recalled(trial["value"])
    return None


def completed(trials: list[dict], ns: dict, slot_ctx, failure: dict) -> list[dict]:
    """Every planned trial, those that never ran failed with the server's failure as the reason."""
    ran = {
        (repr(t["length"]), t["depth"], t["trial"]): t for t in trials if t.get("prompt_n") is not None or t["reason"]
    }
    where = f" at {failure['phase']}" if failure.get("phase") else ""
    reason = f"the server {failure['outcome']}{where}: {failure.get('message') or 'no message'}"
    out = []
    for spec, depth, index in planned_trials(ns):
        t = ran.get((repr(spec), depth, index))
        if t is None:
            t = _trial_base(spec, depth, index, slot_ctx)
            t["reason"] = reason
        out.append(t)
    return out


def grid(trials: list[dict], ns: dict) -> list[dict]:
    """One cell per length x depth: passed only if every trial there passed."""
    cells = []
    for spec in ns["lengths"]:
        for depth in ns["depths"]:
            here = [t for t in trials if same_length(t["length"], spec) and t["depth"] == depth]
            if here:
                cells.append(_cell(spec, depth, here))
    return cells


def _cell(spec, depth, here: list[dict]) -> dict:
    shown = next((t for t in here if not t["passed"]), here[0])
    return {
        "length": spec,
        "length_target": shown["length_target"],
        "depth": depth,
        "n": len(here),
        "n_passed": sum(t["passed"] for t in here),
        "passed": all(t["passed"] for t in here),
        "value": shown["value"],
        "answer": shown["answer"],
        "reason": shown["reason"],
    }


def verdict(trials: list[dict], ns: dict, applicable: bool) -> tuple[str, list]:
    """("pass" | "fail" | "not_applicable", the required lengths that failed)."""
    if not applicable:
        return "not_applicable", []
    failed = [
        spec
        for spec in ns["lengths"]
        if any(not t["passed"] for t in trials if same_length(t["length"], spec))
        or not any(same_length(t["length"], spec) for t in trials)
    ]
    required = [spec for spec in failed if any(same_length(spec, r) for r in ns["required"])]
    return ("pass" if not failed else "fail"), required
