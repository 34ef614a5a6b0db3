"""What a GGUF model is: its shape, its quantisation and where its bytes are.

``inspect_gguf`` reads only metadata and tensor infos (``gguf.GGUFReader`` memory-maps the file, so
no tensor data is read) and returns a JSON-serialisable dict. For split models
(``NAME-00001-of-00003.gguf``) the first shard's ``split.count`` names how many shards follow; the
tensors of every shard are counted.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

import gguf

SPLIT_RE = re.compile(r"^(?P<stem>.+)-(?P<index>\d{5})-of-(?P<count>\d{5})\.gguf$")


def shard_paths(path: Path, count: int) -> list[Path]:
    """The paths of all ``count`` shards of the split model whose first shard is ``path``."""
    m = SPLIT_RE.match(path.name)
    if count <= 1:
        return [path]
    if not m:
        raise ValueError(f"{path}: split.count is {count} but the name is not NAME-00001-of-{count:05d}.gguf")
    return [path.with_name(f"{m['stem']}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]


def _fields(reader: gguf.GGUFReader) -> dict[str, Any]:
    """Metadata values, except string arrays (the vocabulary, merges) which become their length."""
    out: dict[str, Any] = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        if field.types[:1] == [gguf.GGUFValueType.ARRAY] and field.types[-1] == gguf.GGUFValueType.STRING:
            out[key] = len(field.data)
            continue
        try:
            out[key] = field.contents()
        except Exception:  # a field the reader cannot decode is not needed here
            continue
    return out


def _per_layer(value: Any) -> list[int] | int | None:
    """Some architectures store per-layer arrays (e.g. head_count_kv); keep them as lists."""
    if isinstance(value, list):
        return [int(v) for v in value]
    return None if value is None else int(value)


def _type_name(tensor_type: int) -> str:
    try:
        return gguf.GGMLQuantizationType(tensor_type).name
    except ValueError:
        return f"type{int(tensor_type)}"


def _file_type_name(value: Any) -> str | None:
    if value is None:
        return None
    try:
        name = gguf.LlamaFileType(int(value)).name
    except ValueError:
        return f"file_type{int(value)}"
    return name.removeprefix("MOSTLY_").removeprefix("ALL_")


def inspect_gguf(path: Path) -> dict[str, Any]:
    """Architecture, shape, quantisation and byte breakdown of the GGUF model at ``path``.

    gguf-py parses every vocabulary string, so a model with a 262K-token vocabulary takes about
    10 s here, whatever its size.

    ``kv_bytes_per_token_f16`` is the size of one token's K and V cache at f16 over all layers:
    ``sum over layers of n_head_kv * (key_length + value_length) * 2 bytes``, which for uniform
    layers and key_length == value_length == head_dim is ``2 * layers * n_head_kv * head_dim * 2``.
    It ignores sliding-window layers (which keep fewer cells) and architectures whose cache is not
    plain K/V (MLA, recurrent), so read it as the upper bound of a full-attention model.
    """
    path = Path(path)
    first = gguf.GGUFReader(path)
    kv = _fields(first)
    split_count = int(kv.get("split.count", 1))
    paths = shard_paths(path, split_count)
    readers = [first] + [gguf.GGUFReader(p) for p in paths[1:]]

    arch = kv.get("general.architecture")

    def key(name: str) -> Any:
        return kv.get(f"{arch}.{name}")

    layers = int(key("block_count") or 0)
    n_embd = _per_layer(key("embedding_length"))
    n_head = _per_layer(key("attention.head_count"))
    n_head_kv = _per_layer(key("attention.head_count_kv"))
    if n_head_kv is None:
        n_head_kv = n_head
    key_length = key("attention.key_length")
    value_length = key("attention.value_length")
    head_dim = None
    if key_length is not None:
        head_dim = int(key_length)
    elif isinstance(n_embd, int) and isinstance(n_head, int) and n_head:
        head_dim = n_embd // n_head
    key_length = int(key_length) if key_length is not None else head_dim
    value_length = int(value_length) if value_length is not None else head_dim

    tensor_types: Counter[str] = Counter()
    per_layer = [{"layer": i, "expert_bytes": 0, "shared_expert_bytes": 0, "other_bytes": 0} for i in range(layers)]
    embedding_bytes = output_bytes = other_bytes = 0
    n_tensors = 0
    for reader in readers:
        for t in reader.tensors:
            n_tensors += 1
            nbytes = int(t.n_bytes)
            tensor_types[_type_name(t.tensor_type)] += nbytes
            m = re.match(r"^blk\.(\d+)\.(.+)$", t.name)
            if m and int(m[1]) < layers:
                row = per_layer[int(m[1])]
                part = m[2]
                if "_shexp" in part:
                    row["shared_expert_bytes"] += nbytes
                elif "_exps" in part:
                    row["expert_bytes"] += nbytes
                else:
                    row["other_bytes"] += nbytes
            elif t.name.startswith("token_embd."):
                embedding_bytes += nbytes
            elif t.name.startswith(("output.", "output_norm.")):
                output_bytes += nbytes
            else:
                other_bytes += nbytes

    vocab = key("vocab_size")
    if vocab is None:
        vocab = kv.get("tokenizer.ggml.tokens")  # the length of the token list
    # general.file_type names the quantisation ("Q4_K_M"); without it, the tensor type holding most bytes.
    file_type = _file_type_name(kv.get("general.file_type"))
    file_type_from = "general.file_type"
    if file_type is None:
        file_type = max(tensor_types, key=tensor_types.get) if tensor_types else None
        file_type_from = "most common tensor type"

    kv_heads = n_head_kv if isinstance(n_head_kv, list) else [n_head_kv or 0] * layers
    kv_bytes_per_token = sum(h * ((key_length or 0) + (value_length or 0)) * 2 for h in kv_heads[:layers])

    return {
        "path": str(path),
        "files": [str(p) for p in paths],
        "architecture": arch,
        "name": kv.get("general.name"),
        "layers": layers,
        "n_embd": n_embd,
        "n_head": n_head,
        "n_head_kv": n_head_kv,
        "head_dim": head_dim,
        "n_expert": int(key("expert_count") or 0),
        "n_expert_used": int(key("expert_used_count") or 0),
        "expert_ffn": _per_layer(key("expert_feed_forward_length")),
        "context_length": _per_layer(key("context_length")),
        "vocab": int(vocab) if vocab is not None else None,
        "file_type": file_type,
        "quantisation": file_type,
        "file_type_from": file_type_from,
        "total_bytes": sum(p.stat().st_size for p in paths),
        "tensor_bytes": sum(tensor_types.values()),
        "n_tensors": n_tensors,
        "per_layer": per_layer,
        "embedding_bytes": embedding_bytes,
        "output_bytes": output_bytes,
        "other_bytes": other_bytes,
        "tensor_types": dict(sorted(tensor_types.items(), key=lambda kv_: -kv_[1])),
        "kv_bytes_per_token_f16": kv_bytes_per_token,
    }
