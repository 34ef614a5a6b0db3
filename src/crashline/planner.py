"""Predict a configuration's VRAM before running it, and find the n_cpu_moe boundary by search
instead of by trying every value.

Prediction, as a person would do it on paper:
  weights on the GPU  = the non-expert tensors of every offloaded layer
                      + the expert FFNs of the layers at or above n_cpu_moe
                      + the output head
  KV cache            = ctx × Σ layers (n_head_kv × head_dim × (bytes(K type) + bytes(V type)))
  compute buffer      = measured per ubatch from a server's log (linear between two measurements)
  the rest            = CUDA context and small buffers: measured peak − the three above
"""

from __future__ import annotations

from collections.abc import Callable

MIB = 1 << 20
# Bytes per element of each KV cache type (block formats: bytes per 32-element block / 32).
CACHE_TYPE_BYTES = {
    "f32": 4.0,
    "f16": 2.0,
    "bf16": 2.0,
    "q8_0": 34 / 32,
    "q4_0": 18 / 32,
    "q4_1": 20 / 32,
    "iq4_nl": 18 / 32,
    "q5_0": 22 / 32,
    "q5_1": 24 / 32,
}


def gpu_layers(manifest: dict, n_gpu_layers: int | None) -> list[int]:
    """llama.cpp offloads the last n_gpu_layers repeating layers."""
    layers = manifest["layers"]
    n = layers if n_gpu_layers is None else min(n_gpu_layers, layers)
    return list(range(layers - n, layers))


def weights_mib(manifest: dict, settings: dict) -> float:
    on_gpu = gpu_layers(manifest, settings.get("n_gpu_layers"))
    n_cpu_moe = settings.get("n_cpu_moe") or 0
    total = 0
    for layer in on_gpu:
        row = manifest["per_layer"][layer]
        total += row["other_bytes"] + row.get("shared_expert_bytes", 0)
        if layer >= n_cpu_moe:
            total += row["expert_bytes"]
    if (settings.get("n_gpu_layers") or 10**9) > manifest["layers"]:
        total += manifest["output_bytes"]
    return total / MIB


def kv_mib(manifest: dict, settings: dict) -> float:
    heads = manifest["n_head_kv"]
    layers = gpu_layers(manifest, settings.get("n_gpu_layers"))
    per_layer_heads = heads if isinstance(heads, list) else [heads] * manifest["layers"]
    width = sum(per_layer_heads[i] for i in layers) * manifest["head_dim"]
    per_token = width * (CACHE_TYPE_BYTES[settings["cache_type_k"]] + CACHE_TYPE_BYTES[settings["cache_type_v"]])
    return settings["ctx"] * per_token / MIB


class ComputeModel:
    """Compute-buffer MiB per ubatch from measurements: exact where measured, linear between two
    or more, proportional from one."""

    def __init__(self, measured: dict[int, float]):
        if not measured:
            raise ValueError("the compute buffer must be measured for at least one ubatch")
        self.measured = dict(sorted(measured.items()))

    def __call__(self, ubatch: int) -> float:
        if ubatch in self.measured:
            return self.measured[ubatch]
        points = list(self.measured.items())
        if len(points) == 1:
            ((u0, c0),) = points
            return c0 * ubatch / u0
        (u0, c0), (u1, c1) = points[0], points[-1]
        return c0 + (c1 - c0) * (ubatch - u0) / (u1 - u0)


def predict(manifest: dict, settings: dict, compute: ComputeModel, rest_mib: float) -> dict:
    w = weights_mib(manifest, settings)
    kv = kv_mib(manifest, settings)
    c = compute(settings["ubatch"])
    return {
        "weights_mib": round(w, 1),
        "kv_mib": round(kv, 1),
        "compute_mib": round(c, 1),
        "rest_mib": round(rest_mib, 1),
        "total_mib": round(w + kv + c + rest_mib, 1),
    }


def arithmetic(prediction: dict, limit_mib: float, margin_mib: float) -> str:
    """The prediction written out the way a person would check it."""
    p = prediction
    total = p["total_mib"]
    if total + margin_mib <= limit_mib:
        verdict = f"fits with the margin ({limit_mib - total:,.0f} MiB to spare)"
    elif total <= limit_mib:
        verdict = f"fits, but with {limit_mib - total:,.0f} MiB to spare, less than the margin"
    else:
        verdict = f"does not fit: {total - limit_mib:,.0f} MiB more than the card"
    return (
        f"weights {p['weights_mib']:,.0f} + KV {p['kv_mib']:,.0f} + compute {p['compute_mib']:,.0f} "
        f"+ rest {p['rest_mib']:,.0f} = {total:,.0f} MiB against {limit_mib:,.0f} MiB "
        f"(margin {margin_mib:,.0f}): {verdict}"
    )


def predicted_lowest(
    manifest: dict, settings: dict, compute: ComputeModel, rest_mib: float, limit_mib: float, margin_mib: float
) -> int:
    """The smallest n_cpu_moe predicted to fit with the margin (layers if none does)."""
    for n in range(manifest["layers"] + 1):
        if predict(manifest, {**settings, "n_cpu_moe": n}, compute, rest_mib)["total_mib"] + margin_mib <= limit_mib:
            return n
    return manifest["layers"]


def search_lowest(
    survives: Callable[[int], bool], start: int, lo: int, hi: int
) -> tuple[int | None, list[tuple[int, bool]]]:
    """The smallest n in [lo, hi] for which ``survives(n)``, assuming survival is monotonic in n.

    Starts at the prediction and gallops (steps 1, 2, 4, ...) toward the boundary until it is
    bracketed, then bisects: about two probes when the prediction is right, O(log range) when not.
    Returns the boundary (None if even ``hi`` fails) and the probes in order.
    """
    probes: list[tuple[int, bool]] = []
    seen: dict[int, bool] = {}

    def probe(n: int) -> bool:
        if n not in seen:
            seen[n] = survives(n)
            probes.append((n, seen[n]))
        return seen[n]

    start = min(max(start, lo), hi)
    if probe(start):
        good, step, bad = start, 1, lo - 1
        while good - step >= lo:
            if probe(good - step):
                good, step = good - step, step * 2
            else:
                bad = good - step
                break
    else:
        bad, step, good = start, 1, None
        while bad + step <= hi:
            if probe(bad + step):
                good = bad + step
                break
            bad, step = bad + step, step * 2
        if good is None:
            if bad < hi and probe(hi):
                good = hi
            else:
                return None, probes
    while good - bad > 1:
        mid = (good + bad) // 2
        if probe(mid):
            good = mid
        else:
            bad = mid
    return good, probes
