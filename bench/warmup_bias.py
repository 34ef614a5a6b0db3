"""Is the first timed request at each depth slow, and does a warm-up at that depth fix it (#22 item 3)?

The same configuration is measured under ``warmup_requests: 0`` and ``warmup_requests: 1`` in interleaved server
starts (0, 1, 0, 1, ...), each start a real ``python -m crashline measure`` of the config's one configuration.
The statistic, chosen before running: per start and workload, repetition 1's decode t/s over the median of
repetitions 2..R (``first_over_rest``); per warm-up setting and workload, the median of that ratio over the
starts with its min and max. A value of 1.00 means the first timed request is as fast as the rest.

    python bench/warmup_bias.py CONFIG --starts 2 --out DIR

CONFIG is an ordinary crashline config with one configuration and R >= 3 repetitions (its ``warmup_requests`` is
overridden). Every start's record is copied to DIR/records/ (raw, with its settings), DIR/warmup-bias.json holds
the ratios and DIR/console.txt what the jobs printed.

Position or prompt? A measurement's repetition k always sends prompt k (``workloads.one_run``: prompts differ by
index), so a slow repetition 1 may be the first timed request or prompt 0's text (an MoE routes each text to other
experts). ``order`` sends one llama-server, per start, the 64-token request a measurement sends first and then the
prompts of ``--order`` (the first untimed: the warm-up at depth), e.g. 3,0,1,2,0,1,2,0,1,2, so that prompt 0 is
sent at positions 1, 4 and 7:

    python bench/warmup_bias.py order --model GGUF --settings JSON --prompt 16000 --starts 3 --out DIR

The statistic, fixed before it ran: per start and metric, each timed request over the median of that start's
timed requests; per position, the geometric mean of that over the starts; the position effect is position 1's
over the geometric mean of the later positions that sent the same prompt (1.00: none); the prompt effect is the
geometric mean of the positions that sent position 1's prompt over that of the other positions. DIR/order.json holds
every request (raw, with the command) and the statistic. ``order-stats DIR`` computes it again from that file, with
the spread between requests and each effect's two-standard-error half-width (post hoc, session 16):

    python bench/warmup_bias.py order-stats DIR
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

from crashline.config import plan as C
from crashline.core.paths import Layout


def crashline(config_path: Path | None, *args: str, log) -> None:
    """``python -m crashline ARGS --config CONFIG`` (without --config where ``config_path`` is None), to ``log``."""
    started = time.monotonic()
    argv = [*args, *(["--config", str(config_path)] if config_path else [])]
    print(f"$ python -m crashline {' '.join(argv)}", file=log, flush=True)
    proc = subprocess.run([sys.executable, "-m", "crashline", *argv], stderr=log)
    print(f"  ({args[0]}: exit {proc.returncode} after {time.monotonic() - started:.1f} s)", file=log, flush=True)
    if proc.returncode != 0:
        raise SystemExit(f"{args[0]} failed (exit {proc.returncode}); see the console log")


def first_over_rest(workload: dict) -> float | None:
    """Repetition 1's decode over the median of the later repetitions (every request of a run: its median)."""
    per_run = [statistics.median(r["decode_tps"] for r in run["requests"]) for run in workload.get("runs") or []]
    if len(per_run) < 3:
        return None
    return per_run[0] / statistics.median(per_run[1:])


def summary(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


METRICS = ("prefill_tps", "decode_tps", "e2e_tps")


def per_request(r: dict) -> dict:
    """A request's prefill and decode t/s (the server's timings) and its end to end t/s (tokens over its wall)."""
    e2e = (r["prompt_n"] + r["predicted_n"]) / r["end_s"] if r.get("end_s") else None
    return {"prefill_tps": r["prefill_tps"], "decode_tps": r["decode_tps"], "e2e_tps": e2e}


def geomean(values: list[float]) -> float:
    return math.exp(statistics.fmean(math.log(v) for v in values))


def position_statistic(starts: list[list[dict]], order: list[int]) -> dict:
    """The statistic of ``order`` (the module's docstring) from each start's timed requests, in order."""
    timed = order[1:]
    out = {}
    for metric in METRICS:
        ratios = []  # per start, per position
        for requests in starts:
            values = [r[metric] for r in requests]
            mid = statistics.median(values)
            ratios.append([v / mid for v in values])
        by_position = [geomean([start[k] for start in ratios]) for k in range(len(timed))]
        later = [k for k in range(1, len(timed)) if timed[k] == timed[0]]
        out[metric] = {
            "by_position": [round(v, 4) for v in by_position],
            "each_start": [[round(v, 4) for v in start] for start in ratios],
            "position_effect": round(by_position[0] / geomean([by_position[k] for k in later]), 4) if later else None,
            "same_prompt_positions": [1, *(k + 1 for k in later)],
            "prompt_effect": round(
                geomean([by_position[k] for k in (0, *later)])
                / geomean([by_position[k] for k in range(len(timed)) if timed[k] != timed[0]]),
                4,
            )
            if later and len(set(timed)) > 1
            else None,
            **noise(ratios, 1 + len(later), len(timed)),
        }
    return out


def noise(ratios: list[list[float]], same: int, timed: int) -> dict:
    """Post hoc (session 16, not fixed before the lease): the spread between requests within a start, as the
    standard deviation of the log ratios to the start's median, and the two-standard-error half-width it gives each
    effect, whose sides hold 1 and ``same - 1`` positions (position effect), ``same`` and ``timed - same`` (prompt
    effect), each position a geometric mean over the starts."""
    logs = [math.log(v) for start in ratios for v in start]
    if len(logs) < 2:
        return {}
    sd, n = statistics.stdev(logs), len(ratios)
    half = lambda a, b: round(2 * sd * math.sqrt(1 / (a * n) + 1 / (b * n)), 4)  # noqa: E731
    return {
        "request_sd_log": round(sd, 4),
        "position_effect_2se": half(1, same - 1) if same > 1 else None,
        "prompt_effect_2se": half(same, timed - same) if timed > same else None,
    }


def order_stats(folder: str) -> None:
    """The statistic of ``order`` again from DIR/order.json's raw requests (DIR/order-stats.json)."""
    raw = json.loads((Path(folder) / "order.json").read_text())
    order, starts = raw["order"], {}
    for r in raw["requests"]:
        if r["position"]:
            starts.setdefault(r["start"], []).append(per_request(r))
    stats = position_statistic([starts[k] for k in sorted(starts)], order)
    (Path(folder) / "order-stats.json").write_text(json.dumps(stats, indent=1) + "\n")
    print(
        json.dumps(
            {m: {k: v for k, v in x.items() if k not in ("each_start", "by_position")} for m, x in stats.items()}
        )
    )


def order_main(argv: list[str]) -> None:
    from crashline.core.settings import command_line, resolve
    from crashline.engine.server import ServerProcess
    from crashline.engine.workloads import Client, PromptSource, check_run, one_run
    from crashline.config.expand import cache_dir
    from crashline.engine.provision import provide

    parser = argparse.ArgumentParser(description="position or prompt: see the docstring")
    parser.add_argument("--model", required=True)
    parser.add_argument("--settings", required=True, help="crashline settings as JSON")
    parser.add_argument("--prompt", type=int, default=16000)
    parser.add_argument("--gen", type=int, default=64)
    parser.add_argument("--starts", type=int, default=3)
    parser.add_argument("--order", default="3,0,1,2,0,1,2,0,1,2")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    order = [int(x) for x in args.order.split(",")]
    binary = provide({"binary": None, "backend": "auto"}, cache_dir({}))["binary"]  # $LLAMA_SERVER, else built
    command = command_line(binary, args.model, resolve(json.loads(args.settings)))
    workload = {"name": f"prompt-{args.prompt}", "prompt_tokens": args.prompt, "gen_tokens": args.gen}
    starts, raw = [], []
    for start in range(args.starts):
        with ServerProcess(command, out / f"server-{start + 1}.log") as server:
            if server.start_ready(600) != "ready":
                raise SystemExit(f"start {start + 1}: the server did not start; see {out}/server-{start + 1}.log")
            client = Client.of(server, 600)
            prompts = PromptSource(client)
            client.complete(prompts.prompt(64, 0), 4, timeout_s=client.setup_timeout_s)  # as a measurement does
            requests = []
            for k, index in enumerate(order):
                run = one_run(client, prompts, workload, index)
                if problem := check_run(run, workload):
                    raise SystemExit(f"start {start + 1}, request {k}: {problem}")
                (r,) = run["requests"]
                raw.append({"start": start + 1, "position": k, "prompt_index": index, **r})
                print(
                    f"start {start + 1} position {k} prompt {index}: "
                    + ", ".join(f"{m} {v:,.1f}" for m, v in per_request(r).items()),
                    flush=True,
                )
                if k:
                    requests.append(per_request(r))
            starts.append(requests)
        result = {
            "statistic": "per start and metric: each timed request / the median of that start's timed requests; per "
            "position: the geometric mean over starts; position_effect: position 1 / the geometric mean of the later "
            "positions that sent the same prompt; prompt_effect: the geometric mean of the positions that sent "
            "position 1's prompt / that of the other positions",
            "command": command,
            "workload": workload,
            "order": order,
            "starts": len(starts),
            "positions": position_statistic(starts, order),
            "requests": raw,
        }
        (out / "order.json").write_text(json.dumps(result, indent=1) + "\n")
    print(
        json.dumps({m: {k: v[k] for k in ("position_effect", "prompt_effect")} for m, v in result["positions"].items()})
    )


def main() -> None:
    if sys.argv[1:2] == ["order"]:
        return order_main(sys.argv[2:])
    if sys.argv[1:2] == ["order-stats"]:
        return order_stats(sys.argv[2])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config")
    parser.add_argument("--starts", type=int, default=2, help="server starts per warm-up setting")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    out = Path(args.out)
    (out / "records").mkdir(parents=True, exist_ok=True)
    raw = yaml.safe_load(Path(args.config).read_text())
    base = C.validate(raw, C.load_schema())
    (item,) = C.expand(base)
    layout = Layout(base["results_dir"])
    ratios: dict[int, dict[str, list[float]]] = {0: {}, 1: {}}
    with open(out / "console.txt", "a") as log:
        configs = {}
        for warmups in (0, 1):
            path = out / f"config-warmup{warmups}.yaml"
            path.write_text(yaml.safe_dump({**raw, "warmup_requests": warmups}, sort_keys=False))
            configs[warmups] = path
        model = item["model"]
        crashline(configs[0], "fetch", "--model", model, log=log)
        crashline(
            None, "inspect", "--fetch-record", str(layout.fetch(model)), "--out", str(layout.manifest(model)), log=log
        )
        crashline(configs[0], "provision", log=log)
        for start in range(args.starts):
            for warmups in (0, 1):  # interleaved, so that a drift of the machine reaches both alike
                crashline(configs[warmups], "measure", "--model", model, "--id", item["id"], log=log)
                record_path = out / "records" / f"warmup{warmups}-start{start + 1}.json"
                shutil.copy(layout.record(model, item["id"]), record_path)
                record = json.loads(record_path.read_text())
                if record["outcome"] != "ok":
                    raise SystemExit(f"{record_path}: {record['outcome']} ({record['message']})")
                for w in record["workloads"]:
                    if (r := first_over_rest(w)) is not None:
                        ratios[warmups].setdefault(w["name"], []).append(r)
                (out / "warmup-bias.json").write_text(json.dumps(result(base, item, ratios), indent=1) + "\n")
    print(json.dumps(result(base, item, ratios)["first_over_rest"], indent=1))


def result(cfg: dict, item: dict, ratios: dict) -> dict:
    return {
        "statistic": "per start and workload: decode t/s of timed repetition 1 / median of repetitions 2..R; "
        "per warm-up setting: the median, min and max of that over the starts",
        "model": item["model"],
        "settings": item["settings"],
        "workloads": cfg["workloads"],
        "repetitions": cfg["repetitions"],
        "budget": cfg["budget"],
        "first_over_rest": {
            f"warmup_requests={w}": {name: {**summary(v), "each": v} for name, v in by_workload.items()}
            for w, by_workload in ratios.items()
        },
    }


if __name__ == "__main__":
    main()
