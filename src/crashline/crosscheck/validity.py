"""Cross-check with llama-bench: are crashline's speeds the engine's real speeds?

For a configuration crashline measured, llama-bench (built beside llama-server from the same sources) runs the
same model with the same placement, batch sizes, KV types, flash attention and threads: per workload of one
request at a time, a prefill of the workload's prompt on an empty context (``-p P -d 0``) and a decode of its
generated tokens after that prompt (``-n G -d P``). The result puts crashline's medians beside llama-bench's
means with their ratio, and flags a difference over ``TOLERANCE``.

Which to trust: llama-bench times the engine alone (no HTTP, no sampling, no slot bookkeeping, a context of
exactly the tokens it needs); crashline reports the server's own timings of each request, what a client of
llama-server gets. Agreeing within the tolerance, both hold. Beyond it, crashline's figure is what a user of
llama-server sees, and llama-bench's the speed the engine reaches without the server: the gap is the server's.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import subprocess
import time

import psutil

from ..core import progress
from ..core.records import Outcome
from ..core.thresholds import shared
from ..engine.server import private_home, server_env
from ..engine.telemetry import busy_seconds

TOLERANCE = 0.10  # a ratio further than this from 1 is flagged
# crashline setting -> llama-bench flag; what is not here llama-bench cannot express (``left_out`` says which)
BENCH_FLAGS = {
    "n_gpu_layers": "-ngl",
    "n_cpu_moe": "-ncmoe",
    "batch": "-b",
    "ubatch": "-ub",
    "cache_type_k": "-ctk",
    "cache_type_v": "-ctv",
    "flash_attn": "-fa",
    "load_mode": "-lm",
    "override_tensor": "-ot",
    "split_mode": "-sm",
    "tensor_split": "-ts",
    "main_gpu": "-mg",
}
# Settings that do not change one request's speed at a time (or that llama-bench sizes itself: the context is
# the test's tokens), so leaving them out is no difference worth naming.
NOT_SPEED = {"ctx", "parallel", "cont_batching", "kv_unified", "page_cache", "extra_args", "threads", "threads_batch"}
NOT_SPEED |= {"cache_ram", "ctx_checkpoints", "checkpoint_min_step", "cache_reuse", "cache_idle_slots", "fit_ctx"}


class BenchError(RuntimeError):
    """llama-bench did not give a result (its exit status and the end of its stderr)."""


def bench_args(settings: dict, placement: dict) -> tuple[list[str], list[str]]:
    """The llama-bench arguments for a configuration's settings (threads as the server used them, from its log),
    and the settings that change speed but llama-bench cannot express."""
    args = []
    for name, flag in BENCH_FLAGS.items():
        value = settings.get(name)
        if value is not None:
            # llama-bench separates -ot patterns with ";" and -ts shares with "/", where llama-server uses ","
            separator = {"override_tensor": ";", "tensor_split": "/"}.get(name, ",")
            args += [flag, str(value).replace(",", separator)]
    threads = settings.get("threads") or placement.get("n_threads")
    if threads:
        args += ["-t", str(threads)]
    left_out = sorted(k for k, v in settings.items() if v not in (None, [], (), "off") and k not in BENCH_FLAGS)
    left_out = [k for k in left_out if k not in NOT_SPEED]
    batch_threads = settings.get("threads_batch") or placement.get("n_threads_batch")
    if batch_threads and threads and batch_threads != threads:
        left_out.append(f"threads_batch {batch_threads} (llama-bench uses -t {threads} for prefill too)")
    return args, left_out


def run_bench(binary: str, model_path: str, args: list[str], test: list[str], repetitions: int, timeout_s: float):
    """One llama-bench test (``test``: ``-p P -n 0 -d 0`` or ``-p 0 -n G -d P``): its mean, standard deviation and
    samples in tokens per second, and the command."""
    command = [binary, "-m", model_path, *args, *test, "-r", str(repetitions), "-o", "json"]
    started, machine, own = time.monotonic(), busy_seconds(psutil.cpu_times()), _children_cpu_s()
    what = f"llama-bench {' '.join(test)} (up to {timeout_s:.0f} s)"
    try:
        with progress.heartbeat(what):
            with private_home() as home:  # the environment and folders a llama-server gets, nothing of ours
                done = subprocess.run(
                    command,
                    capture_output=True,
                    text=True,
                    timeout=timeout_s,
                    cwd=home,
                    env=server_env(os.environ, home),
                )
    except subprocess.TimeoutExpired as exc:
        raise BenchError(f"llama-bench ran past {timeout_s} s: {' '.join(command)}") from exc
    wall = max(time.monotonic() - started, 1e-3)
    bench = (_children_cpu_s() - own) / wall
    other = max(0.0, (busy_seconds(psutil.cpu_times()) - machine) / wall - bench)
    if done.returncode != 0:
        tail = " | ".join(done.stderr.strip().splitlines()[-3:])
        raise BenchError(f"llama-bench exited with status {done.returncode}: {tail}")
    (row,) = json.loads(done.stdout)
    return {
        "command": command,
        "mean_tps": row["avg_ts"],
        "stddev_tps": row["stddev_ts"],
        "samples": row["samples_ts"],
        # as for a measurement's workload: the cores llama-bench used, and every other process meanwhile
        "cpu_bench_cores": round(bench, 2),
        "cpu_other_cores": round(other, 2),
    }


def _children_cpu_s() -> float:
    """CPU seconds of this process's waited-for children (llama-bench, once it has ended)."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def disturbed(row: dict) -> list[str]:
    """The sides of a cross-check row that other processes competed with (``thresholds.shared``): "llama-bench"
    (its prefill or decode test), "crashline" (its measurement of the workload). A gap there says nothing of the
    server: the row is not concluded."""
    sides = []
    if any(shared((row[f"bench_{k}"] or {}).get("cpu_other_cores")) for k in ("prefill", "decode")):
        sides.append("llama-bench")
    if shared(row.get("crashline_cpu_other_cores")):
        sides.append("crashline")
    return sides


def _number(value) -> float | None:
    return None if value is None or value != value else float(value)  # NaN: not sampled


def _ratio(ours, theirs) -> float | None:
    return round(ours / theirs, 4) if ours and theirs else None


def compare(config: dict, workloads: list[dict], model_path: str, binary: str, repetitions: int, timeout_s: float):
    """llama-bench at each workload of ``config`` (a configs-table row: its settings and log placement) that ran one
    request at a time and survived; ``workloads`` are its measurements-table rows."""
    args, left_out = bench_args(config["settings"], config["placement"])
    rows = []
    for w in workloads:
        if w["concurrency"] != 1 or w["workload_outcome"] != Outcome.OK:
            continue
        prompt, gen = int(w["prompt_tokens"]), int(w["gen_tokens"])
        prefill = run_bench(binary, model_path, args, ["-p", str(prompt), "-n", "0", "-d", "0"], repetitions, timeout_s)
        decode = run_bench(
            binary, model_path, args, ["-p", "0", "-n", str(gen), "-d", str(prompt)], repetitions, timeout_s
        )
        ratios = {
            "prefill": _ratio(w["prefill_tps_median"], prefill["mean_tps"]),
            "decode": _ratio(w["decode_tps_median"], decode["mean_tps"]),
        }
        rows.append(
            {
                "workload": w["workload"],
                "prompt_tokens": prompt,
                "gen_tokens": gen,
                "crashline_prefill_tps": w["prefill_tps_median"],
                "crashline_decode_tps": w["decode_tps_median"],
                "crashline_cpu_other_cores": _number(w.get("cpu_other_cores")),
                "bench_prefill": prefill,
                "bench_decode": decode,
                "prefill_ratio": ratios["prefill"],
                "decode_ratio": ratios["decode"],
                "flagged": [k for k, r in ratios.items() if r is not None and abs(r - 1) > TOLERANCE],
            }
        )
    return {"bench_args": args, "left_out": left_out, "rows": rows}


def check(configs: list[dict], measurements, model_path: str, binary: str, repetitions: int, timeout_s: float):
    """Every configuration given (configs-table rows with ``settings`` and ``placement``), one after another."""
    checked = []
    for config in configs:
        started = time.monotonic()
        mine = measurements[measurements["config_id"] == config["config_id"]].to_dict("records")
        try:
            result = compare(config, mine, model_path, binary, repetitions, timeout_s)
            checked.append({"config_id": config["config_id"], "outcome": Outcome.OK, "message": None, **result})
        except BenchError as exc:
            checked.append(
                {"config_id": config["config_id"], "outcome": Outcome.ERROR, "message": str(exc), "rows": []}
            )
        checked[-1]["seconds"] = round(time.monotonic() - started, 1)
    return checked


def _rows(path) -> list[dict]:
    """A table's rows with native types (None for a missing value: pandas would make integers floats)."""
    import pyarrow.parquet as pq

    return pq.read_table(path).to_pylist()


def _settings(row: dict) -> dict:
    """A configs-table row's settings, from its ``s_*`` columns."""
    from ..core.columns import SETTING_PREFIX

    return {k.removeprefix(SETTING_PREFIX): v for k, v in row.items() if k.startswith(SETTING_PREFIX)}


def chosen(config: dict, configs, measurements, needle) -> list[tuple[str, str]]:
    """(model, config id) to check: each model's recommended configuration, as the report recommends it, and those
    the config's ``validity.configs`` names."""
    from ..tables.recommend import decide

    recs = decide(configs, measurements, config, needle)
    wanted = [(r["model"], r["winner"]) for r in recs if r["winner"]]
    asked = set(config["validity"]["configs"])
    wanted += [(m, c) for m, c in zip(configs["model"], configs["config_id"]) if c in asked and (m, c) not in wanted]
    return wanted


def job(config: dict, tables: dict, provenance: dict, model_paths: dict[str, str], out_path) -> dict:
    """The validity record: llama-bench beside crashline for every configuration ``chosen`` picks, run under the
    machine's server lock (no other llama.cpp process measures meanwhile)."""
    import pandas as pd

    from ..core.atomic import write_json
    from ..core.host import describe, environment_key
    from ..core.locks import LeaseError

    here = environment_key(describe())
    configs, measurements = (this_machine(pd.read_parquet(tables[t]), here) for t in ("configs", "measurements"))
    needle = pd.read_parquet(tables["needle"]) if tables.get("needle") else pd.DataFrame()
    wanted = chosen(config, configs, measurements, needle) if config["validity"]["enabled"] else []
    mine = set(configs["environment"])
    rows = {(r["model"], r["config_id"]): r for r in _rows(tables["configs"]) if r["environment"] in mine}
    binary, reps = provenance.get("bench_binary"), config["validity"]["repetitions"]
    record = {"tolerance": TOLERANCE, "bench_binary": binary, "repetitions": reps, "checked": []}
    if wanted and not binary:
        record["message"] = (
            "no llama-bench in the folder of this llama-server (a build from source has one): nothing was cross-checked"
        )
        wanted = []
    try:
        _check_each(wanted, rows, measurements, model_paths, binary, reps, config, record)
    except LeaseError as exc:
        record["message"] = f"llama-bench did not run: {exc}"
    write_json(out_path, record)
    return record


def this_machine(table, here: str | None = None):
    """The rows measured on this kind of machine (``here``: its host.environment_key, found if not given): records
    merged from others (merge_results) are not checked against this machine's llama-bench."""
    from ..core.host import describe, environment_key

    here = here or environment_key(describe())
    return table[table["environment"].str.startswith(here + "|")] if len(table) else table


def _check_each(wanted, rows, measurements, model_paths, binary, reps, config, record) -> None:
    """llama-bench for each configuration wanted, under one lease (the GPUs of the one that needs the most, the
    host-memory lock where any reads weights from host memory); each one's result goes into ``record``."""
    from ..core.locks import lease
    from ..core.settings import gpu_count, weights_on_cpu

    settings = [_settings(rows[key]) for key in wanted]
    gpus = max(map(gpu_count, settings), default=1)
    on_cpu = any(map(weights_on_cpu, settings))
    with lease("validity", gpus, host_memory=on_cpu) if wanted else contextlib.nullcontext():
        for model, cid in wanted:
            row = rows[(model, cid)]
            config_row = {
                "config_id": cid,
                "settings": _settings(row),
                "placement": {k: row.get(k) for k in ("n_threads", "n_threads_batch")},
            }
            mine = measurements[measurements["model"] == model]
            progress.say(f"llama-bench beside crashline: {model} {cid} ({row['server_args']})")
            (found,) = check(
                [config_row], mine, model_paths[model], binary, reps, config["server"]["request_timeout_s"]
            )
            for r in found["rows"]:
                progress.say(_row_text(r))
            record["checked"].append({"model": model, "server_args": row["server_args"], **found})


def _row_text(r: dict) -> str:
    def one(kind: str) -> str:
        ours, theirs, ratio = r[f"crashline_{kind}_tps"], r[f"bench_{kind}"]["mean_tps"], r[f"{kind}_ratio"]
        mark = " ⚠" if kind in r["flagged"] else ""
        return f"{kind} {ours:,.1f} vs {theirs:,.1f} t/s ({ratio:.2f}){mark}"

    return f"{r['workload']}: {one('prefill')}, {one('decode')}"
