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


def gpus() -> dict:
    """NVML's view of the GPUs, or {"present": False, "reason": ...}."""
    try:
        import pynvml
    except ImportError:
        return {"present": False, "reason": "nvidia-ml-py is not installed"}
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return {"present": False, "reason": f"no GPU (NVML: {exc})"}
    try:
        devices = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            devices.append(
                {
                    "index": i,
                    "name": _str(pynvml.nvmlDeviceGetName(h)),
                    "memory_total_mib": mem.total // (1 << 20),
                    "memory_free_mib": mem.free // (1 << 20),
                    "pcie_max_gen": _try(pynvml.nvmlDeviceGetMaxPcieLinkGeneration, h),
                    "pcie_max_width": _try(pynvml.nvmlDeviceGetMaxPcieLinkWidth, h),
                    "pcie_cur_gen": _try(pynvml.nvmlDeviceGetCurrPcieLinkGeneration, h),
                    "pcie_cur_width": _try(pynvml.nvmlDeviceGetCurrPcieLinkWidth, h),
                }
            )
        return {
            "present": bool(devices),
            "driver": _str(pynvml.nvmlSystemGetDriverVersion()),
            "devices": devices,
            **({} if devices else {"reason": "no GPU (NVML lists no devices)"}),
        }
    finally:
        pynvml.nvmlShutdown()


def _str(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _try(fn, *args):
    try:
        return fn(*args)
    except Exception:  # NVML raises NotSupported on some boards; absent is the honest answer
        return None


def describe() -> dict:
    """The host facts every record carries."""
    return {
        "hostname": platform.node(),
        "os": f"{platform.system()} {platform.release()}",
        "cpu_model": _cpu_model(),
        "cpu_physical_cores": psutil.cpu_count(logical=False),
        "cpu_logical_cores": psutil.cpu_count(logical=True),
        "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "ram_mib": psutil.virtual_memory().total // (1 << 20),
        "python": platform.python_version(),
        "gpu": gpus(),
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
    """What must match for two measurements to be combined: machine, CPU, GPU and driver."""
    gpu = host.get("gpu", {})
    names = ",".join(d["name"] for d in gpu.get("devices", [])) or "no GPU"
    return f"{host.get('hostname')}|{host.get('cpu_model')}|{names}|{gpu.get('driver', '-')}"
