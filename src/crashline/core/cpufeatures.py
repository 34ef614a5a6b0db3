"""Which x86 vector extensions this machine's processes may really use, for the llama.cpp build.

``-march=native`` enables every extension CPUID advertises. A virtual machine can advertise
AVX-512 or AMX while the operating system does not enable their register state for processes:
then the first AVX-512 or AMX instruction traps (SIGILL) and every llama-server dies at warm-up.
The truth is in XCR0 (read with ``xgetbv``: which register states the OS saves) and, for AMX tile
data, in Linux's per-process permission (``arch_prctl(ARCH_REQ_XCOMP_PERM)``). A few lines of C
compiled with the build's own compiler read both; what is advertised but not enabled is switched
off with ``-mno-*`` flags appended to the build's compiler flags.
"""

from __future__ import annotations

import json
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

PROBE_C = r"""
#include <cpuid.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <unistd.h>
int main(void) {
    unsigned a = 0, b = 0, c = 0, d = 0, osxsave = 0, ebx7 = 0, edx7 = 0;
    unsigned long long xcr0 = 0;
    if (__get_cpuid(1, &a, &b, &c, &d)) osxsave = (c >> 27) & 1;
    if (osxsave) {
        unsigned lo, hi;
        __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
        xcr0 = ((unsigned long long)hi << 32) | lo;
    }
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) { ebx7 = b; edx7 = d; }
    long amx_permission = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */);
    printf("{\"osxsave\": %u, \"xcr0\": %llu, \"cpuid7_ebx\": %u, \"cpuid7_edx\": %u, \"amx_permission\": %ld}\n",
           osxsave, xcr0, ebx7, edx7, amx_permission);
    return 0;
}
"""

# XCR0 bits: 1 SSE, 2 AVX, 5 opmask, 6 ZMM_Hi256, 7 Hi16_ZMM (AVX-512), 17 XTILECFG, 18 XTILEDATA (AMX).
XCR0_AVX512 = (1 << 1) | (1 << 2) | (1 << 5) | (1 << 6) | (1 << 7)
XCR0_AMX = (1 << 17) | (1 << 18)
CPUID7_EBX_AVX512F = 1 << 16
CPUID7_EDX_AMX = (1 << 22) | (1 << 24) | (1 << 25)  # AMX-BF16, AMX-TILE, AMX-INT8

# GCC turns off every AVX-512 subset with avx512f; the AMX parts are separate switches.
DISABLE_AVX512 = ("-mno-avx512f",)
DISABLE_AMX = ("-mno-amx-tile", "-mno-amx-int8", "-mno-amx-bf16", "-mno-amx-fp16", "-mno-amx-complex")


def _compiler() -> str | None:
    return shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")


def _accepted(compiler: str, flags: tuple[str, ...]) -> list[str]:
    """The flags this compiler knows (older GCCs lack the newer AMX switches)."""
    out = []
    for flag in flags:
        proc = subprocess.run(
            [compiler, flag, "-x", "c", "-c", "-o", "/dev/null", "-"], input="int x;\n", capture_output=True, text=True
        )
        if proc.returncode == 0:
            out.append(flag)
    return out


def probe() -> dict:
    """XCR0, the CPUID bits and the AMX permission, read by a compiled probe; {} where not x86-64 Linux."""
    compiler = _compiler()
    if platform.machine() not in ("x86_64", "AMD64") or platform.system() != "Linux" or compiler is None:
        return {}
    with tempfile.TemporaryDirectory(prefix="crashline-cpu-") as tmp:
        exe = Path(tmp) / "probe"
        build = subprocess.run(
            [compiler, "-O0", "-x", "c", "-o", str(exe), "-"], input=PROBE_C, capture_output=True, text=True
        )
        if build.returncode != 0:
            return {"error": f"the CPU probe did not compile: {build.stderr.strip()[-300:]}"}
        run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=30)
        if run.returncode != 0:
            return {"error": f"the CPU probe exited with status {run.returncode}"}
        return json.loads(run.stdout)


def usable(raw: dict) -> dict:
    """What CPUID advertises and what processes may use, for AVX-512 and AMX."""
    xcr0 = raw["xcr0"] if raw.get("osxsave") else 0
    return {
        "avx512": {
            "advertised": bool(raw["cpuid7_ebx"] & CPUID7_EBX_AVX512F),
            "enabled": xcr0 & XCR0_AVX512 == XCR0_AVX512,
        },
        "amx": {
            "advertised": bool(raw["cpuid7_edx"] & CPUID7_EDX_AMX),
            "enabled": xcr0 & XCR0_AMX == XCR0_AMX and raw["amx_permission"] == 0,
        },
    }


def native_adjustments(raw: dict | None = None, unwanted: dict[str, str] | None = None) -> dict:
    """For a ``-march=native`` build: the probe, what is advertised but unusable, and the flags off.

    ``unwanted`` names extensions to switch off wherever they are advertised, each with the reason
    (the build's code for them is known to fail). ``disabled`` names the extensions switched off (it
    also names the build's cache folder), ``reasons`` says why each was; ``flags`` go into
    CMAKE_C_FLAGS and CMAKE_CXX_FLAGS.
    """
    raw = probe() if raw is None else raw
    if not raw or "error" in raw:
        return {"probe": raw, "disabled": [], "reasons": {}, "flags": []}
    state = usable(raw)
    reasons = {
        name: "advertised by CPUID, not enabled for processes"
        for name, s in state.items()
        if s["advertised"] and not s["enabled"]
    }
    reasons.update(
        {name: why for name, why in (unwanted or {}).items() if state[name]["advertised"] and name not in reasons}
    )
    disabled = [name for name in state if name in reasons]
    wanted = {"avx512": DISABLE_AVX512, "amx": DISABLE_AMX}
    compiler = _compiler()
    flags = [f for name in disabled for f in _accepted(compiler, wanted[name])]
    return {
        "probe": {**raw, "xcr0_hex": hex(raw["xcr0"])},
        "state": state,
        "disabled": disabled,
        "reasons": {name: reasons[name] for name in disabled},
        "flags": flags,
    }


def cpuinfo_flags() -> set[str]:
    """The kernel's list of CPU flags (first processor)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()
