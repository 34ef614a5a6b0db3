"""Random-weight MoE GGUF files of a declared shape: qwen3moe, or gpt-oss with sliding-window layers.

The weights are random but well-behaved: quantised blocks carry a small fixed fp16 scale, so
llama.cpp computes finite numbers and a benchmark measures the same work as on a real model of the
same shape. Tensor data is streamed from one small random buffer per tensor type, so a 17 GB file
is written at disk speed with a few MiB of RAM.

The vocabulary is SentencePiece-style ("llama" tokenizer model) and byte-level: ``<unk>``, ``<s>``,
``</s>``, the 256 byte tokens ``<0x00>``..``<0xFF>`` and, from a vocabulary of 260 up, the token
``▁`` (U+2581, llama.cpp's escaped space) with the space prefix switched off. With that token every
byte of ASCII text is exactly one token: N bytes of ASCII text tokenize to N tokens (plus ``<s>``
when special tokens are added). At vocabulary 259 a space costs three byte tokens (the UTF-8 bytes
of U+2581). Tokens beyond 260 are filler tokens ``<extra_N>`` that no text ever produces; they only
give the embedding and output matrices a realistic size.
"""

from __future__ import annotations

import re

import os
from pathlib import Path
from typing import Any
from collections.abc import Iterator

import gguf
import numpy as np

from ..core.atomic import atomic_path
from ..config.shape import (  # noqa: F401 - importers read them from here
    DEFAULT_TINY,
    MIN_VOCAB,
    QUANT_BLOCKS,
    QWEN3_30B_A3B,
    SHAPE_KEYS,
    resolve_shape,
)

QUANTS = {
    "Q4_0": (gguf.GGMLQuantizationType.Q4_0, gguf.LlamaFileType.MOSTLY_Q4_0),
    "Q8_0": (gguf.GGMLQuantizationType.Q8_0, gguf.LlamaFileType.MOSTLY_Q8_0),
    "F16": (gguf.GGMLQuantizationType.F16, gguf.LlamaFileType.MOSTLY_F16),
    "F32": (gguf.GGMLQuantizationType.F32, gguf.LlamaFileType.ALL_F32),
}
SPACE_TOKEN = "\u2581"

# The fp16 scale of every quantised block, fixed so weights stay small and finite (random scale
# bytes could be inf or NaN). Both give weights of standard deviation about 0.04.
QUANT_SCALES = {gguf.GGMLQuantizationType.Q4_0: 0.01, gguf.GGMLQuantizationType.Q8_0: 0.0005}
FLOAT_STD = 0.04  # standard deviation of F16/F32 weights
BUFFER_BLOCKS = 1 << 16  # random blocks per tensor type (Q8_0: 2.1 MiB)


def tensor_plan(shape: dict[str, Any]) -> list[tuple[str, tuple[int, ...], gguf.GGMLQuantizationType]]:
    """(name, numpy shape, type) of every tensor, as llama.cpp's loader of ``shape["arch"]`` expects them.

    Numpy shapes are ggml's ``ne`` reversed: ``token_embd`` is ne ``{n_embd, n_vocab}``, numpy
    ``(n_vocab, n_embd)``. gpt-oss (llama.cpp's ``openai-moe.cpp``) has no Q/K norms, a norm after
    attention instead of before the FFN, one attention sink per head and a bias on the attention output,
    the router and every expert matrix; biases and sinks stay F32.
    """
    q = QUANTS[shape["quant"]][0]
    f32 = gguf.GGMLQuantizationType.F32
    E, V, H, KV, D = shape["n_embd"], shape["vocab"], shape["n_head"], shape["n_head_kv"], shape["head_dim"]
    X, F = shape["n_expert"], shape["expert_ffn"]
    plan = [
        ("token_embd.weight", (V, E), q),
        ("output_norm.weight", (E,), f32),
        ("output.weight", (V, E), q),
    ]
    oss = shape["arch"] == "gpt-oss"
    for i in range(shape["layers"]):
        b = f"blk.{i}."
        attention = [
            (b + "attn_norm.weight", (E,), f32),
            (b + "attn_q.weight", (H * D, E), q),
            (b + "attn_k.weight", (KV * D, E), q),
            (b + "attn_v.weight", (KV * D, E), q),
            (b + "attn_output.weight", (E, H * D), q),
        ]
        experts = [
            (b + "ffn_gate_inp.weight", (X, E), f32),  # the router stays F32, as llama-quantize keeps it
            (b + "ffn_gate_exps.weight", (X, F, E), q),
            (b + "ffn_down_exps.weight", (X, E, F), q),
            (b + "ffn_up_exps.weight", (X, F, E), q),
        ]
        if oss:
            plan += attention + [
                (b + "attn_output.bias", (E,), f32),
                (b + "attn_sinks.weight", (H,), f32),
                (b + "post_attention_norm.weight", (E,), f32),
                *experts,
                (b + "ffn_gate_inp.bias", (X,), f32),
                (b + "ffn_gate_exps.bias", (X, F), f32),
                (b + "ffn_down_exps.bias", (X, E), f32),
                (b + "ffn_up_exps.bias", (X, F), f32),
            ]
        else:
            plan += attention + [
                (b + "attn_q_norm.weight", (D,), f32),
                (b + "attn_k_norm.weight", (D,), f32),
                (b + "ffn_norm.weight", (E,), f32),
                *experts,
            ]
    return plan


def nbytes(shape: dict[str, Any]) -> int:
    """The tensor bytes a file of ``shape`` holds (its size less the header and padding)."""
    return sum(tensor_nbytes(numpy_shape, qtype) for _, numpy_shape, qtype in tensor_plan(resolve_shape(shape)))


def tensor_nbytes(numpy_shape: tuple[int, ...], qtype: gguf.GGMLQuantizationType) -> int:
    block, type_size = gguf.GGML_QUANT_SIZES[qtype]
    return int(np.prod(numpy_shape)) // block * type_size


def _random_blocks(qtype: gguf.GGMLQuantizationType, n_blocks: int, rng: np.random.Generator) -> bytes:
    """``n_blocks`` random blocks of ``qtype`` whose values are small and finite."""
    if qtype == gguf.GGMLQuantizationType.F32:
        return (rng.standard_normal(n_blocks) * FLOAT_STD).astype(np.float32).tobytes()
    if qtype == gguf.GGMLQuantizationType.F16:
        return (rng.standard_normal(n_blocks) * FLOAT_STD).astype(np.float16).tobytes()
    _, type_size = gguf.GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)
    # Q4_0 and Q8_0 blocks start with their fp16 scale.
    blocks[:, :2] = np.frombuffer(np.float16(QUANT_SCALES[qtype]).tobytes(), dtype=np.uint8)
    return blocks.tobytes()


def _chunks(data: bytes, nbytes: int, block_bytes: int, rng: np.random.Generator) -> Iterator[memoryview]:
    """``nbytes`` of tensor data cut from ``data`` (random blocks twice over), starting at a random block."""
    view = memoryview(data)
    period = len(data) // 2
    start = int(rng.integers(0, period // block_bytes)) * block_bytes
    while nbytes > 0:
        n = min(nbytes, period)
        yield view[start : start + n]
        nbytes -= n


# the general.name _add_metadata gives every model it writes ("synthetic qwen3moe 8L 128x768 Q4_0")
NAME_RE = re.compile(r"^synthetic \w+ \d+L \d+x\d+ \w+$")


def random_weights(source: str, path: str | Path | None = None) -> bool:
    """Whether a model holds this module's random weights, so that its recall and KL divergence say nothing: a
    ``synthetic:`` source, or a GGUF this module wrote given by its path (a GPU lease writes the shapes and tunes
    the files), known by its general.name. A file that cannot be read is not called random."""
    if source.startswith("synthetic:"):
        return True
    if path is None:
        return False
    from .manifest import ManifestError, inspect_gguf

    try:
        return bool(NAME_RE.match(str(inspect_gguf(Path(path)).get("name") or "")))
    except (ManifestError, OSError):
        return False


def _add_metadata(writer: gguf.GGUFWriter, shape: dict[str, Any]) -> None:
    writer.add_name(
        f"synthetic {shape['arch']} {shape['layers']}L {shape['n_expert']}x{shape['expert_ffn']} {shape['quant']}"
    )
    writer.add_block_count(shape["layers"])
    writer.add_context_length(shape["ctx"])
    writer.add_embedding_length(shape["n_embd"])
    writer.add_feed_forward_length(shape["ffn"])
    writer.add_head_count(shape["n_head"])
    writer.add_head_count_kv(shape["n_head_kv"])
    writer.add_key_length(shape["head_dim"])
    writer.add_value_length(shape["head_dim"])
    writer.add_rope_freq_base(1_000_000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_expert_count(shape["n_expert"])
    writer.add_expert_used_count(shape["n_expert_used"])
    writer.add_expert_feed_forward_length(shape["expert_ffn"])
    if shape["swa_window"]:
        writer.add_sliding_window(shape["swa_window"])
    writer.add_file_type(int(QUANTS[shape["quant"]][1]))
    if shape["quant"] in ("Q4_0", "Q8_0"):
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)

    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL] + [gguf.TokenType.BYTE] * 256
    if shape["vocab"] > MIN_VOCAB:
        tokens.append(SPACE_TOKEN)
        types.append(gguf.TokenType.NORMAL)
    extra = shape["vocab"] - len(tokens)
    tokens += [f"<extra_{i}>" for i in range(extra)]
    types += [gguf.TokenType.NORMAL] * extra
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * len(tokens))
    writer.add_token_types([int(t) for t in types])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(True)
    writer.add_add_space_prefix(False)


def write_moe_gguf(path: Path, shape: dict[str, Any], seed: int = 0) -> dict[str, Any]:
    """Write a random-weight GGUF of ``shape`` (its ``arch``) to ``path`` (atomically).

    Same shape and seed give the same bytes. Returns the resolved shape plus ``bytes`` (file size)
    and ``tensors`` (tensor count).
    """
    shape = resolve_shape(shape)
    plan = tensor_plan(shape)
    rng = np.random.default_rng(seed)
    with atomic_path(path) as tmp:
        writer = gguf.GGUFWriter(tmp, shape["arch"], use_temp_file=False)
        _add_metadata(writer, shape)
        for name, numpy_shape, qtype in plan:
            # The dtype argument is ignored when raw_dtype is given and is not uint8: the shape
            # is then taken as element counts.
            writer.add_tensor_info(
                name, numpy_shape, np.dtype(np.float32), tensor_nbytes(numpy_shape, qtype), raw_dtype=qtype
            )
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()

        # Tensor data, written as GGUFWriter.write_tensor_data would but from a reused buffer:
        # pad to the alignment before the first tensor and after every tensor.
        buffers: dict[gguf.GGMLQuantizationType, bytes] = {}
        fout = writer.fout[0]
        writer.write_padding(fout, fout.tell())
        for name, numpy_shape, qtype in plan:
            nbytes = tensor_nbytes(numpy_shape, qtype)
            if name.endswith("norm.weight"):
                fout.write(np.ones(numpy_shape, dtype=np.float32).tobytes())
            else:
                if qtype not in buffers:
                    buffers[qtype] = _random_blocks(qtype, 2 * BUFFER_BLOCKS, rng)
                block_bytes = gguf.GGML_QUANT_SIZES[qtype][1]
                for chunk in _chunks(buffers[qtype], nbytes, block_bytes, rng):
                    fout.write(chunk)
            writer.write_padding(fout, nbytes)
        writer.close()
        size = os.path.getsize(tmp)
    return {**shape, "bytes": size, "tensors": len(plan)}
