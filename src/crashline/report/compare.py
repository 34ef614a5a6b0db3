"""``crashline compare``: finished runs side by side, one page (compare.md, compare.html, compare.json and one
figure per model across the runs), from each run's recommendation.json and measurements table."""

from __future__ import annotations

from pathlib import Path

import matplotlib
import pandas as pd

from ..core import columns as cols
from ..core.atomic import atomic_path, read_json, write_json
from ..core.owned import outside_inputs, own_folder
from ..core.paths import Layout
from ..core.records import Outcome
from ..core.thresholds import inconclusive
from ..config.plan import ConfigError
from ..tables import compare as compare_mod
from ..tables.compare import Run
from . import html, markdown
from . import drawing as D
from . import figures as F
from .compact import distinguishing
from .doc import Code, Document, Figure, Para, Section, Strong, Table

FIGURES = "figures"


def _folder(given: str) -> Path:
    """The results folder of ``[NAME=]RESULTS``."""
    name, sep, path = given.partition("=")
    return Path(path if sep else given).expanduser()


def read_run(given: str) -> Run:
    """A run from ``[NAME=]RESULTS``: the results folder of a finished run (its report was made)."""
    name, sep, _ = given.partition("=")
    folder = _folder(given)
    layout = Layout(folder.resolve())
    for needed, what in ((layout.recommendation(), "its recommendation"), (layout.measurements_table(), "its tables")):
        if not needed.is_file():
            raise ConfigError(
                f"{given}: not the results folder of a finished crashline run ({what}, {needed}, is missing); "
                "give the results_dir of a run whose report was made"
            )
    return Run(
        name if sep else str(folder), read_json(layout.recommendation()), pd.read_parquet(layout.measurements_table())
    )


def _figure(model: str, rows: list[dict], runs: dict[str, Run]) -> D.Figure | None:
    """Decode and prefill of each run's answer against prompt length, one series per run."""
    drawn = []
    for row in rows:
        run = runs[row["run"]]
        answer = next(a for a in run.answers if a["model"] == model and a.get("environment") == row["environment"])
        data = compare_mod.winner_rows(run, answer)
        data = data[(data["concurrency"].fillna(1) == 1) & (data["workload_outcome"] == Outcome.OK)]
        data = data.sort_values(["prompt_tokens", "gen_tokens"]).drop_duplicates("prompt_tokens", keep="last")
        if len(data):
            drawn.append((row, data))
    if len(drawn) < 2:
        return None
    title = (
        f"Decode and prefill speed of each run's answer for {model} against prompt length, one request at a time: "
        "median of every request, bars from min to max."
    )
    panels = D.SPEEDS
    fig, axes = D.new_figure(title, len(panels))
    series = []
    for i, (row, data) in enumerate(drawn):
        label = row["run"] + (" (reference)" if row["verdict"] == "reference" else "")
        for ax, (metric, _word) in zip(axes, panels, strict=True):
            part = data[data[cols.stat(metric, "median")].notna()]
            if part.empty:
                continue
            med, lo, hi = D.error_bars(part, metric)
            colour = D.SERIES_COLOURS[i % len(D.SERIES_COLOURS)]
            bars = ax.errorbar(
                part["prompt_tokens"], med, yerr=[lo, hi], fmt="o-", capsize=3, color=colour, label=label
            )
            bars.lines[0].set_gid(f"series-{i}-{metric}")
        series.append(label)
    D.prompt_length_axes(axes, panels, [v for _, data in drawn for v in data["prompt_tokens"]])
    return D.finish_figure(fig, axes, f"compare-{model}", title, series, "compare")


def _num(value, digits: int = 1) -> str:
    return "–" if value is None else f"{value:,.{digits}f}"


def _metric(rows: list[dict]) -> str:
    label = next((r["metric_label"] for r in rows if r["metric_label"]), None)
    return f"{label} t/s" if label else rows[0]["metric"]


def _machine(environment: str | None) -> str:
    """A machine key ("CPU|GPU|driver|budget") as words."""
    return ", ".join(p for p in (environment or "").split("|") if p and p != "-") or "–"


def _table(rows: list[dict]) -> Table:
    """One row per run: the answer's settings that differ from the other runs' answers, and its figures."""
    header = ["run", "machine", "llama-server", "answer: settings that differ", _metric(rows), "× reference"]
    header += ["verdict", "prefill t/s", "decode t/s", "first token s", "peak VRAM MiB", "headroom MiB"]
    answers = [r["server_args"] for r in rows if r["server_args"]]
    body = []
    for r in rows:
        if r["server_args"]:
            differ = distinguishing(r["server_args"], answers)
            use = Code(differ) if differ else "the same settings as the others"
        else:
            use = r["why_none"] or "no recommendation"
        body.append(
            [
                r["run"],
                _machine(r["environment"]),
                r["build"] or "–",
                use,
                _num(r["median"]),
                "–" if r["ratio"] is None else f"{r['ratio']:.2f}",
                r["verdict"] or "–",
                _num(r["prefill_tps"]),
                _num(r["decode_tps"]),
                _num(r["ttft_s"], 2),
                _num(r["peak_gpu_mib"], 0),
                _num(r["headroom_mib"], 0),
            ]
        )
    return Table(header, body, numeric=frozenset({4, 5, 7, 8, 9, 10, 11}))


def _headline(rows: list[dict]) -> str:
    """Per model, what the other runs did against the reference, in one sentence."""
    reference = next((r for r in rows if r["verdict"] == "reference"), None)
    if reference is None:
        return "No run recommended a configuration, so no speeds are compared."
    others = [r for r in rows if r is not reference]
    if not others:
        speed = f"{_num(reference['median'])} {_metric(rows)}"
        return f"Only {reference['run']} measured this model ({speed}): nothing to compare."
    said = [
        f"{r['run']} is {r['verdict']} ({r['ratio']:.2f}×)" if r["ratio"] is not None else f"{r['run']}: no answer"
        for r in others
    ]
    if doubt := inconclusive([reference, *others]):
        said.append(doubt)
    return f"Against {reference['run']} ({_num(reference['median'])} {_metric(rows)}): " + "; ".join(said) + "."


def document(rows: list[dict], drawn: dict[str, D.Figure]) -> Document:
    names = list(dict.fromkeys(r["run"] for r in rows))
    blocks = [
        Para(
            [
                "Each run's answer at its objective (",
                rows[0]["objective"],
                f"), with the settings it was measured with; the first run with an answer for a model ({names[0]} "
                "where it has one) is the reference. Tied: the two ranges overlap (the medians of the server starts "
                "where a run has several, else every request), as crashline's search judges noise; cannot tell: a "
                "side measured it once.",
            ]
        )
    ]
    for model in dict.fromkeys(r["model"] for r in rows):
        mine = [r for r in rows if r["model"] == model]
        inside = [Para(Strong(_headline(mine))), _table(mine)]
        if model in drawn:
            f = drawn[model]
            inside.append(Figure(f.title, f.svg, f"{FIGURES}/{f.file}", f.series))
        blocks.append(Section(model, inside, level=2, anchor=f"compare-{model}"))
    return Document(f"crashline compare: {', '.join(names)}", blocks)


def _jsonable(row: dict) -> dict:
    spread = row["spread"]
    return {**row, "spread": None if spread is None else {"low": spread.low, "high": spread.high, "of": spread.what}}


def compare(given: list[str], out: Path) -> tuple[Path, list[dict]]:
    """Write the comparison of the runs ``given`` into ``out``; (the Markdown page, its rows)."""
    runs = [read_run(g) for g in given]
    names = [r.name for r in runs]
    if len(runs) < 2:
        raise ConfigError("compare needs at least two results folders (RESULTS or NAME=RESULTS)")
    if len(set(names)) < len(names):
        raise ConfigError(f"two runs are named alike ({', '.join(names)}): name them, as NAME=RESULTS")
    outside_inputs(out, "--out", [_folder(g) for g in given])  # never an input's figures overwritten or deleted
    own_folder(out, "--out", create=False)  # refused before anything is drawn
    rows = compare_mod.compare(runs)
    by_name = {r.name: r for r in runs}
    drawn = {}
    with matplotlib.rc_context(D.RC):  # drawn as the report's figures are, nothing leaking into other plots
        for model in dict.fromkeys(r["model"] for r in rows):
            fig = _figure(model, [r for r in rows if r["model"] == model], by_name)
            if fig is not None:
                drawn[model] = fig
    doc = document(rows, drawn)
    pages = {"compare.md": markdown.page(doc), "compare.html": html.page(doc)}
    table = [_jsonable(r) for r in rows]  # everything made before anything is written
    own_folder(out, "--out")
    F.write({m: [f] for m, f in drawn.items()}, out / FIGURES)
    for name, text in pages.items():
        with atomic_path(out / name) as tmp:
            tmp.write_text(text)
    write_json(out / "compare.json", table)
    return out / "compare.md", rows


def short(rows: list[dict]) -> str:
    """What ``compare`` prints: per model its headline and table, in Markdown (as llama-bench's ``-o md``)."""
    parts = []
    for model in dict.fromkeys(r["model"] for r in rows):
        mine = [r for r in rows if r["model"] == model]
        parts += [f"## {model}", "", _headline(mine), "", markdown.block(_table(mine)), ""]
    return "\n".join(parts)
