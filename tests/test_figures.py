"""The report's figures (crashline.report.figures) from tables that today's aggregate builds out of real
H200 records (tests/fixtures, derived again as test_report_gpu does): peak VRAM against --n-cpu-moe with
the budget, the margin and every failure; speed against --n-cpu-moe and against prompt length; a
concurrency sweep; memory over one run's time. Each is well-formed SVG that needs no network, never
says "nan", is the same bytes for the same tables, and is left out when the data gives it no meaning."""

from __future__ import annotations

import copy
import re
import xml.etree.ElementTree as ET

import matplotlib
import pandas as pd
import pytest

from crashline.tables import aggregate
from crashline.core import records, settings
from crashline.engine import workloads
from crashline.core.atomic import read_json
from crashline.jobs.measure import memory_summary
from crashline.report import figures as F
from crashline.report import memory_figures as MF

from conftest import FIXTURES
from test_report_gpu import RECORDS, RECORDS_11761, derived_again, sampled, tables_of

BUDGET = {"vram_budget_mib": 12288, "margin_mib": 1024}
OBJECTIVE = "depth-16k"
TELEMETRY = FIXTURES / "h200-telemetry"
H200 = sorted(p for p in RECORDS.glob("*.json") if p.name != "provenance.json")
SVG = "{http://www.w3.org/2000/svg}"


def by_kind(figs: list[F.Figure]) -> dict[str, F.Figure]:
    kinds = [f.kind for f in figs]
    assert len(kinds) == len(set(kinds)), kinds
    return {f.kind: f for f in figs}


def texts(svg: str) -> list[str]:
    """Every text the figure shows (legend, axes, title, phase names)."""
    return ["".join(t.itertext()) for t in ET.fromstring(svg).iter(f"{SVG}text")]


def group(svg: str, gid: str) -> ET.Element:
    (found,) = [g for g in ET.fromstring(svg).iter(f"{SVG}g") if g.get("id", "").endswith(f"-{gid}")]
    return found


def line_y(svg: str, gid: str) -> float:
    """The height in the picture of a horizontal line (its path is "M x0 y L x1 y")."""
    path = group(svg, gid).find(f"{SVG}path").get("d")
    ys = {float(y) for y in re.findall(r"[ML] [-\d.]+ ([-\d.]+)", path)}
    assert len(ys) == 1, path
    return ys.pop()


def markers(svg: str, gid: str) -> list[ET.Element]:
    return list(group(svg, gid).iter(f"{SVG}use"))


@pytest.fixture(scope="module")
def gpu(tmp_path_factory):
    """The 12 GiB-budget sweep: four survivors, three load failures of different kinds, --fit on, a search."""
    configs, measurements = tables_of(H200, 12288, tmp_path_factory.mktemp("h200"))
    searches = aggregate.search_table([FIXTURES / "h200-search" / "search.json"])
    return configs, measurements, searches


@pytest.fixture(scope="module")
def two_ubatches(tmp_path_factory):
    """The 11761 MiB budget: -ub 2048 and -ub 512, load failures and an oom at warm-up."""
    return tables_of(sorted(RECORDS_11761.glob("*.json")), 11761, tmp_path_factory.mktemp("h200-11761"))


@pytest.fixture(scope="module")
def gpu_figures(gpu):
    configs, measurements, searches = gpu
    return F.figures(configs, measurements, searches, BUDGET, OBJECTIVE, recommended=["a8937fb58e"])["moe-synthetic"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One run with its telemetry: the record aggregated, and the sampler's time series."""
    configs, measurements = tables_of([TELEMETRY / "budget-b65d6887e2.json"], 12288, tmp_path_factory.mktemp("run"))
    return configs, measurements, pd.read_parquet(TELEMETRY / "budget-b65d6887e2.parquet")


def slots_record(base: dict, parallel: int) -> dict:
    """The recorded run at -np ``parallel`` with that many requests at once: each request of each repetition
    ``parallel`` times, slower per request, the run's wall time longer; summarised by today's code."""
    rec = copy.deepcopy(base)
    rec["settings"]["parallel"] = parallel
    rec["config_id"] = settings.config_id(rec["model"]["name"], rec["settings"])
    for w in rec["workloads"]:
        w["concurrency"] = parallel
        for run in w["runs"]:
            slower = 1 + 0.35 * (parallel - 1)
            run["requests"] = [
                {**r, "decode_tps": r["decode_tps"] / slower, "prefill_tps": r["prefill_tps"] / slower}
                for r in run["requests"]
                for _ in range(parallel)
            ]
            run["wall_s"] *= 1 + 0.15 * (parallel - 1)
            run["aggregate_tps"] = sum(r["predicted_n"] for r in run["requests"]) / run["wall_s"]
        w.update(workloads.summarize(w["runs"]))
    return rec


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """A slot sweep (-np 1, 2, 4, as many requests at once), written and aggregated by crashline's own code."""
    out = tmp_path_factory.mktemp("slots")
    base = derived_again(TELEMETRY / "budget-b65d6887e2.json", 12288)
    paths = [write(out / f"np{n}.json", slots_record(base, n)) for n in (1, 2, 4)]
    return aggregate.write(paths, out / "configs.parquet", out / "measurements.parquet")


def write(path, rec: dict):
    """Write a fixture record (version 1) as today's writer does, upgraded by today's code first."""
    version = rec.get(records.VERSION_KEY, rec.get(records.LEGACY_VERSION_KEY, 1))
    records.write(path, "measure", records.upgrade("measure", version, rec))
    return path


def cpu_only(path) -> dict:
    """A record as a machine with no GPU writes it: no devices, no VRAM sampled, no limit."""
    rec = read_json(path)
    rec["host"]["gpu"] = {}
    memory = {**sampled(rec), "gpu_present": False, "peak_gpu_mib": None}
    memory["per_phase"] = {k: {**v, "gpu_mib": None} for k, v in memory["per_phase"].items()}
    rec["memory"] = memory_summary(memory, None, rec["host"])
    return rec


# -- the figures -----------------------------------------------------------------------------------


def test_the_crash_line_shows_the_budget_the_margin_and_each_failure_where_it_failed(gpu_figures):
    vram = by_kind(gpu_figures)["vram"]
    assert vram.name == "vram-vs-n-cpu-moe-moe-synthetic"
    shown = texts(vram.svg)
    assert "VRAM budget (12,288 MiB)" in shown
    assert "VRAM budget − margin (11,264 MiB; margin 1,024 MiB)" in shown
    assert vram.series == [
        "-c 32768, -ub 2048",  # the survivors; nothing else varies, so named by what is not the default
        "load_failed (weights) at load",
        "load_failed (kv_cache) at load",
        "load_failed (compute_buffer) at load",
        "planner's prediction",
    ]
    assert [len(markers(vram.svg, f"series-{i}")) for i in range(4)] == [4, 1, 1, 1]
    assert len({group(vram.svg, f"series-{i}").find(f"{SVG}defs/{SVG}path").get("d") for i in (1, 2, 3)}) == 3
    assert line_y(vram.svg, "limit") < line_y(vram.svg, "margin")  # the budget above the margin line


def test_one_series_per_ubatch_and_an_oom_at_warmup(two_ubatches):
    configs, measurements = two_ubatches
    figs = by_kind(
        F.figures(configs, measurements, None, {**BUDGET, "vram_budget_mib": 11761}, OBJECTIVE)["moe-synthetic"]
    )
    vram, speed = figs["vram"], figs["speed"]
    assert [s for s in vram.series if s.startswith("-ub")] == ["-ub 512", "-ub 2048"]
    assert "oom at warmup (-ub 2048)" in vram.series
    assert "load_failed (compute_buffer) at load (-ub 512)" in vram.series
    assert speed.series == ["-ub 512", "-ub 2048"]
    assert "VRAM budget (11,761 MiB)" in texts(vram.svg)


def test_a_failure_with_no_peak_is_drawn_on_the_budget_line(tmp_path):
    recs = [derived_again(p, 12288) for p in H200 if p.stem in ("ncmoe14", "ncmoe29", "ncmoe31")]
    for rec in recs:
        if rec["outcome"] != "ok":  # the sampler saw no VRAM before the server died
            rec["memory"] = memory_summary({**sampled(rec), "peak_gpu_mib": None}, 12288, rec["host"])
    paths = [write(tmp_path / f"{i}.json", rec) for i, rec in enumerate(recs)]
    configs, measurements = aggregate.write(paths, tmp_path / "c.parquet", tmp_path / "m.parquet")
    vram = by_kind(F.figures(configs, measurements, None, BUDGET, OBJECTIVE)["moe-synthetic"])["vram"]
    assert vram.series[1] == "load_failed (kv_cache) at load"
    (marker,) = markers(vram.svg, "series-1")
    assert float(marker.get("y")) == pytest.approx(line_y(vram.svg, "limit"), abs=0.01)


def test_without_a_budget_the_limit_is_the_cards_memory(tmp_path):
    paths = [write(tmp_path / p.name, derived_again(p, None)) for p in H200]
    configs, measurements = aggregate.write(paths, tmp_path / "c.parquet", tmp_path / "m.parquet")
    figs = F.figures(configs, measurements, None, {"vram_budget_mib": None, "margin_mib": 1024}, OBJECTIVE)
    shown = texts(by_kind(figs["moe-synthetic"])["vram"].svg)
    assert "card's memory (143,771 MiB)" in shown
    assert "card's memory − margin (142,747 MiB; margin 1,024 MiB)" in shown


def test_speed_against_n_cpu_moe_and_against_prompt_length(gpu_figures):
    figs = by_kind(gpu_figures)
    speed, depth = figs["speed"], figs["depth"]
    assert speed.series == ["-c 32768, -ub 2048"]  # --fit on has no --n-cpu-moe: not on this axis
    assert {"decode (tokens/s per request)", "prefill (tokens/s per request)"} <= set(texts(speed.svg))
    assert "at workload depth-16k (16,384 prompt tokens, 32 generated)" in speed.title
    assert depth.series[0] == "-ngl 999, --n-cpu-moe 31, --fit off (recommended)"
    assert "no -ngl, no --n-cpu-moe, --fit on" in depth.series  # unset settings in words
    assert len(depth.series) == 5 and {"128", "16,384"} <= set(texts(depth.svg))


def test_speed_against_prompt_length_keeps_the_recommended_and_the_fastest(gpu, monkeypatch):
    monkeypatch.setattr(F, "MAX_DEPTH_CONFIGS", 2)
    configs, measurements, _ = gpu
    figs = F.figures(configs, measurements, None, BUDGET, OBJECTIVE, recommended=["a8937fb58e"])
    depth = by_kind(figs["moe-synthetic"])["depth"]
    fastest = measurements[(measurements["workload"] == OBJECTIVE) & (measurements["config_id"] != "a8937fb58e")]
    fastest = fastest.sort_values("decode_tps_median").iloc[-1]
    assert len(depth.series) == 2 and depth.series[0].endswith("(recommended)")
    assert f"--n-cpu-moe {fastest['s_n_cpu_moe']:.0f}" in depth.series[1] or "--fit on" in depth.series[1]
    assert "2 of 5 configurations: the recommended first, then the fastest at depth-16k" in depth.title


def test_per_request_against_total_throughput_for_a_slot_sweep(sweep):
    configs, measurements = sweep
    assert sorted(measurements["concurrency"].unique()) == [1, 2, 4]
    figs = by_kind(F.figures(configs, measurements, None, BUDGET, OBJECTIVE)["moe-synthetic"])
    pareto = figs["concurrency"]
    assert pareto.series == ["128 prompt + 64 generated tokens", "16,384 prompt + 128 generated tokens"]
    shown = texts(pareto.svg)
    assert {"1 at once, -np 1", "2 at once, -np 2", "4 at once, -np 4"} <= set(shown)
    assert "best trade-offs of each series (no other point of it is faster on both axes)" in shown
    assert [len(markers(pareto.svg, f"series-{i}")) for i in (0, 1)] == [3, 3]
    # #41: no dashed line promised in the title where none is drawn
    assert "the dashed line joins the best trade-offs." not in pareto.title


def test_memory_over_time_shades_the_phases_the_sampler_marked(run):
    configs, measurements, frame = run
    figs = by_kind(F.figures(configs, measurements, None, BUDGET, OBJECTIVE, {"b65d6887e2": frame})["moe-synthetic"])
    memory = figs["memory"]
    assert memory.name == "memory-over-time-moe-synthetic-b65d6887e2"
    assert memory.series == ["VRAM used by the server", "RSS of the server and its children"]
    assert [name for name, *_ in MF.phases(frame)] == ["load", "prepare", "short", "depth-16k", "stop"]
    spans = MF.phases(frame)
    assert all(a[2] == b[1] for a, b in zip(spans, spans[1:], strict=False))  # each phase ends where the next begins
    shown = [t.strip() for t in texts(memory.svg)]
    assert {"load", "warm-up request", "workload short", "workload depth-16k", "stop"} <= set(shown)
    assert "VRAM budget (12,288 MiB)" in shown


def test_figures_are_left_out_where_the_data_gives_them_no_meaning(gpu, tmp_path):
    configs, measurements, _ = gpu
    empty_c, empty_m = aggregate.write([], tmp_path / "c.parquet", tmp_path / "m.parquet")
    assert F.figures(empty_c, empty_m, None, BUDGET, OBJECTIVE) == {}
    assert F.figures(pd.DataFrame(), pd.DataFrame(), pd.DataFrame(), BUDGET, OBJECTIVE) == {}
    # One --n-cpu-moe value: no line against it; two prompt lengths still give speed against depth.
    one = configs["config_id"] == "28da8d9acf"
    alone = F.figures(configs[one], measurements[measurements["config_id"] == "28da8d9acf"], None, BUDGET, OBJECTIVE)
    assert [f.kind for f in alone["moe-synthetic"]] == ["depth"]
    # No concurrency above one, no telemetry: neither figure.
    assert {f.kind for f in F.figures(configs, measurements, None, BUDGET, OBJECTIVE)["moe-synthetic"]} == {
        "vram",
        "speed",
        "depth",
    }
    # Only one prompt length: no speed against depth.
    short = measurements[measurements["workload"] == "short"]
    assert "depth" not in {f.kind for f in F.figures(configs, short, None, BUDGET, "short")["moe-synthetic"]}


def test_no_gpu_means_no_vram_figure(tmp_path):
    paths = [write(tmp_path / p.name, cpu_only(p)) for p in H200]
    configs, measurements = aggregate.write(paths, tmp_path / "c.parquet", tmp_path / "m.parquet")
    assert set(configs["gpu"]) == {"no GPU"}
    figs = F.figures(configs, measurements, None, {"vram_budget_mib": None, "margin_mib": 1024}, OBJECTIVE)
    assert [f.kind for f in figs["moe-synthetic"]] == ["speed", "depth"]


# -- every figure ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def every_figure(gpu_figures, two_ubatches, sweep, run) -> list[F.Figure]:
    out = list(gpu_figures)
    for (configs, measurements), telemetry in ((two_ubatches, None), (sweep, None), (run[:2], {"b65d6887e2": run[2]})):
        for figs in F.figures(configs, measurements, None, BUDGET, OBJECTIVE, telemetry).values():
            out += figs
    assert {f.kind for f in out} == {"vram", "speed", "depth", "concurrency", "memory"}
    return out


def test_every_figure_is_svg_that_needs_no_network_and_never_says_nan(every_figure):
    for fig in every_figure:
        root = ET.fromstring(fig.svg)
        assert root.tag == f"{SVG}svg" and root.find(f"{SVG}title").text == fig.title
        assert not re.search(r"\bnan\b", fig.svg, re.IGNORECASE), fig.name
        assert not any(re.search(r"\bnan\b", s, re.IGNORECASE) for s in [fig.title, *fig.series])
        refs = re.findall(r'href="([^"]*)"|url\(([^)]*)\)', fig.svg)
        assert all((a or b).startswith("#") for a, b in refs), fig.name  # only its own elements
        assert "@import" not in fig.svg and "@font-face" not in fig.svg and "<image" not in fig.svg
        assert "<!DOCTYPE" not in fig.svg and "<?xml" not in fig.svg  # ready to inline in HTML
        assert fig.series and len(fig.series) == len(set(fig.series))


def test_ids_are_unique_across_the_figures_of_a_page(gpu_figures):
    ids = [i for fig in gpu_figures for i in re.findall(r'\bid="([^"]+)"', fig.svg)]
    assert len(ids) == len(set(ids))


def test_the_same_tables_give_the_same_bytes_and_leave_matplotlib_as_it_was(gpu):
    configs, measurements, searches = gpu
    before = dict(matplotlib.rcParams)
    first = F.figures(configs, measurements, searches, BUDGET, OBJECTIVE)
    second = F.figures(configs, measurements, searches, BUDGET, OBJECTIVE)
    assert [f.svg for f in first["moe-synthetic"]] == [f.svg for f in second["moe-synthetic"]]
    assert dict(matplotlib.rcParams) == before


def test_write_puts_one_svg_file_per_figure_beside_the_report(gpu_figures, tmp_path):
    paths = F.write({"moe-synthetic": gpu_figures}, tmp_path)
    assert [p.name for p in paths] == [f.file for f in gpu_figures]
    for path, fig in zip(paths, gpu_figures, strict=True):
        text = path.read_text(encoding="utf-8")
        assert text.startswith("<?xml") and text.endswith(fig.svg)
        assert ET.parse(path).getroot().tag == f"{SVG}svg"
    assert F.write({"m": []}, tmp_path / "none") == [] and (tmp_path / "none").is_dir()  # the workflow's output


def test_read_telemetry_finds_a_measure_job_and_a_search_probe(tmp_path):
    frame = pd.read_parquet(TELEMETRY / "budget-b65d6887e2.parquet")
    (tmp_path / "records/m/aaa").mkdir(parents=True)
    frame.to_parquet(tmp_path / "records/m/aaa/telemetry.parquet")
    (tmp_path / "search/m/g1/records/bbb").mkdir(parents=True)
    frame.to_parquet(tmp_path / "search/m/g1/records/bbb/telemetry.parquet")
    found = F.read_telemetry(tmp_path, "m", ["aaa", "bbb", "ccc"])
    assert sorted(found) == ["aaa", "bbb"] and all(len(f) == len(frame) for f in found.values())


def test_a_configuration_on_two_gpus_is_drawn_by_its_fullest_gpu_against_one_gpu_s_limit():
    """The crash-line figure draws one GPU's limit: a configuration across two GPUs is at its fullest GPU's peak
    (11,000 MiB of a 12,288 MiB budget each), not at the sum (18,000), which would sit above the line."""
    rows = pd.DataFrame(
        {
            "peak_gpu_mib": [18000.0, 9000.0],
            "peak_gpus_mib": [[11000.0, 7000.0], None],
            "vram_limit_mib": [24576.0, 12288.0],
        }
    )
    drawn = F.per_gpu(rows)
    assert drawn["peak_gpu_mib"].tolist() == [11000.0, 9000.0]
    assert drawn["vram_limit_mib"].tolist() == [12288.0, 12288.0]
    assert rows["peak_gpu_mib"].tolist() == [18000.0, 9000.0]  # the table itself is left as it is


def test_a_configuration_that_failed_is_no_trade_off(sweep):
    """The configuration at -np 4 survived its workloads at 4 at once but failed the run (as -c 1024 did on the
    machine of #27: the table lists it as failed): the figure leaves it out, never as a best trade-off."""
    configs, measurements = sweep
    failed = measurements.copy()
    four = failed["concurrency"] == 4
    failed.loc[four, "outcome"] = "crashed"
    pareto = by_kind(F.figures(configs, failed, None, BUDGET, OBJECTIVE)["moe-synthetic"])["concurrency"]
    assert "4 at once, -np 4" not in set(texts(pareto.svg))
    assert [len(markers(pareto.svg, f"series-{i}")) for i in (0, 1)] == [2, 2]


def test_two_workloads_of_one_shape_are_one_point_with_one_label(sweep):
    """The README's default run: its "short" and "concurrent" workloads have one shape, and on an -np 1
    configuration both run one request at a time; the figure drew that point and its label twice, on itself."""
    configs, measurements = sweep
    twice = pd.concat([measurements, measurements[measurements["concurrency"] == 1].assign(workload="again")])
    pareto = by_kind(F.figures(configs, twice, None, BUDGET, OBJECTIVE)["moe-synthetic"])["concurrency"]
    shown = texts(pareto.svg)
    assert shown.count("1 at once, -np 1") == 2  # once per shape, as without the second workload
    assert [len(markers(pareto.svg, f"series-{i}")) for i in (0, 1)] == [3, 3]


def test_labels_of_points_on_one_spot_are_drawn_apart():
    """Two configurations on one spot of the trade-off figure (-ub 128 and -ub 512 of the default run, both on the
    front) had their long labels on each other in Chromium (test_workflow_e2e): the second moves a line away."""
    from matplotlib.backends.backend_agg import RendererAgg

    from crashline.report.drawing import finish_figure, new_figure

    fig, (ax,) = new_figure("two labels on one spot")
    ax.scatter([10.0, 10.05, 30.0], [5.0, 5.02, 9.0])
    for x, y, ub in ((10.0, 5.0, 128), (10.05, 5.02, 512), (30.0, 9.0, 2048)):
        text = f"1 at once, -np 1, -c 4096, -ub {ub}, warm page cache"
        ax.annotate(text, (x, y), xytext=(4, 4), textcoords="offset points", fontsize=7)
    finish_figure(fig, [ax], "apart", "two labels on one spot", [], "concurrency")
    renderer = RendererAgg(*fig.bbox.size, fig.dpi)
    fig.draw(renderer)
    boxes = [t.get_window_extent(renderer) for t in ax.texts]
    assert len(boxes) == 3
    assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1 :])


def test_every_point_of_the_trade_off_figure_is_named(sweep):
    """#41: a configuration one request at a time that another beats on both axes was drawn without a name (three of
    five points in the default run's report); every point is named now, its label apart from the others'."""
    configs, measurements = sweep
    one = measurements[measurements["concurrency"] == 1]
    slower = one.assign(
        config_id=one["config_id"] + "-slow",
        s_ubatch=64,
        decode_tps_median=one["decode_tps_median"] / 2,
        aggregate_tps_median=one["aggregate_tps_median"] / 2,
    )
    figs = F.figures(configs, pd.concat([measurements, slower]), None, BUDGET, OBJECTIVE)["moe-synthetic"]
    pareto = by_kind(figs)["concurrency"]
    shown = texts(pareto.svg)
    assert [len(markers(pareto.svg, f"series-{i}")) for i in (0, 1)] == [4, 4]
    assert sum(" at once, -np " in t for t in shown) == 8
