"""Every results folder committed under bench/results/ renders with the current code (bench/rerender.py), says no
"nan", and its committed headline is the one the current code writes: a committed example cannot go stale (#27: the
H200 search report said "use n_cpu_moe nan" long after the code was fixed). Each page is read in Chromium at 1280 and
1920 px wide, and the committed screenshots of one are the page the current code draws."""

from __future__ import annotations

import re
import sys

import pandas as pd
import pytest

from conftest import REPO, WIDTHS, unreadable

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
    for table in sorted((results / "tables").glob("*.parquet")):  # nothing recorded is lost on the way
        again = tmp_path / "out" / "tables" / table.name
        assert len(pd.read_parquet(again)) == len(pd.read_parquet(table)), f"{table.name}: rows lost or added"
    assert sorted(p.name for p in (results / "figures").glob("*.svg")) == sorted(
        p.name for p in (tmp_path / "out" / "figures").glob("*.svg")
    )


@pytest.mark.parametrize("results", FOLDERS, ids=[str(f.relative_to(REPO / "bench" / "results")) for f in FOLDERS])
def test_a_committed_report_can_be_read_whole_at_1280_and_1920_px(results, tmp_path, browser):
    """Nothing cut or past the window's edge, no figure label outside its figure or on another, no character
    drawn as an empty box (#27 item 6: tables ran off the edge, ✅/❌ were boxes without an emoji font)."""
    html = rerender.rerender(results, tmp_path / "out").with_suffix(".html")
    assert unreadable(browser, html) == {}, WIDTHS
    assert not browser.console()


def test_the_committed_screenshots_are_of_the_page_the_code_draws(tmp_path, browser):
    """bench/results/report-screenshots/ holds the H200 tune's report at 1280 and 1920 px as the current code
    draws it (bench/report_screenshots.py audits the page before it writes them): the window's width, and a page
    within 5% of the height it has now. A report that grew or shrank by more leaves them stale."""
    import json

    from PIL import Image

    shots = REPO / "bench" / "results" / "report-screenshots"
    settings = json.loads((shots / "settings.json").read_text())
    results = REPO / settings["results"]
    html = rerender.rerender(results, tmp_path / "out").with_suffix(".html")
    assert settings["widths"] == list(WIDTHS)
    for width in WIDTHS:
        browser.open(html.as_uri(), width)
        height = browser.evaluate("document.documentElement.scrollHeight")
        committed = Image.open(shots / f"tune-h200-{width}.png").size
        assert committed[0] == width and abs(committed[1] - height) <= 0.05 * height, (
            f"stale at {width} px: {committed} against {height} px now; python bench/report_screenshots.py"
        )
