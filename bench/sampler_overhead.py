"""Does the telemetry sampler change what it measures? Long streamed decodes on one server, with
the sampler switched on and off every few seconds inside each request (the first state alternates
between requests). Each "on" stretch's token rate is compared with the mean of the two "off"
stretches around it, so drift, depth and the server's state hit both sides alike; the median of
these ratios and its bootstrap 95% interval belong within 1% at the default interval.

With ``--replay K`` the requests come in pairs of the same prompt (greedy, no prompt cache: the same
tokens, so with random-weight experts the same experts on the CPU for each token) and the sampler flips
every K tokens, on where the other request of its pair had it off; each stretch's rate with the sampler
is divided by the rate of the same K tokens without it in the other request, and the pair's order
alternates. Its statistic: the mean over pairs of each pair's geometric mean of its ratios (``pair_geomean``), with
its bootstrap 95% interval: a factor by which one request of a pair runs faster than the other cancels in it (the
same tokens decoded up to 11% apart on the H200, 2026-12-02), where the median of the single ratios keeps it.

The sampler runs its own thread at its own interval, as in a measurement; while "off" it is paused
and its thread sleeps on an event without waking. Also reported: what each query of one sample costs
(CPU and wall time; on a GPU machine the NVML queries too), and what the samples cost during the run.

    python bench/sampler_overhead.py --model PATH [--requests 4] [--gen 1536] [--segment 2 | --replay K]
        [--interval S] [--frame-out F.parquet] [--out F.json] [-- extra llama-server args]
    python bench/sampler_overhead.py          # without a model: only the cost of each query
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from crashline.engine import provision  # noqa: E402
from crashline.config.plan import load_schema  # noqa: E402
from crashline.engine.server import ServerProcess  # noqa: E402
from crashline.engine.telemetry import Sampler, page_faults, write_frame  # noqa: E402
from crashline.engine.workloads import Client, PromptSource  # noqa: E402


def _mean_ms(fn, calls: int) -> dict:
    wall, cpu = time.perf_counter(), time.thread_time()
    for _ in range(calls):
        fn()
    return {
        "wall_ms": round((time.perf_counter() - wall) / calls * 1000, 3),
        "cpu_ms": round((time.thread_time() - cpu) / calls * 1000, 3),
    }


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
        "faults (/proc/pid/stat)": lambda: page_faults(pid),
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
            "nvml pcie throughput, one direction (without GPM)": lambda: nv.nvmlDeviceGetPcieThroughput(
                h, nv.NVML_PCIE_UTIL_RX_BYTES
            ),
            "nvml whole row": nvml.row,
        }
        queries.update({name: _mean_ms(fn, calls) for name, fn in gpu.items()})
    first.close()
    return queries


def bootstrap(values: list[float], statistic=statistics.median, draws: int = 5000, seed: int = 1) -> tuple:
    """Percentile bootstrap 95% interval of ``statistic`` (the median unless told)."""
    rng = random.Random(seed)
    drawn = sorted(statistic(rng.choices(values, k=len(values))) for _ in range(draws))
    return drawn[int(0.025 * draws)], drawn[int(0.975 * draws) - 1]


def switched_request(
    client: Client,
    prompt: list[int],
    gen: int,
    sampler: Sampler,
    first_on: bool,
    segment_s: float | None = None,
    stretch_tokens: int | None = None,
) -> tuple[list[dict], dict]:
    """One streamed request; from its first token on, the sampler flips every ``segment_s`` seconds, or every
    ``stretch_tokens`` tokens. Returns the stretches (state, tokens, seconds) and the server's timings."""
    segments: list[dict] = []
    state = {"start": None, "tokens": 0, "on": first_on}

    def on_chunk(t: float) -> None:
        if state["start"] is None:  # the first token: prefill is over, the first stretch begins
            state["start"] = t
            sampler.resume() if state["on"] else sampler.pause()
            return
        state["tokens"] += 1
        if state["tokens"] == stretch_tokens if stretch_tokens else t - state["start"] >= segment_s:
            segments.append({"on": state["on"], "tokens": state["tokens"], "seconds": t - state["start"]})
            state.update(start=t, tokens=0, on=not state["on"])
            sampler.resume() if state["on"] else sampler.pause()

    timings = client.stream(prompt, gen, on_chunk=on_chunk)
    sampler.pause()
    return segments, timings


def neighbour_ratios(segments: list[dict]) -> list[float]:
    """Each inner "on" stretch's rate over the mean rate of the "off" stretches before and after it."""
    rates = [s["tokens"] / s["seconds"] for s in segments]
    return [rates[i] / ((rates[i - 1] + rates[i + 1]) / 2) for i in range(1, len(segments) - 1) if segments[i]["on"]]


def pair_geomean(ratios: list[float]) -> float:
    """A pair's ratios pooled: their geometric mean. Half of a pair's stretches have the sampler on in one request
    and half in the other, so a factor by which one request runs faster than the other (the same tokens decoded
    58.7 and 52.8 t/s apart on the H200) multiplies half the ratios and divides the other half, and cancels here."""
    return math.exp(statistics.fmean(math.log(r) for r in ratios))


def pair_ratios(first: list[dict], second: list[dict]) -> list[float]:
    """Stretch k of two requests of the same tokens, one with the sampler and one without: rate on ÷ rate off."""
    out = []
    for a, b in zip(first, second):
        if a["on"] == b["on"] or a["tokens"] != b["tokens"]:
            raise ValueError(f"stretches do not pair: {a} and {b}")
        on, off = (a, b) if a["on"] else (b, a)
        out.append((on["tokens"] / on["seconds"]) / (off["tokens"] / off["seconds"]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--model", help="the GGUF to serve (without it: only the cost of each query, on a sleeping process)"
    )
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--gen", type=int, default=1536)
    ap.add_argument("--segment", type=float, default=2.0, help="seconds between switching the sampler on and off")
    ap.add_argument(
        "--replay",
        type=int,
        metavar="K",
        help="pairs of requests of the same prompt, the sampler flipped every K tokens, on where the other had it off",
    )
    schema = load_schema()
    default_interval = schema["properties"]["telemetry"]["properties"]["interval_s"]["default"]
    ap.add_argument(
        "--interval",
        type=float,
        default=default_interval,
        help=f"the sampler's interval (default: the configured default, {default_interval} s)",
    )
    ap.add_argument("--cache", default=str(Path.home() / ".cache" / "crashline"))
    ap.add_argument("--frame-out", help="write the sampled time series here (Parquet)")
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
    per_request = []
    with (
        tempfile.TemporaryDirectory() as tmp,
        ServerProcess([binary, "-m", args.model, *args.server_args], Path(tmp) / "server.log") as server,
    ):
        if server.start_ready(600) != "ready":
            raise SystemExit(f"server did not start:\n{server.log_text()[-3000:]}")
        client = Client.of(server, 600)
        prompts = PromptSource(client)
        costs_ms = sample_costs(server.proc.pid)
        client.stream(prompts.prompt(args.prompt, 0), 32)  # warm-up
        sampler = Sampler(pid=server.proc.pid, interval_s=args.interval)
        with sampler:  # the sampler's own thread, paused between stretches; entering lists the children
            sampler.pause()
            for i in range(args.requests):
                # replay: requests 2j and 2j+1 share a prompt; the first of a pair starts on in even pairs, off in odd
                pair, second = divmod(i, 2)
                index, first_on = (pair + 1, (pair % 2 == 0) != bool(second)) if args.replay else (i + 1, bool(i % 2))
                segments, timings = switched_request(
                    client,
                    prompts.prompt(args.prompt, index),
                    args.gen,
                    sampler,
                    first_on,
                    segment_s=args.segment,
                    stretch_tokens=args.replay,
                )
                if not args.replay:
                    ratios = neighbour_ratios(segments)
                elif second:
                    ratios = pair_ratios(per_request[-1]["segments"], segments)
                else:
                    ratios = []
                per_request.append({"segments": segments, "ratios": ratios, "server_decode_tps": timings["decode_tps"]})
                print(
                    f"request {i + 1}: {len(segments)} stretches, ratios " + " ".join(f"{r:.3f}" for r in ratios),
                    file=sys.stderr,
                    flush=True,
                )
        sampler.close()
    if args.frame_out:
        write_frame(sampler.frame(), Path(args.frame_out))
    ratios = [r for req in per_request for r in req["ratios"]]
    low, high = bootstrap(ratios)
    # replay: the statistic fixed for it after 2026-12-02, the mean over pairs of each pair's geometric mean
    pairs = [pair_geomean(req["ratios"]) for req in per_request if req["ratios"]] if args.replay else []
    pairs_ci = bootstrap(pairs, statistics.fmean) if len(pairs) > 1 else None
    rate = {
        on: sum(s["tokens"] for q in per_request for s in q["segments"] if s["on"] == on)
        / sum(s["seconds"] for q in per_request for s in q["segments"] if s["on"] == on)
        for on in (True, False)
    }
    cost = sampler.cost()
    result = {
        "server_args": args.server_args,
        "prompt_tokens": args.prompt,
        "gen_tokens": args.gen,
        "requests": args.requests,
        "design": f"replay: pairs of the same prompt, stretches of {args.replay} tokens" if args.replay else "switched",
        "segment_s": None if args.replay else args.segment,
        "stretch_tokens": args.replay,
        "interval_s": args.interval,
        "tokens_per_s_on": rate[True],
        "tokens_per_s_off": rate[False],
        "ratio_median": statistics.median(ratios),
        "ratio_ci95": [low, high],
        "n_ratios": len(ratios),
        "within_1pct": low >= 0.99 and high <= 1.01,
        **(
            {
                "pair_geomeans": pairs,
                "pairs_mean": statistics.fmean(pairs) if pairs else None,
                "pairs_ci95": pairs_ci,
                "pairs_within_1pct": bool(pairs_ci and pairs_ci[0] >= 0.99 and pairs_ci[1] <= 1.01),
            }
            if args.replay
            else {}
        ),
        "samples_during_run": cost["samples"],
        "sampler_cpu_ms_per_sample": cost["cpu_ms_per_sample"],
        "sampler_wall_ms_per_sample": cost["wall_ms_per_sample"],
        "sample_costs_ms": costs_ms,
        "per_request": per_request,
    }
    print(json.dumps({k: v for k, v in result.items() if k != "per_request"}, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
