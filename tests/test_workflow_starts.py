"""An entry's later server starts run interleaved (#41 item 1): start 2 of a model's configurations only once each has
made start 1 (A B, A B), so that drift between starts hits every configuration alike; a configuration whose first start
failed is not started again, and says so. A later start repeats the timed workloads only: the conversation, a check of
survival, runs in the first."""

from __future__ import annotations

import json
import pandas as pd
import pytest

from conftest import snakemake_in
from helpers import copy_workflow

pytestmark = pytest.mark.e2e

CONFIG = """\
models:
  tiny-moe: {source: "synthetic:tiny-moe"}
defaults: {ctx: 1024, threads: 2}
configurations:
  - grid: {ubatch: [128, 512]}
    starts: 2
  - settings: {ctx: 256}
    starts: 2
workloads:
  - {name: short, prompt_tokens: 300, gen_tokens: 8}
conversations:
  - {name: chat, turn_tokens: 64, reply_tokens: 8, depth_tokens: 192, at_once: 1, restart: true}
repetitions: 1
validity: {enabled: false}
"""


def test_later_starts_run_once_every_configuration_made_the_one_before(tmp_path, server_provenance):
    work = tmp_path / "run"
    work.mkdir()
    copy_workflow(work)
    (work / "config" / "config.yaml").write_text(CONFIG)
    done = snakemake_in(work, "report")
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]

    folders = sorted((work / "results" / "records" / "tiny-moe").iterdir())
    first = {f.name: json.loads((f / "measure.json").read_text()) for f in folders}
    second = {f.name: json.loads((f / "start-2" / "measure.json").read_text()) for f in folders}
    failed = [cid for cid, rec in first.items() if rec["outcome"] != "ok"]
    assert len(failed) == 1 and first[failed[0]]["outcome"] == "context_exceeded"
    assert second[failed[0]]["left_out"].startswith("start 1 ended context_exceeded (short: request (300 tokens)")
    served = [cid for cid in first if cid not in failed]
    assert len(served) == 2 and all(second[cid]["outcome"] == "ok" for cid in served)
    # round 2 begins once round 1 has ended, for every configuration: A B, A B
    assert max(rec["finished_at"] for rec in first.values()) <= min(second[cid]["started_at"] for cid in served)

    configs = pd.read_parquet(work / "results" / "tables" / "configs.parquet").set_index("config_id")
    assert configs.loc[served, "starts"].tolist() == [2, 2] and configs.loc[failed[0], "starts"] == 1
    measurements = pd.read_parquet(work / "results" / "tables" / "measurements.parquet").set_index("config_id")
    assert measurements.loc[served, "decode_tps_n"].tolist() == [2, 2]  # one timed request of each start
    # the conversation ran in each first start, with its restart, and in no later one: its row is the first start's
    assert all(first[cid]["conversations"][0]["outcome"] == "ok" for cid in served)
    assert all(
        second[cid]["conversations"] == [] and "conversations" not in second[cid]["job_config"] for cid in served
    )
    # two starts and the first's restart case: three servers each
    assert configs.loc[served, "server_starts"].tolist() == [3, 3]
    talks = pd.read_parquet(work / "results" / "tables" / "conversations.parquet").set_index("config_id")
    assert sorted(talks.loc[served].index) == sorted(served) and set(talks.loc[served, "outcome"]) == {"ok"}
    again = snakemake_in(work, "-n", "report")
    assert "Nothing to be done" in again.stdout + again.stderr
