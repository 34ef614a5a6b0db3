"""Does the telemetry sampler change what it measures? Decode tokens/s without it and with it at
one or more intervals, on one server, interleaved within each round in a rotating order so that
drift and order hit every mode alike. Each round gives a ratio (with / without); the median ratio
and its bootstrap 95% interval belong within 1% at the default interval.

Also reported: what one sample costs the sampler (CPU and wall time, measured by the sampler
itself during the rounds) and, on a GPU machine, what each NVML query it makes costs.

    python bench/sampler_overhead.py --model PATH [--rounds 10] [--gen 128] [--intervals 0.25 1]
        [--frame-out F.parquet] [--out F.json] [-- extra llama-server args]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from crashline import provision  # noqa: E402
from crashline.config import default_schema_path  # noqa: E402
from crashline.server import ServerProcess  # noqa: E402
from crashline.telemetry import Sampler, _faults, write_frame  # noqa: E402
from crashline.workloads import Client, PromptSource, one_run  # noqa: E402


def _mean_ms(fn, calls: int) -> dict:
    wall, cpu = time.perf_counter(), time.thread_time()
    for _ in range(calls):
        fn()
    return {"wall_ms": round((time.perf_counter() - wall) / calls * 1000, 3),
            "cpu_ms": round((time.thread_time() - cpu) / calls * 1000, 3)}


def sample_costs(pid: int, calls: int = 50) -> dict:
    """Mean wall and CPU milliseconds of each query one sample makes (/proc through psutil, NVML),
    of a sampler's first sample (it lists the server's children) and of a steady one."""
    first = Sampler(pid=pid)
    first_sample = _mean_ms(first._sample, 1)
    queries = {
        "first sample": first_sample,
        "steady sample": _mean_ms(first._sample, calls),
        "pcie source": ("GPM" if first.nvml.gpm else "throughput queries") if first.nvml.present else "no GPU",
    }
    proc = psutil.Process(pid)
    host = {
        "psutil.Process(pid)": lambda: psutil.Process(pid),
        "children(recursive)": lambda: proc.children(recursive=True),
        "cpu_times": proc.cpu_times,
        "memory_info": proc.memory_info,
        "io_counters": proc.io_counters,
        "faults (/proc/pid/stat)": lambda: _faults(pid),
        "machine cpu_times": psutil.cpu_times,
        "swap_memory": psutil.swap_memory,
        "disk_io_counters": psutil.disk_io_counters,
    }
    queries.update({name: _mean_ms(fn, calls) for name, fn in host.items()})
    nvml = first.nvml
    if nvml.present:
        nv, h = nvml.nv, nvml.handles[0]
        gpu = {
            "nvml utilization": lambda: nv.nvmlDeviceGetUtilizationRates(h),
            "nvml power": lambda: nv.nvmlDeviceGetPowerUsage(h),
            "nvml energy (not sampled)": lambda: nv.nvmlDeviceGetTotalEnergyConsumption(h),
            "nvml clock": lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
            "nvml pcie gen": lambda: nv.nvmlDeviceGetCurrPcieLinkGeneration(h),
            "nvml compute processes": lambda: nv.nvmlDeviceGetComputeRunningProcesses(h),
            "nvml GPM rates": nvml.gpm.rates if nvml.gpm else lambda: None,
            "nvml pcie throughput, one direction (without GPM)":
                lambda: nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_RX_BYTES),
            "nvml whole row": nvml.row,
        }
        queries.update({name: _mean_ms(fn, calls) for name, fn in gpu.items()})
    first.close()
    return queries


def bootstrap_median(values: list[float], draws: int = 5000, seed: int = 1) -> tuple[float, float]:
    """Percentile bootstrap 95% interval of the median."""
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(draws))
    return medians[int(0.025 * draws)], medians[int(0.975 * draws) - 1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", help="the GGUF to serve (without it: only the cost of each query, on a sleeping process)")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--gen", type=int, default=128)
    schema = yaml.safe_load(default_schema_path().read_text())
    default_interval = schema["properties"]["telemetry"]["properties"]["interval_s"]["default"]
    ap.add_argument("--intervals", type=float, nargs="+", default=[default_interval],
                    help=f"sampler intervals to compare with none (default: the configured default, {default_interval})")
    ap.add_argument("--cache", default=str(Path.home() / ".cache" / "crashline"))
    ap.add_argument("--frame-out", help="write the time series of the last sampled run here (Parquet)")
    ap.add_argument("--out")
    ap.add_argument("server_args", nargs="*")
    args = ap.parse_args()
    if not args.model:
        sleeper = subprocess.Popen(["sleep", "600"])
        try:
            print(json.dumps(sample_costs(sleeper.pid), indent=2))
        finally:
            sleeper.kill()
        return
    binary = provision.provide({"binary": None, "backend": "auto"}, Path(args.cache))["binary"]
    workload = {"prompt_tokens": args.prompt, "gen_tokens": args.gen}
    modes = ["off", *(f"on@{i:g}s" for i in args.intervals)]
    speeds: dict[str, list[float]] = {m: [] for m in modes}
    costs: dict[str, list[dict]] = {m: [] for m in modes[1:]}
    index = 0
    with tempfile.TemporaryDirectory() as tmp, \
            ServerProcess([binary, "-m", args.model, *args.server_args], Path(tmp) / "server.log") as server:
        if server.wait_ready(600) != "ready":
            raise SystemExit(f"server did not start:\n{server.log_text()[-3000:]}")
        client = Client(server.url, 600)
        prompts = PromptSource(client)
        costs_ms = sample_costs(server.proc.pid)
        one_run(client, prompts, workload, index)  # warm-up
        for r in range(args.rounds):
            for mode in modes[r % len(modes):] + modes[:r % len(modes)]:  # rotate the order each round
                index += 1
                if mode == "off":
                    run = one_run(client, prompts, workload, index)
                else:
                    sampler = Sampler(pid=server.proc.pid, interval_s=args.intervals[modes.index(mode) - 1])
                    with sampler:
                        run = one_run(client, prompts, workload, index)
                    sampler.close()
                    costs[mode].append(sampler.own)
                    frame = sampler.frame()
                speeds[mode].append(run["requests"][0]["decode_tps"])
            print(f"round {r + 1}: " + ", ".join(f"{m} {speeds[m][-1]:.2f}" for m in modes), file=sys.stderr, flush=True)
    if args.frame_out:
        write_frame(frame, Path(args.frame_out))
    result = {"server_args": args.server_args, "rounds": args.rounds, "prompt_tokens": args.prompt,
              "gen_tokens": args.gen, "decode_tps": speeds, "sample_costs_ms": costs_ms,
              "median_off": statistics.median(speeds["off"]),
              "spread_off_pct": (max(speeds["off"]) - min(speeds["off"])) / statistics.median(speeds["off"]) * 100,
              "modes": {}}
    for mode in modes[1:]:
        ratios = [on / off for on, off in zip(speeds[mode], speeds["off"])]
        samples = sum(c["samples"] for c in costs[mode])
        low, high = bootstrap_median(ratios)
        result["modes"][mode] = {
            "median_tps": statistics.median(speeds[mode]),
            "ratio_median": statistics.median(ratios), "ratio_ci95": [low, high],
            "ratio_of_medians": statistics.median(speeds[mode]) / result["median_off"],
            "within_1pct": low >= 0.99,
            "samples": samples,
            "sampler_cpu_ms_per_sample": sum(c["cpu_s"] for c in costs[mode]) / samples * 1000 if samples else None,
            "sampler_wall_ms_per_sample": sum(c["wall_s"] for c in costs[mode]) / samples * 1000 if samples else None,
        }
    print(json.dumps(result, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
