"""The report's figures of memory over time: one configuration's run from its telemetry with the phases the
sampler marked shaded (``memory-over-time-MODEL-ID``), and a conversation's memory against the history it sent
(``conversation-memory-MODEL``)."""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd
from matplotlib.figure import Figure as MplFigure

from ..core.records import Outcome
from .drawing import (
    Figure,
    PHASE_NAMES,
    PHASE_SHADES,
    SERIES_COLOURS,
    SETTING_COLUMNS,
    finish_figure,
    has_columns,
    settings_label,
    label_columns,
    vram_limit,
    limit_lines,
    new_figure,
    present_columns,
    plain_value,
)

# -- 5. memory over time -------------------------------------------------------------------------


def phases(frame: pd.DataFrame) -> list[tuple[str, float, float]]:
    """The phases of a run from its telemetry, as (phase, start s, end s) from the first sample: each phase
    runs from its first sample to the next phase's first (the sampler marks them as they begin)."""
    if not has_columns(frame, "t", "phase") or len(frame) < 2:
        return []
    t0 = float(frame["t"].iloc[0])
    t = (frame["t"].astype(float) - t0).tolist()
    names = frame["phase"].tolist()
    out, start = [], 0
    for i in range(1, len(names) + 1):
        if i == len(names) or names[i] != names[start]:
            out.append((str(names[start]), t[start], t[i] if i < len(names) else t[i - 1]))
            start = i
    return out


# The width a 7 pt label turned upright takes along the time axis, with room to the next one.
PHASE_LABEL_GAP_IN = 0.16


def _phase_labels(spans: list[tuple[str, float, float]], ax, fig: MplFigure) -> list[tuple[float, str]]:
    """One upright label per phase at its start, where it has room; phases that begin closer to the last label
    than a label is wide share it ("load · warm-up request", "workload chat:turn-1 … chat:turn-5"), so that no
    label lies on another."""
    lo, hi = ax.get_xlim()
    axes_in = fig.get_size_inches()[0] * ax.get_position().width
    gap = PHASE_LABEL_GAP_IN * (hi - lo) / axes_in if axes_in > 0 and hi > lo else 0.0
    groups: list[tuple[float, list[str]]] = []
    for name, start, _end in spans:
        text = PHASE_NAMES.get(name, f"workload {name}")
        if groups and start - groups[-1][0] < gap:
            groups[-1][1].append(text)
        else:
            groups.append((start, [text]))
    out = []
    for start, texts in groups:
        shown = [texts[0], *(t.removeprefix("workload ") for t in texts[1:])]
        out.append((start, " · ".join(shown) if len(shown) <= 3 else f"{shown[0]} … {shown[-1]}"))
    return out


def telemetry_figures(
    model: str, configs: pd.DataFrame, telemetry: Mapping[str, pd.DataFrame], budget: dict
) -> list[Figure]:
    """Memory of each configuration of ``model`` over its server's run, from its telemetry: VRAM and the server's
    RSS, the phases shaded, VRAM against the limit."""
    out = []
    rows = configs[configs["model"] == model] if has_columns(configs, "model", "config_id") else pd.DataFrame()
    for cid in sorted(telemetry or {}):
        frame = telemetry[cid]
        match = rows[rows["config_id"] == cid] if len(rows) else rows
        if match.empty or not has_columns(frame, "t") or len(frame) < 2:
            continue
        lines = [
            (c, text)
            for c, text in (
                ("gpu_mib", "VRAM used by the server"),
                ("server_rss_mib", "RSS of the server and its children"),
            )
            if c in frame and frame[c].notna().any()
        ]
        if not lines:
            continue
        row = match.iloc[0]
        args = plain_value(row.get("server_args")) or "crashline's default settings"
        title = f"Memory of {model} over its run with {args} ({cid}), the phases shaded."
        fig, (ax,) = new_figure(title, height=3.6)
        t = frame["t"].astype(float) - float(frame["t"].iloc[0])
        series = []
        for i, (column, text) in enumerate(lines):
            (line,) = ax.plot(t, frame[column], "-", color=SERIES_COLOURS[i], linewidth=1.3, label=text)
            line.set_gid(f"series-{i}")
            series.append(text)
        if "gpu_mib" in dict(lines):
            limit, limit_is = vram_limit(match, budget)
            if limit is not None:
                limit_lines(ax, limit, limit_is, budget.get("margin_mib"))
        for k, (_name, start, end) in enumerate(phases(frame)):
            ax.axvspan(start, end, color=PHASE_SHADES[k % 2], zorder=0, linewidth=0)
        for start, text in _phase_labels(phases(frame), ax, fig):
            ax.text(
                start,
                0.98,
                f" {text}",
                transform=ax.get_xaxis_transform(),
                rotation=90,
                va="top",
                ha="left",
                fontsize=7,
                color="#555555",
            )
        ax.set_xlabel("time since the first sample (s)")
        ax.set_ylabel("memory (MiB)")
        ax.set_ylim(bottom=0)
        out.append(finish_figure(fig, [ax], f"memory-over-time-{model}-{cid}", title, series, "memory"))
    return out


def conversation_memory_figures(model: str, conversations: pd.DataFrame | None) -> list[Figure]:
    """Peak VRAM (with a GPU) and host RSS of each turn against the history it sent, one series per
    configuration and conversation workload; a conversation that failed ends in a marker at its last turn."""
    if not has_columns(conversations, "model", "turn_rows", "conversation"):
        return []
    rows = conversations[conversations["model"] == model]
    if rows.empty:
        return []
    names = label_columns(rows, present_columns(rows, SETTING_COLUMNS))
    several_talks = rows["conversation"].nunique() > 1
    panels = [("gpu_mib", "peak VRAM (MiB)"), ("rss_mib", "peak host RSS (MiB)")]
    panels = [(k, word) for k, word in panels if any(t[k] is not None for ts in rows["turn_rows"] for t in ts)]
    if not panels:
        return []
    title = (
        f"Memory of {model} as each conversation grows with the prompt cache on: the peak of each turn against "
        "the history it sent (the restart case left out); ✕ marks the turn a conversation failed at."
    )
    fig, axes = new_figure(title, panels=len(panels))
    series = []
    for i, (_, row) in enumerate(rows.iterrows()):
        label = ", ".join(t for t in (settings_label(row, names), row["conversation"] if several_talks else "") if t)
        label = label or row["conversation"]
        colour = SERIES_COLOURS[i % len(SERIES_COLOURS)]
        turns = [t for t in row["turn_rows"] if t["turn"] != "restart"]
        for ax, (key, _word) in zip(axes, panels, strict=True):
            done = [t for t in turns if t["outcome"] == Outcome.OK and t[key] is not None]
            (line,) = ax.plot(
                [t["history_tokens"] for t in done], [t[key] for t in done], "o-", color=colour, label=label
            )
            line.set_gid(f"series-{len(series)}")
            cut = [t for t in turns if t["outcome"] != Outcome.OK and t[key] is not None]
            if cut:
                ax.scatter([t["history_tokens"] for t in cut], [t[key] for t in cut], marker="X", s=64, color=colour)
        series.append(label)
    for ax, (_key, word) in zip(axes, panels, strict=True):
        ax.set_ylabel(word)
        ax.set_ylim(bottom=0)
    axes[-1].set_xlabel("history sent (tokens)")
    return [finish_figure(fig, axes, f"conversation-memory-{model}", title, series, "conversation")]
