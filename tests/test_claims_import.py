"""`crashline claims import`: real published speed tables (tests/fixtures/claims/real/, each with its source) read into
claims files that the loader takes once the model is named, what cannot be read said line by line and never guessed,
and a README read over HTTP (https:// and hf:, here from a local server) kept beside the claims file."""

from __future__ import annotations

import functools
import http.server
import threading
from pathlib import Path

import pytest
import yaml

from crashline.cli.main import main
from crashline.config import claims as K
from crashline.config import claims_import as CI

from conftest import FIXTURES
from test_claims import run_config

REAL = FIXTURES / "claims" / "real"


def imported(tmp_path: Path, name: str) -> tuple[CI.Imported, dict]:
    """The fixture ``name`` imported for the model "m" of test_claims' config: what import read, the file's content."""
    out = tmp_path / f"{Path(name).stem}.yaml"
    result = CI.import_claims(str(REAL / name), out, model="m")
    return result, yaml.safe_load(out.read_text())


def rows_by_label(content: dict) -> dict:
    return {r["label"]: r for r in content["rows"]}


def loaded(tmp_path: Path, name: str) -> dict:
    """The claims file of fixture ``name`` through the loader that runs it."""
    imported(tmp_path, name)
    return K.load_claims([tmp_path / f"{Path(name).stem}.yaml"], run_config())[0]


def test_llama_bench_table_with_its_build_line(tmp_path):
    # ggml-org/llama.cpp#15952: | ... | ngl 99 | pp512 | 378.46 ± 1.43 |, tg128 11.09 ± 0.00, "build: 08a216474 (6457)"
    _, content = imported(tmp_path, "llama-cpp-pr15952-build-line.md")
    rows = rows_by_label(content)
    assert set(rows) == {"pp512", "tg128"}
    assert rows["pp512"]["claimed"] == {"prefill_tps": 378.46}
    assert rows["pp512"]["claimed_spread"] == {"prefill_tps": 1.43}
    assert rows["pp512"]["workload"] == {"prompt_tokens": 512, "gen_tokens": 1}
    assert rows["tg128"]["claimed"] == {"decode_tps": 11.09}
    assert rows["tg128"]["workload"] == {"prompt_tokens": 1, "gen_tokens": 128}
    for row in rows.values():
        assert row["stated"] == {"n_gpu_layers": 99}
        assert row["build"] == "08a216474 (6457)"
        assert {"ubatch", "threads", "ctx", "n_cpu_moe", "fit", "load_mode"} <= set(row["unknown"])
        assert "n_gpu_layers" not in row["unknown"] and "build" not in row["unknown"]
    claim = K.load_claims([tmp_path / "llama-cpp-pr15952-build-line.yaml"], run_config())[0]
    assert [r["resolved"]["n_gpu_layers"] for r in claim["rows"]] == [99, 99]
    assert claim["rows"][0]["claimed_spread"] == {"prefill_tps": 1.43}


def test_depth_a_reply_after_the_depth_and_no_prompt_after_it(tmp_path):
    # tools/llama-bench/README.md: pp512, tg128, pp512 @ d512, tg128 @ d512, all at ngl -1 (llama-bench's "all")
    result, content = imported(tmp_path, "llama-bench-depth.md")
    rows = rows_by_label(content)
    assert set(rows) == {"pp512", "tg128", "tg128 @ d512"}
    assert rows["tg128 @ d512"]["workload"] == {"prompt_tokens": 512, "gen_tokens": 128}
    assert rows["tg128 @ d512"]["claimed"] == {"decode_tps": 116.71}
    assert any(line.startswith("line 12 (pp512 @ d512): a prompt processed after tokens") for line in result.lines)
    assert any("'ngl' = '-1'" in line and "not stated" in line for line in result.lines)  # no guess at -1's meaning
    assert all("n_gpu_layers" in r["unknown"] and "build" in r["unknown"] for r in rows.values())


def test_one_row_per_thread_count_in_the_old_test_names(tmp_path):
    # the README's threads table: "pp 64" / "tg 16" (with a space, as older llama-bench printed), -t 1,2,4,8,16,32
    result, content = imported(tmp_path, "llama-bench-threads.md")
    rows = rows_by_label(content)
    assert len(rows) == 12
    assert rows["threads 8, pp64"]["claimed"] == {"prefill_tps": 32.29}
    assert rows["threads 8, pp64"]["claimed_spread"] == {"prefill_tps": 1.21}
    assert rows["threads 32, tg16"]["claimed"] == {"decode_tps": 16.41}
    assert rows["threads 32, tg16"]["stated"] == {"threads": 32}
    assert {r["stated"]["threads"] for r in rows.values()} == {1, 2, 4, 8, 16, 32}
    assert any("-t 1,2,4,8,16,32: several values" in line for line in result.lines)
    assert len(loaded(tmp_path, "llama-bench-threads.md")["rows"]) == 12


def test_hand_made_table_of_several_builds(tmp_path):
    # ik_llama.cpp#2199: | Build | PP512 (t/s) | TG128 (t/s) |, bold and annotated numbers, the command below the table
    result, content = imported(tmp_path, "ik-llama-issue2199-builds.md")
    rows = rows_by_label(content)
    assert len(rows) == 6
    regression = rows["Build ik 4749 (5f063b7b), tg128"]
    assert regression["claimed"] == {"decode_tps": 16.8}
    assert regression["build"] == "ik 4749 (5f063b7b)"
    assert regression["note"] == "← regression"
    assert rows["Build ik 4706 (70ea1522), tg128"]["claimed"] == {"decode_tps": 26.23}
    assert rows["Build mainline 10155 (1cbfd198), pp512"]["claimed"] == {"prefill_tps": 170.5}
    assert rows["Build mainline 10155 (1cbfd198), pp512"]["workload"] == {"prompt_tokens": 512, "gen_tokens": 1}
    # the flags sit under a later heading, below the table: not this table's, so every setting is unknown
    assert all(r["stated"] == {} and "n_cpu_moe" in r["unknown"] for r in rows.values())
    assert {r["build"] for r in loaded(tmp_path, "ik-llama-issue2199-builds.md")["rows"]} == {
        "ik 4706 (70ea1522)",
        "ik 4749 (5f063b7b)",
        "mainline 10155 (1cbfd198)",
    }


def test_hand_made_table_without_lengths_claims_nothing_and_says_why(tmp_path):
    # ik_llama.cpp#1593: NCMOE and notes columns, "~45", "similar", "~150", Gen/Prefill tok/s of no stated length
    with pytest.raises(CI.ImportRefused) as refused:
        imported(tmp_path, "ik-llama-pr1593-ncmoe-notes.md")
    text = str(refused.value)
    assert "line 8: column 'Gen tok/s' = '**~45**': '**~45**' is not a measured number" in text
    assert "line 9: column 'Gen tok/s' = 'similar'" in text
    assert "line 17: column 'Prefill tok/s' = '~150'" in text
    assert "no prompt or generated length stated" in text
    assert not (tmp_path / "ik-llama-pr1593-ncmoe-notes.yaml").exists()


def test_a_table_headed_in_chinese(tmp_path):
    # OminiX-Ascend's change.md (a llama.cpp fork): four tables | 测试 | Baseline | <setup> | 加速 | of pp512 / tg128,
    # "1135 t/s" with its unit in the cell, a speed-up column, "-fa 1" in one table's heading
    result, content = imported(tmp_path, "ominix-ascend-cann-zh.md")
    rows = rows_by_label(content)
    assert len(rows) == 16  # 4 tables x 2 tests x 2 columns of speeds: the ratios are no claim
    fa = rows["FA, pp512"]
    assert fa["claimed"] == {"prefill_tps": 5722.0} and "claimed_spread" not in fa  # no ± in the table
    assert fa["workload"] == {"prompt_tokens": 512, "gen_tokens": 1}
    assert rows["V cache 优化, tg128"]["claimed"] == {"decode_tps": 37.7}
    assert rows["V cache 优化, tg128"]["workload"] == {"prompt_tokens": 1, "gen_tokens": 128}
    # the same Baseline in every table: each led by its own table's heading
    baseline = rows["优化 2: 启用 Flash Attention (运行参数 -fa 1): Baseline, tg128"]
    assert baseline["claimed"] == {"decode_tps": 27.15}
    assert rows["Flash Attention 模式 (FA + 算子融合) — 推荐: 优化后, tg128"]["claimed"] == {"decode_tps": 42.82}
    assert all("note" not in r for r in rows.values())  # "t/s" after a number is its unit, no remark
    # the heading's -fa 1 is read, but is not the Baseline column's: given to neither, said, left unknown
    assert (
        "table at line 39: its columns 'Baseline', 'FA' set setups side by side that it does not state apart; what "
        "is stated above it (flash_attn on) is given to none of them" in result.lines
    )
    assert all(
        r["stated"] == {} and {"flash_attn", "n_gpu_layers", "build"} <= set(r["unknown"]) for r in rows.values()
    )
    assert "table at line 31: column '加速' holds ratios, not speeds; not claimed" in result.lines
    assert len(loaded(tmp_path, "ominix-ascend-cann-zh.md")["rows"]) == 16


def test_flags_in_the_heading_of_a_table_in_another_language():
    # a table of one setup: its section's title states -fa 1 and -ub 512 for every row; the document's title does not
    text = (
        "# 测试 -ub 2048\n\n### 结果（运行参数 -fa 1，-ub 512）\n\n"
        "| 模型 | 测试 | 结果 |\n|---|---|---:|\n| 8B | pp512 | 9761.76 ± 1092.59 t/s |\n| 8B | tg128 | 151.18 t/s |\n"
    )
    result = CI.read_markdown(text)
    rows = {r["label"]: r for r in result.rows}
    assert set(rows) == {"pp512", "tg128"}
    assert rows["pp512"]["claimed"] == {"prefill_tps": 9761.76}
    assert rows["pp512"]["claimed_spread"] == {"prefill_tps": 1092.59}
    assert all(r["stated"] == {"flash_attn": "on", "ubatch": 512} for r in rows.values())
    assert result.lines == []


def test_rows_that_do_not_fit_their_header_are_not_read(tmp_path):
    # ik_llama.cpp#283: a header of 12 columns over rows of 13 cells (n_ubatch printed twice)
    with pytest.raises(CI.ImportRefused) as refused:
        imported(tmp_path, "ik-llama-pr283-misaligned.md")
    for line in (10, 11, 12, 13):
        assert f"line {line}: 13 cells under a header of 12; the row is not read" in str(refused.value)


def test_a_speed_that_does_not_say_prefill_or_decode_is_not_claimed(tmp_path):
    # mudkipdev/flake: "Tokens per Second" beside a model and a context size
    with pytest.raises(CI.ImportRefused, match="'Tokens per Second' does not say prefill or decode"):
        imported(tmp_path, "flake-inference-speeds.md")


def test_settings_above_the_table_and_a_table_that_is_no_speed_table(tmp_path):
    text = (
        "## Speed, q8_0 KV cache, ctx 32K\n\n"
        "```\nllama-server -m x.gguf -ub 1024 --n-cpu-moe 20 -fa on --jinja\n```\n\n"
        "| n_cpu_moe | pp512 t/s | tg128 t/s | notes |\n|---:|---:|---:|---|\n| 30 | 1,234.5 | 4,479 | picked |\n\n"
        "| a | b |\n|---|---|\n| 1 | 2 |\n"
    )
    result = CI.read_markdown(text)
    [row] = result.rows  # 4,479 (a thousands or a decimal comma?) is not read
    assert row["stated"] == {
        "ubatch": 1024,
        "n_cpu_moe": 30,  # the row's own column over the flag block's 20
        "flash_attn": "on",
        "ctx": 32768,
        "cache_type_k": "q8_0",
        "cache_type_v": "q8_0",
    }
    assert row["claimed"] == {"prefill_tps": 1234.5} and row["note"] == "picked"
    assert any("'4,479' is no number" in line for line in result.lines)
    assert any("--jinja" in line and "left out" in line for line in result.lines)
    assert "table at line 11: no column of prefill or decode speed; not a speed table, skipped" in result.lines


def test_out_may_not_be_the_input(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text((REAL / "llama-bench-depth.md").read_text())
    with pytest.raises(CI.ImportRefused, match="would overwrite the input"):
        CI.import_claims(str(readme), readme)
    assert readme.read_text() == (REAL / "llama-bench-depth.md").read_text()


@pytest.fixture
def server(tmp_path):
    """A real HTTP server on 127.0.0.1 serving ``tmp_path/site``; yields (site folder, base URL)."""
    site = tmp_path / "site"
    site.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(site))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield site, f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    thread.join()


def test_import_from_an_address_and_from_hf(tmp_path, server, monkeypatch):
    site, base = server
    card = (REAL / "llama-cpp-pr15952-build-line.md").read_text()
    (site / "owner" / "repo" / "raw" / "main").mkdir(parents=True)
    (site / "owner" / "repo" / "raw" / "main" / "README.md").write_text(card)
    (site / "card.md").write_text(card)

    out = tmp_path / "a" / "claims.yaml"
    assert main(["claims", "import", f"{base}/card.md", "--out", str(out), "--model", "m"]) == 0
    content = yaml.safe_load(out.read_text())
    assert content["source"]["url"] == f"{base}/card.md"
    assert (out.parent / content["source"]["local_copy"]).read_text() == card
    assert len(K.load_claims([out], run_config())[0]["rows"]) == 2

    monkeypatch.setenv("HF_ENDPOINT", base)
    out = tmp_path / "b" / "claims.yaml"
    CI.import_claims("hf:owner/repo", out, model="m")
    content = yaml.safe_load(out.read_text())
    assert content["source"]["hf_repo"] == "owner/repo"
    assert (out.parent / content["source"]["local_copy"]).read_text() == card

    with pytest.raises(CI.SourceUnreadable, match="HTTP 404"):
        CI.import_claims("hf:owner/missing", tmp_path / "c.yaml")
    assert not (tmp_path / "c.yaml").exists()


def test_without_a_model_the_loader_asks_for_it(tmp_path, capsys):
    out = tmp_path / "claims.yaml"
    assert main(["claims", "import", str(REAL / "llama-bench-depth.md"), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"written: {out}: 3 row(s) from 1 speed table(s)" in printed
    assert "not read: line 12 (pp512 @ d512)" in printed
    assert out.read_text().startswith("# Imported by `crashline claims import")
    with pytest.raises(K.ClaimsError, match="model"):
        K.load_claims([out], run_config())


def test_an_imported_table_renders_as_a_correction(tmp_path):
    # import, load, render: the claimed numbers with their ± and the notes column, before anything is measured
    import pandas as pd

    from crashline.report import correction

    for name in ("llama-bench-depth.md", "ik-llama-issue2199-builds.md"):
        imported(tmp_path, name)
    depth, builds = K.load_claims(
        [tmp_path / "llama-bench-depth.yaml", tmp_path / "ik-llama-issue2199-builds.yaml"], run_config()
    )
    none = pd.DataFrame()
    md = correction.section(depth, none, none)
    assert "| pp512 | pp512 tg1 | 7,340.2 ± 23.4 | not measured: no record of configuration" in md
    assert "| tg128 @ d512 | pp512 tg128 | – | – | 116.7 ± 0.6 | not measured" in md
    md = correction.section(builds, none, none)
    assert next(line for line in md.splitlines() if line.startswith("| published row")).endswith(" | notes |")
    assert "| Build ik 4749 (5f063b7b), tg128 | pp1 tg128 | – | – | 16.8 | not measured" in md
    assert md.count("← regression") == 1


def test_an_imported_table_publishes_a_diff_that_git_applies_and_a_second_run_replaces(tmp_path):
    # import -> publish on a real README (nothing measured yet): correction.md, the patched README and its diff
    import pandas as pd

    from crashline import publish as P
    from test_publish import git

    name = "llama-cpp-pr15952-build-line.md"
    imported(tmp_path, name)
    claims = tmp_path / f"{Path(name).stem}.yaml"
    cfg = {
        "models": {"m": {}},
        "defaults": {"threads": 2},
        "claims": [str(claims)],
        "publish": {},
        "budget": {"margin_mib": 1024},
    }
    pd.DataFrame(columns=["model", "config_id", "outcome"]).to_parquet(tmp_path / "configs.parquet")
    pd.DataFrame(columns=["model", "config_id"]).to_parquet(tmp_path / "measurements.parquet")

    def publish() -> Path:
        P.run(cfg, tmp_path / "configs.parquet", tmp_path / "measurements.parquet", tmp_path / "publish")
        return tmp_path / "publish" / claims.stem

    out = publish()
    readme = (out / "README.md").read_text()
    assert f"## Re-measured: Speed table of {name}\n" in readme  # no local path of this machine goes upstream
    assert readme.startswith((REAL / name).read_text()) and readme.count(P.START_MARKER) == 1
    assert "| pp512 | pp512 tg1 | 378.5 ± 1.4 | not measured" in (out / "correction.md").read_text()
    repo = tmp_path / "apply"
    git("init", "--quiet", str(repo))
    (repo / name).write_text((REAL / name).read_text())  # source.file: the README's own name
    git("apply", str(out / "correction.diff"), cwd=repo)
    assert (repo / name).read_text() == readme
    # the patched README as the upstream copy: a second run replaces the section, never adds a second one
    local_copy = tmp_path / yaml.safe_load(claims.read_text())["source"]["local_copy"]
    assert local_copy.name == f"{claims.stem}.source.md" and local_copy.read_text() == (REAL / name).read_text()
    local_copy.write_text(readme)
    assert (publish() / "README.md").read_text() == readme


def test_a_llama_bench_command_above_gives_the_lengths_its_columns_do_not():
    text = (
        "### sweep\n\n```\nllama-bench -m m.gguf -ngl 99 -fa -nocb -p 512 -n 128 -ncmoe 8,16\n```\n\n"
        "| n_cpu_moe | Decode (tok/s) | Prefill (tok/s) |\n|---:|---:|---:|\n"
        "| 8 | 44.1 | 429.5 |\n| 16 | 40.7 | 481.3 |\n"
    )
    result = CI.read_markdown(text)
    rows = {r["label"]: r for r in result.rows}
    assert set(rows) == {"n_cpu_moe 8, tg128", "n_cpu_moe 8, pp512", "n_cpu_moe 16, tg128", "n_cpu_moe 16, pp512"}
    assert rows["n_cpu_moe 16, tg128"]["workload"] == {"prompt_tokens": 1, "gen_tokens": 128}
    assert rows["n_cpu_moe 16, pp512"]["claimed"] == {"prefill_tps": 481.3}
    assert rows["n_cpu_moe 8, pp512"]["stated"] == {
        "n_gpu_layers": 99,
        "flash_attn": "on",  # a bare -fa, as older llama-bench took it
        "cont_batching": False,
        "n_cpu_moe": 8,  # the row's column; the command's 8,16 states nothing alone
    }
    assert any("-ncmoe 8,16: several values" in line for line in result.lines)


def _known(row: dict, name: str):
    """What the imported claims row itself says of ``name`` (None: not stated), read from the file, not the loader."""
    if name == "build":
        return row.get("build")
    if name == "depth":  # the context a decode speed was measured after; prefill starts from none
        decodes = "decode_tps" in row["claimed"] or "aggregate_tps" in row["claimed"]
        return (row["workload"]["prompt_tokens"] if row["workload"]["prompt_tokens"] > 1 else 0) if decodes else None
    return row["stated"].get(name)


@pytest.mark.parametrize("name", sorted(p.name for p in REAL.glob("*.md")))
def test_every_mixed_or_unstated_setting_is_named_per_row(tmp_path, name):
    # Each committed real table: every row names the settings it states differently from another row and those it
    # never states, in the analysis, in the Markdown sent upstream and in the report's part.
    import pandas as pd

    from html import escape

    from crashline.report import correction, html, templates
    from crashline.tables import claims as KC

    try:
        _, content = imported(tmp_path, name)
    except CI.ImportRefused:
        return  # no row to claim (each such table has its own test above): nothing set side by side
    claim = K.load_claims([tmp_path / f"{Path(name).stem}.yaml"], run_config())[0]
    analysis = {m["label"]: m for m in KC.mixed_settings(claim["rows"])}
    none = pd.DataFrame()
    md = correction.section(claim, none, none)
    report = html.block(correction.build(claim, none, none))  # the report's part, without the Markdown it folds away
    for row in content["rows"]:
        mine = analysis[row["label"]]
        depth = _known(row, "depth") is not None
        names = [n for n in KC.MIXED_SETTINGS if n != "depth" or depth]
        unstated = {n for n in names if _known(row, n) is None}
        differs = {
            n
            for n in names
            if _known(row, n) is not None
            and any(_known(o, n) not in (None, _known(row, n)) for o in content["rows"] if o is not row)
        }
        assert set(mine["unstated"]) == unstated, row["label"]
        assert {d["setting"] for d in mine["differs"]} == differs, row["label"]
        for n in unstated | differs:
            assert KC.mixed_title(n) in mine["text"], (row["label"], n)
        line = next(x for x in md.splitlines() if x.startswith(f"- {templates.md(row['label'])}: stated"))
        assert f"mixed with the other rows: {templates.md(mine['text'])}." in line
        assert f"mixed with the other rows: {escape(mine['text'], quote=False)}." in report


def test_what_each_real_table_mixes(tmp_path):
    # what a reader of each table sees at once: threads per row, three builds, a depth, a build line for both rows
    def analysis(name: str) -> dict:
        return {m["label"]: m for m in KC.mixed_settings(loaded(tmp_path, name)["rows"])}

    from crashline.tables import claims as KC

    threads = analysis("llama-bench-threads.md")
    assert all([d["setting"] for d in m["differs"]] == ["threads"] for m in threads.values())
    assert threads["threads 8, pp64"]["text"].startswith("threads (-t) 8 here, 1 / 2 / 4 / 16 / 32 in 10 other rows")
    builds = analysis("ik-llama-issue2199-builds.md")
    assert all([d["setting"] for d in m["differs"]] == ["build"] for m in builds.values())
    assert all({"ubatch", "threads", "n_cpu_moe", "fit", "load_mode"} <= set(m["unstated"]) for m in builds.values())
    depth = analysis("llama-bench-depth.md")
    assert depth["tg128 @ d512"]["differs"][0]["others"] == {"tg128": "0"}
    assert depth["pp512"]["differs"] == [] and "build" in depth["pp512"]["unstated"]
    line = analysis("llama-cpp-pr15952-build-line.md")
    assert all(m["differs"] == [] and not {"build", "n_gpu_layers"} & set(m["unstated"]) for m in line.values())
