"""Render a committed results folder again with the current code: its tables from its records, then its report,
figures, summary and recommendation (#27: committed examples went stale, "use n_cpu_moe nan").

    python bench/rerender.py RESULTS [RESULTS ...] [--out DIR]

RESULTS is a results folder under bench/results/ (it holds records/ and server/provenance.json; its config is its
own .crashline/config.json, else the config.yaml beside it). Without --out the tables and the report are written
in place; with --out, to DIR (tests/test_committed_reports.py renders every committed folder that way).
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import yaml

from crashline.config import plan as C
from crashline.core.paths import Layout
from crashline.core.records import needle_records_from, records_from
from crashline.report.build import render
from crashline.tables.kvquality import write_table as write_kv_table
from crashline.tables import aggregate
from crashline.tables.needle import write_table


def folders(root: Path) -> list[Path]:
    """Every results folder under ``root`` that holds records and a provenance."""
    return sorted(
        p.parent.parent for p in root.glob("**/server/provenance.json") if (p.parent.parent / "records").is_dir()
    )


BENCH_RESULTS = Path(__file__).resolve().parent / "results"


def _here(path: str) -> str:
    """A committed folder named by the absolute path of the clone it ran in: the same folder in this clone."""
    _, sep, rest = path.partition("bench/results/")
    return str(BENCH_RESULTS / rest) if sep and not Path(path).exists() else path


def config_of(results: Path) -> dict:
    own = results / ".crashline" / "config.json"
    raw = json.loads(own.read_text()) if own.exists() else yaml.safe_load((results.parent / "config.yaml").read_text())
    raw = {**raw, "results_dir": str(results)}
    if (raw.get("recheck") or {}).get("against"):
        raw["recheck"] = {**raw["recheck"], "against": _here(raw["recheck"]["against"])}
    raw["merge_results"] = [_here(p) for p in raw.get("merge_results") or []]
    return C.validate(raw, C.load_schema())


def rerender(results: Path, out: Path | None = None) -> Path:
    """The report of ``results`` rendered now, in place or under ``out``; returns the report.md written."""
    cfg = config_of(results)
    out = out or results
    tables = out / "tables"
    tables.mkdir(parents=True, exist_ok=True)
    layout = Layout(results)

    def every(where, *more) -> list[Path]:  # every model's and id's file of the layout's kind
        return sorted(results.glob(str(where("*", "*", *more).relative_to(results))))

    searches = every(layout.search)
    measured = every(layout.record) + every(layout.later_record, "*")  # an entry's later starts beside their first
    aggregate.write(
        records_from([*measured, *searches]),
        tables / "configs.parquet",
        tables / "measurements.parquet",
        searches,
        tables / "searches.parquet",
        tables / "conversations.parquet",
    )
    needles = needle_records_from([*every(layout.needle_record), *every(layout.search_recall)])
    write_table([p for p in needles if p.exists()], tables / "needle.parquet")
    write_kv_table(every(layout.kv_quality), tables / "kv_quality.parquet")
    if out != results:
        for name in ("server", "validity", "models"):
            if (results / name).is_dir():
                shutil.copytree(results / name, out / name, dirs_exist_ok=True)
    validity = out / "validity" / "llama-bench.json"
    render(
        tables / "configs.parquet",
        tables / "measurements.parquet",
        out / "server" / "provenance.json",
        cfg,
        out / "report.md",
        out / "report.html",
        tables / "searches.parquet",
        tables / "needle.parquet",
        results_dir=results,
        conversations_path=tables / "conversations.parquet",
        validity_path=validity if validity.exists() else None,
        kv_quality_path=tables / "kv_quality.parquet",
        recommendation_path=out / "recommendation.json",
        summary_path=out / "summary.md",
    )
    return out / "report.md"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+")
    parser.add_argument("--out")
    args = parser.parse_args()
    for r in map(Path, args.results):
        out = Path(args.out) / r.name if args.out else None
        print(rerender(r, out))


if __name__ == "__main__":
    main()
