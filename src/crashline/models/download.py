"""``https://`` and ``http://`` sources: a streamed download into a ``.part`` file that resumes where a dropped
connection left it, hashed as it is written, each shard of a split model beside the first."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

import requests

from ..core import progress
from ..config.source import SourceError
from . import verify as V


# --- https:// and http://


def fetch_url(source: str, parsed: dict, dest_dir: Path, sha256: str | list[str] | None) -> list[dict]:
    """Each file (shard) of an https:// or http:// source, reused where verified, else downloaded and verified."""
    names = V.all_shard_names(parsed["name"])
    expected = V.expected_hashes(source, sha256, len(names))
    entries = []
    for name, want in zip(names, expected):
        url = parsed["url"] if name == parsed["name"] else _sibling_url(parsed["url"], name)
        path = dest_dir / name
        entry = V.reuse_verified(path, want, "config") or V.adopt_rejected(path, want, "config")
        if entry is None:
            dest_dir.mkdir(parents=True, exist_ok=True)
            part = path.with_name(path.name + ".part")
            entry = V.commit_verified(source, part, path, _download(source, url, part), want, "config", keep=True)
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
            while self.bytes < offset and (block := f.read(min(V.BLOCK, offset - self.bytes))):
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

    A dropped connection is resumed as long as attempts make progress: V.DOWNLOAD_ATTEMPTS attempts in
    a row that add no byte end it (the part file stays for the next fetch to resume). A server that
    cannot be reached at the first attempt is an error at once.
    """
    hasher, failures, last_error = _PartHash(part), 0, None
    while failures < V.DOWNLOAD_ATTEMPTS:
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
        f"model source {source!r}: download of {url} stopped: {V.DOWNLOAD_ATTEMPTS} attempts in a row "
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
            for block in response.iter_content(V.DOWNLOAD_CHUNK):
                f.write(block)
                hasher.update(block)
                meter.add(len(block))
    except (requests.RequestException, ConnectionError):  # dropped (both are OSErrors): the caller resumes
        raise
    except OSError as e:
        raise SourceError(f"model source {source!r}: cannot write {part}: {e}") from None
