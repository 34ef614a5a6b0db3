"""Predict a configuration's VRAM before running it, find the n_cpu_moe boundary by search
instead of by trying every value, and find the fastest value above it (pure functions: each takes
the measurement as a callback).

Prediction, as a person would do it on paper:
  weights on the GPU  = the non-expert tensors of every offloaded layer
                      + the expert FFNs of the layers at or above n_cpu_moe (less those of one layer that a partial
                        placement's -ot keeps on the CPU)
                      + the output head
  KV cache            = Σ offloaded layers cells × n_head_kv × head_dim × (bytes(K type) + bytes(V type)),
                        cells = ctx, or for a sliding-window layer (unless swa_full) the window per slot
                        plus one ubatch, padded to 256 cells, as llama.cpp's llama_kv_cache_iswa sizes it
  compute buffer      = measured per ubatch from a server's log (linear between two measurements), plus the
                        activations a layer split between the CPU and the card sends across
  the rest            = CUDA context and small buffers: measured peak − the three above
"""

from __future__ import annotations

import math
import re

from collections.abc import Callable
from dataclasses import dataclass
from ..core.units import MIB

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
    partial = Partial.of(settings)
    total = 0
    for layer in on_gpu:
        row = manifest["per_layer"][layer]
        total += row["other_bytes"] + row.get("shared_expert_bytes", 0)
        if layer >= n_cpu_moe:
            total += row["expert_bytes"]
            if partial is not None and layer == partial.whole:
                total -= sum((row.get("expert_tensor_bytes") or {}).get(name, 0) for name in partial.on_cpu)
    if (settings.get("n_gpu_layers") or 10**9) > manifest["layers"]:
        total += manifest["output_bytes"]
    return total / MIB


def swa_cells(manifest: dict, settings: dict, read: bool = False) -> int | None:
    """The cells llama.cpp gives each sliding-window layer at ``settings`` (None: the model has none, or
    ``swa_full`` keeps them whole), or that one token reads there (``read``: ``min(ctx, window)``).

    Allocated, padded to 256: one buffer ``min(ctx, window × slots + ubatch)`` with a unified KV cache
    (``kv_unified``, or one slot), else one ``min(ctx / slots, window + ubatch)`` per slot (llama-server's
    default when ``-np`` is given)."""
    window = manifest.get("sliding_window") or 0
    if not window or not manifest.get("swa_layers") or settings.get("swa_full"):
        return None
    ctx = settings["ctx"]
    if read:
        return min(ctx, window)
    slots, ubatch = int(settings.get("parallel") or 1), int(settings.get("ubatch") or 512)
    if slots == 1 or settings.get("kv_unified"):
        return -(-min(ctx, window * slots + ubatch) // 256) * 256
    return slots * (-(-min(ctx // slots, window + ubatch) // 256) * 256)


def kv_mib(manifest: dict, settings: dict, read: bool = False) -> float:
    """The KV cache of the offloaded layers at ``settings`` (allocated; ``read``: what one token reads)."""
    heads = manifest["n_head_kv"]
    layers = gpu_layers(manifest, settings.get("n_gpu_layers"))
    per_layer_heads = heads if isinstance(heads, list) else [heads] * manifest["layers"]
    swa = set(manifest.get("swa_layers") or ())
    window = swa_cells(manifest, settings, read)
    cells = sum(per_layer_heads[i] * (window if window is not None and i in swa else settings["ctx"]) for i in layers)
    per_cell = manifest["head_dim"] * (
        CACHE_TYPE_BYTES[settings["cache_type_k"]] + CACHE_TYPE_BYTES[settings["cache_type_v"]]
    )
    return cells * per_cell / MIB


def mask_mib(settings: dict) -> float:
    """The attention mask each micro-batch builds in the compute buffer, the part of it that grows with the context:
    ubatch × ctx cells in F16, as llama.cpp builds it with flash attention (gemma-3-270m on the CPU at -ub 512: its
    compute buffer 23.28 MiB at -c 4,096, 39.28 at -c 20,480, as its logs say: bench/results/context-cpu-gemma/).
    Without flash attention the attention scores grow with the context too, and this counts less than is used."""
    return min(settings["ubatch"], settings["ctx"]) * settings["ctx"] * 2 / MIB


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


# What a card holds while serving beyond its peak at load: it comes with the first request and stays, whatever the
# depth (148 MiB on two shapes at 16K and 40K, 154 on the seed-scale shape at 16K and at 100K, two starts each:
# bench/results/lease-2026-12-04-s19/). The largest measured, so that the margin is not spent on it.
SERVING_MIB = 154.0


def predict(manifest: dict, settings: dict, compute: ComputeModel, rest_mib: float) -> dict:
    """The card's peak while serving: the weights and KV cache it holds, the compute buffer at this ubatch, the rest
    (CUDA context, small buffers: ``rest_mib``, measured at load) and ``SERVING_MIB``; ``load_mib`` is the peak at
    load, the same less ``SERVING_MIB``."""
    w = weights_mib(manifest, settings)
    kv = kv_mib(manifest, settings)
    c = compute(settings["ubatch"])
    if (partial := Partial.of(settings)) is not None:
        c += split_layer_mib(manifest, settings["ubatch"], partial.on_cpu)
    return {
        "weights_mib": round(w, 1),
        "kv_mib": round(kv, 1),
        "compute_mib": round(c, 1),
        "rest_mib": round(rest_mib, 1),
        "serving_mib": SERVING_MIB,
        "load_mib": round(w + kv + c + rest_mib, 1),
        "total_mib": round(w + kv + c + rest_mib + SERVING_MIB, 1),
    }


# llama.cpp's defaults (common.h) for what a server keeps in host memory besides the model: the host prompt cache
# (--cache-ram) and the context checkpoints of each slot (--ctx-checkpoints).
DEFAULT_CACHE_RAM_MIB = 8192
DEFAULT_CTX_CHECKPOINTS = 32


def checkpoint_mib(manifest: dict, settings: dict) -> float:
    """One context checkpoint: the sliding-window layers' cache over one window (what llama.cpp saves of a slot so
    that it can go back past the window); 0 for a model without such layers or with ``swa_full`` (none is made).
    gemma-3-270m: 7.5 MiB; the synthetic gpt-oss-20b: 3.0 MiB, as their logs say."""
    window = manifest.get("sliding_window") or 0
    swa = manifest.get("swa_layers") or []
    if not window or not swa or settings.get("swa_full"):
        return 0.0
    heads = manifest["n_head_kv"]
    per_layer = heads if isinstance(heads, list) else [heads] * manifest["layers"]
    width = sum(per_layer[i] for i in swa) * manifest["head_dim"]
    return (
        window * width * (CACHE_TYPE_BYTES[settings["cache_type_k"]] + CACHE_TYPE_BYTES[settings["cache_type_v"]]) / MIB
    )


def host_mib(manifest: dict, settings: dict, gpu: bool = True) -> dict:
    """What the server holds in host memory at most, as the planner counts it: the weights kept on the CPU (the
    embedding, the layers not offloaded, the experts of the layers below n_cpu_moe; everything without a ``gpu``),
    the KV cache of the layers not offloaded, the host prompt cache at its limit (--cache-ram: 8192 MiB unless set,
    0 off, -1 no limit, then None) and every slot's context checkpoints at their limit (--ctx-checkpoints, 32). The
    compute buffers and the runtime are not counted: a server start measures them (its RSS at load)."""
    layers = manifest["layers"]
    on_gpu = set(gpu_layers(manifest, settings.get("n_gpu_layers"))) if gpu else set()
    n_cpu_moe = settings.get("n_cpu_moe") or 0
    weights = manifest["embedding_bytes"] + manifest.get("other_bytes", 0)
    if not gpu or (settings.get("n_gpu_layers") or 10**9) <= layers:
        weights += manifest["output_bytes"]
    for layer, row in enumerate(manifest["per_layer"]):
        if layer not in on_gpu:
            weights += row["other_bytes"] + row.get("shared_expert_bytes", 0) + row["expert_bytes"]
        elif layer < n_cpu_moe:
            weights += row["expert_bytes"]
    every_layer = kv_mib(manifest, {**settings, "n_gpu_layers": layers})
    kv = every_layer - kv_mib(manifest, settings) if gpu else every_layer
    cache = settings.get("cache_ram")
    cache = DEFAULT_CACHE_RAM_MIB if cache is None else (None if cache < 0 else float(cache))
    slots = int(settings.get("parallel") or 1)
    per_slot = settings.get("ctx_checkpoints")
    checkpoints = (
        checkpoint_mib(manifest, settings) * slots * (DEFAULT_CTX_CHECKPOINTS if per_slot is None else per_slot)
    )
    parts = {"weights_mib": weights / MIB, "kv_mib": kv, "prompt_cache_mib": cache, "checkpoints_mib": checkpoints}
    total = None if cache is None else sum(parts.values())
    return {
        **{k: None if v is None else round(v, 1) for k, v in parts.items()},
        "total_mib": None if total is None else round(total, 1),
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
        f"+ rest {p['rest_mib']:,.0f} + serving {p['serving_mib']:,.0f} = {total:,.0f} MiB "
        f"against {limit_mib:,.0f} MiB "
        f"(margin {margin_mib:,.0f}): {verdict}"
    )


def calibration_value(manifest: dict, lo: int, hi: int) -> int:
    """The n_cpu_moe a search calibrates on: the most expert layers on the CPU with one still on the card (the
    load most likely to fit whose compute buffer is the probes'). With every expert on the CPU the card's compute
    buffer can be smaller than with any on it: at -ub 2048, -c 131072, q4_0 cache, 896.13 against 1,024.13 MiB on
    two 128-expert shapes and 1,022.13 against 1,024.13 on the 320-expert seed shape, every placement with an expert
    layer on the card alike (bench/results/lease-2026-12-08-s33/); at -c 32768, f16, the same either way."""
    return max(lo, min(hi, manifest["layers"] - 1))


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


def probes_left(seen: dict[int, bool], lo: int, hi: int) -> int:
    """About how many more probes ``search_lowest`` needs to pin the boundary, from what it has seen (n -> survived):
    the bisection of the values not yet bracketed (from the highest failure below the lowest survivor; without a
    survivor, every value above the highest failure up to ``hi``)."""
    ok = [n for n, survived in seen.items() if survived]
    top = min(ok) if ok else hi + 1
    failed = [n for n, survived in seen.items() if not survived and n < top]
    unknown = top - (max(failed) if failed else lo - 1) - 1
    return math.ceil(math.log2(unknown + 1)) if unknown > 0 else 0


# -- the fastest value near the boundary: the climb, the finalists, the interleaved starts -------------------------

MAX_FINALISTS = 3  # values re-measured in interleaved starts after the climb (a challenger may join later)


# The partial placements of a boundary layer's experts, as llama.cpp's --fit on makes them (common/fit.cpp's
# LAYER_FRACTION_UP and LAYER_FRACTION_GATE): its up tensors on the card first, then its gate too; its down last.
# Each names the expert tensors that stay on the CPU, the larger move to the card first.
PARTIAL_ON_CPU = (("down",), ("gate", "down"))
# Partial.override's form, read back: blk\.28\.ffn_down_exps=CPU, blk\.28\.ffn_(gate|down)_exps=CPU
_PARTIAL_OVERRIDE = re.compile(r"blk\\\.(?P<layer>\d+)\\\.ffn_(?:(?P<one>\w+)|\((?P<several>[\w|]+)\))_exps=CPU")


class Partial(float):
    """An n_cpu_moe between two whole values: the experts of layers 0 .. ``whole`` - 1 on the CPU (``--n-cpu-moe
    whole``) and, of layer ``whole``, the expert tensors named in ``on_cpu`` too (an ``-ot`` override); the rest of
    that layer's experts stay on the card. As a number it is ``whole`` plus the share of that layer's three expert
    tensors on the CPU, so it sorts between its whole neighbours (more on the CPU, more VRAM to spare)."""

    whole: int
    on_cpu: tuple[str, ...]

    def __new__(cls, whole: int, on_cpu: tuple[str, ...]) -> Partial:
        self = super().__new__(cls, whole + len(on_cpu) / 3)
        self.whole, self.on_cpu = whole, tuple(on_cpu)
        return self

    def __reduce__(self):
        return (Partial, (self.whole, self.on_cpu))

    @classmethod
    def of(cls, settings: dict) -> Partial | None:
        """The partial placement ``settings`` hold: ``override_tensor`` as ``override`` writes it, for the layer
        ``n_cpu_moe`` names; None for any other override (the planner then counts whole layers)."""
        found = _PARTIAL_OVERRIDE.fullmatch(settings.get("override_tensor") or "")
        if not found or int(found["layer"]) != settings.get("n_cpu_moe"):
            return None
        on_cpu = tuple((found["one"] or found["several"]).split("|"))
        return cls(int(found["layer"]), on_cpu) if set(on_cpu) <= {"up", "gate", "down"} else None

    @property
    def override(self) -> str:
        """llama-server's ``-ot`` value that keeps those tensors on the CPU."""
        names = self.on_cpu[0] if len(self.on_cpu) == 1 else f"({'|'.join(self.on_cpu)})"
        return f"blk\\.{self.whole}\\.ffn_{names}_exps=CPU"

    def __str__(self) -> str:
        return f"{self.whole} (+ layer {self.whole}'s {', '.join(self.on_cpu)} experts on the CPU)"

    __repr__ = __str__

    def __format__(self, spec: str) -> str:
        return str(self) if not spec else float(self).__format__(spec)


def plain(n: int | Partial | None) -> tuple[int | None, str | None]:
    """A value as the settings hold it: (n_cpu_moe, the -ot override or None); None gives (None, None)."""
    return (n.whole, n.override) if isinstance(n, Partial) else (n, None)


def split_layer_mib(manifest: dict, ubatch: int, on_cpu: tuple[str, ...]) -> float:
    """What a layer whose expert tensors are split between the CPU and the card adds to the card's compute buffer:
    one activation of ``ubatch`` × n_expert_used × expert_ffn in F32 for each of its gate and up tensors left on the
    card (``on_cpu`` names those that are not), whose output crosses to the CPU. Measured on two shapes: the 8-layer
    30B-A3B shape at -ub 2048 on an H200, layer 3's down experts on the CPU (gate and up on the card): compute buffer
    572.05 MiB against 476.05 with whole layers, 2 × 2048 × 8 × 768 × 4 B exactly
    (bench/results/lease-2026-12-07-s28/); the seed-scale shape at -ub 2048 on an H100, layer 17's gate and down
    experts on the CPU (up on the card): 1,070.13 against 1,024.13, 46 MiB of the 48 counted
    (bench/results/lease-2026-12-07-s30/)."""
    ffn = manifest.get("expert_ffn") or 0
    ffn = max(ffn) if isinstance(ffn, list) else ffn
    crossing = len({"gate", "up"} - set(on_cpu))
    return crossing * ubatch * (manifest.get("n_expert_used") or 0) * ffn * 4 / MIB


def partials(manifest: dict, layer: int, headroom_mib: float, ubatch: int) -> list[tuple[Partial, float, float]]:
    """The partial placements of ``layer``, where n_cpu_moe ``layer`` + 1 kept ``headroom_mib`` free and n_cpu_moe
    ``layer`` did not keep the margin: (value, MiB its tensors bring to the card, the headroom predicted to be left,
    less ``split_layer_mib`` too), the larger move first, for each of ``PARTIAL_ON_CPU`` the layer's tensors allow (a
    fused gate_up allows none). The caller starts those predicted to keep the margin."""
    split = manifest["per_layer"][layer].get("expert_tensor_bytes") or {}
    if set(split) != {"up", "gate", "down"}:
        return []
    found = []
    for on_cpu in PARTIAL_ON_CPU:
        moved = sum(b for name, b in split.items() if name not in on_cpu) / MIB
        left = headroom_mib - moved - split_layer_mib(manifest, ubatch, on_cpu)
        found.append((Partial(layer, on_cpu), round(moved, 1), round(left, 1)))
    return found


def finalist_starts(climb: int, starts: int) -> int:
    """The further starts of a search's usual two finalists (none without a climb)."""
    return 2 * (starts - 1) if climb else 0


def course_after_boundary(climb: int, starts: int, has_limit: bool, partial: bool = False) -> int:
    """The server starts of a search's usual course once its boundary is found: where there is a VRAM limit (without
    one the boundary is the answer) one for the margin and, with a climb and ``partial``, one for the boundary layer
    in part on the card (``partials``); the whole climb; and the finalists' further starts."""
    return (1 + (1 if climb and partial else 0) if has_limit else 0) + climb + finalist_starts(climb, starts)


@dataclass(frozen=True)
class Speed:
    """One value's speed by the objective: the median and the range [low, high] over ``n`` requests (every request
    of every repetition, of one server start or pooled over several)."""

    median: float
    low: float
    high: float
    n: int = 1

    @classmethod
    def of(cls, stats: dict | None) -> Speed | None:
        """From a workload's statistics (``workloads.stats``: median, min, max, n); None where there are none."""
        if not stats or stats.get("median") is None:
            return None
        return cls(stats["median"], stats["min"], stats["max"], stats.get("n") or 0)

    def text(self) -> str:
        return f"{self.median:,.1f} [{self.low:,.1f}–{self.high:,.1f}]"


# The longest reply the answer is asked about (less where the context leaves less room after the prompt): where the
# answer changes with the reply length (tables.reply) and which search may be cut short (loses_at_every_reply).
MAX_REPLY = 4096


@dataclass(frozen=True)
class Request:
    """One configuration's request as a reply grows: its time to first token and its decode, each as a Speed (the
    median and range over every request), so that t(n) = first + n ÷ decode (``tables.reply``)."""

    first_s: Speed
    decode: Speed

    @classmethod
    def of(cls, stats: dict | None) -> Request | None:
        """From a workload's statistics (``ttft_s`` and ``decode_tps``); None where either is missing."""
        first, decode = (Speed.of((stats or {}).get(k)) for k in ("ttft_s", "decode_tps"))
        return cls(first, decode) if first and decode and decode.low > 0 else None

    def as_dict(self) -> dict:
        return {k: {"median": v.median, "min": v.low, "max": v.high, "n": v.n} for k, v in self.parts().items()}

    def parts(self) -> dict[str, Speed]:
        return {"ttft_s": self.first_s, "decode_tps": self.decode}


def loses_at_every_reply(ours: Request, theirs: Request, longest: int) -> bool:
    """Whether a request of ``ours`` takes longer than one of ``theirs`` at every reply of 1 to ``longest`` tokens,
    by the medians, as the answer's reply-length line judges where another configuration finishes first
    (``tables.reply``): the times grow linearly with the reply, so the shortest and the longest decide for every
    length between. (Judged by the ranges instead, replaying the committed searches, 5 of 6 pruned searches would go
    on, 2 of them only because the ranges overlapped at 4,096 tokens.)"""
    return all(
        ours.first_s.median + n / ours.decode.median > theirs.first_s.median + n / theirs.decode.median
        for n in (1, longest)
    )


def within_noise(a: Speed, b: Speed) -> bool:
    """The noise rule: two speeds are within noise of each other when their ranges (min–max over every request of
    every repetition) overlap. One is clearly faster than the other only when its whole range lies above the other's
    (the rule ``recommend`` uses for "within the spread of the repetitions")."""
    return a.low <= b.high and b.low <= a.high


def _key(n: int, speed: Speed) -> tuple[float, int]:
    """Ranking key: the higher median first; on a tie the higher n_cpu_moe (more VRAM to spare)."""
    return (speed.median, n)


@dataclass(frozen=True)
class Step:
    """One value the climb measured: its speed (None: it did not survive every workload with the margin), its
    verdict against the best value before it ("faster", "within noise", "slower", "failed"), and the best after it."""

    n_cpu_moe: int
    speed: Speed | None
    verdict: str
    best: int


def climb(
    speed: Callable[[int], Speed | None],
    lowest: int,
    hi: int,
    most: int,
    on_step: Callable[[Step, int], None] | None = None,
    left_out: Callable[[int], str | None] = lambda n: None,
) -> tuple[list[Step], str]:
    """Above ``lowest`` (the lowest n_cpu_moe that survives with the margin: measured), measure lowest + 1, + 2, ...
    while each is faster than the best value so far or within noise of it (``within_noise``), since speed is not
    monotonic in n_cpu_moe near the boundary. Stops at the first value clearly slower than the best (its whole range
    below the best's), at the first that does not survive with the margin (``speed`` gives None), after ``most``
    values, at ``hi``, or where ``left_out(n)`` says why n is not measured (the run's time limit). ``on_step(step,
    index)`` is called after each value. Returns the steps and why it stopped.
    """
    best_n, best = lowest, speed(lowest)
    steps: list[Step] = []
    if best is None:
        return steps, f"n_cpu_moe {lowest} has no speed at the objective workload to compare with"
    top = min(hi, lowest + most)
    for n in range(lowest + 1, top + 1):
        if why := left_out(n):
            return steps, why
        s = speed(n)
        if s is None:
            verdict = "failed"
        elif s.high < best.low:
            verdict = "slower"
        elif s.low > best.high:
            verdict = "faster"
        else:
            verdict = "within noise"
        if s is not None and _key(n, s) > _key(best_n, best):
            best_n, best = n, s
        steps.append(Step(n, s, verdict, best_n))
        if on_step:
            on_step(steps[-1], len(steps))
        if verdict == "failed":
            return steps, f"n_cpu_moe {n} did not survive every workload with the margin"
        if verdict == "slower":
            return steps, f"n_cpu_moe {n} is clearly slower than n_cpu_moe {best_n} (ranges apart)"
    if not most:
        return steps, "no climb asked for"
    if top < lowest + most:
        return steps, f"reached the top of the range ({hi})"
    return steps, f"tried {most} value(s) above {lowest}, the most asked for"


def finalists(speeds: dict[int, Speed], most: int = MAX_FINALISTS) -> list[int]:
    """The values to measure again: the fastest by median and every value within noise of it, fastest first, at most
    ``most``. Where none is within noise, the runner-up all the same: one start's range holds the noise within that
    start, not between starts (decode varied up to 27% between starts of one configuration on the H200), so one start
    cannot rule the runner-up out."""
    ranked = sorted(speeds, key=lambda n: _key(n, speeds[n]), reverse=True)
    if not ranked:
        return []
    best = ranked[0]
    close = [n for n in ranked[1:] if within_noise(speeds[n], speeds[best])]
    return [best, *(close or ranked[1:2])][: max(most, 1)]


def rank(per_start: dict[int, list[Speed | None]], pooled: dict[int, Speed | None]) -> dict:
    """The winner among the finalists: the highest pooled median (every request of every start) among those that
    survived every start with the margin (a start that did not leaves None); the runner-up likewise; and in how many
    start pairs (start k of one against start k of the other) the winner's median was the higher."""
    eligible = {n: pooled[n] for n in per_start if pooled.get(n) and all(s is not None for s in per_start[n])}
    ranked = sorted(eligible, key=lambda n: _key(n, eligible[n]), reverse=True)
    out = {"winner": ranked[0] if ranked else None, "runner_up": None, "won": None, "pairs": None}
    if not ranked:
        return {**out, "lead_held": "no finalist survived every start with the margin"}
    winner = ranked[0]
    if len(ranked) == 1:
        alone = "the only finalist" if len(per_start) == 1 else "the only finalist that survived every start"
        return {**out, "lead_held": f"n_cpu_moe {winner}: {alone}"}
    runner = ranked[1]
    pairs = list(zip(per_start[winner], per_start[runner], strict=False))
    won = [a.median > b.median for a, b in pairs]
    text = (
        f"n_cpu_moe {winner} faster than n_cpu_moe {runner} (the runner-up) in {sum(won)} of {len(won)} "
        f"interleaved start pairs"
    )
    if len(won) > 1:
        text += f"; in {sum(won[1:])} of {len(won) - 1} after the first, which chose the finalists"
    return {**out, "runner_up": runner, "won": sum(won), "pairs": len(won), "lead_held": text}


def settle(
    start: Callable[[int, int], Speed | None],
    pooled: Callable[[int], Speed | None],
    speeds: dict[int, Speed],
    starts: int,
    most: int = MAX_FINALISTS,
    left_out: Callable[[int], str | None] = lambda k: None,
) -> dict:
    """Measure the finalists again and pick the winner.

    ``speeds``: the first start's speed of every value measured that survived every workload with the margin, in the
    order they were measured. ``start(n, k)`` runs start k (2, 3, ...) of value n and gives its speed (None: it failed
    or fell under the margin); ``pooled(n)`` the speed over every start of n so far.

    The finalists (``finalists``) get ``starts`` starts each, round by round in the order they were first measured
    (A B A B ...: start 1 of each, then start 2 of each, ...). Then ``rank``. A value measured in fewer starts whose
    median is above the winner's pooled median (or any, when no finalist survived every start) would make the answer
    depend on one start: the fastest such challenger joins the finalists and gets its starts, until there is none.
    Returns ``rank``'s result with ``finalists`` (in order), ``per_start``, ``pooled`` and ``order`` ((n, k) of every
    start run here, in order). Where ``left_out(k)`` says why round k is not run (the run's time limit), the rounds
    stop there, whole, and no challenger joins: the finalists are ranked on the starts they have (``cut``: why).
    """
    chosen = finalists(speeds, most)
    final = [n for n in speeds if n in chosen]
    per_start = {n: [speeds[n]] for n in speeds}
    order: list[tuple[int, int]] = []
    pending = final
    cut = None
    while True:
        for k in range(2, starts + 1):
            if cut := left_out(k):
                break
            for n in pending:
                per_start[n].append(start(n, k))
                order.append((n, k))
        speeds_pooled = {n: pooled(n) for n in final}
        result = rank({n: per_start[n] for n in final}, speeds_pooled)
        winner = result["winner"]
        rest = [n for n in speeds if n not in final]
        if winner is not None:
            bar = _key(winner, speeds_pooled[winner])
            rest = [n for n in rest if _key(n, speeds[n]) > bar]
        if not rest or cut:
            break
        challenger = max(rest, key=lambda n: _key(n, speeds[n]))
        final.append(challenger)
        pending = [challenger]
    return {
        **result,
        "finalists": final,
        "per_start": {n: per_start[n] for n in final},
        "pooled": speeds_pooled,
        "order": order,
        "cut": cut,
    }
