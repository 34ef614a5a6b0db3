"""Provisioning llama-server: the configured binary, $LLAMA_SERVER, or the cached build; provenance."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from crashline import provision


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
