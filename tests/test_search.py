"""The n_cpu_moe search with a real llama-server on the synthetic MoE (CPU: no VRAM limit, so the
lowest value survives and the search stops after the calibration and one probe)."""

from __future__ import annotations

import pandas as pd

from test_measure import fetch_record
from crashline.config import load_schema
from crashline import aggregate, config as C, report
from crashline.atomic import write_json
from crashline.manifest import inspect_gguf
from crashline.search import run_search


SCHEMA = load_schema()


def test_search_on_cpu_writes_probes_summary_and_report(tmp_path, tiny_moe, server_provenance):
    cfg = C.validate(
        {
            "models": {"tiny": {"source": f"file:{tiny_moe}"}},
            "defaults": {"threads": 2, "ctx": 2048},
            "configurations": [{"grid": {"ubatch": [256]}, "search": {"n_cpu_moe": [0, 4]}}],
            "workloads": [{"name": "short", "prompt_tokens": 64, "gen_tokens": 8}],
            "repetitions": 1,
        },
        SCHEMA,
    )
    assert C.expand(cfg) == []
    (group,) = C.expand_searches(cfg)
    assert group["range"] == [0, 4] and "n_cpu_moe" not in group["given"]
    fetch = fetch_record(tiny_moe)
    out = tmp_path / "search" / "tiny" / group["id"]
    summary = run_search(
        model_name="tiny",
        group=group,
        config=cfg,
        fetch_record=fetch,
        manifest=inspect_gguf(tiny_moe),
        provenance=server_provenance,
        out_dir=out,
    )
    assert summary["boundary"] == 0 and summary["recommended_n_cpu_moe"] == 0
    assert summary["probes"] == [{"n_cpu_moe": 0, "survived": True}]
    assert summary["server_starts"] == 2  # calibration at 4, then 0
    statuses = {v["n_cpu_moe"]: v["status"] for v in summary["values"]}
    assert statuses[0] == statuses[4] == "measured" and statuses[2].startswith("not measured")
    records = sorted((out / "records").glob("*/measure.json"))
    assert len(records) == 2
    configs, measurements = aggregate.write(
        records, tmp_path / "c.parquet", tmp_path / "m.parquet", [out / "search.json"], tmp_path / "s.parquet"
    )
    assert sorted(configs["s_n_cpu_moe"]) == [0, 4] and (configs["outcome"] == "ok").all()
    assert pd.read_parquet(tmp_path / "s.parquet")["server_starts"].tolist() == [2]
    write_json(tmp_path / "prov.json", server_provenance)
    report.render(
        tmp_path / "c.parquet",
        tmp_path / "m.parquet",
        tmp_path / "prov.json",
        cfg,
        tmp_path / "r.md",
        tmp_path / "r.html",
        tmp_path / "s.parquet",
    )
    md = (tmp_path / "r.md").read_text()
    assert "**Planner**" in md and "Probed in this order: 0." in md and "use n_cpu_moe 0" in md
    assert "- 0 ✓ chosen\n- 1–3 fit by the same prediction (not measured)\n- 4 ✓\n" in md  # every value, in runs
