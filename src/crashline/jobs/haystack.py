"""What a needle prompt is made of, from the server that will answer it: the client that asks it for token pieces,
its chat template and its slot context; the shipped prose tokenized once, with its sentence and paragraph
boundaries (the haystack); the frame around it (instruction, question, the answer's lead-in) in either prompt
style; a value found nowhere in the prose. The trials that use them: ``jobs.needle``."""

from __future__ import annotations

import bisect
import random
import re

import requests

from ..config.needle import Frame, PromptError, Wording, new_value
from ..engine.workloads import Client, prose_text

CONTENT_MARK = "\u2063crashline-needle-content\u2063"

# A sentence ends with . ! or ? (and closing quotes or brackets), unless it is a common abbreviation.
SENTENCE_END_RE = re.compile(r"[.!?][\"'\u2019\u201d)\]]*$")
ABBREVIATION_RE = re.compile(
    r"(?:\b(?:Mr|Mrs|Ms|Dr|St|Jr|Sr|Messrs|Mme|Mlle|Prof|Rev|Capt|Col|Gen|Lt|No|vol|viz|etc)|\b[A-Z])\.$"
)


# --------------------------------------------------------------------------- server client


class NeedleClient(Client):
    """The workloads client plus what recall needs: pieces, the chat template, the slot context."""

    def tokenize_pieces(self, text: str) -> tuple[list[int], list[bytes]]:
        body = {"content": text, "add_special": False, "with_pieces": True}
        out = self._post("/tokenize", body, self.setup_timeout_s)
        ids, pieces = [], []
        for t in out["tokens"]:
            ids.append(t["id"])
            piece = t["piece"]
            pieces.append(piece.encode("utf-8") if isinstance(piece, str) else bytes(piece))
        return ids, pieces

    def apply_template(self, messages: list[dict]) -> str:
        return self._post("/apply-template", {"messages": messages}, self.setup_timeout_s)["prompt"]

    def slot_context(self) -> int | None:
        """The context one slot holds, as the server reports it (None if it does not say)."""
        try:
            resp = self.session.get(f"{self.url}/props", timeout=self.setup_timeout_s)
            return int(resp.json()["default_generation_settings"]["n_ctx"])
        except (requests.RequestException, ValueError, KeyError, TypeError):
            return None

    def generate(self, prompt: list[int], n_predict: int) -> dict:
        """Greedy, prompt cache off, stops at end of generation (an answer, not a speed test)."""
        body = {"prompt": prompt, "n_predict": n_predict, "cache_prompt": False, "temperature": 0.0, "top_k": 1}
        return self._post("/completion", {**body, "stream": False}, self.timeout_s)


# --------------------------------------------------------------------------- haystack and frame


class Haystack:
    """The shipped prose, tokenized once by this server, with its sentence boundaries.

    Windows wrap around (the prose, a paragraph break, the prose again), so any length can be
    served. A boundary ``i`` means: a sentence ends right before token ``i``, and token ``i``
    starts with whitespace, so ``" <needle sentence>."`` can be inserted before it.
    """

    def __init__(self, client: NeedleClient, text: str | None = None):
        self.text = text if text is not None else prose_text()
        # one paragraph break between copies
        ids, pieces = client.tokenize_pieces(self.text.rstrip("\n") + "\n\n")
        if len(ids) < 1024:
            raise RuntimeError(f"the prose tokenized to only {len(ids)} tokens")
        self.ids = ids
        self.n = len(ids)
        self.boundaries, self.paragraphs = _boundaries(pieces)
        if not self.boundaries or not self.paragraphs:
            raise RuntimeError("no sentence boundaries found in the prose")

    def contains(self, value: str) -> bool:
        return value.lower() in self.text.lower()

    def start(self, index: int) -> int:
        """A paragraph start that differs per trial index (a prime stride through the paragraphs)."""
        return self.paragraphs[(index * 7919 + 13) % len(self.paragraphs)]

    def window(self, start: int, n_tokens: int) -> tuple[list[int], list[int]]:
        """``n_tokens`` ids from ``start`` (wrapping), and the sentence boundaries inside (0 < b < n)."""
        ids: list[int] = []
        bounds: list[int] = []
        pos = start
        while len(ids) < n_tokens:
            take = min(self.n - pos, n_tokens - len(ids))
            base = len(ids) - pos
            lo = bisect.bisect_right(self.boundaries, pos)
            hi = bisect.bisect_left(self.boundaries, pos + take)
            bounds += [b + base for b in self.boundaries[lo:hi]]
            ids += self.ids[pos : pos + take]
            pos = 0
        return ids, [b for b in bounds if 0 < b < n_tokens]


def _boundaries(pieces: list[bytes]) -> tuple[list[int], list[int]]:
    """Token indices where a sentence ends before the token, and where a paragraph starts."""
    offsets = [0]
    for p in pieces:
        offsets.append(offsets[-1] + len(p))
    raw = b"".join(pieces)
    boundaries, paragraphs = [], []
    for i in range(1, len(pieces)):
        spaced = pieces[i][:1] in (b" ", b"\n", b"\t")
        if spaced and _sentence_ends(raw[max(0, offsets[i] - 24) : offsets[i]]):
            boundaries.append(i)
        if pieces[i - 1].endswith(b"\n") and not spaced:
            paragraphs.append(i)
    return boundaries, paragraphs


def _sentence_ends(tail: bytes) -> bool:
    text = tail.decode("utf-8", errors="ignore").rstrip()
    return bool(SENTENCE_END_RE.search(text)) and not ABBREVIATION_RE.search(text.rstrip("\"'\u2019\u201d)]"))


def frame(client: NeedleClient, style: str, words: Wording) -> Frame:
    """Continuation: [BOS] instruction … question lead-in. Chat: the server's template around
    instruction … question, then the assistant's turn started with the lead-in."""
    if style == "continuation":
        head = client.tokenize(words.instruction, add_special=True)
        return Frame(style, words, head, client.tokenize(f"{words.question} {words.lead_in}"))
    if style != "chat":
        raise PromptError(f"unknown prompt style {style!r} (chat or continuation)")
    special = client.tokenize("", add_special=True)
    rendered = client.apply_template([{"role": "user", "content": CONTENT_MARK}])
    if rendered.count(CONTENT_MARK) != 1:
        raise PromptError("the chat template did not render the user message exactly once")
    before, after = rendered.split(CONTENT_MARK)
    # The fixed text is tokenized in one piece each side, as the server would tokenize it.
    head = client.tokenize(before + words.instruction, add_special=True)
    if special and head[: 2 * len(special)] == special + special:
        head = head[len(special) :]  # the template wrote BOS itself: once is what the server sends
    tail = client.tokenize(words.question + after + words.lead_in)
    return Frame(style, words, head, tail, before, after)


def pick_value(haystack: Haystack, words: Wording, rng: random.Random, attempts: int = 1000) -> str:
    """A fresh random value that occurs nowhere in the haystack's text or the prompt's wording."""
    fixed = (words.instruction + words.question + words.lead_in).lower()
    for _ in range(attempts):
        value = new_value(words.kind, rng)
        if not haystack.contains(value) and value.lower() not in fixed:
            return value
    raise PromptError(f"no {words.kind} value absent from the haystack in {attempts} attempts")
