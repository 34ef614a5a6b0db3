"""Snakemake `script:` entry of every job: the rule's input, output, params and log become the
arguments of the same `python -m crashline VERB` a user runs without Snakemake.

Each rule is one line below: which verb, and which of its paths go to which option. The server
jobs (measure, search, needle) also get their spec (everything they read besides their inputs)
from params, so the job reads exactly what Snakemake compares to decide a rerun.
"""

import os
import sys

from crashline.core import progress
from crashline.cli.main import main
from crashline.engine import eta

smk = snakemake  # noqa: F821 (given by Snakemake)
SERVER_INPUTS = {
    "fetch": "--fetch",
    "manifest": "--manifest",
    "server": "--server",
    "draft": "--draft",
    "search": "--search",
    "rivals": "--rival",
    "measured": "--measured",
}
SERVER_OUTPUTS = {"record": "--out", "summary": "--out", "server_log": "--log", "telemetry": "--telemetry"}


def options(named, flags: dict) -> list[str]:
    """The flag before each path of the named inputs or outputs it has; a list of paths repeats its flag."""
    pairs = [(flags[name], p) for name, paths in named.items() if name in flags for p in _listed(paths)]
    return [arg for pair in pairs for arg in pair]


def _listed(paths) -> list[str]:
    return [paths] if isinstance(paths, str) else list(paths)


def server_job(s) -> list[str]:
    return ["--spec", s.params.spec, *options(s.input, SERVER_INPUTS), *options(s.output, SERVER_OUTPUTS)]


ARGV = {
    "fetch_model": lambda s: ["fetch", "--model", s.wildcards.model, "--out", s.output[0]],
    "inspect_model": lambda s: ["inspect", "--fetch-record", s.input[0], "--out", s.output[0]],
    "warmup": lambda s: ["warmup", "--fetch-record", s.input[0], "--out", s.output[0]],
    "provision_server": lambda s: ["provision", "--out", s.output[0]],
    "measure": lambda s: ["measure", *server_job(s)],
    "measure_start": lambda s: ["measure", *server_job(s)],
    "search": lambda s: ["search", *server_job(s)],
    "needle": lambda s: ["needle", *server_job(s)],
    "search_needle": lambda s: ["search-needle", *server_job(s)],
    "needle_table": lambda s: ["needle-table", "--out", s.output[0], *s.input],
    "kv_quality": lambda s: [
        "kv-quality",
        "--model",
        s.wildcards.model,
        "--kv",
        s.wildcards.kv,
        "--fetch",
        s.input.fetch,
        "--server",
        s.input.server,
        "--out",
        s.output.record,
    ],
    "kv_quality_table": lambda s: ["kv-quality-table", "--out", s.output[0], *s.input],
    "aggregate": lambda s: [
        "aggregate",
        "--configs",
        s.output.configs,
        "--measurements",
        s.output.measurements,
        "--searches",
        s.output.searches,
        "--conversations",
        s.output.conversations,
        *s.input,
    ],
    "validity": lambda s: [
        "validity",
        "--configs",
        s.input.configs,
        "--measurements",
        s.input.measurements,
        "--needle",
        s.input.needle,
        "--server",
        s.input.server,
        "--out",
        s.output[0],
    ],
    "report": lambda s: [
        "report",
        "--recommendation",
        s.output.recommendation,
        "--summary",
        s.output.summary,
        "--configs",
        s.input.configs,
        "--measurements",
        s.input.measurements,
        "--searches",
        s.input.searches,
        "--conversations",
        s.input.conversations,
        "--validity",
        s.input.validity,
        "--needle",
        s.input.needle,
        "--kv-quality",
        s.input.kv_quality,
        "--server",
        s.input.server,
        "--md",
        s.output.md,
        "--html",
        s.output.html,
    ],
    "publish_claim": lambda s: [
        "publish",
        "--claim",
        s.wildcards.claim,
        "--out-dir",
        s.params.out_dir,
        "--configs",
        s.input.configs,
        "--measurements",
        s.input.measurements,
    ],
}

argv = ARGV[smk.rule](smk)
# Snakemake gave the job its own stderr, the console: keep it for progress lines ("[measure tiny
# 9893f4ee63] ready in 1.4 s") before fd 1 and 2 become the log, which gets every line too.
progress.to_console(os.dup(2), " ".join([argv[0], *map(str, smk.wildcards)]))
if smk.rule in ("measure", "measure_start", "search", "needle", "search_needle"):
    eta.say_left()  # what is left of the whole run, this job included
log = os.open(smk.log[0], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
os.dup2(log, 1)
os.dup2(log, 2)
status = main(argv)
if status == 2:  # a crashline error: its one line (the log's last) on the console too, not only in the log
    with open(smk.log[0], "rb") as f:
        f.seek(max(0, os.fstat(f.fileno()).st_size - 4096))
        said = f.read().decode(errors="replace").strip().splitlines()
    progress.say(said[-1] if said else f"failed (exit status {status})", log=False)
sys.exit(status)
