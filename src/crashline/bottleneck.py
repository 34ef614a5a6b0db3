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

from . import planner

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
    disk = (decode.get("disk_read_bytes_per_s") or 0) / (1 << 20)
    add(
        "disk reads",
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


def bytes_per_token(manifest: dict, settings: dict, depth: int, gpu: bool) -> dict:
    """Bytes each device reads per generated token: the weights it holds that every token uses
    (experts weighted by the share of experts active), plus the KV cache at this depth."""
    layers = manifest["layers"]
    active = manifest["n_expert_used"] / manifest["n_expert"] if manifest.get("n_expert") else 1.0
    on_gpu = set(planner.gpu_layers(manifest, settings.get("n_gpu_layers"))) if gpu else set()
    n_cpu_moe = settings.get("n_cpu_moe") or 0
    kv_per_layer = planner.kv_mib(manifest, {**settings, "ctx": depth, "n_gpu_layers": None}) * (1 << 20) / layers
    dev = {"gpu": 0.0, "cpu": 0.0}
    for row in manifest["per_layer"]:
        layer_dev = "gpu" if row["layer"] in on_gpu else "cpu"
        dev[layer_dev] += row["other_bytes"] + row.get("shared_expert_bytes", 0) + kv_per_layer
        dev["cpu" if row["layer"] < n_cpu_moe or layer_dev == "cpu" else "gpu"] += row["expert_bytes"] * active
    dev["gpu" if gpu and (settings.get("n_gpu_layers") or 10**9) > layers else "cpu"] += manifest["output_bytes"]
    return dev


def decode_bound(manifest: dict, settings: dict, depth: int, gpu_gbs: float | None, cpu_gbs: float | None) -> dict:
    """Upper bound on decode tokens/s if each device only had to stream its bytes, one after the other."""
    gpu = gpu_gbs is not None
    per = bytes_per_token(manifest, settings, depth, gpu)
    seconds = per["gpu"] / (gpu_gbs * 1e9) if gpu and per["gpu"] else 0.0
    seconds += per["cpu"] / (cpu_gbs * 1e9) if cpu_gbs and per["cpu"] else 0.0
    return {
        "gpu_bytes": per["gpu"],
        "cpu_bytes": per["cpu"],
        "gpu_gbs": gpu_gbs,
        "cpu_gbs": cpu_gbs,
        "bound_tps": 1 / seconds if seconds else None,
    }
