"""Tables and report from real records that crashline wrote on an H200 under an emulated 12 GiB
budget (bench/placement.py): failure kinds, crash line, margin, and llama.cpp's --fit choice."""

from __future__ import annotations

import pytest
import yaml

from crashline import aggregate, config as C, report
from crashline.atomic import read_json

from conftest import FIXTURES, REPO

RECORDS = FIXTURES / "h200-records"


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu-report")
    schema = yaml.safe_load((REPO / "config" / "schema.yaml").read_text())
    cfg = C.validate({
        "models": {"moe-synthetic": {"source": "synthetic:qwen3-30b-a3b"}},
        "configurations": [{"settings": {}}],
        "workloads": [{"name": "short", "prompt_tokens": 128, "gen_tokens": 64},
                      {"name": "depth-16k", "prompt_tokens": 16384, "gen_tokens": 32}],
        "repetitions": 2, "budget": {"vram_budget_mib": 12288, "margin_mib": 1024},
    }, schema)
    records = sorted(p for p in RECORDS.glob("*.json") if p.name != "provenance.json")
    configs, measurements = aggregate.write(records, out / "configs.parquet", out / "measurements.parquet")
    report.render(out / "configs.parquet", out / "measurements.parquet", RECORDS / "provenance.json", cfg,
                  out / "report.md", out / "report.html")
    return configs, (out / "report.md").read_text(), (out / "report.html").read_text()


def test_failure_kinds_and_phases(rendered):
    configs, _, _ = rendered
    by_n = {int(r.s_n_cpu_moe): (r.outcome, r.failure, r.phase) for r in configs.itertuples() if r.s_fit == "off"}
    assert by_n[12] == ("load_failed", "weights", "load")
    assert by_n[14] == ("load_failed", "kv_cache", "load")
    assert by_n[23] == ("load_failed", "compute_buffer", "load")
    assert all(by_n[n][0] == "ok" for n in (25, 26, 29, 31))


def test_vram_is_the_servers_own_and_headroom_is_against_the_budget(rendered):
    configs, _, _ = rendered
    ok = configs[configs["outcome"] == "ok"]
    assert (ok["vram_limit_mib"] == 12288).all()
    assert ((ok["headroom_mib"] - (12288 - ok["peak_gpu_mib"])).abs() < 0.01).all()
    # More experts on the CPU, less VRAM: monotonic in the real runs.
    peaks = ok[ok["s_fit"] == "off"].sort_values("s_n_cpu_moe")["peak_gpu_mib"].tolist()
    assert peaks == sorted(peaks, reverse=True)


def test_report_states_crash_line_margin_and_fit(rendered):
    configs, md, html = rendered
    assert "NVIDIA H200" in md and "12288 MiB (emulated)" in md
    assert "loads from n_cpu_moe 25" in md and "survives every workload from n_cpu_moe 25" in md
    assert "less than the margin: risky" in md
    for n in (25, 26):  # survived, but with less than 1024 MiB to spare: never recommended
        cid = configs[(configs["s_n_cpu_moe"] == n)]["config_id"].iloc[0]
        assert f"`{cid}` — risky: survived with" in md
    fit_id = configs[configs["s_fit"] == "on"]["config_id"].iloc[0]
    assert f"| `--fit on` | `{fit_id}` | ok |" in md and "llama.cpp's own choice" in html
    assert "Recommended:" in md


def test_oom_at_warmup_recorded_on_the_gpu():
    rec = read_json(FIXTURES / "h200-records-11761" / "ncmoe26-ub2048.json")
    assert (rec["outcome"], rec["failure"], rec["phase"]) == ("oom", "oom", "warmup")
    assert rec["returncode"] == -6 and "out of memory" in rec["message"]
    survivor = read_json(FIXTURES / "h200-records-11761" / "ncmoe26-ub512.json")
    assert survivor["outcome"] == "ok"  # the same split survives with a smaller compute buffer
