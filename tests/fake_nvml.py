"""A stand-in for pynvml with H200-like boards whose readings each test sets; everything else is pynvml's own:
its structures (c_nvmlMemory_t, c_nvmlGpmMetricsGet_t, ...), constants and NVMLError, so the calls under test,
their return shapes and their errors are the real library's. Install it as ``sys.modules["pynvml"]``."""

from __future__ import annotations

import ctypes
import time

import pynvml

MIB = 1 << 20
GPM_IDS = {
    "sm": pynvml.NVML_GPM_METRIC_SM_UTIL,
    "occupancy": pynvml.NVML_GPM_METRIC_SM_OCCUPANCY,
    "dram": pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL,
    "rx": pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC,
    "tx": pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC,
}
NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
CLOCKS_MHZ = {pynvml.NVML_CLOCK_SM: 1980, pynvml.NVML_CLOCK_MEM: 2619}


def _address(sample) -> int:
    return ctypes.cast(sample, ctypes.c_void_p).value


class Board:
    """One H200-like board: its identity and what is on it. ``processes`` maps pid -> MiB (an int error code:
    the query fails)."""

    def __init__(self, index: int, local_cpus: list[int] | None = None, name: str = "NVIDIA H200"):
        self.handle = pynvml.c_nvmlDevice_t()
        self.name = name
        self.index, self.uuid = index, f"GPU-{index:08x}-0000-4000-8000-{index:012x}"
        self.pci_bus_id = f"00000000:{0x18 + index * 0x20:02X}:00.0"
        self.used_mib, self.processes, self.local_cpus = 1000, {}, local_cpus


class FakeNvml:
    """pynvml with H200-like boards (``boards``: how many, or their local CPUs). A reading set to None is not
    supported. GPM figures come from ``spans`` (one dict per metrics query), and like the H200 a span under
    0.1 s gives 0% SMs busy and no DRAM figure. ``used_mib`` and ``processes`` are the first board's."""

    def __init__(self, gpm: bool = False, boards: int | list = 1):
        cpus = boards if isinstance(boards, list) else [None] * boards
        self.boards = [Board(i, c) for i, c in enumerate(cpus)]
        self.handle = self.boards[0].handle
        self.util, self.power_mw = (37, 12), 250_000  # SM and memory-controller busy %, mW
        self.pcie_kbs = {pynvml.NVML_PCIE_UTIL_RX_BYTES: 2000, pynvml.NVML_PCIE_UTIL_TX_BYTES: 300}
        self.gpm, self.spans, self.span_pairs, self.shut, self.freed = gpm, [], [], False, 0
        self._buffers, self._taken, self._count = [], {}, 0  # GPM sample buffers; address -> (sequence, time)

    def __getattr__(self, name):  # pynvml's constants, structures and errors; no other function exists
        if name.startswith(("NVML_", "NVMLError", "c_nvml")):
            return getattr(pynvml, name)
        raise AttributeError(name)

    used_mib = property(lambda self: self.boards[0].used_mib, lambda self, v: setattr(self.boards[0], "used_mib", v))
    processes = property(lambda self: self.boards[0].processes, lambda self, v: setattr(self.boards[0], "processes", v))

    def _board(self, handle) -> Board:
        for board in self.boards:
            if handle is board.handle:
                return board
        raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def _reading(self, value):
        if value is None:
            raise pynvml.NVMLError(NOT_SUPPORTED)
        return value

    def nvmlInit(self):
        self.shut = False

    def nvmlShutdown(self):
        self.shut = True

    def nvmlDeviceGetCount(self):
        return len(self.boards)

    def nvmlDeviceGetHandleByIndex(self, index):
        if not 0 <= index < len(self.boards):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self.boards[index].handle

    def nvmlDeviceGetHandleByUUID(self, uuid):
        for board in self.boards:
            if board.uuid == uuid:
                return board.handle
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetIndex(self, handle):
        return self._board(handle).index

    def nvmlDeviceGetUUID(self, handle):
        return self._board(handle).uuid

    def nvmlDeviceGetName(self, handle):
        return self._board(handle).name

    def nvmlDeviceGetPciInfo(self, handle):
        return pynvml.nvmlPciInfo_t(busId=self._board(handle).pci_bus_id.encode())

    def nvmlSystemGetDriverVersion(self):
        return "580.159.04"

    def nvmlDeviceGetCpuAffinity(self, handle, words):
        cpus = self._board(handle).local_cpus
        if cpus is None:
            raise pynvml.NVMLError(NOT_SUPPORTED)
        return [sum(1 << (c - 64 * w) for c in cpus if c // 64 == w) for w in range(words)]

    def nvmlDeviceGetMemoryInfo(self, handle):
        used = self._board(handle).used_mib
        total = 143771 * MIB
        return pynvml.c_nvmlMemory_t(total=total, free=total - used * MIB, used=used * MIB)

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        processes = self._board(handle).processes
        if isinstance(processes, int):
            raise pynvml.NVMLError(processes)
        return [
            pynvml.nvmlFriendlyObject(
                {
                    "pid": pid,
                    "usedGpuMemory": None if mib is None else mib * MIB,
                    "gpuInstanceId": 0xFFFFFFFF,
                    "computeInstanceId": 0xFFFFFFFF,
                }
            )
            for pid, mib in processes.items()
        ]

    def nvmlDeviceGetUtilizationRates(self, handle):
        self._board(handle)
        gpu, memory = self._reading(self.util)
        return pynvml.c_nvmlUtilization_t(gpu=gpu, memory=memory)

    def nvmlDeviceGetPowerUsage(self, handle):
        self._board(handle)
        return self._reading(self.power_mw)

    def nvmlDeviceGetPcieThroughput(self, handle, counter):
        self._board(handle)
        return self._reading(self.pcie_kbs[counter])

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle):
        return 5

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle):
        return 16

    nvmlDeviceGetMaxPcieLinkGeneration = nvmlDeviceGetCurrPcieLinkGeneration
    nvmlDeviceGetMaxPcieLinkWidth = nvmlDeviceGetCurrPcieLinkWidth

    def nvmlDeviceGetClockInfo(self, handle, clock):
        return CLOCKS_MHZ[clock]

    def nvmlDeviceGetMaxClockInfo(self, handle, clock):  # at full clocks, as under load
        return CLOCKS_MHZ[clock]

    def nvmlDeviceGetMemoryBusWidth(self, handle):
        return 5120

    def nvmlGpmQueryDeviceSupport(self, handle):
        self._board(handle)
        return pynvml.c_nvmlGpmSupport_t(version=pynvml.NVML_GPM_SUPPORT_VERSION, isSupportedDevice=int(self.gpm))

    def nvmlGpmSampleAlloc(self):
        self._buffers.append(ctypes.create_string_buffer(8))
        return ctypes.cast(self._buffers[-1], pynvml.c_nvmlGpmSample_t)

    def nvmlGpmSampleFree(self, sample):
        self.freed += 1

    def nvmlGpmSampleGet(self, handle, sample):
        self._board(handle)
        self._taken[_address(sample)], self._count = (self._count, time.monotonic()), self._count + 1
        return sample

    def nvmlGpmMetricsGet(self, get):
        if get.version != pynvml.NVML_GPM_METRICS_GET_VERSION:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        (n1, t1), (n2, t2) = self._taken[_address(get.sample1)], self._taken[_address(get.sample2)]
        if n2 <= n1:  # the metrics are of the span from sample1 to sample2, a later sample
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        self.span_pairs.append((n1, n2))
        figures = {**(self.spans.pop(0) if self.spans else {}), **({"sm": 0.0, "dram": None} if t2 - t1 < 0.1 else {})}
        by_id = {GPM_IDS[k]: v for k, v in figures.items()}
        for i in range(get.numMetrics):
            metric = get.metrics[i]
            value = by_id.get(metric.metricId)
            metric.nvmlReturn = NOT_SUPPORTED if value is None else pynvml.NVML_SUCCESS
            metric.value = value or 0.0
        return get
