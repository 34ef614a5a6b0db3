"""Tables and report from real records that crashline wrote on an H200 under an emulated 12 GiB
budget (bench/placement.py): failure kinds, crash line, margin, and llama.cpp's --fit choice."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest

from crashline.config import load_schema
from crashline import aggregate, config as C, report
from crashline.atomic import read_json

from conftest import FIXTURES

RECORDS = FIXTURES / "h200-records"


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu-report")
    schema = load_schema()
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
    return configs, (out / "report.md").read_text(), (out / "report.html").read_text(), out / "report.html"


def test_failure_kinds_and_phases(rendered):
    configs = rendered[0]
    by_n = {int(r.s_n_cpu_moe): (r.outcome, r.failure, r.phase) for r in configs.itertuples() if r.s_fit == "off"}
    assert by_n[12] == ("load_failed", "weights", "load")
    assert by_n[14] == ("load_failed", "kv_cache", "load")
    assert by_n[23] == ("load_failed", "compute_buffer", "load")
    assert all(by_n[n][0] == "ok" for n in (25, 26, 29, 31))


def test_vram_is_the_servers_own_and_headroom_is_against_the_budget(rendered):
    configs = rendered[0]
    ok = configs[configs["outcome"] == "ok"]
    assert (ok["vram_limit_mib"] == 12288).all()
    assert ((ok["headroom_mib"] - (12288 - ok["peak_gpu_mib"])).abs() < 0.01).all()
    # More experts on the CPU, less VRAM: monotonic in the real runs.
    peaks = ok[ok["s_fit"] == "off"].sort_values("s_n_cpu_moe")["peak_gpu_mib"].tolist()
    assert peaks == sorted(peaks, reverse=True)


def test_report_states_crash_line_margin_and_fit(rendered):
    configs, md, html, _ = rendered
    assert "NVIDIA H200" in md and "12288 MiB (emulated)" in md
    assert "loads from n_cpu_moe 25" in md and "survives every workload from n_cpu_moe 25" in md
    assert "less than the margin: risky" in md
    for n in (25, 26):  # survived, but with less than 1024 MiB to spare: never recommended
        cid = configs[(configs["s_n_cpu_moe"] == n)]["config_id"].iloc[0]
        assert f"- `--n-cpu-moe {n}` (`{cid}`) — risky: survived with" in md
    fit_id = configs[configs["s_fit"] == "on"]["config_id"].iloc[0]
    assert f"| `--fit on` | `{fit_id}` | ok |" in md and "llama.cpp's own choice" in html
    assert "Recommended:" in md


def test_oom_at_warmup_recorded_on_the_gpu():
    rec = read_json(FIXTURES / "h200-records-11761" / "ncmoe26-ub2048.json")
    assert (rec["outcome"], rec["failure"], rec["phase"]) == ("oom", "oom", "warmup")
    assert rec["returncode"] == -6 and "out of memory" in rec["message"]
    survivor = read_json(FIXTURES / "h200-records-11761" / "ncmoe26-ub512.json")
    assert survivor["outcome"] == "ok"  # the same split survives with a smaller compute buffer


def test_html_report_in_a_real_browser(rendered, tmp_path):
    """Headless Chromium loads the page; the DOM it builds has every table row and no template residue."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("chromium is not installed (.ci/run installs it)")
    configs, _, _, html_path = rendered
    proc = subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}",
         "--dump-dom", html_path.as_uri()],
        capture_output=True, text=True, timeout=120,
    )
    dom = proc.stdout
    assert proc.returncode == 0 and "<table>" in dom and "{{" not in dom and "{%" not in dom
    rows = re.findall(r'<tr class="(?:rec)?"><td><code>(\w+)</code>', dom)
    ok = configs[configs["outcome"] == "ok"]
    assert len(rows) == len(ok) * 2 + len(configs) - len(ok)  # two workloads per survivor, one row per failure
    assert "Recommended:" in dom and "llama.cpp's own choice" in dom


def test_search_summary_from_the_gpu():
    """The workflow's search (crashline.search) run on the H200 at a 12 GiB budget, ubatch 2048."""
    table = aggregate.search_table([FIXTURES / "h200-search" / "search.json"])
    (row,) = table.to_dict("records")
    assert (row["predicted_lowest"], row["boundary"], row["recommended_n_cpu_moe"]) == (25, 25, 29)
    assert json.loads(row["probes"]) == [{"n_cpu_moe": 25, "survived": True}, {"n_cpu_moe": 24, "survived": False}]
    assert row["server_starts"] == 7  # calibration at 48, the two probes, then 26..29 up to the margin
    statuses = {v["n_cpu_moe"]: v["status"] for v in json.loads(row["values"])}
    assert statuses[23] == "skipped: predicted to need 488 MiB more than the budget"
    assert statuses[40].startswith("not measured") and statuses[48] == "measured"
