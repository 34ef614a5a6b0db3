"""The planner's arithmetic against what llama-server reported on a real H200 (the fixture logs),
and the boundary search against a survival function."""

from __future__ import annotations

import json
import re
import statistics
import sys

import pytest

from crashline.engine import logparse, planner
from crashline.models import synthetic
from crashline.core.settings import resolve

from conftest import FIXTURES, REPO

LOGS = FIXTURES / "cuda-logs"


def manifest_of(shape: dict) -> dict:
    """The manifest fields the planner reads, from the synthetic writer's own tensor plan."""
    resolved = synthetic.resolve_shape(shape)
    per_layer = [
        {"layer": i, "expert_bytes": 0, "shared_expert_bytes": 0, "other_bytes": 0} for i in range(resolved["layers"])
    ]
    output = 0
    for name, shape_np, qtype in synthetic.tensor_plan(resolved):
        nbytes = synthetic.tensor_nbytes(shape_np, qtype)
        m = re.match(r"blk\.(\d+)\.(.+)", name)
        if m:
            per_layer[int(m[1])]["expert_bytes" if "_exps" in m[2] else "other_bytes"] += nbytes
        elif name.startswith(("output.", "output_norm.")):
            output += nbytes
    return {
        "layers": resolved["layers"],
        "per_layer": per_layer,
        "output_bytes": output,
        "n_head_kv": resolved["n_head_kv"],
        "head_dim": resolved["head_dim"],
    }


QWEN = manifest_of(synthetic.QWEN3_30B_A3B)


@pytest.mark.parametrize(
    "log, n_cpu_moe",
    [
        ("ok-full-gpu.log", 0),
        ("ok-ncmoe28-budget12g.log", 28),
        ("ok-ncmoe26-ub512-budget12g.log", 26),
        ("loadfail-compute-buffer.log", 25),
    ],
)
def test_weights_and_kv_match_the_real_buffers(log, n_cpu_moe):
    buffers = logparse.parse_log((LOGS / log).read_text())["buffers_mib"]
    settings = resolve({"n_cpu_moe": n_cpu_moe, "ctx": 32768})
    assert planner.weights_mib(QWEN, settings) == pytest.approx(buffers["CUDA0:model"], rel=0.01)
    assert planner.kv_mib(QWEN, settings) == pytest.approx(buffers["CUDA0:kv"], rel=0.001)


def test_compute_model_and_prediction_of_the_crash():
    runs = {r["file"]: r for r in json.loads((LOGS / "runs.json").read_text())}
    compute = planner.ComputeModel(
        {
            2048: runs["ok-ncmoe28-budget12g.log"]["bufs"]["CUDA0:compute"],
            512: runs["ok-ncmoe26-ub512-budget12g.log"]["bufs"]["CUDA0:compute"],
        }
    )
    assert compute(2048) == pytest.approx(476, abs=1) and 200 < compute(1024) < 476
    settings = resolve({"ctx": 32768, "ubatch": 2048})
    # 11761 MiB budget: n_cpu_moe 12 must be predicted far over, 28 under.
    over = planner.predict(QWEN, {**settings, "n_cpu_moe": 12}, compute, rest_mib=500)
    under = planner.predict(QWEN, {**settings, "n_cpu_moe": 28}, compute, rest_mib=500)
    assert over["total_mib"] > 11761 > under["total_mib"]
    text = planner.arithmetic(over, 11761, 1024)
    assert text.startswith("weights ") and "does not fit" in text
    lowest = planner.predicted_lowest(QWEN, settings, compute, 500, 11761, 0)
    assert 24 <= lowest <= 28  # the real runs: 26 loaded, 28 survived


@pytest.mark.parametrize("boundary", [0, 1, 7, 26, 27, 48])
@pytest.mark.parametrize("start", [0, 20, 26, 30, 48])
def test_search_finds_the_boundary_with_few_probes(boundary, start):
    found, probes = planner.search_lowest(lambda n: n >= boundary, start, 0, 48)
    assert found == boundary
    assert len(probes) <= 2 * 6 + 1  # gallop then bisect: O(log 49)
    if start == boundary and boundary > 0:
        assert len(probes) == 2  # a right prediction costs two server starts


def test_search_when_nothing_survives():
    found, probes = planner.search_lowest(lambda n: False, 10, 0, 48)
    assert found is None and probes[-1] == (48, False)


# -- the fastest value above the boundary: the climb, the finalists, the interleaved starts -------------------------

S = planner.Speed


def fake(speeds: dict[int, S | None]):
    """A measure callback answering from a table, and the values it was asked for, in order."""
    asked = []

    def speed(n):
        asked.append(n)
        return speeds[n]

    return speed, asked


# Decode t/s at 16K on the H200 (12 GiB budget): 29 and 31 as measured (median [min-max]), the others made up
# around them. The old search stopped at 29, the lowest with the margin; 31 is faster.
H200 = {
    29: S(55.0, 52.2, 57.9),
    30: S(57.5, 55.0, 60.0),
    31: S(59.8, 58.1, 61.5),
    32: S(58.0, 56.5, 59.5),
    33: S(50.0, 48.0, 52.0),
    34: S(61.0, 60.0, 62.0),
}


def test_within_noise_is_overlapping_ranges():
    assert planner.within_noise(H200[29], H200[30]) and planner.within_noise(H200[30], H200[29])
    assert not planner.within_noise(H200[29], H200[31])  # 57.9 < 58.1: apart
    assert planner.within_noise(S(10, 9, 10), S(11, 10, 12))  # touching ends overlap
    assert not planner.within_noise(S(10, 10, 10), S(10.5, 10.5, 10.5))  # one request each: a point each


def test_climb_goes_on_while_faster_or_within_noise_and_stops_at_the_first_clearly_slower():
    speed, asked = fake(H200)
    steps, stop = planner.climb(speed, 29, 48, 6)
    assert [(s.n_cpu_moe, s.verdict, s.best) for s in steps] == [
        (30, "within noise", 30),  # 55.0-60.0 overlaps 52.2-57.9, higher median: the best now
        (31, "within noise", 31),  # against 30, not 29: 58.1-61.5 overlaps 55.0-60.0
        (32, "within noise", 31),
        (33, "slower", 31),  # 48.0-52.0 lies below 31's 58.1: stop, 34 is never measured
    ]
    assert asked == [29, 30, 31, 32, 33] and stop == "n_cpu_moe 33 is clearly slower than n_cpu_moe 31 (ranges apart)"


def test_climb_is_bounded_by_climb_by_the_range_and_by_a_failure():
    speed, asked = fake(H200)
    steps, stop = planner.climb(speed, 29, 48, 2)
    assert [s.n_cpu_moe for s in steps] == [30, 31] and stop == "tried 2 value(s) above 29, the most asked for"
    speed, asked = fake(H200)
    steps, stop = planner.climb(speed, 29, 30, 4)
    assert asked == [29, 30] and stop == "reached the top of the range (30)"
    speed, asked = fake({**H200, 31: None})  # 31 did not survive with the margin
    steps, stop = planner.climb(speed, 29, 48, 4)
    assert [(s.n_cpu_moe, s.verdict) for s in steps] == [(30, "within noise"), (31, "failed")] and asked[-1] == 31
    assert stop == "n_cpu_moe 31 did not survive every workload with the margin"
    speed, asked = fake({29: S(50, 49, 51), 30: S(60, 59, 61), 31: S(70, 69, 71)})
    steps, _ = planner.climb(speed, 29, 31, 4)
    assert [(s.verdict, s.best) for s in steps] == [("faster", 30), ("faster", 31)]
    speed, asked = fake(H200)
    assert planner.climb(speed, 29, 48, 0) == ([], "no climb asked for") and asked == [29]


def test_the_time_limit_stops_the_climb_before_the_value_it_leaves_out():
    speed, asked = fake(H200)
    cut = "the climb from n_cpu_moe 31 on left out: the time limit"
    steps, stop = planner.climb(speed, 29, 48, 6, left_out=lambda n: cut if n >= 31 else None)
    assert [s.n_cpu_moe for s in steps] == [30] and asked == [29, 30] and stop == cut


def test_finalists_are_the_best_and_those_within_noise_else_the_runner_up_at_most_three():
    assert planner.finalists({n: H200[n] for n in (29, 30, 31, 32)}) == [31, 32, 30]  # 29 is apart from 31
    assert planner.finalists({n: H200[n] for n in (29, 31)}) == [31, 29]  # apart: the runner-up all the same
    assert planner.finalists(H200, most=2) == [34, 31]  # 34 (60.0-62.0) overlaps 31 only
    assert planner.finalists({4: S(10, 9, 11), 7: S(10, 9, 11)}) == [7, 4]  # a tie: more VRAM to spare first
    assert planner.finalists({5: S(10, 9, 11)}) == [5] and planner.finalists({}) == []


def starts_from(table: dict[int, list[S | None]]):
    """Fakes of a finalist's further starts (start k answers table[n][k - 1]) and of its pooled speed (the
    median of the starts' medians, the range over every start), and the starts asked for, in order."""
    asked = []
    done = {n: 1 for n in table}

    def start(n, k):
        asked.append((n, k))
        assert k == done[n] + 1  # start k of a value only after its start k - 1
        done[n] = k
        return table[n][k - 1]

    def pooled(n):
        got = table[n][: done[n]]
        if any(s is None for s in got):
            return None
        median = statistics.median(s.median for s in got)
        return S(median, min(s.low for s in got), max(s.high for s in got), len(got))

    return start, pooled, asked


def test_settle_interleaves_the_finalists_and_the_winner_is_the_fastest_pooled_median():
    first = {n: H200[n] for n in (29, 30, 31, 32, 33)}  # in the order measured
    table = {
        29: [H200[29]],
        30: [H200[30], S(58.5, 56, 61), S(59.9, 57, 61)],
        31: [H200[31], S(57.0, 55, 59), S(57.2, 56, 58)],  # the fastest in the first start only
        32: [H200[32], S(59.0, 58, 60), S(59.5, 58, 61)],
        33: [H200[33]],
    }
    start, pooled, asked = starts_from(table)
    result = planner.settle(start, pooled, first, starts=3)
    assert result["finalists"] == [30, 31, 32]  # 31, and 32 and 30 within noise of it; in the order first measured
    assert asked == result["order"] == [(30, 2), (31, 2), (32, 2), (30, 3), (31, 3), (32, 3)]  # A B C A B C
    assert [result["pooled"][n].median for n in (30, 31, 32)] == [58.5, 57.2, 59.0]
    assert (result["winner"], result["runner_up"]) == (32, 30)
    assert (result["won"], result["pairs"]) == (2, 3)  # 58.0 > 57.5, 59.0 > 58.5, 59.5 < 59.9
    assert result["lead_held"] == (
        "n_cpu_moe 32 faster than n_cpu_moe 30 (the runner-up) in 2 of 3 interleaved start pairs; "
        "in 1 of 2 after the first, which chose the finalists"
    )
    start, pooled, asked = starts_from({29: [H200[29], S(56.0, 55, 57)], 31: [H200[31], S(58.0, 57, 59)]})
    two = planner.settle(start, pooled, {n: H200[n] for n in (29, 31)}, starts=2)
    assert two["finalists"] == [29, 31] and asked == [(29, 2), (31, 2)]  # apart, yet the runner-up starts again
    assert two["winner"] == 31 and two["lead_held"].endswith(
        "in 2 of 2 interleaved start pairs; in 1 of 1 after the first, which chose the finalists"
    )


def test_the_time_limit_stops_the_finalists_rounds_whole_and_lets_no_challenger_join():
    """Round 3 is left out: every finalist keeps 2 starts (never A B A), the winner is ranked on them, and 40 (faster
    in its one start than the winner pooled) does not join, since joining needs starts the limit left out."""
    first = {29: S(55.0, 54, 56), 30: S(60.0, 59, 61), 31: S(59.5, 58.5, 60.5), 40: S(58.0, 57.5, 58.4)}
    table = {
        29: [first[29]],
        30: [first[30], S(50.0, 49, 51), S(61.0, 60, 62)],
        31: [first[31], S(51.0, 50, 52), S(61.0, 60, 62)],
        40: [first[40], S(57.0, 56, 58)],
    }
    start, pooled, asked = starts_from(table)
    said = "the finalists' start 3 of 3 and any later one left out: the time limit"
    result = planner.settle(start, pooled, first, starts=3, left_out=lambda k: said if k >= 3 else None)
    assert asked == result["order"] == [(30, 2), (31, 2)] and result["finalists"] == [30, 31]
    assert result["cut"] == said and result["winner"] == max((30, 31), key=lambda n: result["pooled"][n].median)
    assert all(result["pooled"][n].n == 2 for n in (30, 31))
    start, pooled, asked = starts_from(table)  # the same two starts without a limit: 40 joins
    assert planner.settle(start, pooled, first, starts=2)["cut"] is None and (40, 2) in asked


def test_a_value_faster_in_one_start_than_the_winner_pooled_joins_the_finalists():
    """40 was apart from the best in the first start; the finalists then slow down in their second, so that 40's one
    start beats the winner's pooled median: measured once, it would win the report's ranking, so it starts again."""
    first = {29: S(55.0, 54, 56), 30: S(60.0, 59, 61), 31: S(59.5, 58.5, 60.5), 40: S(58.0, 57.5, 58.4)}
    table = {
        29: [first[29]],
        30: [first[30], S(50.0, 49, 51)],
        31: [first[31], S(51.0, 50, 52)],
        40: [first[40], S(57.0, 56, 58)],
    }
    start, pooled, asked = starts_from(table)
    result = planner.settle(start, pooled, first, starts=2)
    assert result["finalists"] == [30, 31, 40] and asked == [(30, 2), (31, 2), (40, 2)]
    assert [result["pooled"][n].median for n in (30, 31, 40)] == [55.0, 55.25, 57.5]
    assert (result["winner"], result["runner_up"]) == (40, 31)


def test_a_finalist_that_fails_a_start_cannot_win():
    first = {30: S(60.0, 59, 61), 31: S(59.0, 58, 60)}
    start, pooled, _ = starts_from({30: [first[30], None], 31: [first[31], S(58.0, 57, 59)]})
    result = planner.settle(start, pooled, first, starts=2)
    assert result["winner"] == 31 and result["runner_up"] is None
    assert result["lead_held"] == "n_cpu_moe 31: the only finalist that survived every start"
    start, pooled, _ = starts_from({30: [first[30], None], 31: [first[31], None]})
    result = planner.settle(start, pooled, first, starts=2)
    assert result["winner"] is None and result["lead_held"] == "no finalist survived every start with the margin"


def test_the_probes_a_search_has_left_are_the_bisection_of_what_is_not_bracketed():
    """The search's time left (#27 item 8) counts its boundary probes from what it has seen: nothing seen in 0..28,
    29 values; a survivor at 27 alone leaves 0..26; a failure at 26 brackets it; a failure alone gallops up."""
    assert planner.probes_left({}, 0, 28) == 5  # log2(30)
    assert planner.probes_left({27: True}, 0, 28) == 5  # 27 values below 27: log2(28)
    assert planner.probes_left({27: True, 26: False}, 0, 28) == 0
    assert planner.probes_left({27: True, 20: False}, 0, 28) == 3  # 21..26
    assert planner.probes_left({20: False}, 0, 28) == 4  # 21..28, no survivor yet
    assert planner.probes_left({30: False, 27: True}, 0, 28) == 5  # a failure above a survivor brackets nothing


def test_the_calibration_leaves_one_expert_layer_on_the_card():
    """``calibration_value``: the most experts on the CPU with one layer's still on the card, within the range."""
    manifest = {"layers": 8}
    assert planner.calibration_value(manifest, 0, 8) == 7  # every layer's on the CPU would miss the card's MoE buffers
    assert planner.calibration_value(manifest, 0, 5) == 5  # layers 5-7 already on the card
    assert planner.calibration_value(manifest, 8, 8) == 8  # a range of one value: that value


def test_the_serving_peak_at_100k_is_predicted_within_64_mib_when_calibrated_with_an_expert_layer_on_the_card():
    """#40 item 4, on the H100 runs at -c 131072 -ub 2048 q4_0 (bench/results/lease-2026-12-08-s33/): the search
    calibrated with every expert on the CPU read a compute buffer of 896.13 MiB where every probe had 1,024.13, and
    predicted each whole-layer probe's peak while serving 110 MiB low on s8 and s16. Calibrated as a search does now
    (on a start with an expert layer on the card: another probe of the same search), within 64 MiB, on the safe side."""
    sys.path.insert(0, str(REPO / "bench"))
    import serving_peak

    lease = REPO / "bench" / "results" / "lease-2026-12-08-s33"
    for shape in ("s8", "s16"):
        results = lease / f"{shape}-100k" / f"{shape}-100k" / "tune" / "results"
        manifest = json.loads((results / "models" / shape / "manifest.json").read_text())
        (search_dir,) = (results / "search" / shape).iterdir()
        then = serving_peak.search_errors(search_dir, manifest)  # the search's own all-CPU calibration
        now = serving_peak.search_errors(search_dir, manifest, own=False)
        whole = lambda found: [p["error_mib"] for p in found["probes"] if not p["override_tensor"]]  # noqa: E731
        assert whole(then) and all(e < -64 for e in whole(then)), then
        assert all(0 <= e <= 64 for e in whole(now)), now
        assert all(p["calibrated_on"]["n_cpu_moe"] < manifest["layers"] for p in now["probes"])
