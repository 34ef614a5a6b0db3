"""Sliding-window attention: the synthetic gpt-oss shape (every other layer a window), which layers llama.cpp
keeps small, the planner's KV cache against what a real llama-server allocates, and context checkpoints made
on the synthetic model as on the real gemma."""

from __future__ import annotations

import re

import gguf
import pytest

from crashline.config.shape import GPT_OSS_20B, TINY_SWA, resolve_shape
from crashline.core.records import Outcome
from crashline.engine import planner
from crashline.models import synthetic
from crashline.models.manifest import inspect_gguf, swa_layers

from helpers import fetch_record, measure_one

KV_SIZE_RE = re.compile(r"llama_kv_cache: size =\s+([\d.]+) MiB")


@pytest.fixture(scope="module")
def tiny_swa(tmp_path_factory):
    path = tmp_path_factory.mktemp("swa") / "tiny-swa.gguf"
    synthetic.write_moe_gguf(path, resolve_shape({}, "tiny-swa"))
    return path


# ----------------------------------------------------------------------------- the shape and the file


def test_presets_with_a_window_are_gpt_oss():
    assert resolve_shape({}, "tiny-swa") == TINY_SWA and TINY_SWA["arch"] == "gpt-oss" and TINY_SWA["swa_window"]
    assert resolve_shape({}, "gpt-oss-20b") == GPT_OSS_20B
    assert resolve_shape({})["arch"] == "qwen3moe" and resolve_shape({})["swa_window"] == 0
    assert 11e9 < synthetic.nbytes(GPT_OSS_20B) < 11.5e9


@pytest.mark.parametrize(
    "shape,key",
    [
        ({"arch": "gpt-oss", "swa_window": 0}, "swa_window"),  # gpt-oss's loader needs a window
        ({"swa_window": 64}, "swa_window"),  # qwen3moe has none
        ({"arch": "llama"}, "arch"),
        ({"arch": "gpt-oss", "swa_window": -1}, "swa_window"),
    ],
)
def test_a_window_that_does_not_suit_the_architecture_is_named(shape, key):
    with pytest.raises(ValueError) as e:
        resolve_shape(shape)
    assert repr(key) in str(e.value) and repr(shape[key]) in str(e.value)


def test_the_gpt_oss_file_has_llama_cpp_s_tensors_and_window(tiny_swa):
    reader = gguf.GGUFReader(tiny_swa)
    kv = {k: f.contents() for k, f in reader.fields.items()}
    assert kv["general.architecture"] == "gpt-oss" and kv["gpt-oss.attention.sliding_window"] == 128
    names = {t.name for t in reader.tensors}
    for part in ("attn_sinks.weight", "post_attention_norm.weight", "attn_output.bias", "ffn_down_exps.bias"):
        assert f"blk.3.{part}" in names
    assert "blk.0.attn_q_norm.weight" not in names and "blk.0.ffn_norm.weight" not in names
    manifest = inspect_gguf(tiny_swa)
    assert (manifest["sliding_window"], manifest["swa_layers"]) == (128, [0, 2])  # gpt-oss: every other layer
    assert manifest["per_layer"][0]["expert_bytes"] > 0  # the experts' biases go with the experts


def test_which_layers_attend_to_the_window():
    gemma3 = swa_layers("gemma3", 18, 512, None)  # gemma3: five windowed layers, then one global
    assert [i for i in range(18) if i not in gemma3] == [5, 11, 17]
    assert swa_layers("cohere2moe", 8, 4096, None) == [1, 2, 3, 5, 6, 7]  # dense first
    assert swa_layers("gemma3", 4, 512, [True, False, True, False]) == [0, 2]  # the GGUF's own pattern
    assert swa_layers("gemma3", 4, 0, None) == []  # no window
    assert swa_layers("newarch", 4, 512, None) is None  # a window whose layout is unknown


# ----------------------------------------------------------------------------- the planner's KV cache

# gemma-3-270m: 18 layers, one KV head of 256, a 512-token window; llama-server allocated 39 MiB of KV at
# -c 8192 and llama-fit-params says 111 MiB at 32K (issue #27); 144 and 576 without the window.
GEMMA = {"layers": 18, "n_head_kv": 1, "head_dim": 256, "sliding_window": 512}


def gemma_kv(ctx: int, **settings) -> float:
    manifest = {**GEMMA, "swa_layers": swa_layers("gemma3", 18, 512, None)}
    return planner.kv_mib(
        manifest, {"ctx": ctx, "cache_type_k": "f16", "cache_type_v": "f16", "ubatch": 512, **settings}
    )


def test_the_planner_keeps_only_the_window_of_sliding_window_layers():
    assert gemma_kv(8192) == 39.0 and gemma_kv(32768) == 111.0
    assert gemma_kv(8192, swa_full=True) == 144.0 and gemma_kv(32768, swa_full=True) == 576.0
    # a context shorter than the window keeps it all; a larger ubatch widens the window's buffer
    assert gemma_kv(512) == 18 * 512 * 1024 / 2**20
    assert gemma_kv(8192, ubatch=2048) > gemma_kv(8192)


@pytest.mark.server
@pytest.mark.parametrize(
    "settings",
    [
        {"ctx": 4096},
        {"ctx": 4096, "parallel": 2},  # a window per slot
        {"ctx": 4096, "parallel": 2, "kv_unified": True},  # one window for both
        {"ctx": 4096, "ubatch": 256},
        {"ctx": 4096, "swa_full": True},
    ],
    ids=["np1", "np2", "np2-unified", "ub256", "swa-full"],
)
def test_the_planner_s_kv_cache_is_what_llama_server_allocates(tmp_path, tiny_swa, server_provenance, settings):
    config = {
        "models": {"tiny": {"source": f"file:{tiny_swa}"}},
        "defaults": {"threads": 2},
        "configurations": [{"settings": settings}],
        "workloads": [{"name": "short", "prompt_tokens": 64, "gen_tokens": 4}],
        "repetitions": 1,
    }
    rec = measure_one(tmp_path, "tiny", fetch_record(tiny_swa), server_provenance, config)
    assert rec["outcome"] == Outcome.OK, rec["message"]
    allocated = sum(float(m) for m in KV_SIZE_RE.findall((tmp_path / "server.log").read_text()))
    ran = {"cache_type_k": "f16", "cache_type_v": "f16", "ubatch": 512, "parallel": 1, **settings}
    assert allocated == pytest.approx(planner.kv_mib(inspect_gguf(tiny_swa), ran), abs=0.01)


@pytest.mark.server
def test_the_synthetic_window_makes_context_checkpoints(tmp_path, tiny_swa, server_provenance):
    """As on gemma: each turn's prompt, evaluated past the window, makes context checkpoints the record counts.
    Replies of 32 tokens of this random model hold byte tokens that end inside a UTF-8 character, which
    llama-server never streams alone: the turn's reply is counted by the server, not by the ids streamed."""
    config = {
        "models": {"tiny": {"source": f"file:{tiny_swa}"}},
        "defaults": {"threads": 2},
        "configurations": [{"settings": {"ctx": 4096}}],
        "workloads": [{"name": "short", "prompt_tokens": 64, "gen_tokens": 4}],
        "conversations": [
            {"name": "chat", "turn_tokens": 512, "reply_tokens": 32, "depth_tokens": 2200, "restart": False}
        ],
        "repetitions": 1,
    }
    rec = measure_one(tmp_path, "tiny", fetch_record(tiny_swa), server_provenance, config)
    assert rec["outcome"] == Outcome.OK, rec["message"]
    (talk,) = rec["conversations"]
    made = [t["checkpoints_created"] for t in talk["turns"]]
    assert len(made) == 4 and all(n >= 1 for n in made), made
    assert talk["checkpoints_held"] == sum(made) and talk["checkpoint_mib"] > 0
    f16 = {"cache_type_k": "f16", "cache_type_v": "f16"}
    # llama.cpp adds about 2 KiB of its own to the windowed layers' cells (0.127 MiB for 0.125)
    assert talk["checkpoint_mib"] == pytest.approx(planner.checkpoint_mib(inspect_gguf(tiny_swa), f16), abs=0.005)


def test_the_planner_counts_what_the_server_keeps_in_host_memory():
    """The host side (#23): the weights kept on the CPU, the KV of layers not offloaded, the prompt cache and the
    checkpoints at their limits. A checkpoint is the windowed layers over one window: 7.5 MiB on gemma-3-270m and
    3.0 MiB on the synthetic gpt-oss-20b, as their servers' logs say."""
    f16 = {"cache_type_k": "f16", "cache_type_v": "f16", "ubatch": 512}
    gemma = {**GEMMA, "swa_layers": swa_layers("gemma3", 18, 512, None)}
    assert planner.checkpoint_mib(gemma, f16) == 7.5
    assert planner.checkpoint_mib(gemma, {**f16, "swa_full": True}) == 0
    oss = {"layers": 24, "n_head_kv": 8, "head_dim": 64, "sliding_window": 128, "swa_layers": list(range(0, 24, 2))}
    assert planner.checkpoint_mib(oss, f16) == 3.0
    manifest = {
        **oss,
        "embedding_bytes": 10 << 20,
        "output_bytes": 20 << 20,
        "other_bytes": 0,
        "per_layer": [{"other_bytes": 4 << 20, "expert_bytes": 100 << 20} for _ in range(24)],
    }
    at = {**f16, "ctx": 32768, "n_gpu_layers": 999, "n_cpu_moe": 12, "parallel": 2}
    host = planner.host_mib(manifest, at)
    assert host["weights_mib"] == 10 + 12 * 100 and host["kv_mib"] == 0
    assert host["prompt_cache_mib"] == 8192 and host["checkpoints_mib"] == 3.0 * 32 * 2
    assert host["total_mib"] == 10 + 1200 + 8192 + 192
    # 20 layers offloaded: the 4 first stay on the CPU, whole, with their KV, and so does the output head (llama.cpp
    # offloads it only with -ngl above the layer count)
    partial = planner.host_mib(manifest, {**at, "n_gpu_layers": 20, "n_cpu_moe": 0, "cache_ram": 0})
    assert partial["weights_mib"] == 10 + 20 + 4 * 104 and partial["prompt_cache_mib"] == 0
    assert partial["kv_mib"] == planner.kv_mib(manifest, {**at, "n_gpu_layers": 4}) > 0
    # without a GPU every weight is in host memory; with no cache limit there is no bound
    cpu = planner.host_mib(manifest, {**at, "cache_ram": -1}, gpu=False)
    assert cpu["weights_mib"] == 10 + 20 + 24 * 104 and cpu["total_mib"] is None
