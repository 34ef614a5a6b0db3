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

from crashline import config as C, locks
from crashline.paths import Layout

from conftest import REPO
from fake_nvml import FakeNvml
from test_measure import SCHEMA, fetch_record, measure_one
from test_workflow_e2e import snakemake

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
