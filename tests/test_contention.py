"""Pairs measured while other processes competed are inconclusive wherever the report sets them side by side (#41):
the cold versus warm table (a cold twin read 3.4× faster than its warm twin on a busy machine) and what limits decode
(contention first among the suspects). Ranking, compare and recheck: tests/test_recommend.py, test_exit_codes.py."""

from __future__ import annotations

import pandas as pd
import pytest

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


def test_the_printed_summary_marks_a_tied_speed_and_names_the_whole_runs_peak(tmp_path):
    """#41: tune's printed table showed 1232.3 vs 933.0 for configurations it called tied, with no mark; "peak RSS"
    meant the whole run in one table and the workload in the other."""
    import sys

    from conftest import RECHECK, REPO

    sys.path.insert(0, str(REPO / "bench"))
    import rerender

    report = rerender.rerender(RECHECK / "native" / "results", tmp_path)  # two configurations, tied end to end
    table = [line for line in (report.parent / "summary.md").read_text().splitlines() if line.startswith("| ")]
    assert table[0].endswith("| end to end t/s | peak RSS MiB (whole run) |")
    assert [line.split(" | ")[5] for line in table[2:]] == ["289.6 (tied)", "267.3 (tied)"]
    assert "| peak RSS MiB (workload) |" in report.read_text()


def test_the_timed_requests_wait_for_a_burst_of_other_load_to_pass_and_no_longer():
    """#41 item 1: a measurement whose warm-up ran beside other processes waits (bounded) for a quiet stretch before
    its timed requests, on real /proc counters: a busy process of about 2 s is waited out; one that stays is not,
    and the wait says so. The "server" here is an idle process, as a server between requests."""
    import subprocess
    import sys
    import time

    from crashline.engine.telemetry import Sampler

    server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    spin = "import time\nend = time.time() + {}\nwhile time.time() < end: pass"
    try:
        sampler = Sampler(server.pid)
        with sampler:
            if not (before := sampler.quiet(10.0, step_s=0.5))["quiet"]:
                pytest.skip(f"other processes keep {before['other_cores']} cores busy: no quiet stretch to wait for")
            busy = subprocess.Popen([sys.executable, "-c", spin.format(2.5)])
            time.sleep(0.5)  # the warm-up: others busy
            found = sampler.quiet(20.0, step_s=0.5)
            busy.wait()
            assert found["quiet"] and 1.0 <= found["waited_s"] <= 6.0, found
            assert sampler.quiet(20.0, step_s=0.5) == {"waited_s": 0.0, "other_cores": pytest.approx(0, abs=0.3),
                                                         "quiet": True}  # fmt: skip
            stays = subprocess.Popen([sys.executable, "-c", spin.format(30)])
            try:
                time.sleep(0.5)
                found = sampler.quiet(2.0, step_s=0.5)
            finally:
                stays.kill()
            assert not found["quiet"] and 2.0 <= found["waited_s"] <= 3.5 and found["other_cores"] > 0.3, found
    finally:
        server.kill()
