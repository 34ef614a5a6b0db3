"""``crashline suggest``: the prediction of ``engine.suggest`` for this machine's card (or ``--vram``), printed as a
person reads it: per ubatch the lowest ``--n-cpu-moe`` with the margin, its arithmetic, a command to paste."""

from __future__ import annotations

import shlex


from ..engine.suggest import ALL_ON_GPU, DEFAULT_UBATCHES, FITS, NO_FIT, PART_ON_GPU, on_cpu, suggest
from ..core.host import gpus
from ..engine.suggest_inputs import parse_size_mib, parse_ubatches
# -- text ---------------------------------------------------------------------------------------------------------


def _card(vram_mib: float) -> str:
    if vram_mib % 1024 == 0:
        return f"a {vram_mib // 1024:,.0f} GiB card ({vram_mib:,.0f} MiB)"
    return f"a {vram_mib:,.0f} MiB card"


def host_text(h: dict) -> str:
    """The host memory ``planner.host_mib`` counts, written out."""
    cache = "no limit (--cache-ram -1)" if h["prompt_cache_mib"] is None else f"{h['prompt_cache_mib']:,.0f}"
    return (
        f"host memory: weights on the CPU {h['weights_mib']:,.0f} + KV {h['kv_mib']:,.0f} + prompt "
        f"cache up to {cache} + checkpoints up to {h['checkpoints_mib']:,.0f}"
        + ("" if h["total_mib"] is None else f" = {h['total_mib']:,.0f} MiB")
        + ", besides the compute buffers and the runtime"
    )


def cpu_text(result: dict, why: str) -> str:
    """An ``on_cpu`` result as the lines a user reads: no GPU (``why``), so every layer on the CPU, per ubatch the
    command to paste and the host memory it takes."""
    path = shlex.quote(result["model_path"]) if result.get("model_path") else "MODEL.gguf"
    lines = [
        f"Prediction (not measured) for {result['model']} on this machine ({why}), ctx {result['ctx']}: every one "
        f"of its {result['layers']} layers runs on the CPU (-ngl 0)."
    ]
    for row in result["ubatches"]:
        lines += [
            f"  -ub {row['ubatch']}: llama-server -m {path} {shlex.join(row['args'])}",
            f"    {host_text(row['host'])}",
        ]
    lines.append("  A card: give --vram SIZE (e.g. 24GiB) for the --n-cpu-moe or -ngl that fits it.")
    return "\n".join(lines)


def text(result: dict) -> str:
    """A ``suggest`` result as the lines a user reads in a terminal: the answer per ubatch with its arithmetic,
    whether everything fits on the GPU or nothing does, and what was assumed."""
    r = result
    kv = (
        r["cache_type_k"]
        if r["cache_type_k"] == r["cache_type_v"]
        else f"K {r['cache_type_k']} / V {r['cache_type_v']}"
    )
    label = "Prediction (not measured" + ("" if r["calibrated"] else ", uncalibrated") + ")"
    np_text = f", -np {r['parallel']}" if r["parallel"] != 1 else ""
    lines = [f"{label} for {r['model']} on {_card(r['vram_mib'])}, ctx {r['ctx']}, {kv} KV{np_text}:"]
    margin = f"{r['margin_mib']:,.0f} MiB margin"
    heads = {row["ubatch"]: f"  -ub {row['ubatch']}: " for row in r["ubatches"]}
    width = max(map(len, heads.values()))
    for row in r["ubatches"]:
        head = heads[row["ubatch"]].ljust(width)
        of = f"of {r['vram_mib']:,.0f} with a {margin}"
        at = f"predicted {row['predicted_mib']:,.0f} MiB {of}"
        if row["status"] == PART_ON_GPU:
            lines.append(
                f"{head}the whole model does not fit, and it has no experts to keep on the CPU: offload "
                f"{row['n_gpu_layers']} of its {r['layers']} layers (-ngl {row['n_gpu_layers']}: {at})"
            )
        elif row["status"] == NO_FIT and not r["expert_layers"]:
            lines.append(f"{head}does not fit, and the model has no experts to keep on the CPU ({at})")
        elif row["status"] == NO_FIT:
            lowest = row["all_experts_on_cpu"]["n_cpu_moe"]
            lines.append(f"{head}does not fit, even with every expert layer on the CPU (--n-cpu-moe {lowest}: {at})")
        elif row["status"] == ALL_ON_GPU:
            lines.append(f"{head}everything on the GPU fits (--n-cpu-moe 0: {at})")
        else:
            lines.append(f"{head}--n-cpu-moe {row['n_cpu_moe']} ({at})")
        if row.get("asked_ubatch"):
            lines.append(
                f"{' ' * width}asked -ub {row['asked_ubatch']}: a micro-batch holds at most the context "
                f"({r['ctx_cells']:,} cells), so llama.cpp runs -ub {row['ubatch']}"
            )
        how = row["compute_from"]
        note = "" if how == "estimated" or how.startswith("measured at") and "moved" not in how else f"; compute {how}"
        lines.append(f"{' ' * width}{row['arithmetic']}{note}")
        if row["args"]:
            gguf_path = shlex.quote(r["model_path"]) if r.get("model_path") else "MODEL.gguf"
            lines.append(f"{' ' * width}llama-server -m {gguf_path} {shlex.join(row['args'])}")
        lines.append(f"{' ' * width}{host_text(row['host'])}")
    if r["expert_layers"] and all(row["status"] == FITS for row in r["ubatches"]):
        need = ", ".join(
            f"{row['all_on_gpu']['predicted_mib']:,.0f} MiB at -ub {row['ubatch']}" for row in r["ubatches"]
        )
        lines.append(f"  Everything on the GPU (--n-cpu-moe 0) would need {need}: it does not fit with the margin.")
    if any(row["status"] == NO_FIT for row in r["ubatches"]):
        lines.append(
            "  To fit: a smaller ctx, a quantised KV cache (--cache-type q8_0), a smaller -ub, or a larger card."
        )
    lines.append("Assumed:")
    lines += [f"  - {a}" for a in r["assumptions"]]
    return "\n".join(lines)


def from_cli(
    model: str,
    vram: str | None,
    ctx: int,
    ubatch: str | None = None,
    cache_type: str | None = None,
    np: int = 1,
    margin: str | None = None,
    calibration: str | None = None,
) -> str:
    """``crashline suggest MODEL --vram 24GiB --ctx 131072 [--ubatch 512,2048] [--cache-type q8_0] [--np 1]
    [--margin MiB] [--calibration search.json]``: the arguments as typed, the text to print."""
    if vram is None and not (card := gpus())["present"]:
        ubatches = DEFAULT_UBATCHES if ubatch is None else parse_ubatches(ubatch)
        found = on_cpu(model, ctx, ubatches=ubatches, cache_type_k=cache_type or "f16", parallel=np)
        return cpu_text(found, card["reason"])
    result = suggest(
        model,
        parse_size_mib(vram, "--vram") if vram is not None else card["devices"][0]["memory_total_mib"],
        ctx,
        ubatches=DEFAULT_UBATCHES if ubatch is None else parse_ubatches(ubatch),
        cache_type_k=cache_type or "f16",
        parallel=np,
        margin_mib=None if margin is None else parse_size_mib(margin, "--margin", minimum=0),
        calibration=calibration,
    )
    return text(result)
