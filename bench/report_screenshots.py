"""Screenshots of a committed report as the current code draws it, in headless Chromium at the widths a report
is read at (#27 item 6), each page checked by the layout audit first: nothing is written for a page a reader
cannot read whole.

    python bench/report_screenshots.py [RESULTS] [--out DIR]

RESULTS defaults to the H200 tune (bench/results/tune-h200/qwen3-30b-a3b/tune/results), DIR to
bench/results/report-screenshots/. Writes NAME-WIDTH.png (the whole page, 256 colours) and settings.json (the
folder, the widths, Chromium's version, each page's size and what the audit checked).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from PIL import Image

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent / "tests"))
sys.path.insert(0, str(BENCH))
import chromium  # noqa: E402
import rerender  # noqa: E402
from conftest import WIDTHS  # noqa: E402

DEFAULT = BENCH / "results" / "tune-h200" / "qwen3-30b-a3b" / "tune" / "results"
OUT = BENCH / "results" / "report-screenshots"
NAME = "tune-h200"


def shoot(results: Path, out: Path, name: str = NAME) -> dict:
    """Render RESULTS again, audit it and write its screenshots to OUT; the settings written beside them."""
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        html = rerender.rerender(results, Path(tmp) / "out").with_suffix(".html")
        pages = {}
        with chromium.Chromium(Path(tmp) / "profile") as browser:
            for width in WIDTHS:
                browser.open(html.as_uri(), width)
                audit = browser.audit()
                if audit["problems"]:
                    raise SystemExit(f"{results} at {width} px: {json.dumps(audit['problems'], indent=1)}")
                shot = Path(tmp) / f"{width}.png"
                size = browser.screenshot(shot)
                Image.open(shot).convert("RGB").quantize(256).save(out / f"{name}-{width}.png", optimize=True)
                pages[str(width)] = {"size_px": list(size), "checked": audit["checked"]}
    version = subprocess.run([chromium.binary(), "--version"], capture_output=True, text=True).stdout.strip()
    settings = {"results": str(results.relative_to(BENCH.parent)), "widths": list(WIDTHS), "chromium": version}
    settings["pages"] = pages
    (out / "settings.json").write_text(json.dumps(settings, indent=1) + "\n")
    return settings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="?", type=Path, default=DEFAULT)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    print(json.dumps(shoot(args.results.resolve(), args.out), indent=1))


if __name__ == "__main__":
    main()
