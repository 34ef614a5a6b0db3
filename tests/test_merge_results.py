"""Results from several machines in one set of tables and one report (merge_results): the records of another
run join this run's tables with the host they ran on, and the report ranks each kind of machine apart.

The other machine is this one with a GPU: its record is measured by the current code with a real llama-server
(CPU build) while NVML is the fake of tests/fake_nvml.py (two H200 boards), so its environment differs from the
workflow's own run here (no GPU) in the GPU alone. The workflow itself runs for real."""

from __future__ import annotations

import sys

import pandas as pd
import pytest
import yaml

from crashline.config import plan as C
from crashline.core import locks
from crashline.core.paths import Layout

from conftest import REPO
from fake_nvml import FakeNvml
from helpers import SCHEMA, fetch_record, measure_one
from helpers import snakemake

pytestmark = pytest.mark.e2e


def config(tiny_moe, results: str, merge: list[str]) -> dict:
    return {
        "results_dir": results,
        "models": {"tiny": {"source": "synthetic:tiny-moe"}},  # random weights: no needle check
        "configurations": [{"grid": {"ubatch": [64, 128]}, "settings": {"ctx": 1024}}],
        "workloads": [{"name": "short", "prompt_tokens": 32, "gen_tokens": 8}],
        "repetitions": 1,
        "validity": {"enabled": False},
        "merge_results": merge,
    }


@pytest.fixture
def other_machine(tmp_path, tiny_moe, server_provenance, monkeypatch):
    """A results folder as a machine with two H200s leaves it: the first configuration's record."""
    other = tmp_path / "other" / "results"
    raw = config(tiny_moe, str(other), [])
    cid = C.expand(C.validate(raw, SCHEMA))[0]["id"]
    with monkeypatch.context() as patch:
        patch.setitem(sys.modules, "pynvml", FakeNvml(boards=2))
        patch.setattr(locks, "LOCK_DIR", tmp_path / "locks")
        patch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        folder = Layout(other).record("tiny", cid).parent
        rec = measure_one(folder, "tiny", fetch_record(tiny_moe), server_provenance, raw)
    assert rec["outcome"] == "ok" and rec["host"]["gpu"]["devices"][0]["name"] == "NVIDIA H200"
    return other, cid


def test_records_of_another_machine_join_the_tables_and_the_report_ranks_each_machine_apart(
    tmp_path, tiny_moe, other_machine
):
    other, shared_id = other_machine
    work = tmp_path / "here"
    work.mkdir()
    (work / "config.yaml").write_text(yaml.safe_dump(config(tiny_moe, "results", [str(other)])))
    snakemake(work, "-s", str(REPO / "Snakefile"), "report", "--configfile", "config.yaml")
    configs = pd.read_parquet(work / "results" / "tables" / "configs.parquet")
    assert len(configs) == 3 and configs["environment"].nunique() == 2
    both = configs[configs["config_id"] == shared_id]
    assert sorted(both["gpu"]) == ["NVIDIA H200", "no GPU"] and both["gpu_uuids"].notna().sum() == 1
    md = (work / "results" / "report.md").read_text()
    titles = [line for line in md.splitlines() if line.startswith("## tiny on ")]
    assert len(titles) == 2 and any("NVIDIA H200" in t for t in titles) and any("no GPU" in t for t in titles)
    assert md.count("**Use `") == 2  # one recommendation for each kind of machine
    # A record of the other machine that changes reruns the tables and the report; its removal as well.
    (other / "records" / "tiny" / shared_id / "measure.json").unlink()
    snakemake(work, "-s", str(REPO / "Snakefile"), "report", "--configfile", "config.yaml")
    assert len(pd.read_parquet(work / "results" / "tables" / "configs.parquet")) == 2
    assert "## tiny on " not in (work / "results" / "report.md").read_text()


def test_a_merge_folder_without_results_is_refused(tmp_path, tiny_moe):
    with pytest.raises(C.ConfigError, match=r"merge_results.0 = '.*nowhere': no crashline results there"):
        C.validate(config(tiny_moe, str(tmp_path / "results"), [str(tmp_path / "nowhere")]), SCHEMA)


def test_a_merge_folder_listed_twice_is_refused(tmp_path, tiny_moe):
    (tmp_path / "other" / "records").mkdir(parents=True)
    twice = [str(tmp_path / "other"), str(tmp_path / "other" / ".")]
    with pytest.raises(C.ConfigError, match=r"merge_results.1 = '.*' is listed twice; keep one"):
        C.validate(config(tiny_moe, str(tmp_path / "results"), twice), SCHEMA)


def test_the_same_configuration_from_two_hosts_of_one_kind_is_ranked_once_the_later(other_machine):
    """Identical nodes rank together (one environment): a configuration both measured is one row, the later
    measurement; two records of one host (a search's probe and a grid point) both stay, as before."""
    import copy

    from crashline.tables import aggregate
    from crashline.core import records

    other, cid = other_machine
    rec = records.load(other / "records" / "tiny" / cid / "measure.json", "measure")
    twin = copy.deepcopy(rec)
    twin["host"]["hostname"], twin["finished_at"] = "node-2", "2999-01-01T00:00:00+00:00"
    kept = aggregate.latest_of_each_host_kind([rec, twin])
    assert [r["host"]["hostname"] for r in kept] == ["node-2"]
    assert aggregate.latest_of_each_host_kind([twin, rec]) == [twin]
    assert len(aggregate.latest_of_each_host_kind([rec, copy.deepcopy(rec)])) == 2


def test_llama_bench_checks_only_what_this_kind_of_machine_measured(other_machine):
    """Records merged from another kind of machine are not compared with this machine's llama-bench."""
    from crashline.tables import aggregate
    from crashline.core import host, records
    from crashline.crosscheck.validity import this_machine

    other, cid = other_machine
    theirs = records.load(other / "records" / "tiny" / cid / "measure.json", "measure")
    ours = {**theirs, "host": host.describe()}  # the same record as if measured here
    table = pd.DataFrame([aggregate._config_row(r) for r in (theirs, ours)])
    assert table["gpu"].tolist() == ["NVIDIA H200", "no GPU"]
    assert this_machine(table)["gpu"].tolist() == ["no GPU"]


def test_another_run_s_later_starts_are_merged_with_their_first(tmp_path):
    """An entry's starts (start-K/ beside the first record) come with the other run's records, to be pooled."""
    from crashline.core.paths import merged_records

    other = tmp_path / "other"
    for rel in ("records/m/aaaaaaaaaa/measure.json", "records/m/aaaaaaaaaa/start-2/measure.json"):
        (other / rel).parent.mkdir(parents=True, exist_ok=True)
        (other / rel).write_text("{}")
    (other / "records" / "m" / "aaaaaaaaaa" / "needle.json").write_text("{}")
    found = [p.relative_to(other).as_posix() for p in merged_records([str(other)], ["m"], "measure")]
    assert found == ["records/m/aaaaaaaaaa/measure.json", "records/m/aaaaaaaaaa/start-2/measure.json"]
    assert [p.name for p in merged_records([str(other)], ["m"], "needle")] == ["needle.json"]
