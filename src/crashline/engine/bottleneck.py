"""What limits decode speed: each suspect measured during steady decode, against its limit, with a
verdict; and an upper bound on tokens/s from the bytes each device must read per token.

Suspects: PCIe (the link's generation × width as NVML reports it under load), GPU memory
bandwidth (DRAM bandwidth used where the board has GPM, else memory-controller busy %), GPU busy
(a kernel running) and, with GPM, the share of SMs busy, the server's CPU threads, paging (major
faults, swap) and disk reads. A GPU that always runs a kernel while its SMs and DRAM bandwidth stay
far from saturated is latency-bound. When nothing is saturated while the GPU and the CPU are each
partly busy, the answer is serial execution: each waits for the other.
"""

from __future__ import annotations

from . import logparse, planner
from ..core import serverflags
from ..core.units import MIB

SATURATED = 0.85  # of the limit
BUSY = 0.5
# Per-lane transfer rate (GT/s) and line-code efficiency per PCIe generation.
PCIE_GTS = {
    1: (2.5, 0.8),
    2: (5.0, 0.8),
    3: (8.0, 128 / 130),
    4: (16.0, 128 / 130),
    5: (32.0, 128 / 130),
    6: (64.0, 242 / 256),
}


def pcie_limit_mbs(gen: float | None, width: float | None) -> float | None:
    """One direction's bandwidth of a PCIe link in MB/s."""
    if not gen or not width or int(round(gen)) not in PCIE_GTS:
        return None
    gts, efficiency = PCIE_GTS[int(round(gen))]
    return gts * efficiency / 8 * 1000 * int(round(width))


def _verdict(fraction: float | None) -> str:
    if fraction is None:
        return "not measured"
    if fraction >= SATURATED:
        return "saturated"
    if fraction >= BUSY:
        return "busy"
    return "far from it"


def table(decode: dict | None, decode_tps: float | None, n_threads: int | None, gpu: bool) -> dict:
    """The suspects during steady decode of one workload, with per-token figures and a verdict."""
    if not decode:
        return {"rows": [], "verdict": "decode window too short to sample: raise gen_tokens"}
    rows = []

    def add(name, value, unit, limit, fraction, verdict=None, per_token=None, **extra):
        rows.append(
            {
                "suspect": name,
                "measured": value,
                "unit": unit,
                "limit": limit,
                "fraction": fraction,
                "verdict": verdict or _verdict(fraction),
                "per_token": per_token,
                **extra,
            }
        )

    tps = decode_tps or None
    if gpu:
        rx, tx = (decode.get("pcie_rx_kbs") or 0) / 1000, (decode.get("pcie_tx_kbs") or 0) / 1000
        link = pcie_limit_mbs(decode.get("pcie_gen"), decode.get("pcie_width"))
        add(
            f"PCIe (gen {decode.get('pcie_gen', 0):.0f} x{decode.get('pcie_width', 0):.0f} under load)",
            max(rx, tx),
            "MB/s",
            link,
            max(rx, tx) / link if link else None,
            per_token=f"{(rx + tx) / tps:.2f} MB/token" if tps else None,
        )
        dram = decode.get("gpm_dram_bw_pct")
        if dram is not None:
            add("GPU memory bandwidth (DRAM bandwidth used, GPM)", dram, "%", 100, dram / 100)
        else:
            mem = decode.get("gpu_mem_pct")
            add("GPU memory bandwidth (controller busy)", mem, "%", 100, mem / 100 if mem is not None else None)
        sm = decode.get("gpu_sm_pct")
        add("GPU busy (a kernel running, however few SMs it uses)", sm, "%", 100, sm / 100 if sm is not None else None)
        sms = decode.get("gpm_sm_pct")
        if sms is not None:
            occupancy = decode.get("gpm_occupancy_pct")
            add(
                f"GPU SMs busy (GPM; warp occupancy {occupancy or 0:.0f}%)",
                sms,
                "%",
                100,
                sms / 100,
                occupancy_pct=occupancy,
            )
    cores = decode.get("server_cpu_cores")
    add(
        "CPU (server threads busy; llama.cpp busy-waits while polling, so this includes waiting)",
        cores,
        "cores",
        n_threads,
        cores / n_threads if cores is not None and n_threads else None,
    )
    majflt = decode.get("majflt_per_s") or 0
    swap = (decode.get("swap_in_bytes_per_s") or 0) + (decode.get("swap_out_bytes_per_s") or 0)
    paging = majflt > 0 or swap > 0
    add(
        "paging (major faults, swap)",
        majflt,
        "faults/s",
        None,
        None,
        verdict="paging" if paging else "none",
        per_token=f"{majflt / tps:.2f} faults/token" if tps else None,
    )
    # The server's own reads (/proc/PID/io: what it made the kernel fetch from storage, its model's page faults
    # included); the whole machine's only where the server's are unknown, and named so: another program's
    # reads are not the server waiting on storage.
    own = decode.get("server_read_bytes_per_s")
    disk = ((own if own is not None else decode.get("disk_read_bytes_per_s")) or 0) / (1 << 20)
    add(
        "disk reads (the server's)" if own is not None else "disk reads (the whole machine's)",
        disk,
        "MiB/s",
        None,
        None,
        verdict="reading" if disk > 1 else "none",
        per_token=f"{disk / tps:.3f} MiB/token" if tps else None,
    )
    return {"rows": rows, "verdict": overall(rows, gpu)}


def overall(rows: list[dict], gpu: bool) -> str:
    by = {r["suspect"].split(" (")[0]: r for r in rows}
    saturated = [name for name, r in by.items() if r["verdict"] == "saturated"]
    sms, dram = by.get("GPU SMs busy", {}).get("fraction"), by.get("GPU memory bandwidth", {}).get("fraction")
    if saturated == ["GPU busy"] and sms is not None and dram is not None:
        occupancy = by["GPU SMs busy"]["occupancy_pct"] or 0
        return (
            f"limited by GPU latency: a kernel runs {by['GPU busy']['fraction']:.0%} of the time, yet the "
            f"kernels keep {sms:.0%} of the SMs busy at {occupancy:.0f}% warp occupancy and use {dram:.0%} of DRAM "
            f"bandwidth (decode's small kernels, one after another)"
        )
    if saturated:
        return "limited by " + " and ".join(saturated)
    if any(r["verdict"] in ("paging", "reading") for r in rows):
        return "waiting on storage: the model is being read from disk during decode"
    sm = by.get("GPU busy", {}).get("fraction")
    cpu = by.get("CPU", {}).get("fraction")
    if gpu and sm is not None and cpu is not None and 0.1 < sm < SATURATED and 0.1 < cpu < SATURATED:
        return (
            f"serial wait between devices: nothing is saturated, the GPU is busy {sm:.0%} and the CPU "
            f"threads {cpu:.0%} of the time; each waits for the other"
        )
    return "no single suspect saturated"


# llama-server arguments that move tensors or the KV cache: with one of them in extra_args (or with --fit on or
# -ot), the settings alone do not say where the weights went; only the server's log does.
PLACEMENT_FLAGS = frozenset(
    {
        "-ngl",
        "--gpu-layers",
        "--n-gpu-layers",
        "-ncmoe",
        "--n-cpu-moe",
        "-cmoe",
        "--cpu-moe",
        "-ot",
        "--override-tensor",
        "-fit",
        "--fit",
        "-fitt",
        "--fit-target",
        "-ts",
        "--tensor-split",
        "-sm",
        "--split-mode",
        "-mg",
        "--main-gpu",
        "-dev",
        "--device",
        "-nkvo",
        "--no-kv-offload",
        "-ncffn",
        "--n-cpu-ffn",
    }
)


def _moves_tensors(extra_args) -> bool:
    """Whether ``extra_args`` (of any record, one that predates the allowlist too) has a flag that moves tensors."""
    return any(serverflags.normalise(str(a).split("=", 1)[0]) in PLACEMENT_FLAGS for a in extra_args or ())


def _settings_placement(manifest: dict, settings: dict, gpu: bool) -> dict | None:
    """Where the settings put the weights: the layers on the GPU (their dense part and KV cache), the layers
    whose experts are there too, and whether the output head is; None when the settings leave it to llama.cpp."""
    if not gpu:
        return {"layers": set(), "expert_layers": set(), "output": False}
    if settings.get("fit") == "on" or settings.get("override_tensor") or _moves_tensors(settings.get("extra_args")):
        return None
    on_gpu = set(planner.gpu_layers(manifest, settings.get("n_gpu_layers")))
    n_cpu_moe = settings.get("n_cpu_moe") or 0
    return {
        "layers": on_gpu,
        "expert_layers": {layer for layer in on_gpu if layer >= n_cpu_moe},
        "output": (settings.get("n_gpu_layers") or 10**9) > manifest["layers"],
    }


def _dense(row: dict) -> int:
    """A layer's weights that every token reads: all but the routed experts (shared experts included)."""
    return row["other_bytes"] + row.get("shared_expert_bytes", 0)


def _by_layers(manifest: dict, where: dict, active: float, kv_per_layer: float) -> dict:
    dev = {"gpu": 0.0, "cpu": 0.0}
    for row in manifest["per_layer"]:
        dev["gpu" if row["layer"] in where["layers"] else "cpu"] += _dense(row) + kv_per_layer
        dev["gpu" if row["layer"] in where["expert_layers"] else "cpu"] += row["expert_bytes"] * active
    dev["gpu" if where["output"] else "cpu"] += manifest["output_bytes"]
    return dev


def _tolerance(manifest: dict) -> float:
    """How far a GPU model buffer may be from the sum of its tensors: the log prints MiB to 0.01, and the
    CUDA allocator pads each quantised tensor by at most one 512-element row (a few hundred bytes)."""
    return MIB + 2048 * (manifest.get("n_tensors") or len(manifest["per_layer"]) * 16)


def _agrees(manifest: dict, where: dict, logged: dict) -> bool:
    """Whether the log shows the placement the settings predict: the same weights on the GPU (to the
    tolerance), the same layers offloaded and the same share of the KV cache."""
    rows = manifest["per_layer"]
    expected = (
        sum(_dense(r) for r in rows if r["layer"] in where["layers"])
        + sum(r["expert_bytes"] for r in rows if r["layer"] in where["expert_layers"])
        + (manifest["output_bytes"] if where["output"] else 0)
    )
    offloaded = len(where["layers"]) + where["output"]
    kv_share = len(where["layers"]) / manifest["layers"]
    return (
        abs(logged["weights_mib"] * MIB - expected) <= _tolerance(manifest)
        and logged["layers_offloaded"] in (None, offloaded)
        and (not logged["kv_total_mib"] or abs(logged["kv_mib"] / logged["kv_total_mib"] - kv_share) < 1e-3)
    )


def _by_log(manifest: dict, logged: dict, active: float, kv_bytes: float) -> dict:
    """Bytes read per token on each device from the weights the log shows on the GPU.

    The log gives how many bytes, not which tensors. llama.cpp offloads whole layers from the last one
    down ("offloaded N/L+1 layers", the output head counting as one), and every way of keeping some of
    them in RAM that moves less than a layer (--n-cpu-moe, --fit on, -ot exps=CPU) moves expert tensors:
    so the offloaded layers' dense part (and the head) is on the GPU, and the rest of the GPU's weights are
    experts, of which a token reads the active share. Fewer bytes than that dense part means some dense
    tensors stayed in RAM (-ot on attention): then all the GPU holds is dense, read every token."""
    layers, rows, tol = manifest["layers"], manifest["per_layer"], _tolerance(manifest)
    weights = logged["weights_mib"] * MIB
    offloaded = logged["layers_offloaded"]
    if offloaded is None:  # not printed: the GPU's weights, if any, are taken as every layer's dense part first
        offloaded = layers + 1 if weights > tol else 0
    on_gpu = {r["layer"] for r in rows if r["layer"] >= layers - min(offloaded, layers)}
    head = manifest["output_bytes"]
    dense_all = sum(_dense(r) for r in rows) + head
    dense_gpu = sum(_dense(r) for r in rows if r["layer"] in on_gpu) + (head if offloaded > layers else 0)
    experts_all = sum(r["expert_bytes"] for r in rows)
    spare = weights - dense_gpu
    if spare < -tol:
        dense_gpu, experts_gpu = weights, 0.0
    else:
        experts_gpu = min(max(spare, 0.0), experts_all)
        if experts_all - experts_gpu <= tol:
            experts_gpu = experts_all
        elif experts_gpu <= tol:
            experts_gpu = 0.0
    kv_share = logged["kv_mib"] / logged["kv_total_mib"] if logged["kv_total_mib"] else len(on_gpu) / layers
    return {
        "gpu": dense_gpu + experts_gpu * active + kv_bytes * kv_share,
        "cpu": dense_all - dense_gpu + (experts_all - experts_gpu) * active + kv_bytes * (1 - kv_share),
    }


def bytes_per_token(manifest: dict, settings: dict, depth: int, gpu: bool, placement: dict | None = None) -> dict:
    """Bytes each device reads per generated token: the weights it holds that every token uses
    (experts weighted by the share of experts active), plus the KV cache at this depth.

    Where the weights are comes from the server's log (``placement``, ``logparse.parse_log``) when it shows
    the model buffers, else from the settings. When both say the same, the settings' layer-by-layer sum is
    used. ``from`` says which: "settings and log", "log", "settings" (no buffers logged); with neither
    (--fit on, -ot or placement flags in extra_args, and no log), gpu and cpu are None and ``unknown`` says why.
    ``gpu`` False: no GPU to stream from (its bandwidth unknown), so the settings put everything in RAM."""
    layers = manifest["layers"]
    active = manifest["n_expert_used"] / manifest["n_expert"] if manifest.get("n_expert") else 1.0
    kv_bytes = planner.kv_mib(manifest, {**settings, "ctx": depth, "n_gpu_layers": None}, read=True) * MIB
    kv_per_layer = kv_bytes / layers
    where = _settings_placement(manifest, settings, gpu)
    logged = logparse.accelerator_share(placement)
    if logged is None:
        if where is None:
            return {
                "gpu": None,
                "cpu": None,
                "from": None,
                "unknown": "the settings leave the placement to llama.cpp (--fit on, -ot) and no log shows it",
            }
        return {**_by_layers(manifest, where, active, kv_per_layer), "from": "settings", "unknown": None}
    if where is not None and _agrees(manifest, where, logged):
        return {**_by_layers(manifest, where, active, kv_per_layer), "from": "settings and log", "unknown": None}
    return {**_by_log(manifest, logged, active, kv_bytes), "from": "log", "unknown": None}


def decode_bound(
    manifest: dict,
    settings: dict,
    depth: int,
    gpu_gbs: float | None,
    cpu_gbs: float | None,
    placement: dict | None = None,
) -> dict:
    """Upper bound on decode tokens/s if each device only had to stream its bytes, one after the other.

    ``placement`` is what the server's log showed (``logparse.parse_log``); see ``bytes_per_token``. The
    bound is None, with ``unknown`` saying why, when the placement is unknown or a device that holds bytes
    has no measured bandwidth."""
    per = bytes_per_token(manifest, settings, depth, gpu_gbs is not None, placement)
    out = {
        "gpu_bytes": per["gpu"],
        "cpu_bytes": per["cpu"],
        "gpu_gbs": gpu_gbs,
        "cpu_gbs": cpu_gbs,
        "bound_tps": None,
        "placement_from": per["from"],
        "unknown": per["unknown"],
    }
    if per["unknown"]:
        return out
    unmeasured = [
        name for name, n, gbs in (("GPU", per["gpu"], gpu_gbs), ("CPU", per["cpu"], cpu_gbs)) if n and not gbs
    ]
    if unmeasured:
        out["unknown"] = f"{' and '.join(unmeasured)} memory bandwidth not measured"
        return out
    seconds = per["gpu"] / (gpu_gbs * 1e9) if per["gpu"] else 0.0
    seconds += per["cpu"] / (cpu_gbs * 1e9) if per["cpu"] else 0.0
    out["bound_tps"] = 1 / seconds if seconds else None
    return out
