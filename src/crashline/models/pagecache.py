"""Page-cache residency of model files (mincore) and warming them (a sequential read).

A cold cache measures the disk, not the configuration: models are read into the page cache before
they are measured, and the residency is recorded before and after.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import time
from pathlib import Path

from ..core import progress

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
PAGE = mmap.PAGESIZE
_CHUNK = 1 << 30  # map at most 1 GiB at a time


def resident_fraction(path: str | os.PathLike) -> float:
    """Fraction of the file's pages that are in the page cache now."""
    size = os.path.getsize(path)
    if size == 0:
        return 1.0
    resident = 0
    pages_total = (size + PAGE - 1) // PAGE
    fd = os.open(path, os.O_RDONLY)
    try:
        for offset in range(0, size, _CHUNK):
            length = min(_CHUNK, size - offset)
            addr = _libc.mmap(None, length, mmap.PROT_READ, mmap.MAP_SHARED, fd, offset)
            if addr in (None, ctypes.c_void_p(-1).value):
                raise OSError(ctypes.get_errno(), f"mmap of {path} failed")
            try:
                pages = (length + PAGE - 1) // PAGE
                vec = (ctypes.c_ubyte * pages)()
                if _libc.mincore(addr, length, vec) != 0:
                    raise OSError(ctypes.get_errno(), f"mincore on {path} failed")
                resident += sum(b & 1 for b in vec)
            finally:
                _libc.munmap(addr, length)
    finally:
        os.close(fd)
    return resident / pages_total


def warm(path: str | os.PathLike, block: int = 16 << 20) -> dict:
    """Read the whole file once; return residency before and after and the read rate. A read that
    takes long says how far it got on the console (``progress.Meter``)."""
    before = resident_fraction(path)
    started = time.monotonic()
    size = 0
    meter = progress.Meter(f"reading {Path(path).name} into the page cache", os.path.getsize(path))
    with open(path, "rb", buffering=0) as f:
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
        buf = bytearray(block)
        view = memoryview(buf)
        while n := f.readinto(view):
            size += n
            meter.update(size)
    meter.finish()
    seconds = time.monotonic() - started
    return {
        "path": str(path),
        "bytes": size,
        "resident_before": round(before, 4),
        "resident_after": round(resident_fraction(path), 4),
        "read_seconds": round(seconds, 3),
        "read_mib_s": round(size / (1 << 20) / seconds, 1) if seconds > 0 else None,
    }


def evict(path: str | os.PathLike) -> float:
    """Ask the kernel to drop the file's pages (after fsync); return the residency that remains."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return resident_fraction(Path(path))
