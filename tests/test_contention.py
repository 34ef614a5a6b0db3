"""Pairs measured while other processes competed are inconclusive wherever the report sets them side by side (#41):
the cold versus warm table (a cold twin read 3.4× faster than its warm twin on a busy machine) and what limits decode
(contention first among the suspects). Ranking, compare and recheck: tests/test_recommend.py, test_exit_codes.py."""

from __future__ import annotations

import pandas as pd

from crashline.report.build import cold_warm
from crashline.report.suspects import limits

STATS = {
    f"{metric}_{name}": value
    for metric, median in (("prefill_tps", 300.0), ("decode_tps", 40.0))
    for name, value in (("median", median), ("min", median * 0.98), ("max", median * 1.02), ("n", 3))
}


def _tables(other_cores: dict[str, float]):
    configs = pd.DataFrame(
        [
            {"model": "m", "environment": "e", "config_id": state, "s_page_cache": state, "s_ubatch": 512,
             "page_cache_resident_at_start": 1.0, "load_s": 1.0}
            for state in ("cold", "warm")
        ]
    )  # fmt: skip
    measurements = pd.DataFrame(
        [
            {"model": "m", "config_id": state, "workload": "w", "workload_outcome": "ok", "server_args": "-ub 512",
             "gpu": "no GPU", "cpu_other_cores": other_cores[state], "cpu_logical_cores": 2, "bottleneck_rows": [],
             "decode_bound_tps": None, "decode_bound_unknown": None, "measured_over_bound": None,
             "bottleneck_verdict": None, **STATS}
            for state in ("cold", "warm")
        ]
    )  # fmt: skip
    return configs, measurements


BUSY = "inconclusive: other processes used 1.2 of 2 cores during these measurements; rerun on a quiet machine"


def test_cold_against_warm_is_inconclusive_where_others_competed_on_either_side():
    (quiet,) = cold_warm(*_tables({"cold": 0.1, "warm": 0.1}))
    assert quiet["inconclusive"] is None
    (busy,) = cold_warm(*_tables({"cold": 0.1, "warm": 1.2}))
    assert busy["inconclusive"] == BUSY


def test_what_limits_decode_names_other_processes_first_where_they_competed():
    configs, measurements = _tables({"cold": 0.1, "warm": 1.2})
    rows = {r["config_id"]: r for r in limits(measurements, configs, "w")}
    assert rows["cold"]["deciding"] == "–"
    assert rows["warm"]["deciding"] == "other processes 1.2 of 2 cores: rerun on a quiet machine"
