"""What other processes used during every committed measurement on a machine without a GPU: the quiet readings that
core/thresholds.py's CONTENTION_CORES is set above.

    python bench/contention_threshold.py [--out bench/results/contention-threshold/readings.json]

Reads every committed measurements table under bench/results/ and writes one row per workload measured without a GPU
(folder, configuration, workload, cores others used, the host's cores), and their range.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from crashline.core.atomic import write_json

RESULTS = Path(__file__).resolve().parent / "results"


def readings(root: Path) -> list[dict]:
    out = []
    for path in sorted(root.glob("**/tables/measurements.parquet")):
        m = pd.read_parquet(path)
        if "cpu_other_cores" not in m:
            continue
        for _, row in m[m["gpu"] == "no GPU"].iterrows():
            if row["cpu_other_cores"] == row["cpu_other_cores"]:
                out.append(
                    {
                        "folder": str(path.parent.parent.relative_to(root)),
                        "config_id": row["config_id"],
                        "workload": row["workload"],
                        "cpu_other_cores": float(row["cpu_other_cores"]),
                        "cpu_logical_cores": None
                        if pd.isna(row.get("cpu_logical_cores"))
                        else int(row["cpu_logical_cores"]),
                    }
                )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(RESULTS / "contention-threshold" / "readings.json"))
    rows = readings(RESULTS)
    values = [r["cpu_other_cores"] for r in rows]
    said = {"readings": rows, "n": len(values), "min": min(values), "max": max(values)}
    write_json(Path(parser.parse_args().out), said)
    print(f"{len(values)} workloads without a GPU: others used {min(values):.2f}-{max(values):.2f} cores")


if __name__ == "__main__":
    main()
