"""``crashline context RESULTS``: the longest context a finished run's answer survives, found by the planner's
prediction and real server starts that each fill the context with one prompt (``jobs.context.context``); one line
per answer, and ``OUT/context.json`` with every start."""

from __future__ import annotations

from pathlib import Path

from ..core.owned import outside_inputs, own_folder
from ..engine.suggest_inputs import parse_size_mib
from .exits import Said


def context_of(
    results: str | Path,
    out: str | Path,
    step: int | None,
    host_ram: str | None,
    margin: str | None,
    with_finalists: bool = False,
) -> Said:
    from ..jobs.context import context

    outside_inputs(out, "--out", [results])  # its records would land in the run's own
    folder = own_folder(out, "--out")
    host_ram_mib = parse_size_mib(host_ram, "--host-ram") if host_ram else None
    margin_mib = parse_size_mib(margin, "--margin", minimum=0) if margin else None
    found = context(Path(results), folder, step, host_ram_mib, margin_mib, with_finalists)
    return Said([*(f["line"] for f in found), f"written: {folder / 'context.json'}"])
