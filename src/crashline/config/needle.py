"""Needle recall, the part without a server: the needle settings and their defaults, the lengths,
the wording around the haystack, the random values, the check of an answer, and the prompt built
from token ids. Pure functions (``jobs.needle`` runs them against a server).

For every length (absolute tokens, or a fraction of the configuration's per-slot context) and
every depth, a random value (a 7-digit number or a UUID, checked not to occur in the haystack) is
written into a sentence, the sentence is inserted at the sentence boundary nearest that depth of a
haystack of the shipped public-domain prose, and the model is asked for the value. The prompt is
exactly the intended number of tokens; the answer passes when it contains the value (not as part
of a longer number or identifier).
"""

from __future__ import annotations

import random
import re
import uuid
from dataclasses import dataclass, field
from ..core.errors import CrashlineError

DEFAULTS = {
    "lengths": [2048, 0.9],
    "depths": [0.1, 0.5, 0.9],
    "trials": 1,
    "required": None,  # None: every length is required
    "kind": "number",
    "gen_tokens": 16,
}

MIN_HAYSTACK_TOKENS = 32
MIN_LENGTH_TOKENS = 64
NOT_APPLICABLE_REASON = "random-weight synthetic model: it cannot recall anything, so recall is not applicable"

NOUN = {"number": "number", "uuid": "UUID"}


class PromptError(CrashlineError, ValueError):
    """A needle prompt cannot be built as asked (a crashline or config problem, not the server's)."""


# --------------------------------------------------------------------------- settings and lengths


def needle_settings(config: dict) -> dict:
    """The needle block of the config with crashline's defaults filled in."""
    given = config.get("needle") or {}
    merged = {**DEFAULTS, **{k: v for k, v in given.items() if v is not None or k == "required"}}
    if merged["required"] is None:
        merged["required"] = list(merged["lengths"])
    for spec in merged["lengths"]:
        _check_length_spec(spec)
    missing = [r for r in merged["required"] if not any(same_length(r, s) for s in merged["lengths"])]
    if missing:
        raise ValueError(
            f"needle.required names length(s) {missing} that are not in needle.lengths {merged['lengths']}"
        )
    if merged["kind"] not in NOUN:
        raise ValueError(f"needle.kind must be one of {', '.join(NOUN)}, got {merged['kind']!r}")
    return merged


def is_fraction(spec) -> bool:
    """A length written with a decimal point is a fraction of the per-slot context."""
    return isinstance(spec, float)


def _check_length_spec(spec) -> None:
    if isinstance(spec, bool) or not isinstance(spec, (int, float)):
        raise ValueError(f"needle length {spec!r}: expected a token count or a fraction of the context")
    if is_fraction(spec) and not 0 < spec <= 1:
        raise ValueError(f"needle length {spec!r}: a fraction of the context must be in (0, 1]")
    if not is_fraction(spec) and spec < MIN_LENGTH_TOKENS:
        raise ValueError(
            f"needle length {spec!r}: a token count must be at least {MIN_LENGTH_TOKENS}; a fraction of the "
            f"context is written with a decimal point (1.0 is the whole context)"
        )


def same_length(a, b) -> bool:
    """The same length spec: 1.0 (the whole context) is not 1 (one token)."""
    return is_fraction(a) == is_fraction(b) and a == b


def length_label(spec) -> str:
    return f"{spec:g} of the context" if is_fraction(spec) else str(spec)


def resolve_length(spec, slot_ctx: int, answer_tokens: int) -> int:
    """Prompt tokens for a length spec: absolute, or a fraction of the per-slot context that
    leaves room for the answer (the server stops, truncated, once prompt + answer fill the slot)."""
    if is_fraction(spec):
        return max(1, min(int(spec * slot_ctx), slot_ctx - answer_tokens - 1))
    return int(spec)


def fitted(ns: dict, slot_ctx: int | None) -> dict:
    """The needle settings for one configuration: crashline's default lengths (not the user's) leave out a token
    length that the configuration's context per slot cannot hold with the answer, so that at ``-c 2048`` the
    default 2048 is no recall failure of every configuration; the fraction of the context still runs. Lengths the
    user gave stay as given: one that does not fit is that configuration's measured failure."""
    if slot_ctx is None or ns["lengths"] != DEFAULTS["lengths"]:
        return ns
    keep = [
        s
        for s in ns["lengths"]
        if is_fraction(s) or resolve_length(s, slot_ctx, ns["gen_tokens"]) < slot_ctx - ns["gen_tokens"]
    ]
    return {**ns, "lengths": keep, "required": [r for r in ns["required"] if any(same_length(r, s) for s in keep)]}


# --------------------------------------------------------------------------- wording and values


@dataclass(frozen=True)
class Wording:
    """The sentences around the haystack. The lead-in ends the prompt; the model continues it."""

    kind: str
    instruction: str
    question: str
    lead_in: str

    def needle(self, value: str) -> str:
        # Leading space: inserted before a token that starts with whitespace, after a sentence's end.
        return f" {self.lead_in} {value}."


def wording(kind: str = "number") -> Wording:
    noun = NOUN[kind]
    return Wording(
        kind=kind,
        # Measured on gemma-3-270m at 8K tokens: "Remember the special magic number hidden in the text
        # below" made it copy "hidden in the text" instead of the value; restating the task after the
        # haystack fixed a passage where it answered another number of the prose.
        instruction=f"The text below hides a special magic {noun}. Remember it.\n\n",
        question=f"\n\nThe text above hides a special magic {noun}. What is the special magic {noun}?",
        lead_in=f"The special magic {noun} is",
    )


def new_value(kind: str, rng: random.Random) -> str:
    if kind == "uuid":
        return str(uuid.UUID(int=rng.getrandbits(128), version=4))
    return str(rng.randrange(1_000_000, 10_000_000))


def _value_re(value: str, kind: str) -> re.Pattern:
    if kind == "uuid":
        return re.compile(rf"(?<![0-9A-Za-z-]){re.escape(value)}(?![0-9A-Za-z-])", re.IGNORECASE)
    return re.compile(rf"(?<!\d){re.escape(value)}(?!\d)")


def recalled(answer: str, value: str, kind: str = "number") -> bool:
    """Exact match: the value occurs in the answer, not as part of a longer number or identifier."""
    return bool(_value_re(value, kind).search(answer or ""))


def not_recalled(value: str) -> str:
    """The reason of a trial whose prompt was served as sent but whose answer lacks the value."""
    return f"the answer does not contain {value}"


# --------------------------------------------------------------------------- the prompt


@dataclass
class Frame:
    """The fixed token ids before and after the haystack, for one prompt style and wording."""

    style: str
    wording: Wording
    head: list[int]
    tail: list[int]
    text_before: str = ""
    text_after: str = ""


@dataclass
class NeedlePrompt:
    ids: list[int]
    target: int
    depth: float
    depth_actual: float
    needle_at: int  # index in ids of the needle sentence's first token
    needle_tokens: int
    haystack_start: int
    haystack_tokens: int
    extra: dict = field(default_factory=dict)


def baseline_failed(trials) -> int | None:
    """The recall baseline: the shortest length among ``trials`` ((length_target, passed) pairs), when no trial at
    it passed; else None. A model that fails even there cannot recall (random weights, a model too small for the
    task): its failures say nothing of a configuration, which would recall short needles and lose long ones."""
    tried = [(int(length), bool(passed)) for length, passed in trials if length == length]  # NaN: no trial
    if not tried:
        return None
    shortest = min(length for length, _ in tried)
    return None if any(passed for length, passed in tried if length == shortest) else shortest


def build_prompt(haystack, fr: Frame, needle_ids: list[int], target: int, depth: float, start: int) -> NeedlePrompt:
    """Exactly ``target`` token ids: head, haystack with the needle at the sentence boundary
    nearest ``depth``, tail. ``haystack``: anything with ``window(start, n)`` (``jobs.haystack.Haystack``)."""
    n_hay = target - len(fr.head) - len(needle_ids) - len(fr.tail)
    if n_hay < MIN_HAYSTACK_TOKENS:
        raise PromptError(
            f"length {target} is too short for a needle prompt: the {fr.style} frame and needle take "
            f"{target - n_hay} tokens, leaving {n_hay} of haystack (at least {MIN_HAYSTACK_TOKENS} needed)"
        )
    hay, bounds = haystack.window(start, n_hay)
    if not bounds:
        raise PromptError(f"no sentence boundary in a haystack of {n_hay} tokens")
    want = depth * n_hay
    at = min(bounds, key=lambda b: (abs(b - want), b))
    ids = fr.head + hay[:at] + needle_ids + hay[at:] + fr.tail
    assert len(ids) == target, (len(ids), target)
    return NeedlePrompt(
        ids=ids,
        target=target,
        depth=depth,
        depth_actual=round(at / n_hay, 4),
        needle_at=len(fr.head) + at,
        needle_tokens=len(needle_ids),
        haystack_start=start,
        haystack_tokens=n_hay,
    )
