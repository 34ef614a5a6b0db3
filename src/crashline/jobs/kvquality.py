"""What a quantised KV cache costs in quality: llama-perplexity's KL divergence against an f16 cache.

llama.cpp's own measure (``tools/perplexity``, built beside llama-server from the same sources): one pass of the
shipped prose (``engine.workloads.prose_text``) with the f16 cache saves every token's log-probabilities
(``--kl-divergence-base``); a pass with the quantised K and V types reads them back (``--kl-divergence``) and prints
the KL divergence of each token's distribution from the f16 one, its percentiles, and how often both put the same
token on top. Both passes score the second half of one chunk of ``ctx`` tokens, so the figure is taken at depths
up to the user's prompt (``context``). A random-weight synthetic model's figure says nothing about a trained
model's: its record says so, and no pass runs.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
import time
from pathlib import Path

from ..core import progress, records
from ..core.errors import CrashlineError
from ..core.locks import lease
from ..core.records import utc_now
from ..engine.server import private_home, server_env
from ..engine.workloads import prose_text
from ..models.synthetic import random_weights

# "Mean    KLD:   0.092403 ±   0.004652", "99.0%   KLD:   0.407537", "Same top p: 80.431 ± 1.757 %", as
# tools/perplexity/perplexity.cpp (kl_divergence) prints them at the end of its run
NUMBER = r"(-?\d+(?:\.\d+)?)"
LINES = {
    "kld_mean": rf"^Mean\s+KLD:\s+{NUMBER}",
    "kld_median": rf"^Median\s+KLD:\s+{NUMBER}",
    "kld_p99": rf"^99\.0%\s+KLD:\s+{NUMBER}",
    "kld_max": rf"^Maximum KLD:\s+{NUMBER}",
    "same_top_pct": rf"^Same top p:\s+{NUMBER}",
    "ppl": rf"^Mean PPL\(Q\)\s+:\s+{NUMBER}",
    "ppl_f16": rf"^Mean PPL\(base\)\s+:\s+{NUMBER}",
}
CHUNKS_RE = re.compile(r"kl_divergence: computing over (\d+) chunks, n_ctx=(\d+)")
# the prose tokenizes to about 4 characters a token; llama-perplexity needs twice the context in tokens
CHARS_PER_TOKEN = 4
NOT_INFORMATIVE = (
    "random-weight synthetic model: its next-token distributions are noise, so their KL divergence is not informative"
)
MIN_CTX = 512  # 255 scored tokens: the 99th percentile is the third largest
PASS_TIMEOUT_S = 3600  # one pass of at most kv_quality.max_ctx tokens


class KvQualityError(CrashlineError, RuntimeError):
    """llama-perplexity gave no KL divergence: the command, its exit status and the end of its output."""


def parse(text: str) -> dict:
    """The figures of one ``--kl-divergence`` run's output; KvQualityError naming the lines it lacks."""
    found = {name: re.search(pattern, text, re.M) for name, pattern in LINES.items()}
    lacking = [name for name, m in found.items() if m is None]
    if lacking:
        raise KvQualityError(f"llama-perplexity printed no {', '.join(lacking)}: {text[-1500:]}")
    out = {name: float(m[1]) for name, m in found.items()}
    chunks = CHUNKS_RE.search(text)
    out["chunks"], out["scored_ctx"] = (int(chunks[1]), int(chunks[2])) if chunks else (None, None)
    return out


def context(prompt_tokens: int, max_ctx: int) -> tuple[int, str]:
    """The context both passes use, and why: the user's prompt where it is at most ``max_ctx`` (kv_quality.max_ctx:
    the f16 pass saves 2 bytes per vocabulary entry for each scored token, 1 GB at 4,096 tokens of a 262K
    vocabulary), else ``max_ctx``; at least MIN_CTX, whose scored half gives a 99th percentile of a few tokens."""
    if prompt_tokens > max_ctx:
        return max_ctx, (
            f"{max_ctx:,} tokens (kv_quality.max_ctx), not the {prompt_tokens:,}-token prompt asked: the f16 pass "
            "saves every scored token's log-probabilities"
        )
    if prompt_tokens < MIN_CTX:
        return MIN_CTX, f"{MIN_CTX:,} tokens, not the {prompt_tokens:,}-token prompt asked: fewer give no percentile"
    return prompt_tokens, f"the prompt asked, {prompt_tokens:,} tokens"


def _prose_file(folder: Path, ctx: int) -> Path:
    """The shipped prose as llama-perplexity's -f, cut to what two chunks need with room (it wants 2 × ctx tokens)."""
    path = folder / "prose.txt"
    path.write_text(prose_text()[: 4 * ctx * CHARS_PER_TOKEN], encoding="utf-8")
    return path


def _run(binary: str, args: list[str], log) -> str:
    """One llama-perplexity pass in the environment a llama-server gets; its output, also into ``log``."""
    command = [binary, *args]
    started = time.monotonic()
    with private_home() as home:
        try:
            proc = subprocess.run(
                command,
                capture_output=True,
                text=True,
                errors="replace",
                stdin=subprocess.DEVNULL,
                timeout=PASS_TIMEOUT_S,
                cwd=home,
                env=server_env(os.environ, home),
            )
        except subprocess.TimeoutExpired:
            raise KvQualityError(f"{' '.join(command)}: no end within {PASS_TIMEOUT_S} s") from None
    output = proc.stdout + proc.stderr
    if log is not None:
        log.write(f"$ {' '.join(command)}\n{output}\n")
        log.flush()
    if proc.returncode != 0:
        raise KvQualityError(f"{' '.join(command)} failed (exit {proc.returncode}): {output[-1500:]}")
    progress.say(f"done in {progress.duration(time.monotonic() - started)}")
    return output


def kv_types(label: str) -> tuple[str, str]:
    """K and V types from a KV label (``config.expand.kv_labels``): "q8_0" (both), "q8_0-q4_0" (K, then V)."""
    k, _, v = label.partition("-")
    return k, v or k


def why_not(model: dict, binary: str | None) -> str | None:
    """Why a model's KV types get no figure: a random-weight model's says nothing; no llama-perplexity to run."""
    if random_weights(model["source"], model.get("path")):
        return NOT_INFORMATIVE
    if binary is None:
        return (
            "no llama-perplexity beside the llama-server in use: put one built from the same sources in its folder, "
            "or leave server.binary unset for crashline's own build"
        )
    return None


def run(binary: str | None, model: dict, kv: str, ctx: int, why_ctx: str, out: Path, log=None) -> dict:
    """The record of one quantised KV type into ``out``: an f16 pass, then the type's against it (or why there is no
    figure). ``model``: its name, source and path. Each type's job makes its own f16 pass (seconds beside the
    server jobs): its saved log-probabilities are 2 bytes per vocabulary entry per scored token, too large to keep
    in the results between jobs."""
    k, v = kv_types(kv)
    skip = why_not(model, binary)
    record = {
        "model": model["name"],
        "source": model["source"],
        "kv": kv,
        "cache_type_k": k,
        "cache_type_v": v,
        "ctx": ctx,
        "ctx_reason": why_ctx,
        "binary": binary,
        "started_at": utc_now(),
        "informative": skip is None,
        "message": skip,
    }
    if skip is None:  # under the machine's (or a GPU's) lease: no server measures while the passes run
        with lease(f"kv_quality {model['name']} {kv}"), tempfile.TemporaryDirectory(prefix="crashline-kld-") as folder:
            base, text = Path(folder) / "f16.kld", _prose_file(Path(folder), ctx)
            progress.say(f"f16 pass over {why_ctx}")
            _run(binary, ["-m", model["path"], "-f", str(text), "-c", str(ctx), "--chunks", "1",
                          "--kl-divergence-base", str(base)], log)  # fmt: skip
            progress.say(f"{kv} pass against it")
            args = ["-m", model["path"], "-c", str(ctx), "--kl-divergence-base", str(base), "--kl-divergence"]
            record |= parse(_run(binary, [*args, "-ctk", k, "-ctv", v], log))
    else:
        progress.say(f"no KL divergence for {kv}: {skip}")
    return records.write(out, "kv_quality", {**record, "finished_at": utc_now()})
