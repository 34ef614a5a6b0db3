"""What is left of a run (#27 item 8: an ETA for the whole run, not only for a search)."""

import json
from pathlib import Path

from crashline.config import plan as C
from crashline.core.paths import Layout, SearchFolder
from crashline.core.progress import duration
from crashline.engine import eta


def _config(tmp_path, vram=12288):
    return C.validate(
        {
            "results_dir": str(tmp_path / "results"),
            "models": {"m": {"source": "synthetic:tiny-moe"}},
            "configurations": [
                {"settings": {"ubatch": 512}},
                {"settings": {"ubatch": 512, "page_cache": "cold"}},  # the same server: its recall is the first's
                {"grid": {"ubatch": [512]}, "search": {"n_cpu_moe": [0, 8]}},
            ],
            "workloads": [{"name": "w", "prompt_tokens": 64, "gen_tokens": 8}],
            "budget": {"vram_budget_mib": vram},
        },
        C.load_schema(),
    )


def _record(path, total_s):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"time_budget_s": {"total": total_s}}))


def _planned(cfg, monkeypatch):
    """Where the run's plan goes (set for the server jobs, as the workflow sets it) and a clock the test moves."""
    path = Layout(cfg["results_dir"]).run_plan()
    path.parent.mkdir(parents=True, exist_ok=True)
    monkeypatch.setenv(eta.PLAN_ENV, str(path))
    clock = [1000.0]
    monkeypatch.setattr(eta.time, "time", lambda: clock[0])
    return path, clock


def test_the_run_left_counts_the_missing_jobs_starts_at_the_mean_start_so_far(tmp_path):
    cfg = _config(tmp_path)
    jobs = eta.plan(cfg)
    (group,) = C.expand_searches(cfg)
    search = eta.search_starts(group, has_limit=True)
    # the two configurations' measurements and one needle job (the cold one's recall is its twin's), the search
    # and its recall check
    assert sorted(j["job"] for j in jobs) == ["measure", "measure", "needle", "needle", "search", "search_needle"]
    assert eta.left(jobs) == (2 + 1 + search + 1, None)  # no start recorded yet: no time
    assert eta.text(*eta.left(jobs)) == f"run: about {2 + 1 + search + 1} more server start(s)"

    layout = Layout(cfg["results_dir"])
    first, second = C.expand(cfg)
    _record(layout.record("m", first["id"]), 30.0)  # one measurement done, in 30 s
    probes = SearchFolder(layout.search("m", group["id"]).parent).probes()
    _record(probes / "abc" / "calibration" / "measure.json", 10.0)  # the search's calibration, running
    _record(probes / "abd" / "measure.json", 20.0)
    starts = 1 + 1 + (search - 2) + 1
    assert eta.left(jobs) == (starts, starts * 20.0)
    assert eta.text(*eta.left(jobs)) == f"run: about {starts} more server start(s), {duration(starts * 20.0)} left"

    for job in jobs:  # everything done: nothing to say
        _record(Path(job["out"]), 1.0)
    assert eta.left(jobs)[0] == 0 and eta.text(*eta.left(jobs)) == ""


def test_a_search_without_a_vram_limit_plans_no_margin_probe(tmp_path):
    (group,) = C.expand_searches(_config(tmp_path, vram=None))
    assert eta.search_starts(group, has_limit=False) == eta.search_starts(group, has_limit=True) - 1


def test_a_server_job_says_the_run_left_from_the_plan_the_workflow_wrote(tmp_path, monkeypatch, capsys):
    cfg = _config(tmp_path)
    path = Layout(cfg["results_dir"]).run_plan()
    jobs = eta.write_plan(cfg, path)
    monkeypatch.setenv(eta.PLAN_ENV, str(path))
    eta.say_left()
    assert f"run: about {eta.left(jobs)[0]} more server start(s)" in capsys.readouterr().err
    monkeypatch.delenv(eta.PLAN_ENV)
    eta.say_left()  # outside a workflow: nothing
    assert capsys.readouterr().err == ""


def test_a_stopped_run_resumed_goes_on_counting_its_time_limit(tmp_path, monkeypatch):
    """tune --time 14m stopped by SIGTERM after 5 minutes and run again (a lease's call ends; a user's Ctrl-C): the
    time limit goes on from 5 minutes, not from zero; a run of other jobs in the folder starts from zero."""
    cfg = _config(tmp_path)
    path, clock = _planned(cfg, monkeypatch)
    eta.write_plan(cfg, path)
    clock[0] += 300.0
    eta.stop_plan(path)
    clock[0] += 3600.0  # an hour between the two
    eta.write_plan(cfg, path)
    assert eta.run_started() == clock[0] - 300.0
    other = {**cfg, "configurations": cfg["configurations"][:1]}
    eta.write_plan(other, path)
    assert eta.run_started() == clock[0]
    eta.write_plan(cfg, path)  # a run that was not stopped (it ended, or was killed): from zero
    assert eta.run_started() == clock[0]


def test_an_optional_start_leaves_time_for_the_starts_other_jobs_must_still_make(tmp_path, monkeypatch):
    """#40 item 3: on the H200 a 15-minute tune took 19.9: the optional starts that ran first left no time for the
    other search's boundary and the references' first starts, which a time limit never leaves out."""
    cfg = _config(tmp_path)
    path, clock = _planned(cfg, monkeypatch)
    jobs = eta.write_plan(cfg, path)
    (search,) = [j for j in jobs if j["job"] == "search"]
    clock[0] += 600.0 - 140.0  # 140 s of a 10-minute limit left: without the owed starts, time for a climb start
    # the search asks for a climb start of 50 s; both measurements' first starts (cold and warm) are still owed
    cut = eta.over_time("the climb", 600, [50.0], 0.0, Path(search["out"]))
    assert cut == (
        "the climb left out: the time limit (10 min) leaves 40 s once 2 start(s) other jobs must still make are set "
        "aside, and a server start takes about 50 s"
    )
    assert eta.reserved(None) == 2 + eta.search_must(has_limit=True)  # seen from outside: the search's owed too
    first, second = C.expand(cfg)
    layout = Layout(cfg["results_dir"])
    _record(layout.record("m", first["id"]), 50.0)
    _record(layout.record("m", second["id"]), 50.0)
    assert eta.over_time("the climb", 600, [50.0], 0.0, Path(search["out"])) is None  # nothing owed: it runs


def test_a_fit_aimed_at_the_margin_counts_two_starts_owes_one_and_its_later_starts_none(tmp_path):
    """Every --fit on aimed at the margin in the committed leases took two or three starts (AIMED_FIT_STARTS); the
    first now ends once loaded (a load's seconds), so a time limit sets aside one whole start for it (session 30:
    two, at 100K, and the run went past its --time)."""
    cfg = C.validate(
        {
            "results_dir": str(tmp_path / "results"),
            "models": {"m": {"source": "synthetic:tiny-moe"}},
            "configurations": [
                {"settings": {"fit": "on"}, "starts": 2},
                {"settings": {"fit": "on", "fit_target": 512}},
            ],
            "workloads": [{"name": "w", "prompt_tokens": 64, "gen_tokens": 8}],
            "budget": {"vram_budget_mib": 12288},
        },
        C.load_schema(),
    )
    measures = [(j["starts"], j["must"]) for j in eta.plan(cfg) if j["job"] == "measure"]
    # aimed: two starts, one owed, its second start optional; a target the config gives runs once, as given
    assert measures == [(eta.AIMED_FIT_STARTS, 1), (1, 0), (1, 1)]
