"""Emulate a smaller GPU: hold the rest of the card's memory in an allocation of our own.

Uses the driver's own library (libcuda, present wherever the NVIDIA driver is) — no framework
needed. The free memory is checked with NVML before and after, so the server starts with exactly
the budget free (within a small tolerance); a card with less free memory than the budget is refused.
"""

from __future__ import annotations

import ctypes

MIB = 1 << 20
TOLERANCE_MIB = 64
_CHUNK = 4096 * MIB  # allocate in pieces so the last one can be sized precisely


class BudgetError(RuntimeError):
    """The budget cannot be emulated on this machine (no GPU, or not enough free memory)."""


def _nvml_free_used(index: int) -> tuple[int, int]:
    import pynvml

    h = pynvml.nvmlDeviceGetHandleByIndex(index)
    mem = pynvml.nvmlDeviceGetMemoryInfo(h)
    return mem.free // MIB, mem.used // MIB


class Ballast:
    """Context manager: while inside, GPU ``device`` has about ``budget_mib`` MiB free."""

    def __init__(self, budget_mib: int, device: int = 0):
        self.budget_mib = int(budget_mib)
        self.device = device
        self.pointers: list[ctypes.c_uint64] = []
        self.info: dict = {"budget_mib": self.budget_mib, "device": device}

    def _cu(self, name: str, *args) -> None:
        rc = getattr(self.lib, name)(*args)
        if rc != 0:
            raise BudgetError(f"{name} failed with CUDA driver error {rc}")

    def __enter__(self) -> Ballast:
        try:
            import pynvml

            pynvml.nvmlInit()
        except Exception as exc:
            raise BudgetError(f"vram_budget needs an NVIDIA GPU; NVML says: {exc}") from None
        free, used = _nvml_free_used(self.device)
        self.info.update(free_before_mib=free, used_before_mib=used)
        if free < self.budget_mib:
            raise BudgetError(
                f"vram_budget_mib = {self.budget_mib} but GPU {self.device} has only {free} MiB free: "
                "a budget larger than the free memory cannot be emulated"
            )
        try:
            self.lib = ctypes.CDLL("libcuda.so.1")
        except OSError as exc:
            raise BudgetError(f"libcuda.so.1 not found ({exc}); the NVIDIA driver is needed for a ballast") from None
        self._cu("cuInit", 0)
        self.dev = ctypes.c_int()
        self._cu("cuDeviceGet", ctypes.byref(self.dev), self.device)
        self.ctx = ctypes.c_void_p()
        self._cu("cuDevicePrimaryCtxRetain", ctypes.byref(self.ctx), self.dev)
        self._cu("cuCtxSetCurrent", self.ctx)
        self.lib.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
        for _ in range(1000):
            free, _used = _nvml_free_used(self.device)
            excess = free - self.budget_mib
            if excess <= TOLERANCE_MIB // 2:
                break
            ptr = ctypes.c_uint64()
            self._cu("cuMemAlloc_v2", ctypes.byref(ptr), min(excess, _CHUNK // MIB) * MIB)
            self.pointers.append(ptr)
        free, used = _nvml_free_used(self.device)
        self.info.update(free_after_mib=free, used_after_mib=used, held_mib=used - self.info["used_before_mib"])
        if abs(free - self.budget_mib) > TOLERANCE_MIB:
            self.__exit__(None, None, None)
            raise BudgetError(f"ballast left {free} MiB free, wanted {self.budget_mib} ± {TOLERANCE_MIB} MiB")
        return self

    def __exit__(self, *exc) -> None:
        for ptr in self.pointers:
            self.lib.cuMemFree_v2(ptr)
        self.pointers.clear()
        if getattr(self, "ctx", None):
            self.lib.cuDevicePrimaryCtxRelease(self.dev)
            self.ctx = None
