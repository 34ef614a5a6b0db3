"""Emulate a smaller GPU: hold the rest of each card's memory in an allocation of our own.

Uses the driver's own library (libcuda, present wherever the NVIDIA driver is) — no framework
needed. The free memory is checked with NVML before and after, so the server starts with exactly
the budget free on each of the job's GPUs (within a small tolerance); a card with less free memory
than the budget is refused. GPUs are named by UUID (the job's lease) and found in CUDA by theirs, so
the ballast lands on the job's GPUs whatever CUDA_VISIBLE_DEVICES said when CUDA started.
"""

from __future__ import annotations

import ctypes
from ..core.units import MIB

TOLERANCE_MIB = 64
_CHUNK = 4096 * MIB  # allocate in pieces so the last one can be sized precisely


class BudgetError(RuntimeError):
    """The budget cannot be emulated on this machine (no GPU, or not enough free memory)."""


def _free_used(handle) -> tuple[int, int]:
    import pynvml

    mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
    return mem.free // MIB, mem.used // MIB


def _uuid_text(raw: bytes) -> str:
    """A CUDA CUuuid's 16 bytes as NVML writes a UUID: GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx."""
    h = raw.hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


class Ballast:
    """Context manager: while inside, each GPU of ``uuids`` (default: NVML's first) has about ``budget_mib``
    MiB free."""

    def __init__(self, budget_mib: int, uuids: list[str] | None = None):
        self.budget_mib = int(budget_mib)
        self.uuids = list(uuids or [])
        self.pointers: list[ctypes.c_uint64] = []
        self.contexts: list[ctypes.c_int] = []
        self.info: dict = {"budget_mib": self.budget_mib, "gpus": []}

    def _cu(self, name: str, *args) -> None:
        rc = getattr(self.lib, name)(*args)
        if rc != 0:
            raise BudgetError(f"{name} failed with CUDA driver error {rc}")

    def __enter__(self) -> Ballast:
        try:
            import pynvml

            pynvml.nvmlInit()
        except Exception as exc:
            raise BudgetError(f"vram_budget_mib needs an NVIDIA GPU; NVML says: {exc}") from None
        handles = [pynvml.nvmlDeviceGetHandleByUUID(u) for u in self.uuids] or [pynvml.nvmlDeviceGetHandleByIndex(0)]
        self.uuids = [_str(pynvml.nvmlDeviceGetUUID(h)) for h in handles]
        names = [f"GPU {pynvml.nvmlDeviceGetIndex(h)}" for h in handles]
        for handle, name in zip(handles, names):
            free, _ = _free_used(handle)
            if free < self.budget_mib:
                raise BudgetError(
                    f"vram_budget_mib = {self.budget_mib} but {name} has only {free} MiB free: "
                    "a budget larger than the free memory cannot be emulated"
                )
        try:
            self.lib = ctypes.CDLL("libcuda.so.1")
        except OSError as exc:
            raise BudgetError(f"libcuda.so.1 not found ({exc}); the NVIDIA driver is needed for a ballast") from None
        self._cu("cuInit", 0)
        self.lib.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
        try:
            for handle, name, uuid in zip(handles, names, self.uuids):
                self.info["gpus"].append(self._fill(handle, name, self._cuda_device(uuid, name)))
        except BaseException:
            self.__exit__(None, None, None)
            raise
        first = self.info["gpus"][0]  # the figures of one GPU, as records before several GPUs had them
        self.info.update({k: first[k] for k in ("free_before_mib", "used_before_mib", "free_after_mib", "held_mib")})
        return self

    def _cuda_device(self, uuid: str, name: str) -> ctypes.c_int:
        """CUDA's device with this NVML UUID."""
        count = ctypes.c_int()
        self._cu("cuDeviceGetCount", ctypes.byref(count))
        for ordinal in range(count.value):
            dev, raw = ctypes.c_int(), ctypes.create_string_buffer(16)
            self._cu("cuDeviceGet", ctypes.byref(dev), ordinal)
            self._cu("cuDeviceGetUuid_v2" if hasattr(self.lib, "cuDeviceGetUuid_v2") else "cuDeviceGetUuid", raw, dev)
            if _uuid_text(raw.raw) == uuid:
                return dev
        raise BudgetError(f"{name} ({uuid}) is not visible to CUDA in this process (CUDA_VISIBLE_DEVICES)")

    def _fill(self, handle, name: str, dev: ctypes.c_int) -> dict:
        """Allocate on ``dev`` until its free memory is the budget; that GPU's figures."""
        free, used = _free_used(handle)
        info = {"gpu": name, "free_before_mib": free, "used_before_mib": used}
        ctx = ctypes.c_void_p()
        self._cu("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), dev)
        self.contexts.append(dev)
        self._cu("cuCtxSetCurrent", ctx)
        for _ in range(1000):
            excess = _free_used(handle)[0] - self.budget_mib
            if excess <= TOLERANCE_MIB // 2:
                break
            ptr = ctypes.c_uint64()
            self._cu("cuMemAlloc_v2", ctypes.byref(ptr), min(excess, _CHUNK // MIB) * MIB)
            self.pointers.append(ptr)
        free, used = _free_used(handle)
        info.update(free_after_mib=free, used_after_mib=used, held_mib=used - info["used_before_mib"])
        if abs(free - self.budget_mib) > TOLERANCE_MIB:
            raise BudgetError(f"ballast left {free} MiB free on {name}, wanted {self.budget_mib} ± {TOLERANCE_MIB} MiB")
        return info

    def __exit__(self, *exc) -> None:
        for ptr in self.pointers:  # cuMemFree finds each allocation's context itself
            self.lib.cuMemFree_v2(ptr)
        self.pointers.clear()
        for dev in self.contexts:
            self.lib.cuDevicePrimaryCtxRelease(dev)
        self.contexts.clear()


def _str(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
