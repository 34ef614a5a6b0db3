"""llama-bench beside crashline: a real gemma-3-270m measured by crashline, then the same configuration through
the real llama-bench built beside llama-server; the record puts the two speeds side by side with their ratio,
and the report says it."""

from __future__ import annotations

import subprocess
import sys
import time

import pyarrow.parquet as pq
import pytest

from crashline.tables import aggregate
from crashline.config import plan as C
from crashline.report import rows as rows_mod
from crashline.crosscheck import validity
from crashline.core.atomic import read_json
from crashline.report import model_sections
from crashline.report.doc import Table

from helpers import SCHEMA, measure_gemma


def test_bench_arguments_follow_the_settings_and_name_what_llama_bench_cannot_express():
    settings = {
        "n_gpu_layers": 999,
        "n_cpu_moe": 12,
        "ubatch": 1024,
        "cache_type_k": "q8_0",
        "override_tensor": "blk\\.1\\.=CPU,blk\\.2\\.=CPU",
        "threads": None,
        "threads_batch": 8,
        "draft_model": "small",
        "ctx": 65536,
        "parallel": 2,
        "split_mode": "layer",
        "tensor_split": "3,1",
    }
    args, left_out = validity.bench_args(settings, {"n_threads": 4, "n_threads_batch": 8})
    assert args == ["-ngl", "999", "-ncmoe", "12", "-ub", "1024", "-ctk", "q8_0", "-ot"] + [
        "blk\\.1\\.=CPU;blk\\.2\\.=CPU",
        "-sm",
        "layer",
        "-ts",
        "3/1",
        "-t",
        "4",
    ]
    assert left_out == ["draft_model", "threads_batch 8 (llama-bench uses -t 4 for prefill too)"]


@pytest.mark.e2e
def test_llama_bench_beside_crashline_on_gemma(tmp_path, gemma_fetch, server_provenance):
    path = gemma_fetch["files"][0]["path"]
    config = {
        "models": {"gemma": {"source": f"file:{path}"}},
        "defaults": {"threads": 2},
        "configurations": [{"settings": {"ubatch": 256, "parallel": 2, "ctx": 8192}}],
        "workloads": [
            {"name": "short", "prompt_tokens": 128, "gen_tokens": 32},
            {"name": "long", "prompt_tokens": 1024, "gen_tokens": 32},
            {"name": "two", "prompt_tokens": 128, "gen_tokens": 32, "concurrency": 2},
        ],
        "repetitions": 2,
        "validity": {"repetitions": 2},
    }
    (tmp_path / "records").mkdir()
    item_id = measure_gemma(tmp_path / "records", gemma_fetch, server_provenance, config)["config_id"]
    record = tmp_path / "records" / "measure.json"
    tables = {name: tmp_path / f"{name}.parquet" for name in ("configs", "measurements")}
    aggregate.write([record], tables["configs"], tables["measurements"])
    out = tmp_path / "llama-bench.json"
    validity.job(C.validate(config, SCHEMA), {**tables, "needle": None}, server_provenance, {"gemma": path}, out)
    written = read_json(out)
    (checked,) = written["checked"]
    assert (checked["model"], checked["config_id"], checked["outcome"]) == ("gemma", item_id, "ok")
    measured = {r["workload"]: r for r in pq.read_table(tables["measurements"]).to_pylist()}
    # one request at a time only: the workload of two at once has no llama-bench counterpart
    assert [r["workload"] for r in checked["rows"]] == ["short", "long"]
    for r in checked["rows"]:
        prefill, decode = r["bench_prefill"], r["bench_decode"]
        test = ["-p", str(r["prompt_tokens"]), "-n", "0", "-d", "0"]
        assert prefill["command"][-10:-4] == test and prefill["command"][-4:] == ["-r", "2", "-o", "json"]
        assert prefill["command"][prefill["command"].index("-ub") + 1] == "256"
        assert decode["command"][decode["command"].index("-d") + 1] == str(r["prompt_tokens"])
        assert len(prefill["samples"]) == len(decode["samples"]) == 2 and prefill["mean_tps"] > 0
        assert r["crashline_decode_tps"] == measured[r["workload"]]["decode_tps_median"]
        assert r["decode_ratio"] == round(r["crashline_decode_tps"] / decode["mean_tps"], 4)
        assert r["flagged"] == [k for k in ("prefill", "decode") if abs(r[f"{k}_ratio"] - 1) > validity.TOLERANCE]
    # the report's table: both speeds and the ratio per workload
    shown = rows_mod.validity_rows(written, "gemma")
    (table,) = [b for b in model_sections.validity(shown) if isinstance(b, Table)]
    workload, decode = table.header.index("workload"), table.header.index("decode")
    assert [row[workload] for row in table.rows] == ["short (128 + 32)", "long (1,024 + 32)"]
    assert f"({checked['rows'][1]['decode_ratio']:.2f})" in table.rows[1][decode].content
    # each side's competition, as for a measurement: llama-bench's own cores and every other process's (#27)
    for r in checked["rows"]:
        assert r["bench_decode"]["cpu_bench_cores"] > 0.5 and r["bench_decode"]["cpu_other_cores"] >= 0
        assert r["crashline_cpu_other_cores"] == measured[r["workload"]]["cpu_other_cores"]
    others = table.header.index("others' cores")
    assert all(row[others].content.startswith("llama-bench ") for row in table.rows)


@pytest.mark.server
def test_a_busy_machine_is_named_as_the_side_disturbed(tiny_moe, server_provenance):
    """A llama-bench check at 31.7x on a busy machine concluded "that gap is the server's" (#27): the other
    processes' CPU is recorded for each test, and a row where they competed says which side, not a conclusion."""
    binary = server_provenance["bench_binary"]
    test = ["-p", "256", "-n", "0", "-d", "0"]
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.5)
        busy = validity.run_bench(binary, str(tiny_moe), ["-t", "1"], test, 20, 120)
    finally:
        hog.kill()
        hog.wait()
    assert busy["cpu_other_cores"] > 0.5 and busy["cpu_bench_cores"] > 0.3, busy
    row = {"bench_prefill": busy, "bench_decode": None, "crashline_cpu_other_cores": 0.0}
    assert validity.disturbed(row) == ["llama-bench"]
    assert validity.disturbed({**row, "bench_prefill": {**busy, "cpu_other_cores": 0.1}}) == []
    assert validity.disturbed({**row, "crashline_cpu_other_cores": 1.2}) == ["llama-bench", "crashline"]
    text, flagged = rows_mod._others_cpu({**row, "bench_decode": {}})
    assert (
        flagged
        and text == f"llama-bench {busy['cpu_other_cores']:.1f}, crashline 0.0: llama-bench disturbed, not concluded"
    )
