"""Do repeated measurements of the host memory bandwidth on one machine agree? (#40 item 6)

Runs the measurement in ``--runs`` fresh processes for each method, interleaved (before, now, before, now, ...), and
prints one JSON line per process, then each method's figures and their spread: (max - min) / max over the processes,
the statistic fixed before the run. ``before`` is crashline's measurement up to session 18, copied here verbatim (one
thread faults every array in, then 16 threads copy 512 MiB three times, best of three); ``now`` is
``crashline.core.host.memory_bandwidth`` (pinned threads, each faulting in its own arrays; best of passes);
``three`` is ``now`` at session 18's shape of three passes of five timings; ``half`` is ``now`` on half the process's
CPUs (a pass waits for its slowest thread, and on a shared host a thread on every CPU meets every CPU's stolen time);
``long`` is ``now`` with 32 passes instead of 8 (the best of more passes meets the host's fast level more often).

    python bench/bandwidth_spread.py --runs 5 [--methods before,now,half] > bandwidth.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

BEFORE = """
import os, time, json
from concurrent.futures import ThreadPoolExecutor
import numpy as np
threads, total_mib, repeats = min(os.cpu_count() or 1, 16), 512, 3
src = [np.ones(max(32, total_mib // threads) * (1 << 20) // 8) for _ in range(threads)]
dst = [np.empty_like(a) for a in src]
best = float("inf")
with ThreadPoolExecutor(threads) as pool:
    for _ in range(repeats):
        t = time.perf_counter()
        list(pool.map(lambda i: np.copyto(dst[i], src[i]), range(threads)))
        best = min(best, time.perf_counter() - t)
print(json.dumps({"gbs": round(2 * threads * src[0].nbytes / best / 1e9, 2), "threads": threads}))
"""
NOW = "import json, os, sys; from crashline.core.host import memory_bandwidth; print(json.dumps(memory_bandwidth({})))"
SHAPES = {
    "before": None,
    "now": "",
    "three": "passes=3, repeats=5",
    "half": "max(1, len(os.sched_getaffinity(0)) // 2)",
    "long": "passes=32",
}


def one(method: str, passes: int | None) -> dict:
    started = time.monotonic()
    shape = SHAPES[method] if passes is None or method != "now" else f"passes={passes}"
    code = BEFORE if method == "before" else NOW.format(shape)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=os.environ)
    return {"method": method, **json.loads(out.stdout), "wall_s": round(time.monotonic() - started, 2)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--passes", type=int, help="memory_bandwidth's passes (default: its own)")
    parser.add_argument("--methods", default="before,now", help=f"comma-separated, of {', '.join(SHAPES)}")
    args = parser.parse_args()
    methods = args.methods.split(",")
    if unknown := set(methods) - set(SHAPES):
        parser.error(f"--methods: {', '.join(sorted(unknown))} unknown; choose from {', '.join(SHAPES)}")
    rows = []
    for _ in range(args.runs):
        for method in methods:
            rows.append(one(method, args.passes))
            print(json.dumps(rows[-1]), flush=True)
    for method in methods:
        figures = [r["gbs"] for r in rows if r["method"] == method]
        spread = (max(figures) - min(figures)) / max(figures)
        print(json.dumps({"summary": method, "gbs": figures, "spread": round(spread, 4)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
