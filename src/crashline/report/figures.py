"""The report's figures, drawn from the tables with matplotlib as SVG, one string each for the HTML
(inline, needing no network) and one file each beside the Markdown report.

Per model, each figure only where the data gives it a meaning (otherwise it is left out, never drawn
empty):

1. ``vram-vs-n-cpu-moe-MODEL``: peak VRAM against ``--n-cpu-moe``, one series per combination of the
   other settings, the limit (budget, or the card) and the limit less the margin as lines, and each
   failure marked where it failed (its peak; at the limit line when no peak was sampled). The crash
   line as a picture. Needs GPU rows and two or more ``--n-cpu-moe`` values.
2. ``speed-vs-n-cpu-moe-MODEL``: decode and prefill t/s per request (median, bars from min to max)
   against ``--n-cpu-moe`` at the objective workload, one curve per combination of the other settings.
   Needs two or more ``--n-cpu-moe`` values that survived that workload.
3. ``speed-vs-prompt-length-MODEL``: decode and prefill against the prompt length of the workloads run
   one request at a time, per configuration: the recommended ones first, then the fastest at the
   objective workload, at most ``MAX_DEPTH_CONFIGS``. Needs two or more prompt lengths.
4. ``per-request-vs-total-throughput-MODEL``: decode per request against the aggregate generated
   throughput of the workloads that send several requests at once (and of the runs of the same prompt
   and generation lengths at one at a time), each point named by its requests at once and ``-np``;
   a dashed line joins a series' best trade-offs (no other point is faster on both axes)
   where it has two or more.
5. ``memory-over-time-MODEL-ID`` (``memory_figures``, with the conversations' memory): VRAM and RSS
   of one configuration's run from its
   ``telemetry.parquet`` (``read_telemetry``), the phases the sampler marked shaded: load (llama.cpp's
   own warm-up runs inside it), the untimed warm-up request (``prepare``), each workload, stop.

What they are drawn with (``drawing``): text stays text
(``svg.fonttype`` "none"): labels are searchable and selectable, and the reader's own
sans-serif draws them; no font is embedded and none is fetched. Ids are salted (``svg.hashsalt``) and
prefixed with the figure's name, so the same tables give the same bytes and several figures inline in
one page never share an id.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

import matplotlib
import pandas as pd
from matplotlib.ticker import MaxNLocator

from ..core import columns as cols
from ..core.atomic import atomic_path
from ..core.paths import Layout
from ..core.records import Outcome
from .drawing import (
    prompt_length_axes,
    FAILURE_COLOURS,
    FAILURE_MARKERS,
    Figure,
    MAX_DEPTH_CONFIGS,
    N_CPU_MOE,
    RC,
    SERIES_COLOURS,
    SETTING_COLUMNS,
    env_text,
    by_environment,
    error_bars,
    failure_text,
    finish_figure,
    grouped_rows,
    has_columns,
    settings_label,
    label_columns,
    vram_limit,
    limit_lines,
    new_figure,
    not_default_columns,
    present_columns,
    series_label,
    setting_text,
    speed_panels,
    plain_value,
    varying_columns,
    with_environment,
)
from .memory_figures import conversation_memory_figures, telemetry_figures

# -- 1. peak VRAM against --n-cpu-moe ------------------------------------------------------------


def _predictions(searches: pd.DataFrame | None, model: str, names: list[str], lo: int, hi: int) -> list[tuple]:
    """The planner's predicted VRAM per n_cpu_moe of each search of the model, within [lo, hi]."""
    if not has_columns(searches, "model", "value_rows"):
        return []
    out = []
    for _, row in searches[searches["model"] == model].iterrows():
        points = sorted(
            (int(v["n_cpu_moe"]), float(v["predicted_mib"]))
            for v in row["value_rows"]
            if v["predicted_mib"] is not None and lo <= v["n_cpu_moe"] <= hi
        )
        key = tuple(plain_value(row[c]) if c in row else None for c in names)
        if len(points) > 1:
            out.append((key, points))
    return out


def per_gpu(rows: pd.DataFrame) -> pd.DataFrame:
    """Rows whose configuration spans several GPUs drawn as each GPU is limited: the fullest GPU's peak against one
    GPU's limit (the budget, or the card), not the sum against one GPU's line."""
    if "peak_gpus_mib" not in rows:
        return rows
    rows = rows.copy()
    for i, each in rows["peak_gpus_mib"].items():
        if each is not None and not isinstance(each, float) and len(each) > 1:
            rows.at[i, "peak_gpu_mib"] = float(max(each))
            if "vram_limit_mib" in rows and pd.notna(rows.at[i, "vram_limit_mib"]):
                rows.at[i, "vram_limit_mib"] = rows.at[i, "vram_limit_mib"] / len(each)
    return rows


def _vram(model: str, configs: pd.DataFrame, searches: pd.DataFrame | None, budget: dict) -> list[Figure]:
    if not has_columns(configs, N_CPU_MOE, "peak_gpu_mib", "gpu", "outcome"):
        return []
    rows = configs[(configs["model"] == model) & configs[N_CPU_MOE].notna() & (configs["gpu"] != "no GPU")]
    envs = [(env, per_gpu(part)) for env, part in by_environment(rows) if part[N_CPU_MOE].nunique() > 1]
    out = []
    for i, (_env, part) in enumerate(envs):
        suffix = f"-{i + 1}" if len(envs) > 1 else ""
        out.append(_vram_one(model, part, searches if len(envs) == 1 else None, budget, suffix))
    return [f for f in out if f is not None]


def _vram_one(model: str, rows: pd.DataFrame, searches, budget: dict, suffix: str) -> Figure | None:
    limit, limit_is = vram_limit(rows, budget)
    margin = budget.get("margin_mib")
    others = [c for c in present_columns(rows, SETTING_COLUMNS) if c != N_CPU_MOE]
    names = varying_columns(rows, others)
    label_names = names or not_default_columns(rows, others)
    groups = grouped_rows(rows, names)
    several = len(groups) > 1
    where = f" on {env_text(rows)}" if suffix else ""
    title = (
        f"Peak VRAM of {model} against --n-cpu-moe{where}, one series per combination of the other settings, "
        f"with the {limit_is} and the margin below it; each failure is marked where it failed."
    )
    fig, (ax,) = new_figure(title)
    series, drawn = [], 0
    kinds: dict[str, int] = {}  # failure kind and phase -> its marker
    failed: dict[str, list[tuple]] = {}  # legend entry -> (x, y, kind, series index)
    for i, (_key, group) in enumerate(groups):
        label = settings_label(group.iloc[0], label_names)
        ok = group[(group["outcome"] == Outcome.OK) & group["peak_gpu_mib"].notna()].sort_values(N_CPU_MOE)
        if len(ok):
            colour = SERIES_COLOURS[i % len(SERIES_COLOURS)]
            (line,) = ax.plot(ok[N_CPU_MOE], ok["peak_gpu_mib"], "o-", color=colour, label=label)
            line.set_gid(f"series-{len(series)}")
            series.append(label)
            drawn += len(ok)
        for _, row in group[group["outcome"] != Outcome.OK].iterrows():
            peak = plain_value(row["peak_gpu_mib"])
            y = peak if peak is not None else limit  # no peak sampled: on the limit line
            if y is None:
                continue
            kind = failure_text(row)
            kinds.setdefault(kind, len(kinds))
            failed.setdefault(f"{kind} ({label})" if several else kind, []).append(
                (plain_value(row[N_CPU_MOE]), y, kind, i)
            )
    for entry, points in failed.items():
        kind, group_index = points[0][2], points[0][3]
        artist = ax.scatter(
            [p[0] for p in points],
            [p[1] for p in points],
            marker=FAILURE_MARKERS[kinds[kind] % len(FAILURE_MARKERS)],
            s=64,
            color=FAILURE_COLOURS[(kinds[kind] + group_index) % len(FAILURE_COLOURS)],
            edgecolors="#3a0a05",
            linewidths=0.6,
            zorder=3,
            label=entry,
        )
        artist.set_gid(f"series-{len(series)}")
        series.append(entry)
        drawn += len(points)
    if drawn < 2:
        return None
    span = (int(rows[N_CPU_MOE].min()), int(rows[N_CPU_MOE].max()))
    for key, points in _predictions(searches, model, names, *span):
        match = next((i for i, (k, _g) in enumerate(groups) if k == key), None)
        colour = SERIES_COLOURS[match % len(SERIES_COLOURS)] if match is not None else "#999999"
        whose = f" ({settings_label(groups[match][1].iloc[0], names)})" if several and match is not None else ""
        label = f"planner's prediction{whose}"
        (line,) = ax.plot(*zip(*points, strict=True), ":", color=colour, linewidth=1.1, label=label)
        line.set_gid(f"series-{len(series)}")
        series.append(label)
    if limit is not None:
        limit_lines(ax, limit, limit_is, margin)
    ax.set_xlabel("--n-cpu-moe (layers whose experts stay on the CPU)")
    ax.set_ylabel("peak VRAM of the server (MiB)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    return finish_figure(fig, [ax], f"vram-vs-n-cpu-moe-{model}{suffix}", title, series, "vram")


# -- 2. speed against --n-cpu-moe at the objective workload -------------------------------------


def _speed(model: str, measurements: pd.DataFrame, workload: str) -> list[Figure]:
    if not has_columns(measurements, N_CPU_MOE, "workload", "workload_outcome", "decode_tps_median"):
        return []
    rows = measurements[
        (measurements["model"] == model)
        & (measurements["workload"] == workload)
        & (measurements["workload_outcome"] == Outcome.OK)
        & measurements[N_CPU_MOE].notna()
    ]
    panels = speed_panels(rows) if len(rows) else []
    if rows[N_CPU_MOE].nunique() < 2 or not panels:
        return []
    others = [c for c in present_columns(rows, SETTING_COLUMNS) if c != N_CPU_MOE]
    names, several = with_environment(rows, varying_columns(rows, others))
    label_names = [c for c in names if c != "environment"] or not_default_columns(rows, others)
    first = rows.iloc[0]
    at_once = plain_value(first["concurrency"]) or 1
    shape = f"{int(first['prompt_tokens']):,} prompt tokens, {int(first['gen_tokens']):,} generated"
    shape += f", {at_once} requests at once" if at_once > 1 else ""
    title = (
        f"Decode and prefill speed of {model} against --n-cpu-moe at workload {workload} ({shape}): "
        "median of every request, bars from min to max."
    )
    fig, axes = new_figure(title, len(panels))
    series = []
    for i, (_key, group) in enumerate(grouped_rows(rows, names)):
        group = group.sort_values(N_CPU_MOE)
        label = series_label(group, label_names, several)
        for ax, (metric, _word) in zip(axes, panels, strict=True):
            data = group[group[cols.stat(metric, "median")].notna()]
            if data.empty:
                continue
            med, lo, hi = error_bars(data, metric)
            bars = ax.errorbar(
                data[N_CPU_MOE], med, yerr=[lo, hi], fmt="o-", capsize=3, color=SERIES_COLOURS[i % 8], label=label
            )
            bars.lines[0].set_gid(f"series-{len(series)}-{metric}")
        series.append(label)
    for ax, (_metric, word) in zip(axes, panels, strict=True):
        ax.set_ylabel(f"{word} (tokens/s per request)")
        ax.set_ylim(bottom=0)
    axes[-1].set_xlabel("--n-cpu-moe (layers whose experts stay on the CPU)")
    axes[-1].xaxis.set_major_locator(MaxNLocator(integer=True))
    return [finish_figure(fig, axes, f"speed-vs-n-cpu-moe-{model}", title, series, "speed")]


# -- 3. speed against prompt length -------------------------------------------------------------


def _depth(model: str, measurements: pd.DataFrame, workload: str, recommended: set[str]) -> list[Figure]:
    if not has_columns(measurements, "prompt_tokens", "concurrency", "workload_outcome", "decode_tps_median"):
        return []
    survived = measurements["outcome"] == Outcome.OK if "outcome" in measurements else True
    rows = measurements[  # a configuration that failed is no trade-off, whatever its workloads here did
        (measurements["model"] == model)
        & survived
        & (measurements["workload_outcome"] == Outcome.OK)
        & (measurements["concurrency"].fillna(1) == 1)
    ]
    if rows["prompt_tokens"].nunique() < 2 or not speed_panels(rows):
        return []
    # Per configuration and prompt length one row: the workload with the most generated tokens.
    rows = rows.sort_values(["config_id", "prompt_tokens", "gen_tokens"]).drop_duplicates(
        ["config_id", "prompt_tokens"], keep="last"
    )
    depths = rows.groupby("config_id")["prompt_tokens"].nunique()
    candidates = [cid for cid in depths.index if depths[cid] > 1]
    if not candidates:
        return []
    objective = rows[rows["workload"] == workload].set_index("config_id")["decode_tps_median"]
    objective = objective[~objective.index.duplicated()]

    def rank(cid):
        speed = plain_value(objective.get(cid))
        return (cid not in recommended, speed is None, -(speed or 0.0), cid)

    chosen = sorted(candidates, key=rank)[:MAX_DEPTH_CONFIGS]
    rows = rows[rows["config_id"].isin(chosen)]
    settings = present_columns(rows, SETTING_COLUMNS)
    first = rows.drop_duplicates("config_id").set_index("config_id").loc[chosen]
    names = label_columns(first, settings)
    several = "environment" in rows and rows["environment"].nunique(dropna=False) > 1
    how = "the recommended first, then " if recommended & set(chosen) else ""
    more = (
        f" {len(chosen)} of {len(candidates)} configurations: {how}the fastest at {workload}."
        if len(candidates) > len(chosen)
        else ""
    )
    title = (
        f"Decode and prefill speed of {model} against prompt length, one request at a time: "
        f"median of every request, bars from min to max.{more}"
    )
    panels = speed_panels(rows)
    fig, axes = new_figure(title, len(panels))
    series = []
    for i, cid in enumerate(chosen):
        data = rows[rows["config_id"] == cid].sort_values("prompt_tokens")
        label = series_label(data, names, several) + (" (recommended)" if cid in recommended else "")
        for ax, (metric, _word) in zip(axes, panels, strict=True):
            part = data[data[cols.stat(metric, "median")].notna()]
            if part.empty:
                continue
            med, lo, hi = error_bars(part, metric)
            bars = ax.errorbar(
                part["prompt_tokens"],
                med,
                yerr=[lo, hi],
                fmt="o-",
                capsize=3,
                color=SERIES_COLOURS[i % len(SERIES_COLOURS)],
                linewidth=2.2 if cid in recommended else 1.4,
                label=label,
            )
            bars.lines[0].set_gid(f"series-{i}-{metric}")
        series.append(label)
    prompt_length_axes(axes, panels, rows["prompt_tokens"])
    return [finish_figure(fig, axes, f"speed-vs-prompt-length-{model}", title, series, "depth")]


# -- 4. per-request decode against aggregate throughput ------------------------------------------


def _pareto(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The points no other point beats on both axes, by rising x."""
    front, best = [], float("-inf")
    for x, y in sorted(points, key=lambda p: (-p[0], -p[1])):
        if y > best:
            front.append((x, y))
            best = y
    return sorted(front)


def _concurrency(model: str, measurements: pd.DataFrame) -> list[Figure]:
    need = ("concurrency", "prompt_tokens", "gen_tokens", "aggregate_tps_median", "decode_tps_median")
    if not has_columns(measurements, *need):
        return []
    survived = measurements["outcome"] == Outcome.OK if "outcome" in measurements else True
    rows = measurements[  # a configuration that failed is no trade-off, whatever its workloads here did
        (measurements["model"] == model)
        & survived
        & (measurements["workload_outcome"] == Outcome.OK)
        & measurements["aggregate_tps_median"].notna()
        & measurements["decode_tps_median"].notna()
    ]
    at_once = rows[rows["concurrency"] > 1]
    shapes = sorted({(int(p), int(g)) for p, g in zip(at_once["prompt_tokens"], at_once["gen_tokens"], strict=True)})
    rows = rows[[(int(p), int(g)) in shapes for p, g in zip(rows["prompt_tokens"], rows["gen_tokens"], strict=True)]]
    # one point per configuration, requests at once and shape: two workloads of one shape (the default config's
    # "short" and a "concurrent" run one at a time on -np 1) drew the same label twice on top of itself
    same = [c for c in ("config_id", "environment", "concurrency", "prompt_tokens", "gen_tokens") if c in rows]
    rows = rows.drop_duplicates(same, keep="last")
    if len(rows) < 2:
        return []
    parallel = cols.setting("parallel")
    names = varying_columns(rows, [c for c in present_columns(rows, SETTING_COLUMNS) if c != parallel])
    keys, several = with_environment(rows, [])
    title = (
        f"Decode speed per request against total generated throughput for {model}, as more requests run "
        "at once: each point a configuration at a number of requests at once (medians); where a "
        "series has two or more best trade-offs, a dashed line joins them (the legend says which)."
    )
    fig, (ax,) = new_figure(title, height=4.2)
    series = []
    front_label = "best trade-offs of each series (no other point of it is faster on both axes)"
    for prompt, gen in shapes:
        same = rows[(rows["prompt_tokens"] == prompt) & (rows["gen_tokens"] == gen)]
        for _key, data in grouped_rows(same, keys):
            colour = SERIES_COLOURS[len(series) % len(SERIES_COLOURS)]
            label = f"{prompt:,} prompt + {gen:,} generated tokens" + (f" ({env_text(data)})" if several else "")
            xs = data["aggregate_tps_median"].astype(float).tolist()
            ys = data["decode_tps_median"].astype(float).tolist()
            artist = ax.scatter(xs, ys, color=colour, s=30, zorder=3, label=label)
            artist.set_gid(f"series-{len(series)}")
            series.append(label)
            front = _pareto(list(zip(xs, ys, strict=True)))
            for (_, row), x, y in zip(data.iterrows(), xs, ys, strict=True):  # every point named (drawing._apart)
                slots = setting_text("parallel", row[parallel]) if parallel in row else ""
                text = ", ".join(t for t in (f"{int(row['concurrency'])} at once", slots) if t)
                text += f", {settings_label(row, names)}" if names else ""
                ax.annotate(text, (x, y), xytext=(4, 4), textcoords="offset points", fontsize=7, color="#333333")
            if len(front) > 1:
                ax.plot(*zip(*front, strict=True), "--", color=colour, linewidth=1.0, label=front_label)
    ax.set_xlabel("aggregate generated throughput (tokens/s, all requests together)")
    ax.set_ylabel("decode per request (tokens/s)")
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    return [finish_figure(fig, [ax], f"per-request-vs-total-throughput-{model}", title, series, "concurrency")]


# -- all of them ---------------------------------------------------------------------------------


def figures(
    configs: pd.DataFrame,
    measurements: pd.DataFrame,
    searches: pd.DataFrame | None,
    budget: dict,
    objective_workload: str,
    telemetry: Mapping[str, pd.DataFrame] | None = None,
    recommended: Iterable[str] = (),
    conversations: pd.DataFrame | None = None,
) -> dict[str, list[Figure]]:
    """Every figure the tables give meaning to, per model (in the order of ``configs``).

    ``budget`` is the config's ``budget`` block (``vram_budget_mib`` may be None: then the limit is the
    card's total memory, the ``vram_limit_mib`` of the rows). ``telemetry`` maps a configuration id to
    its run's time series (``read_telemetry``), drawn as memory over time; ``recommended`` names the
    recommended configuration ids, which the speed-against-prompt-length figure draws first;
    ``conversations`` is the conversations table (memory over the turns).
    """
    if not has_columns(configs, "model"):
        return {}
    recommended = set(recommended)
    # A search probe with the settings of a sweep configuration has its id: one row each is enough here.
    configs = (
        configs.drop_duplicates(["model", "config_id"], keep="last") if has_columns(configs, "config_id") else configs
    )
    if has_columns(measurements, "model", "config_id", "workload"):
        measurements = measurements.drop_duplicates(["model", "config_id", "workload"], keep="last")
    out = {}
    with matplotlib.rc_context(RC):  # the figures' own settings, restored after: nothing leaks into other plots
        for model in configs["model"].drop_duplicates():
            out[model] = [
                *_vram(model, configs, searches, budget),
                *_speed(model, measurements, objective_workload),
                *_depth(model, measurements, objective_workload, recommended),
                *_concurrency(model, measurements),
                *telemetry_figures(model, configs, telemetry or {}, budget),
                *conversation_memory_figures(model, conversations),
            ]
    return out


def telemetry_path(results_dir: str | Path, model: str, config_id: str) -> Path | None:
    """Where a configuration's time series is: its measure job's folder, or a search's probe folder."""
    path = Layout(results_dir).telemetry(model, config_id)
    if path.exists():
        return path
    probes = Layout(results_dir).probe_telemetry(model, config_id)
    return probes[0] if probes else None


def read_telemetry(results_dir: str | Path, model: str, config_ids: Iterable[str]) -> dict[str, pd.DataFrame]:
    """The time series of these configurations that exist (``figures(telemetry=...)``)."""
    out = {}
    for cid in config_ids:
        path = telemetry_path(results_dir, model, cid)
        if path is not None:
            out[cid] = pd.read_parquet(path)
    return out


def write(by_model: Mapping[str, list[Figure]], directory: str | Path) -> list[Path]:
    """Each figure as ``directory/NAME.svg`` (the Markdown report links them by ``Figure.file``); the
    directory is made even when there is no figure (the workflow declares it as an output), and a figure
    left there by an earlier report that this one does not draw is removed."""
    Path(directory).mkdir(parents=True, exist_ok=True)
    drawn = {fig.file for figs in by_model.values() for fig in figs}
    for old in Path(directory).glob("*.svg"):
        if old.name not in drawn:
            old.unlink()
    paths = []
    for figs in by_model.values():
        for fig in figs:
            path = Path(directory) / fig.file
            with atomic_path(path) as tmp:
                tmp.write_text('<?xml version="1.0" encoding="utf-8" standalone="no"?>\n' + fig.svg, encoding="utf-8")
            paths.append(path)
    return paths
