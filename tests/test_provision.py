"""Provisioning llama-server: the configured binary, $LLAMA_SERVER, or the cached build; provenance."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from crashline.core import cpufeatures
from crashline.engine import provision, servercheck


def test_provenance_of_the_real_binary(server_provenance):
    p = server_provenance
    assert Path(p["binary"]).is_file()
    assert p["sha256"] == hashlib.sha256(Path(p["binary"]).read_bytes()).hexdigest()
    assert p["version"] and "version" in p["version_output"]
    assert p["backend"] in ("cpu", "cuda")
    if p["obtained"].startswith("built from"):
        assert p["source_sha256"] == provision.SDIST_SHA256 and "-DCMAKE_BUILD_TYPE=Release" in p["build_flags"]


def test_configured_binary_wins_and_missing_one_is_named(server_binary, tmp_path, monkeypatch):
    monkeypatch.delenv("LLAMA_SERVER", raising=False)
    got = provision.provide({"binary": server_binary}, tmp_path)
    assert got["obtained"] == "configured (server.binary)" and got["binary"] == str(Path(server_binary).resolve())
    with pytest.raises(provision.ProvisionError, match="server.binary = '/nowhere/llama-server'"):
        provision.provide({"binary": "/nowhere/llama-server"}, tmp_path)


def test_environment_variable(server_binary, tmp_path, monkeypatch):
    monkeypatch.setenv("LLAMA_SERVER", server_binary)
    assert provision.provide({"binary": None}, tmp_path)["obtained"] == "environment ($LLAMA_SERVER)"
    monkeypatch.setenv("LLAMA_SERVER", str(tmp_path / "missing"))
    with pytest.raises(provision.ProvisionError, match=r"\$LLAMA_SERVER"):
        provision.provide({"binary": None}, tmp_path)


def test_a_binary_that_is_not_llama_server_is_refused(tmp_path):
    fake = tmp_path / "llama-server"
    fake.write_text("#!/bin/sh\nexit 3\n")
    fake.chmod(0o755)
    with pytest.raises(provision.ProvisionError, match="--version failed"):
        provision.provide({"binary": str(fake)}, tmp_path)


# A stand-in for a llama.cpp build whose -march=native code this machine cannot run: it answers
# --version, --help and --list-devices (by running the real llama-server), and dies by SIGILL, a
# real trapping instruction, as soon as it is asked to serve. Without DIE_WHEN_SERVING it is the
# real server. Its CMakeLists compiles the trap exactly when GGML_NATIVE is on, as llama.cpp's
# -march=native build would contain the instruction.
FAKE_SERVER_C = r"""
#include <string.h>
#include <unistd.h>
int main(int argc, char **argv) {
#ifdef DIE_WHEN_SERVING
    int info = 0;
    for (int i = 1; i < argc; i++)
        info |= !strcmp(argv[i], "--version") || !strcmp(argv[i], "--help") || !strcmp(argv[i], "--list-devices");
    if (!info) {
#ifdef DIE_BY_SEGV
        *(volatile int *)0 = 0;  /* as llama.cpp 11434's AMX kernels die on a working AMX CPU */
#endif
        __builtin_trap();
    }
#endif
    argv[0] = REAL_SERVER;
    execv(REAL_SERVER, argv);
    return 127;
}
"""

FAKE_CMAKELISTS = """
cmake_minimum_required(VERSION 3.14)
project(fake_llama C)
option(GGML_NATIVE "" ON)
set(CMAKE_RUNTIME_OUTPUT_DIRECTORY ${{CMAKE_BINARY_DIR}}/bin)
foreach(target llama-server llama-bench llama-perplexity)
  add_executable(${{target}} server.c)
  target_compile_definitions(${{target}} PRIVATE REAL_SERVER="{real}")
  if (GGML_NATIVE)
    target_compile_definitions(${{target}} PRIVATE DIE_WHEN_SERVING {die})
  endif()
endforeach()
"""


def _without_llama_server_on_path(monkeypatch):
    monkeypatch.delenv("LLAMA_SERVER", raising=False)
    dirs = [d for d in os.environ["PATH"].split(os.pathsep) if not (Path(d) / "llama-server").exists()]
    monkeypatch.setenv("PATH", os.pathsep.join(dirs))


def test_a_build_made_before_a_target_was_added_gets_that_target_alone(server_binary, tmp_path, monkeypatch):
    """llama-perplexity joined the targets after builds were made (#43): such a build is reused and the missing
    target built in it, without rebuilding llama-server, and build.json then names it."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "server.c").write_text(FAKE_SERVER_C)
    (src / "CMakeLists.txt").write_text(FAKE_CMAKELISTS.format(real=server_binary, die=""))
    monkeypatch.setattr(provision, "source_tree", lambda cache_dir: src)
    first = provision.build(tmp_path / "cache", "cpu")
    server, perplexity = Path(first["binary"]), Path(first["perplexity_binary"])
    assert perplexity.is_file() and perplexity.parent == server.parent
    marker = server.parents[2] / "build.json"
    older = {k: v for k, v in json.loads(marker.read_text()).items() if k != "perplexity_binary"}
    marker.write_text(json.dumps(older))  # as a build from before the target wrote it
    perplexity.unlink()
    built_at = server.stat().st_mtime_ns
    again = provision.build(tmp_path / "cache", "cpu")
    assert perplexity.is_file() and again["perplexity_binary"] == str(perplexity)
    assert server.stat().st_mtime_ns == built_at and again["build_seconds"] == first["build_seconds"]
    assert json.loads(marker.read_text())["perplexity_binary"] == str(perplexity)


@pytest.mark.parametrize("signal, die", [("SIGILL", ""), ("SIGSEGV", "DIE_BY_SEGV")])
def test_a_build_killed_by_a_signal_is_rebuilt_portable_and_checked(server_binary, tmp_path, monkeypatch, signal, die):
    src = tmp_path / "src"
    src.mkdir()
    (src / "server.c").write_text(FAKE_SERVER_C)
    (src / "CMakeLists.txt").write_text(FAKE_CMAKELISTS.format(real=server_binary, die=die))
    monkeypatch.setattr(provision, "source_tree", lambda cache_dir: src)
    _without_llama_server_on_path(monkeypatch)
    cache = tmp_path / "cache"
    got = provision.provide({"binary": None, "backend": "cpu"}, cache)
    (native,) = got["failed_builds"]
    assert native["variant"] == "native" and "-DGGML_NATIVE=ON" in native["build_flags"]
    assert native["check"]["signal"] == signal and native["check"]["outcome"] == "crashed"
    assert native["check"]["command"][0] == native["binary"] and "-portable" not in native["binary"]
    assert got["variant"] == "portable" and "-DGGML_NATIVE=OFF" in got["build_flags"]
    assert "-DGGML_AVX512=OFF" in got["build_flags"] or platform.machine() != "x86_64"
    assert got["binary"].startswith(str(cache)) and "-portable" in got["binary"]
    assert got["check"]["ok"] and got["check"]["tokens_generated"] == servercheck.CHECK_TOKENS
    # The portable build is cached; the next provision checks both again and keeps the portable one.
    again = provision.provide({"binary": None, "backend": "cpu"}, cache)
    assert again["binary"] == got["binary"] and again["sha256"] == got["sha256"]


def test_a_given_binary_that_fails_the_check_is_one_clear_error(server_binary, tmp_path):
    fake = tmp_path / "llama-server"
    source = tmp_path / "server.c"
    source.write_text(FAKE_SERVER_C)
    subprocess.run(
        ["cc", "-DDIE_WHEN_SERVING", f'-DREAL_SERVER="{server_binary}"', "-o", str(fake), str(source)], check=True
    )
    with pytest.raises(provision.ProvisionError) as err:
        provision.provide({"binary": str(fake)}, tmp_path / "cache")
    message = str(err.value)
    assert str(fake.resolve()) in message and "killed by SIGILL" in message
    assert "server check" in message and "tiny synthetic MoE" in message and "-c 512" in message


def test_the_real_binary_passed_the_check(server_provenance):
    check = server_provenance["check"]
    assert check["ok"] and check["tokens_generated"] == servercheck.CHECK_TOKENS and check["signal"] is None
    assert {"-ub", "--n-cpu-moe", "-cb", "-nocb", "-kvu", "-no-kvu"} <= set(server_provenance["help_flags"])


@pytest.mark.skipif(platform.machine() != "x86_64" or shutil.which("cc") is None, reason="x86-64 with a C compiler")
def test_cpu_probe_reads_this_machine():
    raw = cpufeatures.probe()
    assert raw["osxsave"] == 1 and raw["xcr0"] & 0b110 == 0b110  # SSE and AVX state: every x86-64 Linux today
    state = cpufeatures.usable(raw)
    advertised = cpufeatures.cpuinfo_flags()
    assert state["avx512"]["advertised"] == ("avx512f" in advertised)


@pytest.mark.skipif(platform.machine() != "x86_64" or shutil.which("cc") is None, reason="x86-64 with a C compiler")
def test_extensions_the_os_does_not_enable_are_switched_off_in_the_compiler():
    # A VM that advertises AVX-512 and AMX but enables neither (XCR0 = x87|SSE|AVX, AMX permission refused).
    raw = {
        "osxsave": 1,
        "xcr0": 0b111,
        "cpuid7_ebx": cpufeatures.CPUID7_EBX_AVX512F,
        "cpuid7_edx": cpufeatures.CPUID7_EDX_AMX,
        "amx_permission": -1,
    }
    adjust = cpufeatures.native_adjustments(raw)
    assert adjust["disabled"] == ["avx512", "amx"]
    # What the compiler then targets, for a Sapphire Rapids CPU (AVX-512 and AMX) named explicitly.
    macros = subprocess.run(
        ["cc", "-march=sapphirerapids", *adjust["flags"], "-dM", "-E", "-x", "c", "/dev/null"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "__AVX2__" in macros and "__AVX512F__" not in macros and "__AMX_TILE__" not in macros
    enabled = {**raw, "xcr0": 0b111 | cpufeatures.XCR0_AVX512 | cpufeatures.XCR0_AMX, "amx_permission": 0}
    assert cpufeatures.native_adjustments(enabled)["flags"] == []
    # The native variant switches AMX off where it works too (the pinned llama.cpp's AMX kernels crash), not AVX-512.
    native = provision.variant_plan("native")
    amx = cpufeatures.native_adjustments(enabled, unwanted=provision.NATIVE_UNWANTED)
    assert amx["disabled"] == ["amx"] and "ggml_backend_amx_mul_mat" in amx["reasons"]["amx"]
    assert "-mno-amx-tile" in amx["flags"] and "-mno-avx512f" not in amx["flags"]
    if cpufeatures.usable(cpufeatures.probe())["amx"]["advertised"]:
        assert "amx" in native["cpu"]["disabled"] and native["suffix"].startswith("-no-") and "amx" in native["suffix"]


def test_a_build_older_than_crashline_supports_is_refused_by_name(tmp_path):
    old = tmp_path / "llama-server"
    old.write_text(
        '#!/bin/sh\ncase "$1" in\n'
        '  --version) echo "version: 5000 (0abc123)"; echo "built with cc for x86_64";;\n'
        '  --list-devices) echo "Available devices:";;\n'
        '  --help) printf -- "-m,    --model FNAME    model path\\n'
        '-fa,   --flash-attn     enable Flash Attention (default: disabled)\\n";;\n'
        "esac\n"
    )
    old.chmod(0o755)
    with pytest.raises(
        provision.ProvisionError,
        match=r"lacks llama-server flag\(s\) crashline needs: --host, "
        r"--port, -lv, .*-fa on\|off\|auto .*supports llama.cpp b6340",
    ):
        provision.provide({"binary": str(old)}, tmp_path)


@pytest.mark.parametrize(
    "script,expected",
    [
        ('if [ "$1" = --version ]; then sleep 600; fi', "--version did not answer within 2 s; is it a llama-server?"),
        ("printf 'version \\377\\376 b1\\n'; exit 1", "--version failed (exit 1): version \ufffd\ufffd b1"),
    ],
    ids=["hangs", "non-utf8"],
)
def test_a_binary_that_hangs_or_prints_bytes_is_named_not_a_traceback(tmp_path, monkeypatch, script, expected):
    """A binary that hung on --list-devices, or printed non-UTF-8, ended in a Python exception name (issue #26)."""
    monkeypatch.setattr(provision, "ASK_TIMEOUT_S", 2)
    fake = tmp_path / "llama-server"
    fake.write_text(f"#!/bin/sh\n{script}\n")
    fake.chmod(0o755)
    started = time.monotonic()
    with pytest.raises(provision.ProvisionError) as err:
        provision.provide({"binary": str(fake)}, tmp_path / "cache")
    assert expected in str(err.value) and str(fake.resolve()) in str(err.value)
    assert time.monotonic() - started < 30


def test_a_check_server_killed_from_outside_is_not_called_a_broken_build():
    """An outside SIGKILL of the check server (the OOM killer, a user) sent crashline to build the portable variant
    and blamed the build; only the signals of code this CPU cannot run (SIGILL, SIGSEGV, SIGBUS) do."""
    said = servercheck.describe_failure(
        Path("/x/llama-server"),
        {
            "signal": "SIGKILL",
            "phase": "load",
            "message": "killed",
            "request": "8 tokens",
            "command": ["x"],
            "log_tail": "",
        },
    )
    assert "killed by SIGKILL, which crashline never sends a check" in said and "run again" in said
