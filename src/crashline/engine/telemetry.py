"""Sampling beside a running server, cheap enough not to change what it measures.

Every ``interval_s`` one row: the server's CPU time, RSS, page faults and storage reads (/proc),
the machine's busy CPU time, swap traffic and disk reads, and for the GPU (NVML) SM and memory
controller utilisation, PCIe RX/TX traffic, clocks, power and the server process's own memory.
Where the board offers GPM (Hopper and later) the share of SMs busy, warp occupancy, DRAM bandwidth
and PCIe traffic come from it, exact over each span between samples; elsewhere PCIe comes from
``nvmlDeviceGetPcieThroughput``, which samples 20 ms per direction and per call. Energy is not
sampled: its query took 3.5 ms of CPU on an H200, more than all the others together. The sampler
times itself: ``result()`` says how much CPU its own samples took.

GPU memory is the server's own (nvmlDeviceGetComputeRunningProcesses), so other processes and a
ballast do not count; where the driver cannot see the server's pid (a container's pid namespace)
the change of the device's used memory from a baseline taken just before the server started
stands in for it.

Phases (load, each workload) get their peaks and CPU shares as they end; the time series goes to
Parquet, and ``window_summary`` turns it into rates over the prefill and steady-decode windows.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pandas as pd
import psutil
from ..core.thresholds import CONTENTION_CORES, QUIET_STRETCH_MIN_S
from ..core.units import MIB


class _Nvml:
    """The NVIDIA GPUs through NVML (those named by ``uuids``, the job's lease, else all), or nothing when
    there are none."""

    def __init__(self, uuids: list[str] | None = None):
        self.handles = []
        try:
            import pynvml

            pynvml.nvmlInit()
            self.nv = pynvml
            self.handles = (
                [pynvml.nvmlDeviceGetHandleByUUID(u) for u in uuids]
                if uuids
                else [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
            )
        except Exception:  # no driver, no library, no device: the GPU columns say "no GPU"
            self.handles = []
        self.gpm = _Gpm(self.nv, self.handles[0]) if self.handles else None
        if self.gpm and not self.gpm.start():
            self.gpm = None

    @property
    def present(self) -> bool:
        return bool(self.handles)

    def used_mib(self) -> list[float]:
        """Each GPU's used memory, whoever uses it."""
        return [self.nv.nvmlDeviceGetMemoryInfo(h).used / MIB for h in self.handles]

    def process_mib(self, pids: set[int]) -> list[float]:
        """The memory the processes ``pids`` hold on each GPU (0 where the driver lists none of them)."""
        each = []
        for h in self.handles:
            try:
                procs = self.nv.nvmlDeviceGetComputeRunningProcesses(h)
            except self.nv.NVMLError:
                procs = []
            each.append(sum(p.usedGpuMemory or 0 for p in procs if p.pid in pids) / MIB)
        return each

    def _get(self, fn, *args):
        try:
            return fn(*args)
        except self.nv.NVMLError:  # not supported on this board: absent, not zero
            return None

    def row(self) -> dict:
        """The first GPU's counters (with several, the main GPU: its compute and PCIe traffic stand for the
        job's; memory is counted on each, in ``Sampler``)."""
        nv, h = self.nv, self.handles[0]
        util = self._get(nv.nvmlDeviceGetUtilizationRates, h)
        power = self._get(nv.nvmlDeviceGetPowerUsage, h)
        if self.gpm:
            rates = self.gpm.rates()
        else:
            rates = {
                "pcie_rx_kbs": self._get(nv.nvmlDeviceGetPcieThroughput, h, nv.NVML_PCIE_UTIL_RX_BYTES),
                "pcie_tx_kbs": self._get(nv.nvmlDeviceGetPcieThroughput, h, nv.NVML_PCIE_UTIL_TX_BYTES),
            }
        return {
            "gpu_sm_pct": util.gpu if util else None,
            "gpu_mem_pct": util.memory if util else None,
            **rates,
            "pcie_gen": self._get(nv.nvmlDeviceGetCurrPcieLinkGeneration, h),
            "pcie_width": self._get(nv.nvmlDeviceGetCurrPcieLinkWidth, h),
            "sm_clock_mhz": self._get(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM),
            "mem_clock_mhz": self._get(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_MEM),
            "power_w": power / 1000 if power is not None else None,
        }

    def memory_bandwidth_gbs(self) -> float | None:
        """Peak memory bandwidth from the maximum memory clock and the bus width (double data rate)."""
        if not self.present:
            return None
        clock = self._get(self.nv.nvmlDeviceGetMaxClockInfo, self.handles[0], self.nv.NVML_CLOCK_MEM)
        width = self._get(self.nv.nvmlDeviceGetMemoryBusWidth, self.handles[0])
        return clock * 1e6 * 2 * width / 8 / 1e9 if clock and width else None

    def close(self):
        if self.gpm:
            self.gpm.close()
        if self.handles:
            self.nv.nvmlShutdown()


class _Gpm:
    """NVML's GPU Performance Monitoring (Hopper and later): the share of SMs busy, warp occupancy,
    DRAM bandwidth used and PCIe traffic, each exact over the span between two samples. Each row
    gets the figures of the span that ends with it (the first row of a sampler has none)."""

    METRICS = {  # column: (metric name in pynvml, factor to the column's unit)
        "gpm_sm_pct": ("NVML_GPM_METRIC_SM_UTIL", 1.0),
        "gpm_occupancy_pct": ("NVML_GPM_METRIC_SM_OCCUPANCY", 1.0),
        "gpm_dram_bw_pct": ("NVML_GPM_METRIC_DRAM_BW_UTIL", 1.0),
        "pcie_rx_kbs": ("NVML_GPM_METRIC_PCIE_RX_PER_SEC", MIB / 1000),  # MiB/s -> KB/s, the throughput query's unit
        "pcie_tx_kbs": ("NVML_GPM_METRIC_PCIE_TX_PER_SEC", MIB / 1000),
    }

    MIN_SPAN_S = 0.1  # over shorter spans the H200 gave 0% SMs busy and no DRAM figure: skip, keep the span open

    def __init__(self, nv, handle):
        self.nv, self.handle = nv, handle
        self.samples: list = []
        self.taken = 0.0  # time.monotonic() of the sample that starts the open span

    def start(self) -> bool:
        """Take the first sample; False where the board, driver or permissions do not allow GPM."""
        nv = self.nv
        try:
            if not nv.nvmlGpmQueryDeviceSupport(self.handle).isSupportedDevice:
                return False
            self.samples = [nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()]
            nv.nvmlGpmSampleGet(self.handle, self.samples[0])
            self.taken = time.monotonic()
            return True
        except (nv.NVMLError, AttributeError):
            self.close()
            return False

    def rates(self) -> dict:
        nv = self.nv
        out = dict.fromkeys(self.METRICS)
        if time.monotonic() - self.taken < self.MIN_SPAN_S:
            return out
        try:
            nv.nvmlGpmSampleGet(self.handle, self.samples[1])
            self.taken = time.monotonic()
            get = nv.c_nvmlGpmMetricsGet_t()
            get.version, get.numMetrics = nv.NVML_GPM_METRICS_GET_VERSION, len(self.METRICS)
            get.sample1, get.sample2 = self.samples
            for i, (name, _) in enumerate(self.METRICS.values()):
                get.metrics[i].metricId = getattr(nv, name)
            nv.nvmlGpmMetricsGet(get)
        except nv.NVMLError:
            return out
        finally:
            self.samples.reverse()  # this sample starts the next span
        for i, (column, (_, factor)) in enumerate(self.METRICS.items()):
            metric = get.metrics[i]
            if metric.nvmlReturn == nv.NVML_SUCCESS:
                out[column] = metric.value * factor
        return out

    def close(self) -> None:
        for sample in self.samples:
            try:
                self.nv.nvmlGpmSampleFree(sample)
            except self.nv.NVMLError:
                pass
        self.samples = []


def page_faults(pid: int) -> tuple[int, int]:
    """Minor and major page faults of a process (fields 10 and 12 of /proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[7]), int(fields[9])


def busy_seconds(t) -> float:
    """Busy CPU seconds of a psutil cpu_times() reading (user, system, nice, interrupts)."""
    return t.user + t.system + getattr(t, "nice", 0) + getattr(t, "irq", 0) + getattr(t, "softirq", 0)


class Sampler:
    """Samples every ``interval_s`` in a thread; ``phase(name)`` marks where the next samples belong.

    Create it before the server starts (the GPU baseline is taken then); ``follow(pid)`` points it
    at the server's process once that has started (again after a restart on another port).
    """

    def __init__(self, pid: int | None = None, interval_s: float = 0.25, uuids: list[str] | None = None):
        self.pid = pid
        self.interval_s = interval_s
        self.current = "load"
        self.peaks: dict[str, dict] = {}
        self.rows: list[dict] = []
        self.nvml = _Nvml(uuids)
        self.baseline_each = self.nvml.used_mib() if self.nvml.present else None
        self.baseline_used_mib = sum(self.baseline_each) if self.nvml.present else None
        self.own = {"samples": 0, "cpu_s": 0.0, "wall_s": 0.0}  # what sampling itself cost
        self._procs: list[psutil.Process] | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._sampling = threading.Event()  # cleared by pause(): the thread then sleeps without waking
        self._sampling.set()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._cpu_start = None

    def phase(self, name: str) -> None:
        self._sample()
        self._close_phase()
        self.current = name
        self._find_processes()

    def now(self) -> dict:
        """A sample taken now: the server's RSS and (with a GPU) its VRAM in MiB; None where it is gone."""
        count = len(self.rows)
        self._sample()
        row = self.rows[-1] if len(self.rows) > count else {}
        return {"rss_mib": row.get("server_rss_mib"), "gpu_mib": row.get("gpu_mib")}

    def follow(self, pid: int) -> None:
        """Sample this process (the server just started) from now on."""
        with self._lock:
            self.pid = pid
            self._find_processes()
            self._cpu_start = self._cpu_mark()

    def _find_processes(self) -> None:
        """The server and its children. Listing children reads all of /proc (a millisecond or more), so
        it happens as a phase begins, outside the requests, and not at every sample."""
        if self.pid is None:
            self._procs = None
            return
        try:
            server = psutil.Process(self.pid)
            self._procs = [server, *server.children(recursive=True)]
        except (psutil.Error, ValueError):
            self._procs = None

    def _peak(self) -> dict:
        return self.peaks.setdefault(self.current, {"rss_mib": 0.0, "gpu_mib": None, "gpu_source": None, "samples": 0})

    def _sample(self) -> None:
        with self._lock:
            wall, cpu = time.perf_counter(), time.thread_time()
            self._take_row()
            self.own["samples"] += 1
            self.own["cpu_s"] += time.thread_time() - cpu
            self.own["wall_s"] += time.perf_counter() - wall

    def _take_row(self) -> None:
        if self._procs is None:
            self._find_processes()
        if self._procs is None:  # the server is gone
            return
        try:
            server = self._procs[0]
            with server.oneshot():
                cpu = server.cpu_times()
                io = server.io_counters() if hasattr(server, "io_counters") else None
                rss = server.memory_info().rss
            rss += sum(p.memory_info().rss for p in self._procs[1:] if p.is_running())
            minflt, majflt = page_faults(self.pid)
        except (psutil.Error, OSError):
            return
        machine = psutil.cpu_times()
        swap = psutil.swap_memory()
        disk = psutil.disk_io_counters()
        row = {
            "t": time.monotonic(),
            "phase": self.current,
            "server_cpu_s": cpu.user + cpu.system + cpu.children_user + cpu.children_system,
            "server_rss_mib": round(rss / MIB, 1),
            "server_minflt": minflt,
            "server_majflt": majflt,
            "server_read_bytes": io.read_bytes if io else None,
            "machine_busy_s": busy_seconds(machine),
            "machine_steal_s": getattr(machine, "steal", 0.0),
            "swap_in_bytes": swap.sin,
            "swap_out_bytes": swap.sout,
            "disk_read_bytes": disk.read_bytes if disk else None,
        }
        peak = self._peak()
        peak["rss_mib"] = max(peak["rss_mib"], row["server_rss_mib"])
        peak["samples"] += 1
        if self.nvml.present:
            each = self.nvml.process_mib({p.pid for p in self._procs})
            source = "process"
            if sum(each) <= 0:
                each = [used - base for used, base in zip(self.nvml.used_mib(), self.baseline_each)]
                source = "device delta"
            each = [round(x, 1) for x in each]
            gpu = round(sum(each), 1)
            row.update(self.nvml.row(), gpu_mib=gpu)
            if len(each) > 1:  # several GPUs: each one's memory too (each has its own limit)
                row.update({f"gpu{i}_mib": x for i, x in enumerate(each)})
                peak["gpus_mib"] = [max(a, b) for a, b in zip(peak.get("gpus_mib") or each, each)]
            if peak["gpu_mib"] is None or gpu > peak["gpu_mib"]:
                peak["gpu_mib"], peak["gpu_source"] = gpu, source
        self.rows.append(row)

    def _close_phase(self) -> None:
        """CPU used during the phase that ends: by the server, and by every other process."""
        mark = self._cpu_mark()
        start, self._cpu_start = self._cpu_start, mark
        if start is None or mark is None or mark[0] - start[0] < 0.05:
            return
        wall = mark[0] - start[0]
        server = (mark[2] - start[2]) / wall
        machine = (mark[1] - start[1]) / wall
        self._peak().update(
            cpu_server_cores=round(server, 2),
            cpu_other_cores=round(max(0.0, machine - server), 2),
            cpu_steal_cores=round((mark[3] - start[3]) / wall, 2),
            seconds=round(wall, 2),
        )

    def _cpu_mark(self) -> tuple[float, float, float, float] | None:
        if self.pid is None:
            return None
        try:
            t = psutil.Process(self.pid).cpu_times()
        except (psutil.Error, ValueError):
            return None
        machine = psutil.cpu_times()
        own = t.user + t.system + t.children_user + t.children_system
        return time.monotonic(), busy_seconds(machine), own, getattr(machine, "steal", 0.0)

    def others_so_far(self) -> float | None:
        """The cores other processes (the machine less the server and its threads) used since the phase's CPU figures
        began counting (the phase's start, or the end of the last ``quiet`` wait); None where the CPU cannot be read
        or the stretch is too short for a rate."""
        start, end = self._cpu_start, self._cpu_mark()
        if start is None or end is None or end[0] - start[0] < QUIET_STRETCH_MIN_S:
            return None
        return round(max(0.0, ((end[1] - start[1]) - (end[2] - start[2])) / (end[0] - start[0])), 2)

    def quiet(self, wait_s: float, step_s: float = 1.0) -> dict | None:
        """Wait, ``wait_s`` at most, for a stretch of ``step_s`` in which other processes (the machine less the server
        and its threads) use at most CONTENTION_CORES cores: a measurement then starts on a quiet machine where the
        load was a burst. The phase's CPU figures then count from the end of the wait. Returns what it found
        ({"waited_s", "other_cores" of the last stretch, "quiet"}), or None where the CPU cannot be read. The first
        stretch is the phase so far (the warm-up), lengthened to QUIET_STRETCH_MIN_S where shorter: a quiet one costs
        no wait."""
        waited, start, first = 0.0, self._cpu_start, True
        while True:
            end = self._cpu_mark()
            if start is None or end is None:
                return None
            wall = end[0] - start[0]
            if wall < QUIET_STRETCH_MIN_S:  # too short for a rate (clock ticks of 10 ms): lengthen this stretch
                time.sleep(QUIET_STRETCH_MIN_S - wall)
                continue
            others = max(0.0, ((end[1] - start[1]) - (end[2] - start[2])) / wall)
            waited += 0.0 if first else wall
            first = False
            if others <= CONTENTION_CORES or waited >= wait_s:
                with self._lock:  # the phase's CPU figures count from here: the timed requests, not the wait
                    self._cpu_start = self._cpu_mark()
                return {
                    "waited_s": round(waited, 1),
                    "other_cores": round(others, 2),
                    "quiet": others <= CONTENTION_CORES,
                }
            start = end
            time.sleep(step_s)

    def _run(self) -> None:
        while True:
            self._sampling.wait()
            if self._stop.wait(self.interval_s):
                return
            if self._sampling.is_set():
                self._sample()

    def pause(self) -> None:
        """Stop sampling until ``resume()`` (the overhead bench compares stretches with and without)."""
        self._sampling.clear()

    def resume(self) -> None:
        self._sampling.set()

    def __enter__(self) -> Sampler:
        self._cpu_start = self._cpu_mark()
        self._find_processes()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._close_phase()
        self._stop.set()
        self._sampling.set()
        self._thread.join()

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows)

    def result(self) -> dict:
        gpu = [p["gpu_mib"] for p in self.peaks.values() if p["gpu_mib"] is not None]
        return {
            "gpu_present": self.nvml.present,
            "gpu_baseline_used_mib": self.baseline_used_mib,
            "gpu_memory_bandwidth_gbs": self.nvml.memory_bandwidth_gbs(),
            "interval_s": self.interval_s,
            "pcie_source": ("GPM" if self.nvml.gpm else "throughput samples") if self.nvml.present else None,
            "sampler_cost": self.cost(),
            "per_phase": self.peaks,
            "peak_rss_mib": max((p["rss_mib"] for p in self.peaks.values()), default=None),
            "peak_gpu_mib": max(gpu) if gpu else None,
            **({"peak_gpus_mib": self.peak_each()} if len(self.nvml.handles) > 1 else {}),
        }

    def peak_each(self) -> list[float] | None:
        """Each GPU's own peak over every phase (several GPUs only)."""
        each = [p["gpus_mib"] for p in self.peaks.values() if p.get("gpus_mib")]
        return [max(x) for x in zip(*each)] if each else None

    def cost(self) -> dict:
        """The sampler's own CPU and wall time per sample, and the share of one core it kept busy."""
        n = self.own["samples"]
        return {
            "samples": n,
            "cpu_ms_per_sample": round(self.own["cpu_s"] / n * 1000, 3) if n else None,
            "wall_ms_per_sample": round(self.own["wall_s"] / n * 1000, 3) if n else None,
            "core_share": round(self.own["cpu_s"] / n / self.interval_s, 5) if n else None,
        }

    def close(self) -> None:
        self.nvml.close()


COUNTERS = {  # cumulative columns and the rate each becomes over a window
    "server_cpu_s": "server_cpu_cores",
    "machine_busy_s": "machine_busy_cores",
    "server_minflt": "minflt_per_s",
    "server_majflt": "majflt_per_s",
    "server_read_bytes": "server_read_bytes_per_s",
    "swap_in_bytes": "swap_in_bytes_per_s",
    "swap_out_bytes": "swap_out_bytes_per_s",
    "disk_read_bytes": "disk_read_bytes_per_s",
}
GAUGES = (
    "gpu_sm_pct",
    "gpu_mem_pct",
    "gpm_sm_pct",
    "gpm_occupancy_pct",
    "gpm_dram_bw_pct",
    "pcie_rx_kbs",
    "pcie_tx_kbs",
    "pcie_gen",
    "pcie_width",
    "sm_clock_mhz",
    "mem_clock_mhz",
    "power_w",
    "gpu_mib",
    "server_rss_mib",
)


def window_summary(frame: pd.DataFrame, windows: list[tuple[float, float]]) -> dict | None:
    """Rates of the counters and means of the gauges over the prefill or decode windows.

    A counter's rate over a window comes from the samples that bracket it (the last one at or
    before its start, the first one at or after its end), so a window shorter than the sampling
    interval still gets a rate, over a slightly longer span; gauges average the samples inside the
    windows, or the bracketing ones when none falls inside.
    """
    if frame.empty or not windows:
        return None
    t = frame["t"]
    seconds, deltas, picked = 0.0, {c: 0.0 for c in COUNTERS}, []
    for t0, t1 in windows:
        before, after = frame[t <= t0], frame[t >= t1]
        if before.empty or after.empty:
            continue
        a, b = before.iloc[-1], after.iloc[0]
        seconds += b["t"] - a["t"]
        for col in COUNTERS:
            if col in frame and pd.notna(a.get(col)) and pd.notna(b.get(col)):
                deltas[col] += float(b[col] - a[col])
        inside = frame[(t >= t0) & (t <= t1)]
        picked.append(inside if not inside.empty else pd.DataFrame([a, b]))
    if not picked or seconds <= 0:
        return None
    samples = pd.concat(picked)
    out = {"samples": len(samples), "seconds": round(seconds, 3)}
    for col, rate in COUNTERS.items():
        has = col in frame and frame[col].notna().any()
        value = deltas[col] / seconds if has else None
        out[rate] = value
    for col in GAUGES:
        if col in samples and samples[col].notna().any():
            out[col] = float(pd.to_numeric(samples[col]).mean())
    return out


def write_frame(frame: pd.DataFrame, path: Path) -> None:
    from ..core.atomic import atomic_path

    with atomic_path(path) as tmp:
        frame.to_parquet(tmp, index=False)
