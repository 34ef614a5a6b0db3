"""Needle recall: does a configuration really read the context it claims?

For every length (absolute tokens, or a fraction of the configuration's per-slot context) and
every depth, a random value (a 7-digit number or a UUID, checked not to occur in the haystack) is
written into a sentence, the sentence is inserted at the sentence boundary nearest that depth of a
haystack of the shipped public-domain prose, and the model, served with exactly that
configuration, is asked for the value. The prompt is built from token ids, tokenized by the
server itself, to exactly the intended length; the server's ``prompt_n`` must equal it. A prompt
that is refused, truncated or shifted is a failure of the configuration, never a pass. Greedy,
prompt cache off; the answer passes when it contains the value (not as part of a longer number or
identifier).

Prompt styles: ``continuation`` (base models; the prompt ends with the needle's lead-in, and the
model continues with the value) and ``chat`` (the model's own chat template, applied by the server
through ``/apply-template``; the assistant's turn is started with the same lead-in).

Random-weight synthetic models cannot recall anything: their record says "not applicable" and no
server is started.
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import datetime as dt
import json
import random
import re
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import requests

from . import host, logparse
from . import settings as settings_mod
from .atomic import write_json
from .ballast import Ballast, BudgetError
from .measure import model_summary, require_unchanged, server_command, server_failure
from .locks import server_lock
from .server import ServerProcess
from .supervision import exit_with_workflow
from .workloads import Client, RequestFailed, prose_text

RECORD_SCHEMA = 1

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

# A sentence ends with . ! or ? (and closing quotes or brackets), unless it is a common abbreviation.
SENTENCE_END_RE = re.compile(r"[.!?][\"'\u2019\u201d)\]]*$")
ABBREVIATION_RE = re.compile(r"(?:\b(?:Mr|Mrs|Ms|Dr|St|Jr|Sr|Messrs|Mme|Mlle|Prof|Rev|Capt|Col|Gen|Lt|No|vol|viz|etc)|\b[A-Z])\.$")


class PromptError(ValueError):
    """A needle prompt cannot be built as asked (a crashline or config problem, not the server's)."""


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


# --------------------------------------------------------------------------- settings and wording


def needle_settings(config: dict) -> dict:
    """The needle block of the config with crashline's defaults filled in."""
    given = config.get("needle") or {}
    merged = {**DEFAULTS, **{k: v for k, v in given.items() if v is not None or k == "required"}}
    if merged["required"] is None:
        merged["required"] = list(merged["lengths"])
    for spec in merged["lengths"]:
        _check_length_spec(spec)
    missing = [r for r in merged["required"] if not any(_same_length(r, s) for s in merged["lengths"])]
    if missing:
        raise ValueError(f"needle.required names length(s) {missing} that are not in needle.lengths {merged['lengths']}")
    if merged["kind"] not in NOUN:
        raise ValueError(f"needle.kind must be one of {', '.join(NOUN)}, got {merged['kind']!r}")
    return merged


def _is_fraction(spec) -> bool:
    return isinstance(spec, float)


def _check_length_spec(spec) -> None:
    if isinstance(spec, bool) or not isinstance(spec, (int, float)):
        raise ValueError(f"needle length {spec!r}: expected a token count or a fraction of the context")
    if _is_fraction(spec) and not 0 < spec <= 1:
        raise ValueError(f"needle length {spec!r}: a fraction of the context must be in (0, 1]")
    if not _is_fraction(spec) and spec < MIN_LENGTH_TOKENS:
        raise ValueError(
            f"needle length {spec!r}: a token count must be at least {MIN_LENGTH_TOKENS}; a fraction of the "
            f"context is written with a decimal point (1.0 is the whole context)"
        )


def _same_length(a, b) -> bool:
    return _is_fraction(a) == _is_fraction(b) and a == b


def length_label(spec) -> str:
    return f"{spec:g} of the context" if _is_fraction(spec) else str(spec)


def resolve_length(spec, slot_ctx: int, answer_tokens: int) -> int:
    """Prompt tokens for a length spec: absolute, or a fraction of the per-slot context that
    leaves room for the answer (the server stops, truncated, once prompt + answer fill the slot)."""
    if _is_fraction(spec):
        return max(1, min(int(spec * slot_ctx), slot_ctx - answer_tokens - 1))
    return int(spec)


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


# --------------------------------------------------------------------------- server client


class NeedleClient(Client):
    """The workloads client plus what recall needs: pieces, the chat template, the slot context."""

    def tokenize_pieces(self, text: str) -> tuple[list[int], list[bytes]]:
        out = self._post("/tokenize", {"content": text, "add_special": False, "with_pieces": True}, self.setup_timeout_s)
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
        return self._post(
            "/completion",
            {"prompt": prompt, "n_predict": n_predict, "cache_prompt": False, "temperature": 0.0, "top_k": 1,
             "stream": False},
            self.timeout_s,
        )


# --------------------------------------------------------------------------- haystack and prompt


class Haystack:
    """The shipped prose, tokenized once by this server, with its sentence boundaries.

    Windows wrap around (the prose, a paragraph break, the prose again), so any length can be
    served. A boundary ``i`` means: a sentence ends right before token ``i``, and token ``i``
    starts with whitespace, so ``" <needle sentence>."`` can be inserted before it.
    """

    def __init__(self, client: NeedleClient, text: str | None = None):
        self.text = text if text is not None else prose_text()
        ids, pieces = client.tokenize_pieces(self.text.rstrip("\n") + "\n\n")  # one paragraph break between copies
        if len(ids) < 1024:
            raise RuntimeError(f"the prose tokenized to only {len(ids)} tokens")
        self.ids = ids
        self.n = len(ids)
        offsets = [0]
        for p in pieces:
            offsets.append(offsets[-1] + len(p))
        raw = b"".join(pieces)
        self.boundaries = []
        self.paragraphs = []
        for i in range(1, self.n):
            if pieces[i][:1] in (b" ", b"\n", b"\t") and _sentence_ends(raw[max(0, offsets[i] - 24):offsets[i]]):
                self.boundaries.append(i)
            if pieces[i - 1].endswith(b"\n") and pieces[i][:1] not in (b" ", b"\n", b"\t"):
                self.paragraphs.append(i)
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
            ids += self.ids[pos:pos + take]
            pos = 0
        return ids, [b for b in bounds if 0 < b < n_tokens]


def _sentence_ends(tail: bytes) -> bool:
    text = tail.decode("utf-8", errors="ignore").rstrip()
    return bool(SENTENCE_END_RE.search(text)) and not ABBREVIATION_RE.search(text.rstrip("\"'\u2019\u201d)]"))


@dataclass
class Frame:
    """The fixed token ids before and after the haystack, for one prompt style and wording."""

    style: str
    wording: Wording
    head: list[int]
    tail: list[int]
    text_before: str = ""
    text_after: str = ""


CONTENT_MARK = "\u2063crashline-needle-content\u2063"


def frame(client: NeedleClient, style: str, words: Wording) -> Frame:
    """Continuation: [BOS] instruction … question lead-in. Chat: the server's template around
    instruction … question, then the assistant's turn started with the lead-in."""
    if style == "continuation":
        before, after = "", ""
        head = client.tokenize(words.instruction, add_special=True)
        tail = client.tokenize(f"{words.question} {words.lead_in}")
    elif style == "chat":
        special = client.tokenize("", add_special=True)
        rendered = client.apply_template([{"role": "user", "content": CONTENT_MARK}])
        if rendered.count(CONTENT_MARK) != 1:
            raise PromptError("the chat template did not render the user message exactly once")
        before, after = rendered.split(CONTENT_MARK)
        # The fixed text is tokenized in one piece each side, as the server would tokenize it.
        head = client.tokenize(before + words.instruction, add_special=True)
        if special and head[: 2 * len(special)] == special + special:
            head = head[len(special):]  # the template wrote BOS itself: once is what the server sends
        tail = client.tokenize(words.question + after + words.lead_in)
    else:
        raise PromptError(f"unknown prompt style {style!r} (chat or continuation)")
    return Frame(style, words, head, tail, before, after)


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


def build_prompt(haystack: Haystack, fr: Frame, needle_ids: list[int], target: int, depth: float,
                 start: int) -> NeedlePrompt:
    """Exactly ``target`` token ids: head, haystack with the needle at the sentence boundary
    nearest ``depth``, tail."""
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
    return NeedlePrompt(ids=ids, target=target, depth=depth, depth_actual=round(at / n_hay, 4),
                        needle_at=len(fr.head) + at, needle_tokens=len(needle_ids), haystack_start=start,
                        haystack_tokens=n_hay)


# --------------------------------------------------------------------------- trials


def _trial_base(spec, depth, index, slot_ctx) -> dict:
    return {"length": spec, "length_target": None, "length_fraction": None, "depth": depth, "depth_actual": None,
            "trial": index, "value": None, "answer": None, "passed": False, "prompt_n": None, "predicted_n": None,
            "prompt_ms": None, "slot_ctx": slot_ctx, "reason": None}


def planned_trials(ns: dict) -> list[tuple]:
    return [(spec, depth, t) for spec in ns["lengths"] for depth in ns["depths"] for t in range(ns["trials"])]


def run_trials(client: NeedleClient, style: str, ns: dict, slot_ctx: int, rng: random.Random,
               trials: list[dict] | None = None) -> list[dict]:
    """Every length x depth x trial against a running server, appended to ``trials``. A server
    that stops answering (timeout, connection lost) propagates as the exception; the trials so
    far stay in ``trials``."""
    words = wording(ns["kind"])
    haystack = Haystack(client)
    fr = frame(client, style, words)
    sample = client.tokenize(words.needle(new_value(ns["kind"], rng)))
    answer_tokens = max(ns["gen_tokens"], len(sample) + 2)
    trials = [] if trials is None else trials
    for spec, depth, index in planned_trials(ns):
        trial = _trial_base(spec, depth, index, slot_ctx)
        trials.append(trial)
        if not slot_ctx:
            if _is_fraction(spec):
                trial["reason"] = "the server did not report its per-slot context, so a fraction of it is unknown"
                continue
            target = int(spec)
            trial["length_target"] = target
        else:
            target = resolve_length(spec, slot_ctx, answer_tokens)
            trial.update(length_target=target, length_fraction=round(target / slot_ctx, 4))
        if slot_ctx and target > slot_ctx:
            trial["reason"] = f"length {target} exceeds the configuration's context of {slot_ctx} tokens per slot"
            continue
        if slot_ctx and target + answer_tokens >= slot_ctx:
            trial["reason"] = (f"length {target} leaves no room for the {answer_tokens}-token answer in the "
                               f"configuration's context of {slot_ctx} tokens per slot")
            continue
        value = pick_value(haystack, words, rng)
        trial["value"] = value
        try:
            prompt = build_prompt(haystack, fr, client.tokenize(words.needle(value)), target, depth,
                                  haystack.start(index))
        except PromptError as exc:
            trial["reason"] = str(exc)
            continue
        trial["depth_actual"] = prompt.depth_actual
        try:
            answer = client.generate(prompt.ids, answer_tokens)
        except RequestFailed as exc:
            if "context" in exc.message.lower():
                trial["reason"] = (f"length {target} exceeds the configuration's context of {slot_ctx} tokens per "
                                   f"slot: the server refused it (HTTP {exc.status}: {exc.message})")
            else:
                trial["reason"] = f"the server refused the request (HTTP {exc.status}: {exc.message})"
            continue
        timings = answer.get("timings") or {}
        trial.update(answer=answer.get("content", ""), prompt_n=timings.get("prompt_n"),
                     predicted_n=timings.get("predicted_n"), prompt_ms=timings.get("prompt_ms"))
        if answer.get("truncated"):
            trial["reason"] = (f"truncated by the server (prompt_n {trial['prompt_n']} of {target}, "
                               f"{trial['predicted_n']} tokens generated)")
        elif trial["prompt_n"] != target:
            trial["reason"] = f"the server evaluated {trial['prompt_n']} prompt tokens, {target} were sent"
        elif not recalled(trial["answer"], value, ns["kind"]):
            trial["reason"] = f"the answer does not contain {value}"
        else:
            trial["passed"] = True
    return trials


def pick_value(haystack: Haystack, words: Wording, rng: random.Random, attempts: int = 1000) -> str:
    """A fresh random value that occurs nowhere in the haystack's text or the prompt's wording."""
    fixed = (words.instruction + words.question + words.lead_in).lower()
    for _ in range(attempts):
        value = new_value(words.kind, rng)
        if not haystack.contains(value) and value.lower() not in fixed:
            return value
    raise PromptError(f"no {words.kind} value absent from the haystack in {attempts} attempts")


def grid(trials: list[dict], ns: dict) -> list[dict]:
    """One cell per length x depth: passed only if every trial there passed."""
    cells = []
    for spec in ns["lengths"]:
        for depth in ns["depths"]:
            here = [t for t in trials if _same_length(t["length"], spec) and t["depth"] == depth]
            if not here:
                continue
            shown = next((t for t in here if not t["passed"]), here[0])
            cells.append({
                "length": spec,
                "length_target": shown["length_target"],
                "depth": depth,
                "n": len(here),
                "n_passed": sum(t["passed"] for t in here),
                "passed": all(t["passed"] for t in here),
                "value": shown["value"],
                "answer": shown["answer"],
                "reason": shown["reason"],
            })
    return cells


def verdict(trials: list[dict], ns: dict, applicable: bool) -> tuple[str, list]:
    """("pass" | "fail" | "not_applicable", the required lengths that failed)."""
    if not applicable:
        return "not_applicable", []
    failed = [spec for spec in ns["lengths"]
              if any(not t["passed"] for t in trials if _same_length(t["length"], spec))
              or not any(_same_length(t["length"], spec) for t in trials)]
    required = [spec for spec in failed if any(_same_length(spec, r) for r in ns["required"])]
    return ("pass" if not failed else "fail"), required


# --------------------------------------------------------------------------- the job


def is_synthetic(config: dict, model_name: str, fetch_record: dict | None = None) -> bool:
    source = (config.get("models", {}).get(model_name) or {}).get("source") or (fetch_record or {}).get("source", "")
    return str(source).startswith("synthetic:")


def run_needle(*, model_name: str, item: dict, config: dict, fetch_record: dict, provenance: dict,
               record_path: Path, log_path: Path, manifest: dict | None = None, draft_path: str | None = None,
               rng: random.Random | None = None) -> dict:
    """Start the server for one configuration, run every needle trial, stop it, write the record."""
    server_cfg = config["server"]
    resolved = item["settings"]
    ns = needle_settings(config)
    style = (config.get("models", {}).get(model_name) or {}).get("prompt_style") or "continuation"
    rng = rng or random.SystemRandom()
    record = {
        "schema": RECORD_SCHEMA,
        "kind": "needle",
        "config_id": item["id"],
        "model": model_summary(model_name, fetch_record, manifest or {}),
        "settings": resolved,
        "given": item["given"],
        "server": {k: provenance.get(k) for k in ("binary", "obtained", "sha256", "version", "backend", "source", "build_flags")},
        "host": host.describe(),
        "prompt_style": style,
        "needle": ns,
        "wording": dataclasses.asdict(wording(ns["kind"])),
        "budget": config.get("budget"),
        "requests": {"cache_prompt": False, "temperature": 0.0, "top_k": 1, "prompt": "token ids"},
        "started_at": _now(),
    }
    settings_slot_ctx = resolved["ctx"] // max(1, resolved["parallel"]) if resolved.get("ctx") else None
    if is_synthetic(config, model_name, fetch_record):
        record.update(
            applicable=False, outcome="not_applicable", failure=None, phase=None, message=NOT_APPLICABLE_REASON,
            command=None, returncode=None, slot_ctx=settings_slot_ctx, trials=[], grid=[],
            recall="not_applicable", failed_required=[], finished_at=_now(),
        )
        _note(log_path, f"crashline: no llama-server started for {model_name}: {NOT_APPLICABLE_REASON}\n")
        write_json(record_path, record)
        return record

    model_path = fetch_record["files"][0]["path"]
    require_unchanged(model_name, fetch_record)
    command, _ = server_command(provenance, model_path, item, draft_path)
    server = ServerProcess(command, log_path)
    trials: list[dict] = []
    failure = None
    phase = "start"
    slot_ctx = settings_slot_ctx
    budget_mib = (config.get("budget") or {}).get("vram_budget_mib")
    exit_with_workflow()
    try:
        # The same emulated card as the measurement: recall is checked in the environment it counts for.
        with server_lock(f"needle {model_name} {item['id']}"), \
                Ballast(budget_mib) if budget_mib else contextlib.nullcontext() as ballast:
            record["ballast"] = ballast.info if ballast else None
            phase = "load"
            state = server.start_ready(server_cfg["startup_timeout_s"])
            record["command"] = server.command
            if state == "ready":
                record["load_s"] = round(server.ready_after_s, 2)
                client = NeedleClient(server.url, server_cfg["request_timeout_s"])
                slot_ctx = client.slot_context() or settings_slot_ctx
                phase = "needle"
                try:
                    run_trials(client, style, ns, slot_ctx, rng, trials)
                except requests.Timeout:
                    failure = server_failure(server, "needle", timed_out=True)
                except requests.ConnectionError as exc:
                    if server.alive():
                        failure = {"outcome": "error", "failure": "request", "phase": "needle",
                                   "message": str(exc)[:300]}
                    else:
                        failure = server_failure(server, "needle")
            else:
                failure = server_failure(server, "load", timed_out=(state == "timeout"))
            phase = "stop"
            server.stop(server_cfg["stop_timeout_s"])
    except BudgetError as exc:
        failure = {"outcome": "budget_refused", "failure": "budget", "phase": "start", "message": str(exc)}
    except Exception as exc:  # a crashline fault still leaves a record and no server behind
        failure = {"outcome": "error", "failure": "crashline", "phase": phase, "message": f"{type(exc).__name__}: {exc}"}
    finally:
        server.stop(5)
    if not Path(log_path).exists():
        _note(log_path, f"crashline: llama-server did not start ({failure and failure.get('message')})\n")
    log = server.log_text()
    placement = logparse.parse_log(log)
    if failure is None:
        failure = logparse.classify(log, server.returncode, phase_hint="stop")
    if failure["outcome"] != "ok":
        trials = _complete(trials, ns, slot_ctx, failure)
    recall, failed_required = verdict(trials, ns, applicable=True)
    record.update(
        applicable=True,
        returncode=server.returncode,
        slot_ctx=slot_ctx,
        placement=placement,
        outcome=failure["outcome"],
        failure=failure.get("failure"),
        phase=failure.get("phase"),
        message=failure.get("message"),
        log_tail=placement.get("tail") if failure["outcome"] != "ok" else None,
        trials=trials,
        grid=grid(trials, ns),
        recall=recall,
        failed_required=failed_required,
        finished_at=_now(),
    )
    write_json(record_path, record)
    return record


def _note(log_path: Path, text: str) -> None:
    """The server log is a job output: say in it why there is no server output."""
    Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    Path(log_path).write_text(text)


def _complete(trials: list[dict], ns: dict, slot_ctx, failure: dict) -> list[dict]:
    """Every planned trial, those that never ran failed with the server's failure as the reason."""
    ran = {(repr(t["length"]), t["depth"], t["trial"]): t for t in trials
           if t.get("prompt_n") is not None or t["reason"]}
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


# --------------------------------------------------------------------------- tables and report


def _spec_text(spec) -> str:
    return json.dumps(spec)  # 2048 -> "2048", 0.9 -> "0.9", 1.0 -> "1.0": ints and fractions stay apart


def table(record_paths) -> "pd.DataFrame":
    """Needle records into one row per trial (a configuration without trials gets one row with
    empty trial columns), for ``results/tables/needle.parquet``."""
    import pandas as pd

    from .atomic import read_json
    from .host import environment_key

    rows = []
    for path in record_paths:
        rec = read_json(path)
        ns = rec.get("needle") or {}
        base = {
            "model": rec["model"]["name"],
            "config_id": rec["config_id"],
            "server_args": settings_mod.label(rec["settings"]),
            "environment": environment_key(rec["host"])
            + f"|budget {(rec.get('budget') or {}).get('vram_budget_mib') or 'none'}",
            "server_version": rec["server"].get("version"),
            "server_sha256": rec["server"].get("sha256"),
            "prompt_style": rec.get("prompt_style"),
            "needle_kind": ns.get("kind"),
            "applicable": rec["applicable"],
            "recall": rec["recall"],
            "failed_required": json.dumps([_spec_text(s) for s in rec.get("failed_required") or []]),
            "required": json.dumps([_spec_text(s) for s in ns.get("required") or []]),
            "outcome": rec["outcome"],
            "failure": rec.get("failure"),
            "phase": rec.get("phase"),
            "message": rec.get("message"),
            "slot_ctx": rec.get("slot_ctx"),
            "started_at": rec.get("started_at"),
        }
        trials = rec.get("trials") or []
        if not trials:
            rows.append({**base, "length": None})
        for t in trials:
            rows.append({
                **base,
                "length": _spec_text(t["length"]),
                **{k: t.get(k) for k in ("length_target", "length_fraction", "depth", "depth_actual", "trial", "value",
                                         "answer", "passed", "prompt_n", "predicted_n", "prompt_ms", "reason")},
            })
    return pd.DataFrame(rows)


def write_table(record_paths, path: Path) -> "pd.DataFrame":
    """``table`` written atomically as Parquet."""
    from .atomic import atomic_path

    frame = table([Path(p) for p in record_paths])
    with atomic_path(Path(path)) as tmp:
        frame.to_parquet(tmp, index=False)
    return frame


def _short(answer, limit: int = 48) -> str | None:
    if answer is None:
        return None
    text = str(answer).strip().replace("\r", "").replace("\n", "⏎")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _present(value):
    try:
        import pandas as pd

        return None if value is None or pd.isna(value) else value
    except (TypeError, ValueError):
        return value


def report_context(frame) -> list[dict]:
    """The ``needle`` variable of the report templates, from the needle table: per model, per
    configuration, a grid of lengths x depths."""
    out = []
    if frame is None or frame.empty:
        return out
    for model, by_model in frame.groupby("model", sort=False):
        configs = []
        for cid, rows in by_model.groupby("config_id", sort=False):
            first = rows.iloc[0]
            trials = rows[rows["length"].notna()]
            depths = list(dict.fromkeys(float(d) for d in trials["depth"])) if not trials.empty else []
            grid_rows = []
            for length, at_length in trials.groupby("length", sort=False):
                spec = json.loads(length)
                cells = []
                for depth in depths:
                    here = at_length[at_length["depth"] == depth]
                    if here.empty:
                        cells.append(None)
                        continue
                    failed = here[~here["passed"].astype(bool)]
                    shown = (failed if not failed.empty else here).iloc[0]
                    cells.append({
                        "depth": depth,
                        "passed": failed.empty,
                        "n": len(here),
                        "n_passed": int(here["passed"].astype(bool).sum()),
                        "value": _present(shown["value"]),
                        "answer": _present(shown["answer"]),
                        "answer_short": _short(_present(shown["answer"])),
                        "reason": _present(shown["reason"]),
                    })
                target = _present(at_length["length_target"].iloc[0])
                grid_rows.append({"length": length_label(spec), "length_target": None if target is None else int(target),
                                  "required": length in json.loads(first["required"]), "cells": cells})
            configs.append({
                "config_id": cid,
                "server_args": first["server_args"],
                "prompt_style": first["prompt_style"],
                "applicable": bool(first["applicable"]),
                "recall": first["recall"],
                "failed_required": [length_label(json.loads(s)) for s in json.loads(first["failed_required"])],
                "outcome": first["outcome"],
                "message": _present(first["message"]),
                "slot_ctx": None if _present(first["slot_ctx"]) is None else int(first["slot_ctx"]),
                "depths": depths,
                "rows": grid_rows,
            })
        applicable = any(c["applicable"] for c in configs)
        out.append({"name": model, "applicable": applicable,
                    "message": None if applicable else configs[0]["message"], "configs": configs})
    return out


def recall_failures(frame) -> dict[tuple[str, str], str]:
    """(model, config_id) -> why the recommendation must skip it: recall failed at a required length."""
    out: dict[tuple[str, str], str] = {}
    if frame is None or frame.empty:
        return out
    for (model, cid), rows in frame.groupby(["model", "config_id"], sort=False):
        failed = json.loads(rows.iloc[0]["failed_required"])
        if not failed:
            continue
        bad = rows[rows["length"].isin(failed) & ~rows["passed"].fillna(False).astype(bool)]
        detail = ""
        if not bad.empty:
            t = bad.iloc[0]
            detail = f" (at {t['length_target']:.0f} tokens, depth {t['depth']:g}: {t['reason']})" \
                if _present(t["length_target"]) is not None else f" ({t['reason']})"
        labels = ", ".join(length_label(json.loads(s)) for s in failed)
        out[(model, cid)] = f"needle recall failed at required length {labels}{detail}"
    return out
