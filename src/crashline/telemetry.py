"""Sampling beside a running server: its RSS from /proc and its own GPU memory from NVML,
with the peak per phase (load, each workload), and the CPU the server and every other process
used in each phase (other processes on the machine make a measurement untrustworthy). GPU memory is the server process's own
(nvmlDeviceGetComputeRunningProcesses), so other processes and any ballast do not count; where
the driver cannot see the server's pid (a container's pid namespace), the change of the devices'
used memory from a baseline taken just before the server started stands in for it.
"""

from __future__ import annotations

import threading
import time

import psutil


class _Nvml:
    """Per-process GPU memory, or nothing when there is no NVIDIA GPU."""

    def __init__(self):
        self.handles = []
        try:
            import pynvml

            pynvml.nvmlInit()
            self.pynvml = pynvml
            self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        except Exception:  # no driver, no library, no device: GPU columns say "no GPU"
            self.handles = []

    @property
    def present(self) -> bool:
        return bool(self.handles)

    def used_mib(self) -> float:
        return sum(self.pynvml.nvmlDeviceGetMemoryInfo(h).used for h in self.handles) / (1 << 20)

    def process_mib(self, pids: set[int]) -> float:
        total = 0
        for h in self.handles:
            try:
                procs = self.pynvml.nvmlDeviceGetComputeRunningProcesses(h)
            except self.pynvml.NVMLError:
                continue
            total += sum(p.usedGpuMemory or 0 for p in procs if p.pid in pids)
        return total / (1 << 20)

    def close(self):
        if self.handles:
            self.pynvml.nvmlShutdown()


class MemorySampler:
    """Samples every ``interval_s`` in a thread; ``phase(name)`` marks where the next samples belong."""

    def __init__(self, pid: int | None = None, interval_s: float = 0.2):
        """Create before the server starts (the GPU baseline is taken here); set ``pid`` before entering."""
        self.pid = pid
        self.interval_s = interval_s
        self.current = "load"
        self.peaks: dict[str, dict] = {}
        self.nvml = _Nvml()
        self.baseline_used_mib = self.nvml.used_mib() if self.nvml.present else None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def phase(self, name: str) -> None:
        self._sample()
        self._close_cpu_window()
        self.current = name

    def _cpu_mark(self) -> tuple[float, float, float, float] | None:
        """(wall, busy CPU seconds of the whole machine, of the server, steal seconds)."""
        try:
            t = psutil.Process(self.pid).cpu_times()
            own = t.user + t.system + t.children_user + t.children_system
        except (psutil.Error, ValueError):
            return None
        sys_t = psutil.cpu_times()
        busy = sys_t.user + sys_t.system + getattr(sys_t, "nice", 0) + getattr(sys_t, "irq", 0) + getattr(sys_t, "softirq", 0)
        return time.monotonic(), busy, own, getattr(sys_t, "steal", 0.0)

    def _close_cpu_window(self) -> None:
        """CPU used during the phase that ends: by the server, and by every other process (contention)."""
        mark = self._cpu_mark()
        start, self._cpu_start = getattr(self, "_cpu_start", None), mark
        if start is None or mark is None or mark[0] - start[0] < 0.05:
            return
        wall = mark[0] - start[0]
        server = (mark[2] - start[2]) / wall
        machine = (mark[1] - start[1]) / wall
        peak = self.peaks.setdefault(self.current, {"rss_mib": 0.0, "gpu_mib": None, "gpu_source": None, "samples": 0})
        peak.update(cpu_server_cores=round(server, 2), cpu_other_cores=round(max(0.0, machine - server), 2),
                    cpu_steal_cores=round((mark[3] - start[3]) / wall, 2), seconds=round(wall, 2))

    def _pids(self) -> tuple[set[int], float]:
        try:
            proc = psutil.Process(self.pid)
            procs = [proc, *proc.children(recursive=True)]
            rss = sum(p.memory_info().rss for p in procs) / (1 << 20)
            return {p.pid for p in procs}, rss
        except psutil.Error:
            return set(), 0.0

    def _sample(self) -> None:
        pids, rss = self._pids()
        if not pids:
            return
        peak = self.peaks.setdefault(self.current, {"rss_mib": 0.0, "gpu_mib": None, "gpu_source": None, "samples": 0})
        peak["rss_mib"] = max(peak["rss_mib"], round(rss, 1))
        peak["samples"] += 1
        if self.nvml.present:
            own = self.nvml.process_mib(pids)
            gpu, source = (own, "process") if own > 0 else (self.nvml.used_mib() - self.baseline_used_mib, "device delta")
            if peak["gpu_mib"] is None or gpu > peak["gpu_mib"]:
                peak["gpu_mib"], peak["gpu_source"] = round(gpu, 1), source

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def __enter__(self) -> "MemorySampler":
        self._cpu_start = self._cpu_mark()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._close_cpu_window()
        self._stop.set()
        self._thread.join()
        self.nvml.close()

    def result(self) -> dict:
        gpu = [p["gpu_mib"] for p in self.peaks.values() if p["gpu_mib"] is not None]
        return {
            "gpu_present": self.nvml.present,
            "gpu_baseline_used_mib": self.baseline_used_mib,
            "per_phase": self.peaks,
            "peak_rss_mib": max((p["rss_mib"] for p in self.peaks.values()), default=None),
            "peak_gpu_mib": max(gpu) if gpu else None,
        }
