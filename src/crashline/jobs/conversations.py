"""Conversations: the workload of chat clients and coding agents. Each turn resends the whole history (every
earlier turn's text and the model's replies, as token ids) with new prose of a declared size, the prompt cache on,
so the server reuses what its slot holds and evaluates only the new part. Several conversations run at once,
interleaved: each round sends the next turn of every one together, and with more conversations than slots the
server evicts, saves and restores prompt caches. With ``soak_s``, new sets of conversations follow, each to a
depth that varies (a quarter, all, half, three quarters of ``depth_tokens`` in turn), until that many seconds have
passed since the first began: the server's prompt cache keeps filling, as under hours of real use. After the last
round the restart case sends the longest history, with one more turn, to a freshly started server in one request
(no cache: one long prefill).

This module is the protocol (what each turn sends, what its answer must hold, what a conversation adds up to);
jobs/serving.py runs it against its server and classifies a server that fails under it.
"""

from __future__ import annotations

import itertools
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from ..core.columns import CHECKPOINT_KEYS
from ..core.records import Outcome
from ..engine.workloads import Client, PromptSource

SEED_STRIDE = 1000  # prose offsets: conversation c's turn t reads from index SEED_STRIDE * (c + 1) + t
SOAK_DEPTHS = (0.25, 1.0, 0.5, 0.75)  # the soak's sets after the first go to these shares of depth_tokens, in turn


def planned_turns(spec: dict, depth: int | None = None) -> int:
    """Turns until the history (prompt and reply of the last turn) would pass ``depth`` (``depth_tokens``); at
    least one."""
    return max(1, (depth or spec["depth_tokens"]) // (spec["turn_tokens"] + spec["reply_tokens"]))


def depths(spec: dict):
    """(set number, depth) of each set of conversations: the first to ``depth_tokens``, the soak's after it to
    the shares of SOAK_DEPTHS in turn (endless: the caller stops at its time)."""
    yield 0, spec["depth_tokens"]
    for number, share in zip(itertools.count(1), itertools.cycle(SOAK_DEPTHS)):
        yield number, int(spec["depth_tokens"] * share)


def phase(spec: dict, turn: int | str, soak: int = 0) -> str:
    """The telemetry and failure phase of a turn ("chat:turn-3"; in the soak's third set "chat:soak-3:turn-3") or
    of the restart ("chat:restart")."""
    where = f"{spec['name']}:soak-{soak}" if soak else spec["name"]
    return f"{where}:turn-{turn}" if isinstance(turn, int) else f"{where}:{turn}"


@dataclass
class Conversation:
    spec: dict
    index: int  # which conversation, counted over every set (its prose differs from every other's)
    soak: int = 0  # which set: 0 the first, 1, 2, ... the soak's
    depth: int | None = None  # the depth it grows to (``depth_tokens`` unless the soak varies it)
    started: float = field(default_factory=time.monotonic)  # the workload's start, for each turn's time
    history: list[int] = field(default_factory=list)
    turns: list[dict] = field(default_factory=list)
    outcome: str = Outcome.OK
    message: str | None = None
    failed_at: str | None = None  # the phase it failed in

    def next_prompt(self, prompts: PromptSource, turn: int) -> list[int]:
        """The history and ``turn_tokens`` of new prose (the first turn starts with the model's special prefix)."""
        n, seed = self.spec["turn_tokens"], SEED_STRIDE * (self.index + 1) + turn
        return self.history + (prompts.prompt(n, seed) if not self.history else prompts.prose(n, seed))

    def fail(self, where: str, turn: int | str, prompt: list[int], outcome: str, message: str) -> None:
        """The turn failed: recorded with its outcome (no answer, no speeds), and the conversation ends."""
        self.turns.append({**self._turn(where, turn, prompt, {}), "outcome": outcome})
        self.outcome, self.message, self.failed_at = outcome, message, where

    def _turn(self, where: str, turn: int | str, prompt: list[int], answer: dict) -> dict:
        keys = ("cache_n", "prompt_n", "ttft_s", "prefill_tps", "decode_tps", "predicted_n")
        return {
            "conversation": self.index,
            "soak": self.soak,
            "t_s": round(time.monotonic() - self.started, 2),
            "turn": turn,
            "phase": where,
            "history_tokens": len(prompt),
            **{k: answer.get(k) for k in keys},
            "outcome": Outcome.OK,
        }

    def add(self, where: str, turn: int | str, prompt: list[int], answer: dict) -> str | None:
        """Record a turn's answer and grow the history by the reply; why it does not count, or None."""
        problem = check_answer(prompt, self.spec["reply_tokens"], answer)
        if problem:
            self.turns.append({**self._turn(where, turn, prompt, answer), "outcome": problem[0]})
            self.outcome, self.message, self.failed_at = problem[0], problem[1], where
            return problem[1]
        self.turns.append(self._turn(where, turn, prompt, answer))
        self.history = prompt + answer["tokens"]
        return None


def checkpoints(events: list[dict], slot: int | None) -> dict:
    """A turn's context checkpoints (``logparse.checkpoint_events`` of its round, of its own slot where known):
    how many its slot made, restored and erased, how many it held after the turn, and the size of the last made."""
    mine = [e for e in events if slot is None or e["slot"] == slot]
    made = [e for e in mine if e["action"] == "created"]
    return {
        "checkpoints_created": len(made),
        "checkpoints_restored": sum(e["action"] == "restored" for e in mine),
        "checkpoints_erased": sum(e["action"] == "erased" for e in mine),
        "checkpoints_held": made[-1]["held"] if made else None,
        "checkpoint_mib": made[-1]["mib"] if made else None,
    }


def check_answer(prompt: list[int], reply_tokens: int, answer: dict) -> tuple[str, str] | None:
    """(outcome, message) when a turn's answer does not count: the prompt not evaluated whole (reused plus
    evaluated tokens short of what was sent), or the reply cut (the slot's context filled).

    The reply's length is the server's count (``predicted_n``): a streamed token whose text ends inside a UTF-8
    character is never sent as a chunk of its own (llama-server holds its text back and sends the next token's
    id alone), so the streamed ids can be fewer than the tokens generated, as with a random-weight model."""
    seen = (answer["cache_n"] or 0) + (answer["prompt_n"] or 0)
    if seen != len(prompt):
        return Outcome.TRUNCATED, f"the server took {seen} of the {len(prompt)} history tokens sent"
    got = answer["predicted_n"] if answer.get("predicted_n") is not None else len(answer["tokens"])
    if got != reply_tokens or answer["truncated"]:
        return (
            Outcome.CONTEXT_EXCEEDED,
            f"the context filled: {got} of {reply_tokens} reply tokens after a history of {len(prompt)}",
        )
    return None


def send_round(client: Client, conversations: list[Conversation], prompts: PromptSource, turn: int | str):
    """The next turn of every conversation, sent together: [(conversation, prompt, answer or the exception)]."""
    sent = [(c, c.next_prompt(prompts, turn if isinstance(turn, int) else len(c.turns) + 1)) for c in conversations]

    def go(prompt):
        try:
            return client.stream(prompt, sent[0][0].spec["reply_tokens"], cache_prompt=True)
        except Exception as exc:  # noqa: BLE001 - measure classifies it against the server's state
            return exc

    with ThreadPoolExecutor(max_workers=len(sent)) as pool:
        answers = list(pool.map(go, [p for _, p in sent]))
    return [(c, p, a) for (c, p), a in zip(sent, answers)]


def _slope(points: list[tuple[float, float]]) -> float | None:
    """Least-squares growth of y per 1,000 of x (None with fewer than two distinct x)."""
    if len({x for x, _ in points}) < 2:
        return None
    xs, ys = zip(*points)
    return round(statistics.linear_regression(xs, ys).slope * 1000, 3)


def summary(spec: dict, conversations: list[Conversation]) -> dict:
    """A conversation workload's result: survival, where it failed, how much each turn reused, every turn; with a
    soak, how many sets ran and for how long."""
    turns = [t for c in conversations for t in c.turns]
    grown = [t for t in turns if t["turn"] != "restart"]
    # what the cache held of what had been sent before (the history without the turn's new text): 1 is all of it
    turn_tokens = spec["turn_tokens"]
    reused = [
        t["cache_n"] / (t["history_tokens"] - turn_tokens) for t in grown if t["turn"] != 1 and t["cache_n"] is not None
    ]
    failed = next((c for c in conversations if c.outcome != Outcome.OK), None)
    first = [c for c in conversations if c.soak == 0]
    return {
        **spec,
        "conversations": len(first),
        "turns_planned": planned_turns(spec),
        "turns_done": min(sum(t["turn"] != "restart" and t["outcome"] == Outcome.OK for t in c.turns) for c in first),
        "outcome": failed.outcome if failed else Outcome.OK,
        "message": failed.message if failed else None,
        "failed_at": failed.failed_at if failed else None,
        "depth_reached": max(
            (t["history_tokens"] + (t["predicted_n"] or 0) for t in grown if t["outcome"] == Outcome.OK), default=0
        ),
        "reused_median": round(statistics.median(reused), 4) if reused else None,
        "soak_sets": max(c.soak for c in conversations),
        **checkpoint_totals(turns),
        "ran_s": max((t["t_s"] for t in turns), default=0.0),
        "restart_turn": next((t for t in turns if t["turn"] == "restart"), None),
        "turns": turns,
    }


def checkpoint_totals(turns: list[dict]) -> dict:
    """Over every turn: context checkpoints made, restored and erased, the most a slot held, the largest one.
    None where no turn counted them (a record of a build before the counts)."""
    counted = [t for t in turns if t.get("checkpoints_created") is not None]
    if not counted:
        return dict.fromkeys((*CHECKPOINT_KEYS, "checkpoint_mib"))
    held = [t["checkpoints_held"] for t in counted if t["checkpoints_held"] is not None]
    size = [t["checkpoint_mib"] for t in counted if t["checkpoint_mib"] is not None]
    return {
        **{k: sum(t[k] for t in counted) for k in CHECKPOINT_KEYS[:3]},
        "checkpoints_held": max(held, default=0),
        "checkpoint_mib": max(size, default=None),
    }


def with_memory(result: dict, per_phase: dict) -> dict:
    """Each turn's peak VRAM and RSS (the peaks of its phase), their growth per 1,000 tokens of history, and
    RSS's per hour of the workload (a prompt cache that keeps growing under a soak)."""
    for t in result["turns"]:
        peak = per_phase.get(t["phase"]) or {}
        t.update(gpu_mib=peak.get("gpu_mib"), rss_mib=peak.get("rss_mib"))
    grown = [t for t in result["turns"] if t["turn"] != "restart" and t["outcome"] == Outcome.OK]
    per_hour = _slope([(t["t_s"], t["rss_mib"]) for t in grown if t["rss_mib"]])
    return {
        **result,
        "gpu_mib_per_1k": _slope([(t["history_tokens"], t["gpu_mib"]) for t in grown if t["gpu_mib"] is not None]),
        "rss_mib_per_1k": _slope([(t["history_tokens"], t["rss_mib"]) for t in grown if t["rss_mib"]]),
        "rss_mib_per_hour": round(per_hour * 3.6, 1) if per_hour is not None else None,
    }
