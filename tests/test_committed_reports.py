"""Every results folder committed under bench/results/ renders with the current code (bench/rerender.py), says no
"nan", and its committed headline is the one the current code writes: a committed example cannot go stale (#27: the
H200 search report said "use n_cpu_moe nan" long after the code was fixed)."""

from __future__ import annotations

import re
import sys

import pytest

from conftest import REPO

sys.path.insert(0, str(REPO / "bench"))
import rerender  # noqa: E402

FOLDERS = rerender.folders(REPO / "bench" / "results")
HEADLINE = re.compile(r"^\*\*(Use |No recommendation|Every configuration|No configuration).*$", re.M)


def test_every_committed_folder_is_found():
    assert len(FOLDERS) >= 10 and all((f / "records").is_dir() for f in FOLDERS)


@pytest.mark.parametrize("results", FOLDERS, ids=[str(f.relative_to(REPO / "bench" / "results")) for f in FOLDERS])
def test_a_committed_results_folder_renders_as_committed(results, tmp_path):
    md = rerender.rerender(results, tmp_path / "out").read_text()
    assert not re.search(r"\bnan\b", md, re.I), [line for line in md.splitlines() if re.search(r"\bnan\b", line, re.I)]
    assert (tmp_path / "out" / "recommendation.json").exists() and (tmp_path / "out" / "summary.md").exists()
    fresh = HEADLINE.findall(md) and HEADLINE.search(md).group(0)
    assert fresh, md[:2000]
    committed = (results / "report.md").read_text()
    assert HEADLINE.search(committed).group(0) == fresh, "stale: python bench/rerender.py " + str(results)
    assert sorted(p.name for p in (results / "figures").glob("*.svg")) == sorted(
        p.name for p in (tmp_path / "out" / "figures").glob("*.svg")
    )
