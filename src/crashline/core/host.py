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


TIMED_S = 0.2  # each timing of the host's memory bandwidth copies for at least this long


def _last_level_cache_bytes() -> int:
    """The last-level caches of this machine together (each L3 once, however many CPUs share it); 0 where unknown."""
    seen: dict[str, int] = {}
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    for index in Path("/sys/devices/system/cpu").glob("cpu[0-9]*/cache/index3"):
        try:
            size, shared = (index / "size").read_text().strip(), (index / "shared_cpu_list").read_text().strip()
        except OSError:
            continue
        seen[shared] = int(size[:-1]) * units[size[-1]] if size[-1] in units else int(size)
    return sum(seen.values())


def memory_bandwidth(threads: int | None = None, total_mib: int | None = None, passes: int = 8, repeats: int = 2):
    """Host memory bandwidth as STREAM's copy measures it (read + write), in GB/s: the best of ``passes`` passes and
    every pass's figure (a busy or shared host has slow passes; the best is the memory's).

    ``threads`` threads, each pinned to its own CPU spread over the process's affinity, each allocate and first-touch
    their own arrays once, so that every array lives on its thread's NUMA node. The arrays copied from are together at
    least 256 MiB and four times the last-level caches, so no copy runs from a cache. After an untimed copy, each pass
    is ``repeats`` timings that copy as many times over as fill ``TIMED_S``, and keeps its fastest: many short passes
    over a few seconds rather than a few long ones, since a shared host moves between a slow and a fast level from
    one second to the next (78, 77, 100, 79, 89 GB/s in one process on the H200 host: bench/results/bandwidth-h200/),
    and the best of more passes is more likely to have met the fast one."""
    import math
    import threading
    import time

    import numpy as np

    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    threads = threads or min(len(cpus), 32)
    chosen = [cpus[i * len(cpus) // threads] for i in range(threads)]
    total = total_mib or max(256, 4 * _last_level_cache_bytes() // (1 << 20))
    words = max(32, total // threads) * (1 << 20) // 8
    gate, plan = threading.Barrier(threads + 1), {"copies": 1}

    def work(cpu: int) -> None:
        if hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, {cpu})  # this thread alone (Linux)
        src, dst = np.ones(words), np.ones(words)  # faulted in here, on this thread's node
        for _ in range(1 + passes * repeats):
            gate.wait()
            for _ in range(plan["copies"]):
                np.copyto(dst, src)  # numpy releases the GIL
            gate.wait()

    def timed() -> float:
        gate.wait()
        started = time.perf_counter()
        gate.wait()
        return time.perf_counter() - started

    workers = [threading.Thread(target=work, args=(cpu,), daemon=True) for cpu in chosen]
    for w in workers:
        w.start()
    plan["copies"] = max(1, math.ceil(TIMED_S / timed()))  # read by the threads after the next gate
    bytes_copied = 2 * threads * words * 8 * plan["copies"]
    figures = [round(bytes_copied / min(timed() for _ in range(repeats)) / 1e9, 2) for _ in range(passes)]
    for w in workers:
        w.join()
    best = max(figures)
    return {
        "gbs": best,
        "passes": figures,
        "spread": round((best - min(figures)) / best, 4),  # the slowest pass's shortfall, a share of the best
        "threads": threads,
        "total_mib": total,
    }


def memory_bandwidth_gbs() -> float:
    """This machine's host memory bandwidth in GB/s (``memory_bandwidth``'s best pass)."""
    return memory_bandwidth()["gbs"]


# Passes of the measurement kept once per machine: once, so it can take 32 passes (about 13 s) where a measurement
# in a job takes 8 (on this project's 2-core VM, three fresh processes of each read 10% apart with 8 and 1.3% with
# 32: bench/results/bandwidth-cpu-s27/; a shared GPU host's passes ran 55-94 GB/s in one process)
KEPT_PASSES = 32


def measured_memory_bandwidth(cache_dir: Path, passes: int = KEPT_PASSES) -> dict:
    """This machine's memory bandwidth with the machine it was measured on and every pass (provenance.json keeps
    it), measured once per machine (#40 item 6): the first provisioning on a host measures it and keeps it in the
    cache folder, and every later one there reads it, whichever llama-server it provisions, so that two runs on one
    machine divide their decode by the same bound (four runs on one kind of machine read 58 to 106 GB/s, and a ratio
    read 0.58 in one and 0.78 in the next). It is the memory's figure, not a build's: keyed by the build, every test's
    wrapper binary measured again and left a file. Deleting the file measures again."""
    import re
    import time

    from .atomic import read_json, write_json

    host = platform.node()
    path = Path(cache_dir) / "host-bandwidth" / f"{re.sub(r'[^A-Za-z0-9._-]', '_', host) or 'host'}.json"
    try:
        known = read_json(path)
        if known["hostname"] == host and known["gbs"] > 0:
            return known
    except (OSError, ValueError, KeyError, TypeError):
        pass  # none yet, or not one this code wrote: measured now and written over
    found = {
        "hostname": host,
        **memory_bandwidth(passes=passes),
        "measured_at": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, found)
    return found


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
