"""The shape of a synthetic model, filled in and checked without numpy or gguf (``crashline.models.synthetic``
writes the file; this light part is what a config check needs).

Two architectures: ``qwen3moe`` (every layer attends to the whole context) and ``gpt-oss`` (every other layer
attends to a sliding window of ``swa_window`` tokens, as gpt-oss, gemma and cohere models do). llama.cpp keeps a
small KV cache for sliding-window layers and saves context checkpoints of it, so only the second shape shows
what checkpoints cost."""

from __future__ import annotations

import difflib
from typing import Any

DEFAULT_TINY: dict[str, Any] = {
    "layers": 4,
    "n_embd": 256,
    "n_head": 4,
    "n_head_kv": 2,
    "head_dim": 64,
    "n_expert": 8,
    "n_expert_used": 2,
    "expert_ffn": 128,
    "ffn": 128,
    "vocab": 260,
    "ctx": 8192,
    "quant": "Q4_0",
    "arch": "qwen3moe",
    "swa_window": 0,
}

# The tiny shape with sliding-window attention: gpt-oss's layout (every other layer a 128-token window).
TINY_SWA: dict[str, Any] = {**DEFAULT_TINY, "arch": "gpt-oss", "swa_window": 128}

# The shape of Qwen3-30B-A3B (the model behind the CUDA log fixtures), every matrix Q4_0: 16.9 GB.
QWEN3_30B_A3B: dict[str, Any] = {
    "layers": 48,
    "n_embd": 2048,
    "n_head": 32,
    "n_head_kv": 4,
    "head_dim": 128,
    "n_expert": 128,
    "n_expert_used": 8,
    "expert_ffn": 768,
    "ffn": 768,
    "vocab": 260,
    "ctx": 40960,
    "quant": "Q4_0",
    "arch": "qwen3moe",
    "swa_window": 0,
}

# The shape of gpt-oss-20b (24 layers, 32 experts / 4, a 128-token window on every other layer), every matrix
# Q4_0 instead of MXFP4 and the vocabulary cut to the byte tokens: 11.3 GB.
GPT_OSS_20B: dict[str, Any] = {
    "layers": 24,
    "n_embd": 2880,
    "n_head": 64,
    "n_head_kv": 8,
    "head_dim": 64,
    "n_expert": 32,
    "n_expert_used": 4,
    "expert_ffn": 2880,
    "ffn": 2880,
    "vocab": 260,
    "ctx": 131072,
    "quant": "Q4_0",
    "arch": "gpt-oss",
    "swa_window": 128,
}

# ``synthetic:NAME`` with one of these names starts from its shape (a ``synthetic:`` block overrides keys);
# any other name starts from DEFAULT_TINY.
PRESETS: dict[str, dict[str, Any]] = {
    "tiny-moe": DEFAULT_TINY,
    "tiny-swa": TINY_SWA,
    "qwen3-30b-a3b": QWEN3_30B_A3B,
    "gpt-oss-20b": GPT_OSS_20B,
}
# What each architecture's llama.cpp loader needs of the window: none, or one of at least 1 token.
ARCHS = {"qwen3moe": "swa_window must be 0", "gpt-oss": "swa_window must be at least 1"}

SHAPE_KEYS = tuple(DEFAULT_TINY)
MAX_DIMENSION = 2**31 - 1  # every count of the shape is a 32-bit field of the GGUF header (or tensor dimension)
MIN_VOCAB = 3 + 256  # <unk> <s> </s> and the byte tokens
# Weights per quantisation block of each type a synthetic model may use (ggml's GGML_QUANT_SIZES).
QUANT_BLOCKS = {"Q4_0": 32, "Q8_0": 32, "F16": 1, "F32": 1}


def resolve_shape(shape: dict[str, Any] | None = None, name: str | None = None) -> dict[str, Any]:
    """Fill ``shape`` from the preset called ``name`` (else DEFAULT_TINY) and validate it; ValueError names
    the key and the value.

    ``ffn`` (the dense feed-forward length, unused by qwen3moe's experts) defaults to ``expert_ffn``.
    """
    shape = dict(shape or {})

    def error(key: str, text: str, why: str) -> ValueError:
        exc = ValueError(text)
        exc.key, exc.reason = key, why  # for a caller that names the key path itself (crashline.config)
        return exc

    unknown = sorted(set(shape) - set(SHAPE_KEYS), key=str)
    if unknown:
        key = unknown[0]
        close = difflib.get_close_matches(str(key), SHAPE_KEYS, n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"known keys: {', '.join(SHAPE_KEYS)}"
        raise error(key, f"unknown synthetic shape key {key!r} (value {shape[key]!r}); {hint}", f"unknown key; {hint}")
    base = PRESETS.get(name or "", DEFAULT_TINY)
    resolved = {**base, **shape}
    if "ffn" not in shape:
        resolved["ffn"] = resolved["expert_ffn"]

    def bad(key: str, why: str) -> ValueError:
        return error(key, f"synthetic shape key {key!r} has bad value {resolved[key]!r}: {why}", why)

    if resolved["arch"] not in ARCHS:
        raise bad("arch", f"must be one of {', '.join(ARCHS)}")
    for key in SHAPE_KEYS:
        if key in ("quant", "arch"):
            continue
        value = resolved[key]
        low = 0 if key == "swa_window" else 1
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise bad(key, "must be a positive integer" if low else "must be a whole number, 0 or more")
        if value > MAX_DIMENSION:
            raise bad(key, f"must be at most {MAX_DIMENSION:,} (what a GGUF header's 32-bit field holds)")
    if (resolved["swa_window"] > 0) != (resolved["arch"] == "gpt-oss"):
        raise bad("swa_window", f"{ARCHS[resolved['arch']]} for arch {resolved['arch']!r}")
    if resolved["quant"] not in QUANT_BLOCKS:
        raise bad("quant", f"must be one of {', '.join(QUANT_BLOCKS)}")
    if resolved["n_expert_used"] > resolved["n_expert"]:
        raise bad("n_expert_used", f"more than n_expert ({resolved['n_expert']})")
    if resolved["n_head"] % resolved["n_head_kv"]:
        raise bad("n_head_kv", f"must divide n_head ({resolved['n_head']})")
    if resolved["head_dim"] % 2:
        raise bad("head_dim", "must be even (rotary embedding)")
    if resolved["vocab"] < MIN_VOCAB:
        raise bad("vocab", f"must be at least {MIN_VOCAB} (3 special + 256 byte tokens)")
    block = QUANT_BLOCKS[resolved["quant"]]
    # The first ggml dimension (row length) of every quantised matrix must be whole blocks.
    for key in ("n_embd", "expert_ffn"):
        if resolved[key] % block:
            raise bad(key, f"must be a multiple of {block} for {resolved['quant']}")
    if (resolved["n_head"] * resolved["head_dim"]) % block:
        raise bad("head_dim", f"n_head * head_dim must be a multiple of {block} for {resolved['quant']}")
    return resolved
