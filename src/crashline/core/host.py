"""What machine a number was measured on: CPU, memory, GPU (through NVML) or "no GPU"."""

from __future__ import annotations

import os
import platform
from pathlib import Path

import psutil


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def gpus(uuids: list[str] | None = None) -> dict:
    """NVML's view of the GPUs (all of them, or those named by ``uuids``, in that order), or
    {"present": False, "reason": ...}."""
    try:
        import pynvml
    except ImportError:
        return {"present": False, "reason": "nvidia-ml-py is not installed"}
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return {"present": False, "reason": f"no GPU (NVML: {exc})"}
    try:
        handles = (
            [pynvml.nvmlDeviceGetHandleByUUID(u) for u in uuids]
            if uuids is not None
            else [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        )
        devices = [_device(pynvml, h) for h in handles]
        return {
            "present": bool(devices),
            "driver": _str(pynvml.nvmlSystemGetDriverVersion()),
            "devices": devices,
            **({} if devices else {"reason": "no GPU (NVML lists no devices)"}),
        }
    finally:
        pynvml.nvmlShutdown()


def _device(pynvml, h) -> dict:
    mem = pynvml.nvmlDeviceGetMemoryInfo(h)
    return {
        "index": pynvml.nvmlDeviceGetIndex(h),  # NVML's number: nvidia-smi's, in PCI bus order
        "uuid": _str(pynvml.nvmlDeviceGetUUID(h)),
        "name": _str(pynvml.nvmlDeviceGetName(h)),
        "pci_bus_id": _str(pynvml.nvmlDeviceGetPciInfo(h).busId),
        "memory_total_mib": mem.total // (1 << 20),
        "memory_free_mib": mem.free // (1 << 20),
        "pcie_max_gen": _try(pynvml.nvmlDeviceGetMaxPcieLinkGeneration, h),
        "pcie_max_width": _try(pynvml.nvmlDeviceGetMaxPcieLinkWidth, h),
        "pcie_cur_gen": _try(pynvml.nvmlDeviceGetCurrPcieLinkGeneration, h),
        "pcie_cur_width": _try(pynvml.nvmlDeviceGetCurrPcieLinkWidth, h),
        "local_cpus": _local_cpus(pynvml, h),
    }


def _local_cpus(pynvml, h) -> list[int] | None:
    """The CPUs close to the GPU (its NUMA node), from NVML's affinity mask; None where NVML gives none."""
    n = os.cpu_count() or 1
    words = (n + 63) // 64
    mask = _try(pynvml.nvmlDeviceGetCpuAffinity, h, words)
    if not mask:
        return None
    cpus = [64 * w + b for w, word in enumerate(mask) for b in range(64) if int(word) >> b & 1]
    return cpus or None


def _str(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _try(fn, *args):
    try:
        return fn(*args)
    except Exception:  # NVML raises NotSupported on some boards; absent is the honest answer
        return None


def describe(gpu_uuids: list[str] | None = None) -> dict:
    """The host facts every record carries; ``gpu_uuids``: the GPUs the job holds (crashline.core.locks), else all."""
    return {
        "hostname": platform.node(),
        "os": f"{platform.system()} {platform.release()}",
        "cpu_model": _cpu_model(),
        "cpu_physical_cores": psutil.cpu_count(logical=False),
        "cpu_logical_cores": psutil.cpu_count(logical=True),
        "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "ram_mib": psutil.virtual_memory().total // (1 << 20),
        "python": platform.python_version(),
        "gpu": gpus(gpu_uuids),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),  # the cluster job it ran in (profiles/slurm), else None
    }


def memory_bandwidth_gbs(threads: int | None = None, total_mib: int = 512, repeats: int = 3) -> float:
    """Host memory bandwidth: the best of a few large copies (read + write), one per thread at once."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    threads = threads or min(os.cpu_count() or 1, 16)
    src = [np.ones(max(32, total_mib // threads) * (1 << 20) // 8) for _ in range(threads)]
    dst = [np.empty_like(a) for a in src]
    best = float("inf")
    with ThreadPoolExecutor(threads) as pool:
        for _ in range(repeats):
            t = time.perf_counter()
            list(pool.map(lambda i: np.copyto(dst[i], src[i]), range(threads)))  # numpy releases the GIL
            best = min(best, time.perf_counter() - t)
    return round(2 * threads * src[0].nbytes / best / 1e9, 2)


def measured_memory_bandwidth() -> dict:
    """This machine's memory bandwidth with the machine it was measured on (provenance.json keeps it)."""
    return {"hostname": platform.node(), "gbs": memory_bandwidth_gbs()}


def memory_bandwidth_from(provenance: dict) -> float:
    """The bandwidth provisioning measured on this machine, else measured now (a first measurement in a
    process costs about 1.5 s: the copies' memory is faulted in)."""
    known = provenance.get("host_memory_bandwidth") or {}
    if known.get("hostname") == platform.node() and known.get("gbs"):
        return known["gbs"]
    return memory_bandwidth_gbs()


def environment_key(host: dict) -> str:
    """What must match for two measurements to be ranked together: the hardware and the driver (CPU model and
    cores, memory, GPU model, driver), not the host's name, so identical nodes of a cluster rank together and
    a configuration on one GPU ranks with one on two of the same."""
    gpu = host.get("gpu", {})
    names = ",".join(sorted({d["name"] for d in gpu.get("devices", [])})) or "no GPU"
    ram_gib = round((host.get("ram_mib") or 0) / 1024)
    cores = host.get("cpu_logical_cores")
    return f"{host.get('cpu_model')} ({cores} threads, {ram_gib} GiB)|{names}|{gpu.get('driver', '-')}"
