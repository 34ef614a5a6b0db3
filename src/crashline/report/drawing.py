"""What every figure of the report is drawn with: matplotlib set for SVG whose text stays text and whose bytes
depend only on the tables (``RC``), the colours and markers, the ``Figure`` a report embeds, the values and labels
of the series (each named by the settings that tell it apart), and the figure's frame, legend and SVG.
The figures themselves: ``report.figures`` and ``report.memory_figures``."""

from __future__ import annotations

import io
import re
import textwrap
from collections.abc import Iterable
from dataclasses import dataclass, field

import pandas as pd
from matplotlib.backends.backend_agg import RendererAgg
from matplotlib.backends.backend_svg import FigureCanvasSVG
from matplotlib.figure import Figure as MplFigure
from matplotlib.text import Annotation
from matplotlib.ticker import FuncFormatter

from ..core import columns as cols
from ..core.settings import SETTINGS, server_args
from ..core.thresholds import missing

N_CPU_MOE = cols.setting("n_cpu_moe")
SETTING_COLUMNS = tuple(cols.setting(name) for name in SETTINGS)
MAX_DEPTH_CONFIGS = 6  # curves in the speed-against-prompt-length figure

SERIES_COLOURS = ("#3b6ea8", "#5b9a68", "#8a6bb0", "#b08850", "#4a9fb5", "#6f6f6f", "#b5a03a", "#2f4b7c")
FAILURE_COLOURS = ("#c0392b", "#e06a2c", "#8e1b10", "#d64c6a", "#a0522d", "#f08a5d")
FAILURE_MARKERS = ("X", "v", "s", "D", "^", "P", "*", "<", ">", "h")
LIMIT_COLOUR, MARGIN_COLOUR = "#222222", "#777777"
PHASE_SHADES = ("#eef1f5", "#f8f8f8")

RC = {
    "svg.fonttype": "none",  # text as <text>: no glyphs embedded, no font fetched; the browser's sans-serif
    "svg.hashsalt": "crashline",  # clip-path and marker ids from their content, not from random numbers
    "font.family": "sans-serif",
    "font.size": 9,
    "axes.titlesize": 9,
    "axes.labelsize": 9,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.edgecolor": "#888888",
    "axes.grid": True,
    "grid.color": "#e4e4e4",
    "grid.linewidth": 0.6,
    "xtick.color": "#444444",
    "ytick.color": "#444444",
    "legend.frameon": False,
    "legend.fontsize": 8,
    "lines.linewidth": 1.4,
    "lines.markersize": 5,
}
NO_METADATA = {"Creator": None, "Date": None, "Format": None, "Type": None}  # no date: the same input, the same bytes
PHASE_NAMES = {"load": "load", "prepare": "warm-up request", "stop": "stop"}


@dataclass
class Figure:
    """One figure of the report."""

    name: str  # file stem, unique within a report: "vram-vs-n-cpu-moe-MODEL"
    title: str  # a sentence saying what it shows (the caption; the SVG's <title> and its heading too)
    svg: str  # the whole <svg> element, no XML declaration or doctype: ready to inline in HTML
    series: list[str] = field(default_factory=list)  # labels of the plotted data series, in legend order
    kind: str = ""  # vram | speed | depth | concurrency | memory | conversation

    @property
    def file(self) -> str:
        return f"{self.name}.svg"


# -- values and labels ---------------------------------------------------------------------------


def plain_value(value):
    """A table value as plain Python: None for a missing one, an int for a whole float (NaN-padded ints)."""
    if missing(value):
        return None
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _mib(value) -> str:
    return f"{value:,.0f} MiB"


def setting_text(name: str, value) -> str:
    """One setting as llama-server would be given it (``-ub 512``, ``-kvu``), or in words where it has no flag."""
    value = plain_value(value)
    if name == "page_cache":
        return f"{value} page cache" if value else "page cache unknown"
    if name == "extra_args":
        return f"extra arguments {value}" if value else "no extra arguments"
    if value is None:
        flag = SETTINGS[name].flag
        return f"no {flag}" if flag else f"{name.replace('_', ' ')}: llama.cpp's default"
    return " ".join(server_args({name: value})) or f"{name.replace('_', ' ')} {value}"


def present_columns(frame: pd.DataFrame, names: Iterable[str]) -> list[str]:
    """The columns of ``names`` that ``frame`` has, in that order."""
    return [c for c in names if c in frame.columns]


def varying_columns(rows: pd.DataFrame, names: Iterable[str]) -> list[str]:
    """The setting columns whose values differ between the rows (a missing value counts as one value)."""
    return [c for c in names if len({plain_value(v) for v in rows[c]}) > 1]


def not_default_columns(rows: pd.DataFrame, names: Iterable[str]) -> list[str]:
    """The setting columns where some row differs from crashline's default."""
    out = []
    for c in names:
        default = SETTINGS[c.removeprefix(cols.SETTING_PREFIX)].default
        default = " ".join(default) if isinstance(default, (list, tuple)) else default
        given = [v for v in map(plain_value, rows[c]) if v not in (None, "")]  # unset: not a difference
        if any(v != default for v in given):
            out.append(c)
    return out


def settings_label(row, names: list[str]) -> str:
    """A row named by its settings ``names`` as llama-server flags, or "crashline's default settings" without any."""
    if not names:
        return "crashline's default settings"
    return ", ".join(setting_text(c.removeprefix(cols.SETTING_PREFIX), row[c]) for c in names)


def label_columns(rows: pd.DataFrame, names: list[str]) -> list[str]:
    """What tells the rows apart: the settings that vary, or (all alike) those that are not crashline's defaults."""
    return varying_columns(rows, names) or not_default_columns(rows, names)


def _order(value) -> tuple:
    """A sort key for values of mixed kinds: numbers by size, then texts, then missing."""
    value = plain_value(value)
    if value is None:
        return (2, "")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (0, value)
    return (1, str(value))


def grouped_rows(rows: pd.DataFrame, names: list[str]) -> list[tuple[tuple, pd.DataFrame]]:
    """The rows grouped by the values of ``names`` (missing values alike), in a stable order."""
    if not names:
        return [((), rows)] if len(rows) else []
    keys = rows[names].apply(lambda r: tuple(plain_value(v) for v in r), axis=1)
    groups: dict[tuple, list] = {}
    for index, key in zip(rows.index, keys, strict=True):
        groups.setdefault(key, []).append(index)
    ordered = sorted(groups, key=lambda k: tuple(_order(v) for v in k))
    return [(key, rows.loc[groups[key]]) for key in ordered]


def failure_text(row) -> str:
    """How a configuration failed, in the report's words: "oom at warmup", "load_failed (weights) at load"."""
    outcome, failure, phase = (plain_value(row.get(c)) for c in ("outcome", "failure", "phase"))
    kind = f"{outcome} ({failure})" if failure and failure != outcome else str(outcome)
    return f"{kind} at {phase}" if phase else kind


def by_environment(rows: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """The rows of each environment (machine and budget), in a stable order; all as one without the column."""
    if "environment" not in rows or rows.empty:
        return [("", rows)]
    return [(str(env), part) for env, part in rows.groupby(rows["environment"].fillna(""), sort=True)]


def env_text(rows: pd.DataFrame) -> str:
    """A short name of a machine: its GPU and the budget it ran under."""
    gpu = plain_value(rows["gpu"].iloc[0]) if "gpu" in rows else None
    budget = plain_value(rows["vram_budget_mib"].iloc[0]) if "vram_budget_mib" in rows else None
    return f"{gpu or 'unknown GPU'}" + (f", budget {_mib(budget)}" if budget else "")


def with_environment(rows: pd.DataFrame, names: list[str]) -> tuple[list[str], bool]:
    """Rows of several machines (or budgets) are never one series: the environment joins the key."""
    several = "environment" in rows and rows["environment"].nunique(dropna=False) > 1
    return (["environment", *names] if several else names), several


def series_label(rows: pd.DataFrame, names: list[str], several_envs: bool) -> str:
    """The legend label of a series: its settings, and its machine where the figure holds several."""
    settings = [c for c in names if c != "environment"]
    text = settings_label(rows.iloc[0], settings)
    return f"{text} ({env_text(rows)})" if several_envs else text


# -- drawing -------------------------------------------------------------------------------------


def new_figure(title: str, panels: int = 1, height: float = 3.8) -> tuple[MplFigure, list]:
    """A new figure of ``panels`` panels stacked on one x axis, its title wrapped above them."""
    fig = MplFigure(figsize=(7.6, height + 1.9 * (panels - 1)), layout="constrained")
    FigureCanvasSVG(fig)
    axes = fig.subplots(panels, 1, sharex=True, squeeze=False)[:, 0].tolist()
    fig.suptitle("\n".join(textwrap.wrap(title, 105)), x=0.01, ha="left", fontsize=9.5)
    for ax in axes:
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:,.0f}" if abs(v) >= 10 else f"{v:g}"))
    return fig, axes


def _legend(fig: MplFigure, axes: list) -> None:
    handles, labels = [], []
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            if label not in labels:
                handles.append(handle)
                labels.append(label)
    if handles:
        ncols = 2 if len(labels) > 3 else 1
        # A label as long as the settings that tell its series apart is wrapped to its column (8 pt: about 56
        # characters in one of two columns of the 7.6 in figure), never cut at the figure's edge.
        width = 56 if ncols == 2 else 110
        wrapped = ["\n".join(textwrap.wrap(label, width, break_on_hyphens=False)) or label for label in labels]
        fig.legend(handles, wrapped, loc="outside lower center", ncols=ncols)


_ID = re.compile(r'(\bid="|href="#|url\(#)([^")]+)')


def _svg(fig: MplFigure, name: str, title: str) -> str:
    """The figure as an <svg> element: every id prefixed with the figure's name, a <title> for readers."""
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata=NO_METADATA)
    text = buf.getvalue()
    text = text[text.index("<svg") :]
    prefix = re.sub(r"[^A-Za-z0-9_-]", "_", name)
    text = _ID.sub(lambda m: f"{m.group(1)}{prefix}-{m.group(2)}", text)
    head = text.index(">") + 1
    caption = title.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return f"{text[:head]}\n <title>{caption}</title>{text[head:]}".rstrip() + "\n"


def _apart(fig: MplFigure, axes: list) -> None:
    """No two labels of points (annotations) on each other: each in turn, from the highest point down, keeps its
    place if it is free, else moves one line up or down, then two, ... to the first free place (a thin line joins
    a moved label to its point). Two configurations on the front of a trade-off figure can sit on one spot."""
    labels = sorted(
        (t for ax in axes for t in ax.texts if isinstance(t, Annotation)),
        key=lambda t: -t.axes.transData.transform(t.xy)[1],
    )
    if len(labels) < 2:
        return
    renderer = RendererAgg(*fig.bbox.size, fig.dpi)
    fig.draw(renderer)  # the layout, as the SVG will have it
    placed = []
    for label in labels:
        x, y = label.xyann
        box = label.get_window_extent(renderer)
        line = (box.height + 2) * 72 / fig.dpi  # one label's height, in the offset's points
        for step in (0, 1, -1, 2, -2, 3, -3, 4, -4, 5, -5, 6, -6):
            label.xyann = (x, y + step * line)
            box = label.get_window_extent(renderer)
            if not any(box.overlaps(other) for other in placed):
                break
        if step:  # drawn again with a line to its point (an annotation takes its line when it is made)
            ax = label.axes
            label.remove()
            label = ax.annotate(
                label.get_text(),
                label.xy,
                xytext=label.xyann,
                textcoords=label.anncoords,
                fontsize=label.get_fontsize(),
                color=label.get_color(),
                arrowprops={"arrowstyle": "-", "color": "#999999", "linewidth": 0.5, "shrinkA": 0, "shrinkB": 3},
            )
            box = label.get_window_extent(renderer)
        placed.append(box.padded(1))


def finish_figure(fig: MplFigure, axes: list, name: str, title: str, series: list[str], kind: str) -> Figure:
    """The report's ``Figure`` of a drawn figure: its legend added, its point labels apart, rendered to SVG."""
    _legend(fig, axes)
    _apart(fig, axes)
    return Figure(name=name, title=title, svg=_svg(fig, name, title), series=series, kind=kind)


def error_bars(rows: pd.DataFrame, metric: str) -> tuple[list, list, list]:
    """Medians and the distances to min and max (none where min or max is missing)."""
    med = [float(v) for v in rows[cols.stat(metric, "median")]]
    lo = [m - v if not missing(v) else 0.0 for m, v in zip(med, rows[cols.stat(metric, "min")], strict=True)]
    hi = [v - m if not missing(v) else 0.0 for m, v in zip(med, rows[cols.stat(metric, "max")], strict=True)]
    return med, [max(0.0, d) for d in lo], [max(0.0, d) for d in hi]


SPEEDS = (("decode_tps", "decode"), ("prefill_tps", "prefill"))


def speed_panels(rows: pd.DataFrame) -> list[tuple[str, str]]:
    """(metric, word) of each speed (decode, prefill) that some row has a median of: one panel each."""
    return [(m, word) for m, word in SPEEDS if rows[cols.stat(m, "median")].notna().any()]


def has_columns(frame: pd.DataFrame | None, *names: str) -> bool:
    """Whether ``frame`` is given, has rows, and has every column of ``names``."""
    return frame is not None and not frame.empty and all(n in frame.columns for n in names)


def vram_limit(rows: pd.DataFrame, budget: dict) -> tuple[float | None, str]:
    """The VRAM limit the rows ran under, and what it is: the budget, else the card's total memory."""
    limits = rows["vram_limit_mib"].dropna() if "vram_limit_mib" in rows else pd.Series(dtype=float)
    budgets = rows["vram_budget_mib"].dropna() if "vram_budget_mib" in rows else pd.Series(dtype=float)
    if budget.get("vram_budget_mib") and (budgets.empty or (budgets == budget["vram_budget_mib"]).all()):
        return float(budget["vram_budget_mib"]), "VRAM budget"
    if limits.empty:
        return None, "VRAM budget"
    kinds = set(rows["vram_limit_is"].dropna()) if "vram_limit_is" in rows else set()  # "budget" or "card"
    card = kinds == {"card"} if kinds else budgets.empty
    return float(limits.max()), "card's memory" if card else "VRAM budget"


def limit_lines(ax, limit: float, limit_is: str, margin) -> None:
    """The limit, and the limit less the margin, as labelled horizontal lines (ids ``limit``, ``margin``)."""
    line = ax.axhline(limit, color=LIMIT_COLOUR, linewidth=1.0, label=f"{limit_is} ({_mib(limit)})")
    line.set_gid("limit")
    if margin:
        label = f"{limit_is} − margin ({_mib(limit - margin)}; margin {_mib(margin)})"
        line = ax.axhline(limit - margin, color=MARGIN_COLOUR, linestyle="--", linewidth=1.0, label=label)
        line.set_gid("margin")


def prompt_length_axes(axes: list, panels, prompt_tokens) -> None:
    """Speed panels against prompt length: each panel's speed per request from 0, the prompt lengths as ticks
    (on a log scale where they span 8x or more)."""
    for ax, (_metric, word) in zip(axes, panels, strict=True):
        ax.set_ylabel(f"{word} (tokens/s per request)")
        ax.set_ylim(bottom=0)
    ticks = sorted({int(v) for v in prompt_tokens})
    if ticks[-1] >= 8 * ticks[0]:
        axes[-1].set_xscale("log", base=2)
    axes[-1].set_xticks(ticks, [f"{t:,}" for t in ticks])
    axes[-1].minorticks_off()
    axes[-1].set_xlabel("prompt length (tokens)")
