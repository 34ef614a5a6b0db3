"""Page-cache residency of model files (mincore) and warming them (a read of the pages not resident).

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

import numpy as np

from ..core import progress

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
PAGE = mmap.PAGESIZE
_CHUNK = 1 << 30  # map at most 1 GiB at a time


def resident_pages(path: str | os.PathLike) -> np.ndarray:
    """Which of the file's pages are in the page cache now (mincore), one bool per page."""
    size = os.path.getsize(path)
    parts = []
    fd = os.open(path, os.O_RDONLY)
    try:
        for offset in range(0, size, _CHUNK):
            length = min(_CHUNK, size - offset)
            addr = _libc.mmap(None, length, mmap.PROT_READ, mmap.MAP_SHARED, fd, offset)
            if addr in (None, ctypes.c_void_p(-1).value):
                raise OSError(ctypes.get_errno(), f"mmap of {path} failed")
            try:
                vec = (ctypes.c_ubyte * ((length + PAGE - 1) // PAGE))()
                if _libc.mincore(addr, length, vec) != 0:
                    raise OSError(ctypes.get_errno(), f"mincore on {path} failed")
                parts.append(np.frombuffer(vec, dtype=np.uint8) & 1)
            finally:
                _libc.munmap(addr, length)
    finally:
        os.close(fd)
    return np.concatenate(parts).astype(bool) if parts else np.zeros(0, dtype=bool)


def resident_fraction(path: str | os.PathLike) -> float:
    """Fraction of the file's pages that are in the page cache now."""
    pages = resident_pages(path)
    return float(pages.mean()) if pages.size else 1.0


def _missing_runs(pages: np.ndarray, block_pages: int) -> list[tuple[int, int]]:
    """(first page, page count) of each run of pages not resident, each at most ``block_pages`` long."""
    edges = np.diff(np.concatenate(([1], pages.view(np.int8), [1])))
    starts, ends = np.flatnonzero(edges == -1), np.flatnonzero(edges == 1)
    return [(s, min(block_pages, e - s)) for a, e in zip(starts, ends) for s in range(int(a), int(e), block_pages)]


def warm(path: str | os.PathLike, block: int = 16 << 20) -> dict:
    """Read in the pages of the file that are not in the page cache (mincore says which: a file already resident
    costs one scan, not a read of every byte); return residency before and after and the read rate. A read that
    takes long says how far it got on the console (``progress.Meter``)."""
    pages = resident_pages(path)
    before = float(pages.mean()) if pages.size else 1.0
    runs = _missing_runs(pages, max(1, block // PAGE))
    started = time.monotonic()
    size = 0
    meter = progress.Meter(f"reading {Path(path).name} into the page cache", sum(n for _, n in runs) * PAGE)
    with open(path, "rb", buffering=0) as f:
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
        buf = bytearray(block)
        view = memoryview(buf)
        for first, count in runs:
            f.seek(first * PAGE)
            size += f.readinto(view[: count * PAGE])
            meter.update(size)
    meter.finish()
    seconds = time.monotonic() - started
    return {
        "path": str(path),
        "bytes": os.path.getsize(path),
        "read_bytes": size,
        "resident_before": round(before, 4),
        "resident_after": round(resident_fraction(path), 4),
        "read_seconds": round(seconds, 3),
        "read_mib_s": round(size / (1 << 20) / seconds, 1) if seconds > 0 and size else None,
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
