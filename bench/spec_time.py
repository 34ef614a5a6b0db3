"""The time to build every server job's spec of a config (what Snakemake evaluates as each job's params while it
builds the DAG, `snakemake -n` included): measure and needle per configuration, search and search_needle per
search group. Prints one JSON line: the config, the job count and the seconds.

    PYTHONPATH=src python bench/spec_time.py bench/configs/grid-401.yaml
"""

from __future__ import annotations

import json
import sys
import time

from crashline.config import plan as C
from crashline.jobs import spec as S


def main(path: str) -> None:
    cfg = C.load(path)
    items, groups = C.expand(cfg), C.expand_searches(cfg)
    started = time.perf_counter()
    for item in items:
        for job in ("measure", "needle"):
            S.spec(job, cfg, item["model"], item["id"])
    for group in groups:
        for job in ("search", "search_needle"):
            S.spec(job, cfg, group["model"], group["id"])
    seconds = time.perf_counter() - started
    print(
        json.dumps(
            {
                "config": path,
                "configurations": len(items),
                "searches": len(groups),
                "specs": 2 * (len(items) + len(groups)),
                "seconds": round(seconds, 3),
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1])
