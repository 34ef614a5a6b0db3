"""`python -m crashline <verb>`: every job of the workflow, runnable without Snakemake."""

from __future__ import annotations

import argparse
import os
import select
import signal
import sys
import traceback

from ..config import plan
from ..core.errors import CrashlineError
from . import verbs
from .exits import Exit, epilog


class _Parser(argparse.ArgumentParser):
    """A usage error is one line too, naming where the usage is (the verbs' parsers are of this class)."""

    def error(self, message: str):
        self.exit(Exit.ERROR, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("crashline")
    except PackageNotFoundError:  # run from a checkout without installing it
        return "unknown (not installed)"


def parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="crashline", description=__doc__, epilog=epilog(), formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--debug", action="store_true", help="on an error, print its traceback too")
    p.add_argument("--version", action="version", version=f"crashline {_version()}")
    sub = p.add_subparsers(dest="verb", required=True)

    def verb(name, fn, help_text, config=True):
        s = sub.add_parser(name, help=help_text)
        if config:
            s.add_argument(
                "--config",
                default=os.environ.get("CRASHLINE_CONFIG", plan.DEFAULT_CONFIG),
                help=f"workflow config (default $CRASHLINE_CONFIG or {plan.DEFAULT_CONFIG})",
            )
        s.set_defaults(fn=fn)
        return s

    s = verb("plan", verbs.cmd_plan, "print the configurations the config expands to, with their ids")
    s.add_argument("--json", action="store_true")
    s = verb("fetch", verbs.cmd_fetch, "fetch and verify one model")
    s.add_argument("--model", required=True)
    s.add_argument("--out")
    s = verb("inspect", verbs.cmd_inspect, "write a model's manifest (layers, experts, bytes per layer)", config=False)
    g = s.add_mutually_exclusive_group(required=True)
    g.add_argument("--fetch-record")
    g.add_argument("--path")
    s.add_argument("--out")
    s = verb("warmup", verbs.cmd_warmup, "read a model into the page cache, recording residency", config=False)
    s.add_argument("--fetch-record", required=True)
    s.add_argument("--out", required=True)
    s = verb("provision", verbs.cmd_provision, "find or build llama-server and record its provenance")
    s.add_argument("--out")
    for name, help_text in (
        ("measure", "measure one model x configuration"),
        ("needle", "needle recall for one model x configuration"),
        ("search", "find the fastest n_cpu_moe that survives with the margin, for one search group (see `plan`)"),
        ("search-needle", "needle recall for a search's winner, and the next fastest until one recalls"),
    ):
        s = verb(name, verbs.server_job, help_text)
        s.add_argument("--model")
        s.add_argument("--id", help="configuration or search group id (see `plan`)")
        s.add_argument("--spec", help="the job's spec as JSON (what the workflow passes) instead of --model/--id")
        for option in ("--fetch", "--manifest", "--server", "--draft", "--search"):
            s.add_argument(option, help="input record (default: the results layout's)")
        s.add_argument(
            "--rival", action="append", help="search: a rival's search.json (default: the layout's, as the group says)"
        )
        s.add_argument(
            "--measured",
            help="needle of a --fit on aimed at the margin: its measure record, whose --fit-target it is checked at "
            "(default: the layout's)",
        )
        if name == "measure":
            s.add_argument(
                "--start", type=int, help="server start K (2, 3, ...) of a configuration whose entry asks for starts"
            )
        s.add_argument("--out")
        s.add_argument("--log")
        s.add_argument("--telemetry")
    s = verb("needle-table", verbs.cmd_needle_table, "needle records into results/tables/needle.parquet")
    s.add_argument("--out")
    s.add_argument("records", nargs="*")
    s = verb("kv-quality", verbs.cmd_kv_quality, "a quantised KV type's KL divergence against f16, for one model")
    s.add_argument("--model", required=True)
    s.add_argument("--kv", required=True, help="the KV type: q8_0 (K and V), or q8_0-q4_0 (K, then V)")
    s.add_argument("--fetch", help="the model's fetch.json (default: the layout's)")
    s.add_argument("--server", help="provenance.json, which names llama-perplexity (default: the layout's)")
    s.add_argument("--out", help="the record (default: the layout's)")
    s = verb("kv-quality-table", verbs.cmd_kv_quality_table, "KV quality records into results/tables/kv_quality.*")
    s.add_argument("--out")
    s.add_argument("records", nargs="*")
    s = verb("aggregate", verbs.cmd_aggregate, "turn records into Parquet tables")
    s.add_argument("--configs")
    s.add_argument("--measurements")
    s.add_argument("--searches")
    s.add_argument("--conversations")
    s.add_argument("records", nargs="*", help="measure.json and search.json files (default: all the config asks for)")
    s = verb("report", verbs.cmd_report, "render results/report.md and results/report.html")
    for option in (
        "--configs",
        "--measurements",
        "--searches",
        "--conversations",
        "--validity",
        "--kv-quality",
        "--needle",
        "--server",
        "--md",
        "--html",
        "--recommendation",
        "--summary",
    ):
        s.add_argument(option, help="path (default: the results layout's)")
    s = verb("validity", verbs.cmd_validity, "run llama-bench beside crashline for the recommended configurations")
    for option in ("--configs", "--measurements", "--needle", "--server", "--out"):
        s.add_argument(option, help="path (default: the results layout's)")
    s = verb(
        "suggest",
        verbs.cmd_suggest,
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
        verbs.cmd_tune,
        "from a model and a card to a verified answer: write the config, run the workflow, print what to use",
        config=False,
    )
    s.add_argument("model", help="a GGUF path, a source (hf:, pypi:, https://, synthetic:) or OWNER/REPO:QUANT")
    s.add_argument("--ctx", type=int, required=True, help="the context size to serve (-c)")
    s.add_argument("--prompt", type=int, required=True, help="the prompt length that must survive, in tokens")
    s.add_argument(
        "--gen",
        type=int,
        help="the reply's length in tokens: the objective is the whole request, prompt and reply (default 512)",
    )
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
    s.add_argument(
        "--max-kld",
        type=float,
        help="the median KL divergence from an f16 KV cache above which the report says a faster quantised type "
        "costs more than you allow (kv_quality.max_kld, default 0.01)",
    )
    s.add_argument(
        "--draft",
        help="a draft model for speculative decoding (a GGUF path or source of a small model with the same "
        "vocabulary): tried beside no draft, each its own search, recommended only where it wins",
    )
    s.add_argument(
        "--spec",
        help="llama.cpp's n-gram speculative decoding to try beside none, e.g. ngram-simple or ngram-mod,ngram-cache "
        "(no second model)",
    )
    s.add_argument(
        "--time",
        help="the time the run may take, e.g. 15m: the searches then climb and start their finalists again only "
        "while a server start still ends within it, and say what they left out (default: no limit)",
    )
    s = verb(
        "recheck",
        verbs.cmd_recheck,
        "measure an earlier run's recommended configurations again on another llama-server build and say what "
        "it changed (survived then / now, speed ratio, peak memory, the first request after /health)",
        config=False,
    )
    s.add_argument("results", help="the earlier run's results folder (its results_dir)")
    s.add_argument("--binary", required=True, help="the other llama-server build to run them on")
    s.add_argument("--out", default="recheck", help="folder for this run's config and results (default ./recheck)")
    s = verb(
        "context",
        verbs.cmd_context,
        "the longest context an earlier run's answer survives: the planner's prediction, then real server starts "
        "that each fill the context with one prompt, bisected, each peak held to the margin",
        config=False,
    )
    s.add_argument("results", help="the earlier run's results folder (its results_dir)")
    s.add_argument(
        "--out", default="context", help="folder for context.json and each start's records (default ./context)"
    )
    s.add_argument("--step", type=int, help="the contexts tried are multiples of this (default 4096)")
    s.add_argument(
        "--host-ram",
        help="without a GPU: the host memory to fit into (e.g. 2GiB; default the run's budget.host_ram_mib, else this "
        "machine's RAM), each start under a memory cgroup of that size",
    )
    s.add_argument("--margin", help="the memory each start's peak must leave (e.g. 256MiB; default the run's margin)")
    s.add_argument(
        "--finalists",
        action="store_true",
        help="also the configurations each answer was chosen among (those tied with it, its searches' finalists): "
        "the longest context of each beside its speed, a bisection of real starts each",
    )
    s = verb(
        "compare",
        verbs.cmd_compare,
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
        verbs.cmd_publish,
        "write each claims file's correction section into a copy of the upstream file, "
        "with the diff; push a branch / open a pull request only if publish.* says so",
    )
    s.add_argument("--claim", help="only this claims file (named by its file's stem)")
    s.add_argument("--out-dir", help="where to write (default RESULTS/publish/NAME)")
    s.add_argument(
        "--dry-run", action="store_true", help="write everything, say exactly what publish.* would send, send nothing"
    )
    s.add_argument("--configs")
    s.add_argument("--measurements")
    s = sub.add_parser("claims", help="published speed tables: `claims import` reads one into a claims file")
    claims_sub = s.add_subparsers(dest="claims_verb", required=True)
    s = claims_sub.add_parser(
        "import",
        help="find the speed tables of a Markdown file (a path, https:// or hf:OWNER/REPO) and write a claims file",
    )
    s.set_defaults(fn=verbs.cmd_claims_import)
    s.add_argument("source", help="a Markdown file, an https:// address or hf:OWNER/REPO (its model card)")
    s.add_argument("--out", default="claims.yaml", help="the claims file to write (default ./claims.yaml)")
    s.add_argument("--model", help="the model's name in your workflow config (models:); without it, fill it in")
    s.add_argument("--table", type=int, help="only the N-th table of the file (from 1; default every speed table)")
    again = "derive telemetry summaries and bottlenecks again from a saved record"
    s = verb("reanalyse", verbs.cmd_reanalyse, again, config=False)
    s.add_argument("record")
    s.add_argument("--manifest", required=True)
    s.add_argument("--telemetry")
    classify = "classify a llama-server log and print its placement as JSON"
    s = verb("parse-log", verbs.cmd_parse_log, classify, config=False)
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
    return Exit.ERROR


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
