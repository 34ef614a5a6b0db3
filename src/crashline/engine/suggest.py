"""Predict, from the GGUF alone and in seconds, the lowest ``--n-cpu-moe`` that fits a card: no server starts.

The prediction is the planner's (``planner.predict``): the weights each layer puts on the GPU, the KV cache,
a compute buffer and "the rest", added and compared with the card's VRAM less a margin. Weights and KV cache
come from the manifest and are exact (within 1% of the buffers llama.cpp reported on an H200). The compute
buffer and the rest depend on the GPU, the driver and llama.cpp's graph; they come from a calibration (one real
server start: ``search_rules.calibration``, kept in search.json as ``compute_mib`` {ubatch: MiB} and ``rest_mib``),
or, without one, from the estimates below, and the result is then marked uncalibrated.

Uncalibrated estimates (llama.cpp has no closed formula: it sizes the compute buffer by allocating the worst-case
graph, ``llama_context::sched_reserve``):

- compute buffer = KQ mask + activations + an allowance, where
  - the KQ mask is ctx × ubatch × 2 bytes: with flash attention it is an f16 [n_kv, n_tokens] tensor that lives
    through every layer (llama.cpp ``build_attn_inp_kq_mask``; n_kv is the whole cache at reserve time);
  - the activations are ubatch × 4 bytes × max(2·n_expert_used·(n_embd + expert_ffn) + 4·n_embd,
    3·n_head·head_dim + 3·n_embd): the expert outputs and gate/up products of one MoE layer, or the attention's
    query, output and residuals, whichever is larger. Checked against the compute buffer the CPU build of
    llama.cpp 11434 reported for 16 synthetic qwen3moe shapes of two layers or more (n_embd 256–4096, 2–16
    experts used, expert FFN 128–3072, 4–64 heads; ctx 512–131072, ubatch 512–2048): the activations 7–42% above
    it, never below, the mask exact. (A one-layer model is smaller: its only layer is also the last, which runs
    its feed-forward on the output row alone.) tests/test_suggest.py repeats the check on two shapes;
  - the allowance is ``COMPUTE_ALLOWANCE_MIB``: on the H200 (CUDA) the compute buffer at ubatch 512 was 64 MiB
    above mask + activations (200 MiB against 136), at ubatch 2048 68 MiB below (476 against 544).
- the rest is ``REST_ESTIMATE_MIB``: on the H200 the process held 591 MiB more than its CUDA0 buffers at load
  (CUDA context, cuBLAS, small buffers) in every record. A smaller GPU's CUDA context is usually smaller, so this
  errs high. What serving adds on top (``planner.SERVING_MIB``) is the planner's.

Calibrated, a compute buffer measured at another ubatch is used as follows: between two measured ubatches,
linearly; below the smallest, the smallest's value (an upper bound: the buffer grows with the ubatch); above the
largest, the largest's value plus the estimate's growth per token. A calibration at another context is moved by
the difference of the KQ mask (ctx × ubatch × 2 bytes), exact on the CPU build from ctx 4096 to 131072.

Other rules: the context llama.cpp allocates is ctx rounded up to a multiple of 256 (per slot when the slots
are not unified), so the KV cache counts those cells; flash attention is on (``-fa auto`` chooses it on CUDA;
``-fa off`` adds ctx × ubatch × n_head × 4 bytes, 8 GiB at 32K × 2048 × 32 heads); one GPU and every layer
offloaded (``-ngl 999``; the token embeddings stay on the CPU, the output head goes to the GPU).

A prediction is of the peak while serving, like the planner's (``planner.predict``): the peak at load plus
``planner.SERVING_MIB``, which did not grow from 16K to 100K tokens (bench/results/lease-2026-12-04-s19/).

Cards (``what_if``): N GB as marketed is N × 1024 MiB, what ``nvidia-smi`` reports as the total of consumer
cards of that size (RTX 3060 12 GB: 12,288; RTX 3090: 24,576; RTX 4090: 24,564, 12 MiB less) and of the
A100 80 GB (81,920). Cards with ECC on report less: H100 80 GB 81,559, L40S 48 GB 46,068, L4 and A10 24 GB
23,034 and 23,028 (6% less). A desktop on the same GPU takes more. For such a card give its own total.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from . import planner
from ..core import settings as settings_mod
from .suggest_inputs import (
    Calibration,
    SuggestError,
    calibration_from,
    default_margin_mib,
    load_model,
    model_name,
    parse_ubatches,
)

MIB = planner.MIB
DEFAULT_UBATCHES = (512, 2048)
WHAT_IF_CTXS = (8192, 32768, 131072)
# Cards by their marketed size and the MiB such a card reports (module docstring: N GB = N × 1024 MiB).
CARDS: tuple[tuple[str, int], ...] = tuple((f"{gb} GB", gb * 1024) for gb in (8, 12, 16, 24, 32, 48, 80))
REST_ESTIMATE_MIB = 600  # 591 MiB at load on the H200, rounded up (serving adds planner.SERVING_MIB)
COMPUTE_ALLOWANCE_MIB = 128  # CUDA's compute buffer above mask + activations (64 MiB on the H200 at ubatch 512)
CTX_PAD = 256  # llama.cpp rounds the context (per slot) up to a multiple of this
DEFAULT_BATCH = 2048  # llama-server's -b; a larger -ub needs -b raised with it

ALL_ON_GPU = "all on GPU"  # --n-cpu-moe 0 fits with the margin
FITS = "fits"  # the lowest value that fits is above 0
NO_FIT = "does not fit"  # not even with every expert layer on the CPU
PART_ON_GPU = "part on GPU"  # a model without experts: the most layers that fit are offloaded (-ngl N)


# -- the arithmetic -----------------------------------------------------------------------------------------------


def _largest(value: Any) -> int:
    return max(value) if isinstance(value, list) else int(value or 0)


def allocated_ctx(ctx: int, parallel: int = 1) -> int:
    """The KV cells llama.cpp allocates for ``-c ctx -np parallel``: ctx rounded up to 256; when the slots are not
    unified, each slot's share rounded up to 256 again (``llama_context``). The larger of the two."""
    total = -(-ctx // CTX_PAD) * CTX_PAD
    per_slot = -(-(total // parallel) // CTX_PAD) * CTX_PAD
    return max(total, per_slot * parallel)


def activation_floats_per_token(manifest: dict) -> int:
    """The f32 activations per token of the largest stage of one layer (module docstring)."""
    e = _largest(manifest["n_embd"])
    k = int(manifest.get("n_expert_used") or 0)
    f = _largest(manifest.get("expert_ffn"))
    if not (k and f):  # a dense model: the manifest has no dense FFN length; take the usual 4 × n_embd
        k, f = 1, 4 * e
    attention = 3 * _largest(manifest["n_head"]) * int(manifest["head_dim"]) + 3 * e
    return max(2 * k * (e + f) + 4 * e, attention)


def estimated_compute_mib(manifest: dict, ubatch: int, ctx_cells: int) -> float:
    """Uncalibrated compute buffer (MiB): KQ mask + activations + allowance (module docstring)."""
    tokens = min(ubatch, ctx_cells)
    mask = ctx_cells * tokens * 2
    return (mask + tokens * 4 * activation_floats_per_token(manifest)) / MIB + COMPUTE_ALLOWANCE_MIB


def _mask_mib(ctx_cells: int, tokens: int) -> float:
    return ctx_cells * tokens * 2 / MIB


def calibrated_compute_mib(manifest: dict, cal: Calibration, ubatch: int, ctx_cells: int) -> tuple[float, str]:
    """The compute buffer at ``ubatch`` and ``ctx_cells`` from a calibration, and how it was obtained."""
    shift = 0 if cal.ctx is None else ctx_cells - allocated_ctx(cal.ctx)
    # each measured point moved to this context by its KQ mask (ctx × ubatch × 2 bytes)
    points = {u: mib + _mask_mib(shift, min(u, ctx_cells)) for u, mib in sorted(cal.compute_mib.items())}
    moved = f", moved to ctx {ctx_cells} by the KQ mask" if shift else ""
    where = f"measured at -ub {ubatch}"
    if ubatch in points:
        return points[ubatch], where + moved
    below = [u for u in points if u < ubatch]
    above = [u for u in points if u > ubatch]
    if below and above:
        u0, u1 = below[-1], above[0]
        c0, c1 = points[u0], points[u1]
        return c0 + (c1 - c0) * (ubatch - u0) / (u1 - u0), f"between -ub {u0} and -ub {u1}, linearly{moved}"
    if above:
        u0 = above[0]
        return points[u0], f"taken from -ub {u0} (an upper bound: the buffer grows with the ubatch){moved}"
    u0 = below[-1]
    per_token = (4 * activation_floats_per_token(manifest) + 2 * ctx_cells) / MIB
    grown = (min(ubatch, ctx_cells) - min(u0, ctx_cells)) * per_token
    return points[u0] + grown, f"from -ub {u0} plus the estimate's {per_token * 1024:,.0f} KiB per token{moved}"


def _settings(ubatch: int, ctx_cells: int, cache_k: str, cache_v: str) -> dict:
    return {"n_gpu_layers": 999, "ctx": ctx_cells, "ubatch": ubatch, "cache_type_k": cache_k, "cache_type_v": cache_v}


def predictions(
    manifest: dict,
    ctx_cells: int,
    ubatch: int,
    cache_k: str,
    cache_v: str,
    calibration: Calibration | None,
    vary: str = "n_cpu_moe",
) -> tuple[list[dict], str]:
    """``planner.predict`` for every value of ``vary`` from 0 to the layer count (``n_cpu_moe``: expert layers kept
    on the CPU; ``n_gpu_layers``: layers offloaded, for a model without experts), and where the compute buffer came
    from."""
    if calibration is None:
        compute, source = estimated_compute_mib(manifest, ubatch, ctx_cells), "estimated"
        rest = REST_ESTIMATE_MIB
    else:
        compute, source = calibrated_compute_mib(manifest, calibration, ubatch, ctx_cells)
        rest = calibration.rest_mib
    base = _settings(ubatch, ctx_cells, cache_k, cache_v)
    out = [
        planner.predict(manifest, {**base, vary: n}, lambda _ubatch: compute, rest)
        for n in range(manifest["layers"] + 1)
    ]
    return out, source


def highest_offload(preds: list[dict], vram_mib: float, margin_mib: float) -> int | None:
    """The most layers offloaded (``preds`` by n_gpu_layers) whose predicted total plus the margin is at most the
    VRAM (None: not even none is)."""
    return next((n for n in range(len(preds) - 1, -1, -1) if preds[n]["total_mib"] + margin_mib <= vram_mib), None)


def lowest_fitting(preds: list[dict], vram_mib: float, margin_mib: float) -> int | None:
    """The smallest n_cpu_moe whose predicted total plus the margin is at most the VRAM (None: none is)."""
    return next((n for n, p in enumerate(preds) if p["total_mib"] + margin_mib <= vram_mib), None)


def _status(n: int | None) -> str:
    return NO_FIT if n is None else ALL_ON_GPU if n == 0 else FITS


# -- suggest ------------------------------------------------------------------------------------------------------


def _given(ctx: int, ubatch: int, cache_k: str, cache_v: str, parallel: int, **placement) -> dict:
    """The settings a prediction is of, as crashline would write them: ``-b`` at least the micro-batch, and the
    placement (``n_cpu_moe`` or ``n_gpu_layers``) where one is given."""
    return {
        **placement,
        "ctx": ctx,
        "ubatch": ubatch,
        "batch": max(ubatch, DEFAULT_BATCH),
        "cache_type_k": cache_k,
        "cache_type_v": cache_v,
        "parallel": parallel,
    }


def _check(ctx: int, cache_k: str, cache_v: str, parallel: int, ubatches: tuple[int, ...]) -> None:
    """The settings as crashline would check them (SettingsError names the setting and the value)."""
    for u in ubatches:
        settings_mod.resolve(_given(ctx, u, cache_k, cache_v, parallel))


def _assumptions(
    manifest: dict, ctxs: Iterable[int], parallel: int, cal: Calibration | None, cache_k: str, cache_v: str
) -> list[str]:
    out = ["a prediction from the model's manifest, not a measurement: no server was started"]
    if cal is None:
        per_token = activation_floats_per_token(manifest) * 4 / 1024
        out.append(
            "uncalibrated: the compute buffer is estimated as the KQ mask (ctx × ubatch × 2 bytes) + ubatch × "
            f"{per_token:,.0f} KiB of activations + {COMPUTE_ALLOWANCE_MIB} MiB, and the rest (CUDA context, cuBLAS, "
            f"the memory pool) as {REST_ESTIMATE_MIB} MiB, from one H200; one server start calibrates them "
            "(crashline search, then --calibration search.json)"
        )
    else:
        measured = ", ".join(f"{mib:,.0f} MiB at -ub {u}" for u, mib in sorted(cal.compute_mib.items()))
        at = f" (ctx {cal.ctx})" if cal.ctx is not None else " (its ctx unknown: taken as the one predicted)"
        out.append(f"calibrated by {cal.source}{at}: compute buffer {measured}, rest {cal.rest_mib:,.0f} MiB")
    out.append(
        "flash attention on (-fa auto chooses it on CUDA); one GPU with every layer offloaded (-ngl 999) unless a "
        "line says -ngl N; "
        f"KV cache K {cache_k}, V {cache_v}, for ctx rounded up to a multiple of {CTX_PAD}"
        + (" per slot" if parallel > 1 else "")
    )
    trained = manifest.get("context_length")
    trained = _largest(trained) if trained else None
    beyond = sorted(c for c in set(ctxs) if trained and c > trained)
    if beyond:
        out.append(
            f"ctx {', '.join(map(str, beyond))} is above the model's trained context ({trained:,}): llama.cpp "
            f"allocates the KV cache for all of it but serves each slot at most {trained:,} tokens"
        )
    out.append(
        f"the peak while serving, as the planner predicts it: the peak at load plus {planner.SERVING_MIB:,.0f} MiB, "
        "the most the H200 added with the first request at any depth from 16K to 100K tokens"
    )
    if not any(row["expert_bytes"] for row in manifest["per_layer"]):
        out.append("the model has no expert tensors: --n-cpu-moe changes nothing")
    return out


def _end(prediction: dict, n: int, vram_mib: float, margin_mib: float) -> dict:
    """One end of the range (every expert on the GPU, or every expert layer on the CPU)."""
    return {
        "n_cpu_moe": n,
        "predicted_mib": prediction["total_mib"],
        "fits": prediction["total_mib"] + margin_mib <= vram_mib,
        "arithmetic": planner.arithmetic(prediction, vram_mib, margin_mib),
    }


def suggest(
    model: Any,
    vram_mib: int,
    ctx: int,
    *,
    ubatches: Iterable[int] = DEFAULT_UBATCHES,
    cache_type_k: str = "f16",
    cache_type_v: str | None = None,
    parallel: int = 1,
    margin_mib: int | None = None,
    calibration: Any = None,
) -> dict:
    """The lowest ``--n-cpu-moe`` predicted to fit ``vram_mib`` with ``margin_mib`` to spare, per ubatch.

    ``model``: a GGUF path, a manifest.json path or a manifest dict. ``cache_type_v`` defaults to
    ``cache_type_k``; ``margin_mib`` to crashline's budget margin (``default_margin_mib``); ``calibration``:
    anything ``calibration_from`` reads, or None for the uncalibrated estimate. Plain data (JSON-serialisable):

    ``kind`` "prediction", ``measured`` False, ``calibrated``, ``model``, ``layers``, ``expert_layers``,
    ``vram_mib``, ``ctx``, ``ctx_cells`` (what llama.cpp allocates), ``cache_type_k``, ``cache_type_v``,
    ``parallel``, ``margin_mib``, ``calibration`` (None or its fields), ``assumptions`` (sentences), and
    ``ubatches``: one dict per ubatch with ``ubatch``, ``n_cpu_moe`` (None: does not fit), ``status`` (``ALL_ON_GPU``,
    ``FITS`` or ``NO_FIT``), ``predicted_mib`` and ``headroom_mib`` (VRAM less the prediction; at every expert
    layer on the CPU when nothing fits), ``prediction`` (weights, KV, compute, rest, total), ``arithmetic``
    (``planner.arithmetic``), ``compute_from``, ``all_on_gpu`` and ``all_experts_on_cpu`` (each ``n_cpu_moe``,
    ``predicted_mib``, ``fits``, ``arithmetic``), ``args`` (the llama-server arguments; None when nothing fits)
    and ``values`` (``n_cpu_moe``, ``predicted_mib`` for every value).
    """
    manifest = load_model(model)
    cal = None if calibration is None else calibration_from(calibration)
    cache_type_v = cache_type_v or cache_type_k
    margin = default_margin_mib() if margin_mib is None else margin_mib
    ubs = parse_ubatches(ubatches)
    _check(ctx, cache_type_k, cache_type_v, parallel, ubs)
    if isinstance(vram_mib, bool) or not isinstance(vram_mib, (int, float)) or vram_mib <= 0:
        raise SuggestError(f"vram_mib {vram_mib!r} must be a positive number of MiB (parse_size_mib reads '24GiB')")
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or margin < 0:
        raise SuggestError(f"margin_mib {margin!r} must be a number of MiB, 0 or more")
    if margin >= vram_mib:
        raise SuggestError(
            f"--margin {margin:,} MiB is not less than the card's {vram_mib:,} MiB, so nothing could fit with it; "
            "give a margin smaller than the card (the default is 1024 MiB)"
        )
    cells = allocated_ctx(ctx, parallel)
    layers = manifest["layers"]
    rows = []
    # llama.cpp runs at most the context per micro-batch: a larger -ub is that (one row per ubatch it runs)
    asked = {}
    for u in ubs:
        asked.setdefault(min(u, cells), u)
    for u, wanted in asked.items():
        preds, source = predictions(manifest, cells, u, cache_type_k, cache_type_v, cal)
        n = lowest_fitting(preds, vram_mib, margin)
        at = preds[layers if n is None else n]

        given = _given(ctx, u, cache_type_k, cache_type_v, parallel, n_cpu_moe=n)
        # a model without experts that does not fit whole: the most layers that do (-ngl N), the rest on the CPU
        ngl = None
        if n is None and not any(row["expert_bytes"] for row in manifest["per_layer"]):
            by_layers, _ = predictions(manifest, cells, u, cache_type_k, cache_type_v, cal, vary="n_gpu_layers")
            ngl = highest_offload(by_layers, vram_mib, margin)
            if ngl is not None:
                at = by_layers[ngl]
                given = _given(ctx, u, cache_type_k, cache_type_v, parallel, n_gpu_layers=ngl)
        rows.append(
            {
                "ubatch": u,
                "asked_ubatch": None if wanted == u else wanted,
                "n_gpu_layers": ngl,  # a dense model's partial offload, where it is the answer
                "n_cpu_moe": n,
                "status": _status(n) if ngl is None else PART_ON_GPU,
                "predicted_mib": at["total_mib"],
                "headroom_mib": round(vram_mib - at["total_mib"], 1),
                "prediction": at,
                "arithmetic": planner.arithmetic(at, vram_mib, margin),
                "compute_from": source,
                "all_on_gpu": _end(preds[0], 0, vram_mib, margin),
                "all_experts_on_cpu": _end(preds[layers], layers, vram_mib, margin),
                "args": None if n is None and ngl is None else settings_mod.server_args(settings_mod.resolve(given)),
                "host": planner.host_mib(manifest, {**_settings(u, cells, cache_type_k, cache_type_v), **given}),
                "values": [{"n_cpu_moe": k, "predicted_mib": p["total_mib"]} for k, p in enumerate(preds)],
            }
        )
    return {
        "kind": "prediction",
        "measured": False,
        "calibrated": cal is not None,
        "model": model_name(manifest),
        "model_path": manifest.get("path"),
        "layers": layers,
        "expert_layers": sum(1 for row in manifest["per_layer"] if row["expert_bytes"]),
        "vram_mib": vram_mib,
        "ctx": ctx,
        "ctx_cells": cells,
        "cache_type_k": cache_type_k,
        "cache_type_v": cache_type_v,
        "parallel": parallel,
        "margin_mib": margin,
        "calibration": None if cal is None else {**cal.__dict__, "compute_mib": dict(cal.compute_mib)},
        "assumptions": _assumptions(manifest, [ctx], parallel, cal, cache_type_k, cache_type_v),
        "ubatches": rows,
    }


def on_cpu(
    model: Any,
    ctx: int,
    *,
    ubatches: Iterable[int] = DEFAULT_UBATCHES,
    cache_type_k: str = "f16",
    cache_type_v: str | None = None,
    parallel: int = 1,
) -> dict:
    """Without a GPU every layer runs on the CPU: per ubatch the llama-server arguments (``-ngl 0``) and the host
    memory the planner counts (``planner.host_mib``). Plain data: ``model``, ``model_path``, ``layers``, ``ctx``,
    ``ubatches`` (each ``ubatch``, ``args``, ``host``)."""
    manifest = load_model(model)
    cache_type_v = cache_type_v or cache_type_k
    ubs = parse_ubatches(ubatches)
    _check(ctx, cache_type_k, cache_type_v, parallel, ubs)
    cells = allocated_ctx(ctx, parallel)
    rows = []
    for u in sorted({min(u, cells) for u in ubs}):  # llama.cpp runs at most the context per micro-batch
        given = _given(ctx, u, cache_type_k, cache_type_v, parallel, n_gpu_layers=0)
        settings = {**_settings(u, cells, cache_type_k, cache_type_v), **given}
        rows.append(
            {
                "ubatch": u,
                "args": settings_mod.server_args(settings_mod.resolve(given)),
                "host": planner.host_mib(manifest, settings, gpu=False),
            }
        )
    return {
        "model": model_name(manifest),
        "model_path": manifest.get("path"),
        "layers": manifest["layers"],
        "ctx": ctx,
        "ubatches": rows,
    }


# -- what if ------------------------------------------------------------------------------------------------------


def what_if(
    model: Any,
    calibration: Any = None,
    *,
    cards: Iterable[tuple[str, int]] = CARDS,
    ctxs: Iterable[int] = WHAT_IF_CTXS,
    ubatches: Iterable[int] = DEFAULT_UBATCHES,
    cache_type_k: str = "f16",
    cache_type_v: str | None = None,
    parallel: int = 1,
    margin_mib: int | None = None,
) -> dict:
    """The predicted lowest safe ``--n-cpu-moe`` for every card × ctx × ubatch, from one calibration (None: the
    uncalibrated estimate). ``cards``: (label, MiB) pairs, by default ``CARDS`` (8 to 80 GB, N GB = N × 1024 MiB).

    Plain data: ``kind`` "what-if prediction", ``measured`` False, ``calibrated``, ``model``, ``margin_mib``,
    ``cache_type_k``, ``cache_type_v``, ``parallel``, ``calibration``, ``cards`` ([{card, vram_mib}]), ``ctxs``,
    ``ubatches``, ``assumptions`` (sentences; the card rule first), and ``rows``, ordered by card, ctx and ubatch,
    each ``{card, vram_mib, ctx, ubatch, n_cpu_moe, status, predicted_mib, headroom_mib}``: ``n_cpu_moe`` is the
    lowest value that fits with the margin (None with ``status`` ``NO_FIT``); ``predicted_mib`` the prediction
    at that value (at every expert layer on the CPU when nothing fits); ``headroom_mib`` the VRAM less it.
    """
    manifest = load_model(model)
    cal = None if calibration is None else calibration_from(calibration)
    cache_type_v = cache_type_v or cache_type_k
    margin = default_margin_mib() if margin_mib is None else margin_mib
    cards = [(str(label), int(mib)) for label, mib in cards]
    ctxs, ubs = sorted(set(ctxs)), parse_ubatches(ubatches)
    for ctx in ctxs:
        _check(ctx, cache_type_k, cache_type_v, parallel, ubs)
    rows = []
    for ctx in ctxs:
        cells = allocated_ctx(ctx, parallel)
        for u in ubs:
            preds, _ = predictions(manifest, cells, u, cache_type_k, cache_type_v, cal)
            for label, vram in cards:
                n = lowest_fitting(preds, vram, margin)
                total = preds[manifest["layers"] if n is None else n]["total_mib"]
                rows.append(
                    {
                        "card": label,
                        "vram_mib": vram,
                        "ctx": ctx,
                        "ubatch": u,
                        "n_cpu_moe": n,
                        "status": _status(n),
                        "predicted_mib": total,
                        "headroom_mib": round(vram - total, 1),
                    }
                )
    order = {label: i for i, (label, _) in enumerate(cards)}
    rows.sort(key=lambda r: (order[r["card"]], r["ctx"], r["ubatch"]))
    card_rule = (
        "cards as marketed: N GB = N × 1024 MiB, the total nvidia-smi reports for consumer cards of that size "
        "(RTX 4090: 24,564); cards with ECC on report up to 6% less (L40S 48 GB: 46,068)"
    )
    return {
        "kind": "what-if prediction",
        "measured": False,
        "calibrated": cal is not None,
        "model": model_name(manifest),
        "margin_mib": margin,
        "cache_type_k": cache_type_k,
        "cache_type_v": cache_type_v,
        "parallel": parallel,
        "calibration": None if cal is None else {**cal.__dict__, "compute_mib": dict(cal.compute_mib)},
        "cards": [{"card": label, "vram_mib": mib} for label, mib in cards],
        "ctxs": ctxs,
        "ubatches": list(ubs),
        "assumptions": [card_rule, *_assumptions(manifest, ctxs, parallel, cal, cache_type_k, cache_type_v)],
        "rows": rows,
    }
