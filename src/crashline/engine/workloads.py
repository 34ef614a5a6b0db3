"""Workloads against a running llama-server: prompts of real prose sized to exact token counts
through the server's own /tokenize, prompt cache off, greedy, speeds from the response timings.
"""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from importlib import resources

import requests
import urllib3

from ..core.stats import end_to_end_tps, resent_seconds, stats
from ..core.settings import concurrency  # noqa: F401 - measure reads it from here; it is a config matter

PROSE_DIR = "data/prose"


class RequestFailed(Exception):
    """The server answered a request with an error (it is still running)."""

    def __init__(self, status: int, message: str):
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message


def prose_text() -> str:
    """The public-domain prose shipped with the package, all works joined."""
    folder = resources.files("crashline").joinpath(PROSE_DIR)
    parts = sorted(p for p in folder.iterdir() if p.name.endswith(".txt"))
    if not parts:
        raise FileNotFoundError(f"no prose texts in crashline/{PROSE_DIR}")
    return "\n\n".join(p.read_text(encoding="utf-8") for p in parts)


def _error_message(resp: requests.Response) -> str:
    try:
        err = resp.json().get("error", {})
        message = err.get("message", resp.text) if isinstance(err, dict) else str(err)
    except ValueError:
        message = resp.text
    return message.strip()[:500]


class Client:
    """crashline's one HTTP client of a llama-server: tokenizing, completions, streamed requests, each carrying
    the server's key (``headers``)."""

    def __init__(self, url: str, timeout_s: float, setup_timeout_s: float = 300, headers: dict | None = None):
        self.url = url
        self.timeout_s = timeout_s  # for completions: a workload that takes longer has timed out
        self.setup_timeout_s = setup_timeout_s  # for tokenizing the prose
        self.headers = dict(headers or {})
        self.session = requests.Session()
        self.session.headers.update(self.headers)

    @classmethod
    def of(cls, server, timeout_s: float, **kw):
        """The client of a running ServerProcess (its URL and key)."""
        return cls(server.url, timeout_s, headers=server.headers, **kw)

    def stream(self, prompt: list[int], n_predict: int, on_chunk=None, cache_prompt: bool = False) -> dict:
        """One streamed completion on its own connection (stream_request), bounded by ``timeout_s``."""
        return stream_request(
            self.url, prompt, n_predict, self.timeout_s, on_chunk, cache_prompt=cache_prompt, headers=self.headers
        )

    def _post(self, path: str, body: dict, timeout_s: float) -> dict:
        resp = self.session.post(f"{self.url}{path}", json=body, timeout=timeout_s)
        if resp.status_code != 200:
            raise RequestFailed(resp.status_code, _error_message(resp))
        return resp.json()

    def tokenize(self, text: str, add_special: bool = False) -> list[int]:
        return self._post("/tokenize", {"content": text, "add_special": add_special}, self.setup_timeout_s)["tokens"]

    def complete(self, prompt: list[int] | str, n_predict: int, timeout_s: float | None = None) -> dict:
        return self._post(
            "/completion",
            {
                "prompt": prompt,
                "n_predict": n_predict,
                "cache_prompt": False,
                "temperature": 0.0,
                "top_k": 1,
                "ignore_eos": True,
                "stream": False,
            },
            timeout_s or self.timeout_s,
        )


class PromptSource:
    """Token ids of the prose, tokenized once by this server; prompts are slices at distinct offsets."""

    def __init__(self, client: Client):
        self.special = client.tokenize("", add_special=True)  # BOS where the model uses one
        self.tokens = client.tokenize(prose_text())
        if len(self.tokens) < 1024:
            raise RuntimeError(f"the prose tokenized to only {len(self.tokens)} tokens")

    def prompt(self, n_tokens: int, index: int) -> list[int]:
        """Exactly ``n_tokens`` ids: the special prefix, then prose from an offset that differs per index."""
        return self.special + self.prose(n_tokens - len(self.special), index)

    def prose(self, n_tokens: int, index: int) -> list[int]:
        """Exactly ``n_tokens`` ids of prose (no special prefix) from an offset that differs per index."""
        start = (index * 7919 + 13) % len(self.tokens)  # a prime stride: no two repetitions share a prefix
        out: list[int] = []
        while len(out) < n_tokens:
            out += self.tokens[start : start + n_tokens - len(out)]
            start = 0
        return out


def stream_request(
    url: str,
    prompt: list[int],
    n_predict: int,
    timeout_s: float,
    on_chunk=None,
    cache_prompt: bool = False,
    headers: dict | None = None,
) -> dict:
    """One streamed completion on its own connection: timings from the server, time to first
    token from the client; ``on_chunk(t)`` is called with the arrival time of each streamed token.
    With ``cache_prompt`` the server reuses what its slot holds of the prompt (``cache_n``), and the
    reply's token ids come back (``tokens``), so that a conversation can send them as its history.

    ``timeout_s`` bounds the whole request, not each read: llama-server sends an SSE ping (":")
    every 30 s while it waits for its own results, so a server that hangs mid-answer (it did, in
    its SIGTERM handler) keeps a read timeout from ever firing. At the deadline the socket is shut
    down from a timer thread, which ends the blocked read."""
    body = {
        "prompt": prompt,
        "n_predict": n_predict,
        "cache_prompt": cache_prompt,
        "return_tokens": cache_prompt,
        "temperature": 0.0,
        "top_k": 1,
        "ignore_eos": True,
        "stream": True,
    }
    started = time.monotonic()
    first = None
    final: dict = {}
    reply: list[int] = []
    expired = threading.Event()
    try:
        with requests.post(f"{url}/completion", json=body, headers=headers, timeout=timeout_s, stream=True) as resp:
            if resp.status_code != 200:
                raise RequestFailed(resp.status_code, _error_message(resp))

            def expire():
                expired.set()
                resp.raw.shutdown()

            deadline = threading.Timer(max(0.0, timeout_s - (time.monotonic() - started)), expire)
            deadline.daemon = True
            deadline.start()
            try:
                for line in resp.iter_lines():
                    if not line.startswith(b"data: "):
                        continue  # SSE pings and blank lines carry no token
                    chunk = json.loads(line[6:])
                    now = time.monotonic()
                    if first is None:
                        first = now
                    if on_chunk and not chunk.get("stop"):
                        on_chunk(now)
                    reply += chunk.get("tokens") or []
                    if chunk.get("stop"):
                        final = chunk
                        break
            finally:
                deadline.cancel()
    except (requests.exceptions.ChunkedEncodingError, requests.ConnectionError, urllib3.exceptions.HTTPError) as exc:
        if expired.is_set() or (exc.args and isinstance(exc.args[0], urllib3.exceptions.ReadTimeoutError)):
            raise requests.Timeout(f"no answer within {timeout_s} s") from exc
        raise requests.ConnectionError(str(exc)) from exc  # the server went away mid-answer
    if expired.is_set() and not final:
        raise requests.Timeout(f"no answer within {timeout_s} s")
    t = final.get("timings", {})
    return {
        "prompt_n": t.get("prompt_n"),
        "cache_n": t.get("cache_n"),
        "prompt_ms": t.get("prompt_ms"),
        "prefill_tps": t.get("prompt_per_second"),
        "predicted_n": t.get("predicted_n"),
        "predicted_ms": t.get("predicted_ms"),
        "decode_tps": t.get("predicted_per_second"),
        "draft_n": t.get("draft_n"),  # with a draft model: tokens it drafted, and how many the model accepted
        "draft_n_accepted": t.get("draft_n_accepted"),
        "truncated": final.get("truncated"),
        "id_slot": final.get("id_slot"),  # the slot that served it (whose lines in the log are its own)
        "ttft_s": round(first - started, 4) if first is not None else None,
        "end_s": time.monotonic() - started,
        "t_start": started,  # time.monotonic(), the clock the telemetry sampler uses
        **({"tokens": reply} if cache_prompt else {}),
    }


def one_run(client: Client, prompts: PromptSource, workload: dict, index: int, n_requests: int = 1) -> dict:
    """``n_requests`` requests started together, each with its own prompt (no shared prefix)."""
    batch = [prompts.prompt(workload["prompt_tokens"], index * n_requests + j) for j in range(n_requests)]
    barrier = threading.Barrier(n_requests)

    def go(prompt):
        barrier.wait()
        return client.stream(prompt, workload["gen_tokens"])

    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=n_requests) as pool:
        requests_done = list(pool.map(go, batch))
    wall = time.monotonic() - started
    generated = sum(r["predicted_n"] or 0 for r in requests_done)
    return {"requests": requests_done, "wall_s": wall, "aggregate_tps": generated / wall if wall else None}


# what a re-sent repetition keeps of the fresh request it stands on: its prefill and time to first token
FRESH_KEYS = ("prompt_n", "prompt_ms", "prefill_tps", "ttft_s", "t_start")


def resent_run(client: Client, prompt: list[int], workload: dict, fresh: dict) -> dict:
    """One timed repetition of a ``decode_from: resent`` workload: ``prompt``, the start's last fresh request's,
    sent again with llama-server's prompt cache on, so the slot keeps all but its last token (``cache_n``) and the
    reply is decoded over the same KV depth without a second prefill. The request's end-to-end time takes the fresh
    request's time to first token (``first_s``): what a new prompt of this length waits before its first token on
    this start. The run carries that fresh request (``fresh``) for the prefill statistics. Checked on the H200 at
    16K, 40K and 100K tokens on three MoE shapes: the re-sent decode ties a fresh one (ratios 0.99-1.14 inside the
    spread between starts; bench/results/lease-2026-12-04-s19/)."""
    r = client.stream(prompt, workload["gen_tokens"], cache_prompt=True)
    r.pop("tokens", None)
    r["first_s"] = fresh["ttft_s"]
    seconds = resent_seconds(r)
    return {
        "requests": [r],
        "wall_s": seconds,
        "aggregate_tps": (r["predicted_n"] or 0) / seconds if seconds else None,
        "fresh": {k: fresh.get(k) for k in FRESH_KEYS},
    }


def check_run(run: dict, workload: dict) -> str | None:
    """Why a run does not count, or None: every request must be evaluated and answered whole (a re-sent prompt's
    tokens are the ones evaluated and the ones the slot kept)."""
    for r in run["requests"]:
        held = (r.get("cache_n") or 0) if r.get("first_s") is not None else 0
        if r["prompt_n"] is None or r["prompt_n"] + held != workload["prompt_tokens"]:
            return f"server evaluated {r['prompt_n']} prompt tokens, {workload['prompt_tokens']} were sent"
        if r["predicted_n"] != workload["gen_tokens"]:
            return f"server generated {r['predicted_n']} tokens, {workload['gen_tokens']} were asked"
        if r["truncated"]:  # the counts match, yet the server says it cut something
            return (
                f"the server flagged the answer as truncated (prompt_n {r['prompt_n']}, predicted_n {r['predicted_n']})"
            )
    return None


def summarize(runs: list[dict]) -> dict:
    """Per-request speeds over every request of every run; the aggregate over runs; with a draft model, the tokens
    it drafted and the share the model accepted, over every request."""
    reqs = [r for run in runs for r in run["requests"]]
    prefilled = fresh_requests(runs)
    drafted = sum(r.get("draft_n") or 0 for r in reqs)
    accepted = sum(r.get("draft_n_accepted") or 0 for r in reqs)
    return {
        "prefill_tps": stats([r["prefill_tps"] for r in prefilled if r.get("prefill_tps")]),
        "decode_tps": stats([r["decode_tps"] for r in reqs if r.get("decode_tps")]),
        "ttft_s": stats([r["ttft_s"] for r in prefilled if r.get("ttft_s") is not None]),
        "e2e_tps": stats([e2e for r in reqs if (e2e := end_to_end_tps(r))]),
        "aggregate_tps": stats([run["aggregate_tps"] for run in runs if run.get("aggregate_tps")]),
        "draft": {"drafted": drafted, "accepted": accepted, "acceptance": accepted / drafted} if drafted else None,
    }


def fresh_requests(runs: list[dict]) -> list[dict]:
    """The requests whose prefill and time to first token count: every fresh one, and each fresh request that
    re-sent repetitions stood on, once (``resent_run``)."""
    out = [r for run in runs for r in run["requests"] if r.get("first_s") is None]
    behind = {run["fresh"]["t_start"]: run["fresh"] for run in runs if run.get("fresh")}
    return out + list(behind.values())


def windows(runs: list[dict], skip_tokens: int = 4) -> dict:
    """Per run, the prefill window (batch start to the last first token) and the steady-decode
    window (from there, less the first ``skip_tokens`` tokens, to the first request's end)."""
    prefill, decode = [], []
    for run in runs:
        reqs = [r for r in run["requests"] if r["ttft_s"] is not None]
        if not reqs:
            continue
        start = min(r["t_start"] for r in reqs)
        first_token = max(r["t_start"] + r["ttft_s"] for r in reqs)
        end = min(r["t_start"] + r["end_s"] for r in reqs)
        per_token = max((r["predicted_ms"] or 0) / max(r["predicted_n"] or 1, 1) for r in reqs) / 1000
        if not run.get("fresh"):  # a re-sent prompt's prefill is one token: no window to sample
            prefill.append((start, first_token))
        if end > first_token + skip_tokens * per_token:
            decode.append((first_token + skip_tokens * per_token, end))
    return {"prefill": prefill, "decode": decode}
