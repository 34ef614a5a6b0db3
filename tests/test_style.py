"""The code is formatted and lint-clean (ruff, configured in pyproject.toml)."""

from __future__ import annotations

import subprocess
import sys

from conftest import REPO


def ruff(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ruff", *args], cwd=REPO, capture_output=True, text=True, timeout=120)


def test_ruff_check_is_clean():
    proc = ruff("check", ".")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_ruff_format_is_applied():
    proc = ruff("format", "--check", ".")
    assert proc.returncode == 0, proc.stdout + proc.stderr
