"""Atomic writes: the final file is readable as the umask says (not mkstemp's 0600), and a block that
fails leaves nothing under the final name."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from crashline.core.atomic import atomic_path

from conftest import REPO

WRITE = textwrap.dedent("""
    import os, sys
    os.umask(int(sys.argv[1], 8))
    from crashline.core.atomic import atomic_path, write_json
    write_json(sys.argv[2] + "/record.json", {"a": 1})
    with atomic_path(sys.argv[2] + "/table.txt") as tmp:
        tmp.write_text("x")
""")


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_outputs_get_the_mode_the_umask_gives(tmp_path, umask, mode):
    proc = subprocess.run(
        [sys.executable, "-c", WRITE, oct(umask)[2:], str(tmp_path)],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(REPO / "src"), "PATH": "/usr/bin:/bin"},
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    for name in ("record.json", "table.txt"):
        assert (tmp_path / name).stat().st_mode & 0o777 == mode, name
    assert not list(tmp_path.glob(".*.part"))


def test_a_failed_block_leaves_nothing(tmp_path):
    with pytest.raises(RuntimeError), atomic_path(tmp_path / "out.json") as tmp:
        tmp.write_text("half")
        raise RuntimeError("stop")
    assert list(tmp_path.iterdir()) == []
