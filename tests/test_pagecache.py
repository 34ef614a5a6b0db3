"""Page-cache residency, warming and eviction on a real file on a real disk (mincore, fadvise)."""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import pytest

from crashline.models import pagecache
from crashline.jobs.measure import page_cache_state

from conftest import REPO

MIB = 1 << 20
UNEVICTABLE = {"tmpfs", "ramfs", "devtmpfs", "hugetlbfs"}  # the page cache is the storage: nothing to drop


def filesystem(path: Path) -> str:
    """The type of the filesystem that holds ``path`` (the longest mount point above it)."""
    path = path.resolve()
    best, kind = "", "unknown"
    with open("/proc/self/mounts") as mounts:
        for line in mounts:
            _, point, fstype, *_ = line.split()
            point = point.replace("\\040", " ")
            if (path == Path(point) or Path(point) in path.parents) and len(point) > len(best):
                best, kind = point, fstype
    return kind


@pytest.fixture
def disk_dir(tmp_path) -> Path:
    """A directory on a disk-backed filesystem: pytest's own, or else one beside the repository."""
    if filesystem(tmp_path) not in UNEVICTABLE:
        yield tmp_path
        return
    beside = REPO / "tests" / ".tmp-pagecache"
    if filesystem(REPO) in UNEVICTABLE:
        pytest.skip(f"{tmp_path} and {REPO} are on {filesystem(REPO)}: its pages cannot be evicted")
    beside.mkdir(exist_ok=True)
    yield beside
    for child in beside.iterdir():
        child.unlink()
    beside.rmdir()


@pytest.fixture
def model_file(disk_dir) -> Path:
    """32 MiB written and not synced: some of its pages are still dirty when the test starts."""
    path = disk_dir / "model.gguf"
    path.write_bytes(os.urandom(32 * MIB))
    return path


def read_first_half(path: Path) -> None:
    size = path.stat().st_size
    with open(path, "rb", buffering=0) as f:
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_RANDOM)  # no readahead past what is read
        for offset in range(0, size // 2, MIB):
            os.pread(f.fileno(), MIB, offset)


def test_warm_then_evict_a_real_file(model_file):
    warmed = pagecache.warm(model_file)
    assert warmed["bytes"] == 32 * MIB and warmed["resident_after"] > 0.95
    left = pagecache.evict(model_file)
    assert left < 0.05 and pagecache.resident_fraction(model_file) == pytest.approx(left, abs=0.01)
    assert pagecache.warm(model_file)["resident_before"] < 0.05  # the next read really came from the disk


def test_warm_reads_only_the_pages_not_resident(model_file):
    """A file already in the page cache is scanned, not read again; half of one is read in by its missing half."""
    pagecache.warm(model_file)
    again = pagecache.warm(model_file)
    assert again["resident_before"] > 0.95 and again["read_bytes"] < MIB and again["resident_after"] > 0.95
    pagecache.evict(model_file)
    read_first_half(model_file)
    half = pagecache.warm(model_file)
    assert 0.4 < half["resident_before"] < 0.6 and half["resident_after"] > 0.95
    assert 0.35 * 32 * MIB < half["read_bytes"] < 0.6 * 32 * MIB


def test_residency_counts_pages_across_mapped_chunks(model_file, monkeypatch):
    monkeypatch.setattr(pagecache, "_CHUNK", MIB)  # 32 separate mappings, as a file over 1 GiB gets
    pagecache.evict(model_file)
    read_first_half(model_file)
    assert 0.45 < pagecache.resident_fraction(model_file) < 0.6


def test_page_cache_state_cold_and_warm_are_verified(model_file):
    fetch = {"files": [{"path": str(model_file)}]}
    pagecache.warm(model_file)
    cold = page_cache_state(fetch, None, "cold")
    assert cold["wanted"] == "cold" and cold["verified"] and cold["resident"][str(model_file)] < 0.05
    warm = page_cache_state(fetch, None, "warm")
    assert warm["verified"] and warm["resident"][str(model_file)] > 0.95


def test_a_cold_run_is_not_verified_while_another_process_maps_the_model(model_file):
    """The kernel keeps pages that are mapped (a server still holding the model): the eviction is not verified."""
    fetch = {"files": [{"path": str(model_file)}]}
    with open(model_file, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as mapped:
        sum(mapped[i] for i in range(0, len(mapped), mmap.PAGESIZE))  # touch every page
        held = page_cache_state(fetch, None, "cold")
    assert not held["verified"] and held["resident"][str(model_file)] > 0.95
