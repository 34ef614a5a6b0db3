"""Decode at depth from a re-sent prompt, and the peak while serving a deep prompt (#40 items 3 and 4).

Per server start of one configuration, for each depth D (shortest first): one untimed request of a fresh D-token
prompt (the warm-up: the deep request that tests survival), ``--fresh`` timed requests of other fresh D-token prompts
(``cache_prompt`` off but for the last, which leaves its prompt in the slot), then ``--cached`` timed re-sends of that
last prompt with ``cache_prompt`` on: the server skips its prefill (``cache_n`` D - 1) and decodes over the same depth.
NVML's peak of the GPU's used memory is taken for the load (until ready) and for each depth's requests.

    python bench/depth_check.py --model GGUF --settings JSON --depths 16000,100000 [--gen 64] [--starts 2]
        [--fresh 3] [--cached 3] --out DIR

DIR/depth-check.json holds every request (raw: the server's timings, ``prompt_n``, ``cache_n``), the command, the
model's manifest, each start's buffers from its log and its peaks, and the statistics fixed before the run:

- ``cached_over_fresh``: per depth, the median decode t/s of the cached re-sends over that of the timed fresh
  requests, all starts pooled; ``tied`` where the range of the cached per-start medians overlaps that of the fresh
  ones (crashline's tie rule between starts, ``tables.ties.overlap``). Decode read from a re-sent prompt stands in
  for a fresh prefill's only where it is tied.
- ``serving_growth_mib``: per start and depth, the peak while serving that depth less the peak at load (what the
  planner, which predicts the load peak, misses while serving).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path


def per_start_median(requests: list[dict], kind: str, depth: int) -> dict[int, float]:
    out: dict[int, list[float]] = {}
    for r in requests:
        if r["kind"] == kind and r["depth"] == depth and r.get("decode_tps"):
            out.setdefault(r["start"], []).append(r["decode_tps"])
    return {start: statistics.median(values) for start, values in out.items()}


def statistics_of(raw: dict) -> dict:
    """The two statistics of the module's docstring, from the raw requests and peaks."""
    from crashline.tables.ties import Spread, overlap

    out = {"cached_over_fresh": {}, "serving_growth_mib": []}
    for depth in raw["depths"]:
        fresh = [r["decode_tps"] for r in raw["requests"] if r["kind"] == "fresh" and r["depth"] == depth]
        cached = [r["decode_tps"] for r in raw["requests"] if r["kind"] == "cached" and r["depth"] == depth]
        if not fresh or not cached:
            continue
        f, c = per_start_median(raw["requests"], "fresh", depth), per_start_median(raw["requests"], "cached", depth)
        spread = lambda v: Spread(min(v.values()), max(v.values()), "start medians", len(v))  # noqa: E731
        out["cached_over_fresh"][str(depth)] = {
            "ratio": round(statistics.median(cached) / statistics.median(fresh), 4),
            "fresh_median": round(statistics.median(fresh), 2),
            "cached_median": round(statistics.median(cached), 2),
            "fresh_start_medians": [round(v, 2) for v in f.values()],
            "cached_start_medians": [round(v, 2) for v in c.values()],
            "tied": overlap(spread(f), spread(c)),
        }
    for start in raw["starts"]:
        for depth, peak in start["serving_peak_mib"].items():
            if peak is not None and start["load_peak_mib"] is not None:
                growth = round(peak - start["load_peak_mib"], 1)
                out["serving_growth_mib"].append({"start": start["start"], "depth": int(depth), "growth_mib": growth})
    return out


def main() -> None:
    from crashline.config.expand import cache_dir
    from crashline.core.settings import command_line, resolve
    from crashline.engine import logparse
    from crashline.engine.provision import provide
    from crashline.engine.server import ServerProcess
    from crashline.engine.telemetry import Sampler
    from crashline.engine.workloads import Client, PromptSource
    from crashline.models.manifest import inspect_gguf

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--settings", required=True, help="crashline settings as JSON")
    parser.add_argument("--depths", default="16000,100000")
    parser.add_argument("--gen", type=int, default=64)
    parser.add_argument("--starts", type=int, default=2)
    parser.add_argument("--fresh", type=int, default=3)
    parser.add_argument("--cached", type=int, default=3)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    depths = sorted(int(d) for d in args.depths.split(","))
    binary = provide({"binary": None, "backend": "auto"}, cache_dir({}))["binary"]  # $LLAMA_SERVER, else built
    command = command_line(binary, args.model, resolve(json.loads(args.settings)))
    raw = {
        "statistics_fixed_before": __doc__.split("fixed before the run:", 1)[1].strip(),
        "command": command,
        "settings": json.loads(args.settings),
        "manifest": inspect_gguf(Path(args.model)),
        "depths": depths,
        "gen": args.gen,
        "starts": [],
        "requests": [],
    }

    def save() -> None:
        (out / "depth-check.json").write_text(json.dumps({**raw, "statistics": statistics_of(raw)}, indent=1) + "\n")

    for start in range(1, args.starts + 1):
        log = out / f"server-{start}.log"
        with Sampler(interval_s=0.1) as sampler, ServerProcess(command, log) as server:
            began = time.monotonic()
            state = server.start_ready(900, on_start=lambda s: sampler.follow(s.proc.pid))
            if state != "ready":
                raise SystemExit(f"start {start}: the server is {state}; see {log}")
            sampler.phase("ready")
            here = {
                "start": start,
                "ready_s": round(time.monotonic() - began, 1),
                "load_peak_mib": sampler.peaks.get("load", {}).get("gpu_mib"),
                "buffers": logparse.parse_buffers(server.log_text().splitlines()),
                "serving_peak_mib": {},
            }
            raw["starts"].append(here)
            client = Client.of(server, 1800)
            prompts = PromptSource(client)
            for depth in depths:
                sampler.phase(f"depth-{depth}")
                sent = [prompts.prompt(depth, start * 100 + k) for k in range(args.fresh + 1)]
                for k, prompt in enumerate(sent):  # the warm-up (k 0), then the timed fresh ones
                    last = k == args.fresh
                    r = client.stream(prompt, args.gen, cache_prompt=last)  # the last stays in the slot
                    raw["requests"].append(
                        {"start": start, "depth": depth, "kind": "fresh" if k else "warm-up", "index": k,
                         **{key: v for key, v in r.items() if key != "tokens"}}
                    )  # fmt: skip
                    print(f"start {start} depth {depth} fresh {k}: decode {r['decode_tps']:.1f} "
                          f"prefill {r['prefill_tps']:.1f} prompt_n {r['prompt_n']}", flush=True)  # fmt: skip
                for k in range(args.cached):
                    r = client.stream(sent[-1], args.gen, cache_prompt=True)
                    raw["requests"].append(
                        {"start": start, "depth": depth, "kind": "cached", "index": k,
                         **{key: v for key, v in r.items() if key != "tokens"}}
                    )  # fmt: skip
                    print(f"start {start} depth {depth} cached {k}: decode {r['decode_tps']:.1f} "
                          f"prompt_n {r['prompt_n']} cache_n {r['cache_n']}", flush=True)  # fmt: skip
                sampler.phase(f"after-{depth}")
                here["serving_peak_mib"][str(depth)] = sampler.peaks.get(f"depth-{depth}", {}).get("gpu_mib")
                save()
    save()
    print(json.dumps(statistics_of(raw), indent=1))


if __name__ == "__main__":
    main()
