"""The layout audit (tests/layout_audit.js) of every committed report, rendered again by the code on PYTHONPATH, at
each width a report is read at: per folder and width, the problems a reader would see (#27 item 6).

    PYTHONPATH=src python bench/report_audit.py OUT.json

Run with another checkout's src on PYTHONPATH to audit that code's pages (bench/results/report-screenshots/ holds
the audit before and after the fixes)."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent / "tests"))
sys.path.insert(0, str(BENCH))
import chromium  # noqa: E402
import rerender  # noqa: E402
from conftest import WIDTHS  # noqa: E402

import crashline  # noqa: E402


def main() -> None:
    out = Path(sys.argv[1])
    found = {}
    with tempfile.TemporaryDirectory() as tmp, chromium.Chromium(Path(tmp) / "profile") as browser:
        for i, folder in enumerate(rerender.folders(BENCH / "results")):
            html = rerender.rerender(folder, Path(tmp) / str(i)).with_suffix(".html")
            name = str(folder.relative_to(BENCH / "results"))
            for width in WIDTHS:
                browser.open(html.as_uri(), width)
                found[f"{name} @ {width}px"] = browser.audit()["problems"]
    version = subprocess.run([chromium.binary(), "--version"], capture_output=True, text=True).stdout.strip()
    summary = {
        "code": str(Path(crashline.__file__).parent),
        "chromium": version,
        "pages_with_problems": sum(bool(p) for p in found.values()),
        "pages": len(found),
        "problems": found,
    }
    out.write_text(json.dumps(summary, indent=1, ensure_ascii=False) + "\n")
    print(f"{summary['pages_with_problems']} of {summary['pages']} pages with problems: {out}")


if __name__ == "__main__":
    main()
