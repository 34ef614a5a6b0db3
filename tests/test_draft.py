"""Speculative decoding for real: the real gemma-3-270m as its own draft model (the plumbing's test: a greedy
draft of the same model should be accepted almost always). The server's counts of drafted and accepted tokens
are recorded per workload and carried into the measurements table."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from crashline.tables import aggregate
from crashline.report import rows as rows_mod
from crashline.report import model_sections
from crashline.report.doc import Table
from crashline.core.records import Outcome

from helpers import measure_gemma

pytestmark = pytest.mark.e2e


def test_gemma_as_its_own_draft_is_accepted_and_recorded(tmp_path, gemma_fetch, server_provenance):
    path = gemma_fetch["files"][0]["path"]
    config = {
        "models": {"gemma": {"source": f"file:{path}"}, "draft": {"source": f"file:{path}"}},
        "defaults": {"threads": 2, "ctx": 2048},
        "configurations": [{"models": ["gemma"], "settings": {"draft_model": "draft", "draft_max": 8}}],
        "workloads": [{"name": "w", "prompt_tokens": 128, "gen_tokens": 96}],
        "repetitions": 2,
    }
    rec = measure_gemma(tmp_path, gemma_fetch, server_provenance, config, draft_path=path)
    assert rec["outcome"] == Outcome.OK, rec["message"]
    assert rec["command"][rec["command"].index("-md") + 1] == path and "--spec-draft-n-max" in rec["command"]
    assert rec["command"][rec["command"].index("--spec-type") + 1] == "draft-simple"
    (w,) = rec["workloads"]
    requests = [r for run in w["runs"] for r in run["requests"]]
    assert all(r["draft_n"] and r["draft_n_accepted"] <= r["draft_n"] for r in requests)
    assert w["draft"]["drafted"] == sum(r["draft_n"] for r in requests)
    assert w["draft"]["acceptance"] > 0.75, w["draft"]  # 0.92 here: a batch of drafts verifies to slightly other logits
    tables = {name: tmp_path / f"{name}.parquet" for name in ("configs", "measurements")}
    aggregate.write([tmp_path / "measure.json"], tables["configs"], tables["measurements"])
    (row,) = pq.read_table(tables["measurements"]).to_pylist()
    assert (row["draft_drafted"], row["draft_accepted"]) == (w["draft"]["drafted"], w["draft"]["accepted"])
    # the report's results table says it beside the speeds
    configs, measurements = (pq.read_table(tables[n]).to_pandas() for n in ("configs", "measurements"))
    rows = [{**r, "differs": ""} for r in rows_mod.result_rows(configs, measurements, set())]
    (table,) = [b for b in model_sections.results(rows) if isinstance(b, Table)]
    (cells,) = table.rows
    accepted = f"{w['draft']['acceptance']:.0%} of {w['draft']['drafted']:,}"
    assert cells[table.header.index("draft tokens accepted")] == accepted
