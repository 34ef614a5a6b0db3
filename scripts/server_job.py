"""Snakemake `script:` entry of the measure, needle and search jobs.

The job's spec comes from the rule's params, every path from its input, output and log; the same
verb as `python -m crashline measure|needle|search` runs it, with the same errors and signals.
"""

import os
import sys

from crashline.cli import main

smk = snakemake  # noqa: F821 (given by Snakemake)
log = os.open(smk.log[0], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
os.dup2(log, 1)
os.dup2(log, 2)

FLAGS = {"fetch": "--fetch", "manifest": "--manifest", "server": "--server", "draft": "--draft"}
OUTPUTS = {"record": "--out", "summary": "--out", "server_log": "--log", "telemetry": "--telemetry"}
argv = [smk.rule, "--spec", smk.params.spec]
argv += [arg for name, path in smk.input.items() if name in FLAGS for arg in (FLAGS[name], path)]
argv += [arg for name, path in smk.output.items() for arg in (OUTPUTS[name], path)]
sys.exit(main(argv))
