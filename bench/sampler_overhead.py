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
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from crashline import provision  # noqa: E402
from crashline.config import default_schema_path  # noqa: E402
from crashline.server import ServerProcess  # noqa: E402
from crashline.telemetry import Sampler, write_frame  # noqa: E402
from crashline.workloads import Client, PromptSource, one_run  # noqa: E402


def nvml_call_costs(sampler: Sampler, calls: int = 50) -> dict:
    """Mean wall and CPU milliseconds of each NVML query one sample makes (none without a GPU)."""
    nvml = sampler.nvml
    if not nvml.present:
        return {}
    nv, h = nvml.nv, nvml.handles[0]
    queries = {
        "utilization": lambda: nv.nvmlDeviceGetUtilizationRates(h),
        "power": lambda: nv.nvmlDeviceGetPowerUsage(h),
        "energy (not sampled)": lambda: nv.nvmlDeviceGetTotalEnergyConsumption(h),
        "clock_sm": lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
        "pcie_gen": lambda: nv.nvmlDeviceGetCurrPcieLinkGeneration(h),
        "gpm_rates": nvml.gpm.rates if nvml.gpm else lambda: None,
        "pcie_throughput_rx (without GPM)": lambda: nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_RX_BYTES),
        "compute_processes": lambda: nv.nvmlDeviceGetComputeRunningProcesses(h),
        "memory_info": lambda: nv.nvmlDeviceGetMemoryInfo(h),
        "whole_row": nvml.row,
    }
    out = {"gpm": bool(nvml.gpm)}
    for name, fn in queries.items():
        wall, cpu = time.perf_counter(), time.thread_time()
        try:
            for _ in range(calls):
                fn()
        except nv.NVMLError as exc:
            out[name] = {"error": str(exc)}
            continue
        out[name] = {"wall_ms": round((time.perf_counter() - wall) / calls * 1000, 3),
                     "cpu_ms": round((time.thread_time() - cpu) / calls * 1000, 3)}
    return out


def bootstrap_median(values: list[float], draws: int = 5000, seed: int = 1) -> tuple[float, float]:
    """Percentile bootstrap 95% interval of the median."""
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(draws))
    return medians[int(0.025 * draws)], medians[int(0.975 * draws) - 1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", required=True)
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
        probe = Sampler(pid=server.proc.pid)
        nvml_costs = nvml_call_costs(probe)
        probe.close()
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
              "gen_tokens": args.gen, "decode_tps": speeds, "nvml_call_costs": nvml_costs,
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
