"""Does the telemetry sampler change what it measures? Decode tokens/s with and without it, on one
server, alternating (off, on, off, on, ...) so that drift hits both sides alike; the ratio of the
medians belongs within 1%.

    python bench/sampler_overhead.py --model PATH [--rounds 10] [--gen 128] [-- extra llama-server args]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from crashline import provision  # noqa: E402
from crashline.server import ServerProcess  # noqa: E402
from crashline.telemetry import Sampler  # noqa: E402
from crashline.workloads import Client, PromptSource, one_run  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", required=True)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--interval", type=float, default=0.25, help="the sampler's default interval")
    ap.add_argument("--cache", default=str(Path.home() / ".cache" / "crashline"))
    ap.add_argument("--out")
    ap.add_argument("server_args", nargs="*")
    args = ap.parse_args()
    binary = provision.provide({"binary": None, "backend": "auto"}, Path(args.cache))["binary"]
    workload = {"prompt_tokens": args.prompt, "gen_tokens": args.gen}
    speeds = {"off": [], "on": []}
    with tempfile.TemporaryDirectory() as tmp, \
            ServerProcess([binary, "-m", args.model, *args.server_args], Path(tmp) / "server.log") as server:
        if server.wait_ready(600) != "ready":
            raise SystemExit(f"server did not start:\n{server.log_text()[-3000:]}")
        client = Client(server.url, 600)
        prompts = PromptSource(client)
        one_run(client, prompts, workload, 0)  # warm-up
        for i in range(args.rounds):
            for mode in ("off", "on"):
                index = 2 * i + (mode == "on") + 1
                if mode == "on":
                    sampler = Sampler(pid=server.proc.pid, interval_s=args.interval)
                    with sampler:
                        run = one_run(client, prompts, workload, index)
                    sampler.close()
                else:
                    run = one_run(client, prompts, workload, index)
                speeds[mode].append(run["requests"][0]["decode_tps"])
    off, on = statistics.median(speeds["off"]), statistics.median(speeds["on"])
    result = {"server_args": args.server_args, "rounds": args.rounds, "gen_tokens": args.gen,
              "interval_s": args.interval, "decode_tps_off": speeds["off"], "decode_tps_on": speeds["on"],
              "median_off": off, "median_on": on, "ratio_on_over_off": on / off,
              "spread_off_pct": (max(speeds["off"]) - min(speeds["off"])) / off * 100}
    print(json.dumps(result, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
