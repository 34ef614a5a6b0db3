"""crashline tune: from a model and a card to an answer in one command. The question becomes a config
(checked before anything runs), the workflow runs through Snakemake's Python API with the default
profile's settings, and the answer is printed; a second run measures nothing again."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
import time

import pandas as pd
import pytest
import yaml

from crashline.config.file import ConfigError
from crashline.cli.tune import _hf_file, config, model_source
from crashline.config import plan as C
from crashline.core.host import gpus


def test_the_model_as_typed_becomes_a_source(tmp_path, tiny_moe):
    assert model_source(str(tiny_moe)) == ("tiny-moe", f"file:{tiny_moe.resolve()}")
    assert model_source("hf:unsloth/Qwen3-30B-A3B-GGUF/Qwen3-30B-A3B-Q4_K_M.gguf") == (
        "Qwen3-30B-A3B-Q4_K_M",
        "hf:unsloth/Qwen3-30B-A3B-GGUF/Qwen3-30B-A3B-Q4_K_M.gguf",
    )
    with pytest.raises(ConfigError, match="not a file, a source"):
        model_source(str(tmp_path / "missing.gguf"))


def hf_cache(root, repo: str, files: list[str]):
    """A Hugging Face cache as huggingface_hub lays it out: blobs named by their hash, a snapshot of
    symlinks, refs/main naming the snapshot."""
    folder = root / f"models--{repo.replace('/', '--')}"
    revision = "0" * 40
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(revision)
    for name in files:
        data = name.encode()
        blob = folder / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = folder / "snapshots" / revision / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(blob)


def test_the_llama_server_shorthand_is_resolved_from_the_hf_cache(tmp_path):
    repo = "owner/Model-GGUF"
    files = ["Model-Q4_K_M.gguf", "Model-Q8_0.gguf", "mmproj-Model-Q8_0.gguf", "README.md"]
    files += [f"big/Model-Q2_K-0000{i}-of-00002.gguf" for i in (1, 2)]
    hf_cache(tmp_path, repo, files)
    assert _hf_file(repo, "Q4_K_M", tmp_path) == "Model-Q4_K_M.gguf"
    assert _hf_file(repo, "q8_0", tmp_path) == "Model-Q8_0.gguf"  # not the projector
    assert _hf_file(repo, "Q2_K", tmp_path) == "big/Model-Q2_K-00001-of-00002.gguf"  # the first shard
    with pytest.raises(ConfigError, match="expected one GGUF file named with 'IQ1_S', found none"):
        _hf_file(repo, "IQ1_S", tmp_path)


def test_a_prompt_longer_than_the_context_is_refused_before_anything_runs(tmp_path, tiny_moe):
    with pytest.raises(ConfigError, match=r"--prompt 4096 plus 512 generated tokens \(--gen\) does not fit --ctx 4096"):
        config(str(tiny_moe), 4096, 4096, None, None, tmp_path)
    with pytest.raises(
        ConfigError, match=r"--prompt 1024 plus 3100 generated tokens \(--gen\) does not fit --ctx 4096"
    ):
        config(str(tiny_moe), 4096, 1024, None, None, tmp_path, gen=3100)
    raw = config(str(tiny_moe), 8192, 4096, 12288, 512, tmp_path)
    assert raw["budget"] == {"vram_budget_mib": 12288, "margin_mib": 512}
    assert raw["objective"] == {"workload": "prompt-4096"} and len(raw["configurations"]) == 3
    # the reply is the user's (--gen, #40): 512 tokens unless asked, the objective's workload carries it
    assert raw["workloads"] == [{"name": "prompt-4096", "prompt_tokens": 4096, "gen_tokens": 512}]
    assert config(str(tiny_moe), 8192, 4096, None, None, tmp_path, gen=300)["workloads"][0]["gen_tokens"] == 300


def test_a_prompt_past_the_models_training_context_is_refused_at_once(tmp_path, tiny_moe):
    """llama-server caps each slot's context at the model's training context whatever -c says: tiny-moe (trained
    for 8,192) at --ctx 32768 --prompt 16000 ran every configuration into context_exceeded (#27)."""
    for model in (str(tiny_moe), "synthetic:tiny-moe"):
        with pytest.raises(ConfigError, match=r"trained for a context of 8,192 tokens.*give --prompt 7680 or less"):
            config(model, 32768, 16000, None, None, tmp_path)
        with pytest.raises(ConfigError, match=r"8,000 \+ 300 generated tokens.*give --prompt 7892 or less"):
            config(model, 32768, 8000, None, None, tmp_path, gen=300)
    assert config(str(tiny_moe), 32768, 7680, None, None, tmp_path)["objective"] == {"workload": "prompt-7680"}
    assert config("synthetic:qwen3-30b-a3b", 32768, 16000, None, None, tmp_path)  # trained for 40,960


def test_the_levers_tried_are_the_users_to_choose(tmp_path, tiny_moe):
    """tune --ubatch --cache-type --threads (#22): each combination is a search of n_cpu_moe, --fit on runs once per
    KV cache type; a quantised KV cache only where asked, and the default is the config as before."""
    from crashline.cli.tune import levers

    tried = levers("1024,256", "f16,q8_0", "8,4")
    assert tried == {"ubatch": [256, 1024], "cache_type": ["f16", "q8_0"], "threads": [4, 8]}
    cfg = C.validate(config(str(tiny_moe), 8192, 4096, 12288, None, tmp_path, True, tried), C.load_schema())
    groups = C.expand_searches(cfg)
    combos = {(g["given"]["ubatch"], g["given"].get("cache_type_k", "f16"), g["given"]["threads"]) for g in groups}
    assert combos == {(u, k, t) for u in (256, 1024) for k in ("f16", "q8_0") for t in (4, 8)}
    assert all(g["given"].get("cache_type_v", "f16") == g["given"].get("cache_type_k", "f16") for g in groups)
    assert all(g["given"]["cache_ram"] == 0 for g in groups)  # prompts that share nothing: no host prompt cache
    # each search races the ones before it (prune): the first none, the last every other
    assert [g.get("rivals") for g in groups] == [[g["id"] for g in groups[:k]] for k in range(len(groups))]
    fits = [i["settings"] for i in C.expand(cfg) if i["settings"].get("fit") == "on"]
    # --fit on per KV cache type twice: as the searches run (no prompt cache), and as llama-server starts by default
    assert sorted((f["ubatch"], f.get("cache_type_k", "f16"), f["cache_ram"] == 0) for f in fits) == [
        (1024, kv, off) for kv in ("f16", "q8_0") for off in (False, True)
    ]
    assert {f["cache_ram"] for f in fits} == {8192, 0}  # llama-server's default named, so the two rows differ
    default = config(str(tiny_moe), 8192, 4096, 12288, None, tmp_path)
    assert default["configurations"] == [
        {
            "settings": {"cache_ram": 0},
            "grid": {"ubatch": [2048, 512]},  # the largest first: the smaller one races it
            "search": {"n_cpu_moe": [0, 1000], "prune": True, "partial": True},
        },
        # each fit run started as often as a search's finalist, so the spread between starts can tie it
        {"settings": {"ubatch": 2048, "fit": "on", "cache_ram": 0}, "starts": 2},
        {"settings": {"ubatch": 2048, "fit": "on", "cache_ram": 8192}, "starts": 2},
    ]
    assert {i.get("starts") for i in C.expand(cfg) if i["settings"].get("fit") == "on"} == {2}
    assert config(str(tiny_moe), 8192, 4096, None, None, tmp_path, False, tried)["configurations"] == [
        {"settings": {"cache_ram": 0}, "grid": {"ubatch": [1024, 256], "threads": [4, 8]}},
        {
            "settings": {"cache_type_k": "q8_0", "cache_type_v": "q8_0", "cache_ram": 0},
            "grid": {"ubatch": [1024, 256], "threads": [4, 8]},
        },
    ]
    for bad, said in (
        (("256,x", None, None), "--ubatch '256,x': 'x' is not a positive integer"),
        ((None, "f16,q3", None), "--cache-type 'f16,q3': q3 is not a KV cache type of llama.cpp"),
        ((None, None, "8,0"), "--threads '8,0': '0' is not a positive integer"),
    ):
        with pytest.raises(ConfigError, match=re.escape(said)):
            levers(*bad)


def test_a_deep_prompt_is_timed_from_re_sends_of_its_warm_up(tmp_path):
    """From RESENT_FROM tokens on, tune's workload re-sends each start's warm-up prompt for its timed repetitions
    (one prefill at depth per start, #40 item 3); a shorter prompt keeps fresh ones."""
    from crashline.cli.tune import RESENT_FROM

    model = "synthetic:qwen3-30b-a3b"  # trained for 40,960 tokens
    deep = config(model, 32768, RESENT_FROM, 12288, None, tmp_path)["workloads"]
    short = config(model, 32768, RESENT_FROM - 1, 12288, None, tmp_path)["workloads"]
    assert [w.get("decode_from") for w in deep + short] == ["resent", None]
    assert C.validate(config(model, 32768, RESENT_FROM, 12288, None, tmp_path), C.load_schema())


def test_tune_time_is_a_duration_of_at_least_a_minute():
    from crashline.cli.tune import time_limit_s

    assert [time_limit_s(t) for t in ("15m", "900", "1.5h")] == [900, 900, 5400]
    for bad, said in (("5s", "--time 5s: give at least 60 s"), ("soon", "--time 'soon': not a duration")):
        with pytest.raises(ConfigError, match=re.escape(said)):
            time_limit_s(bad)


def test_a_draft_and_n_gram_lookups_are_variants_of_every_configuration_tried(tmp_path, tiny_moe):
    """tune --draft MODEL --spec ngram-simple (#43 item 2): on a GPU each variant is a search of its own (the draft's
    memory moves the boundary) and a --fit on without the prompt cache; without one, the levers' grid per variant.
    The draft is a model of the config that no configuration tunes; n-gram lookups keep fresh decode."""
    from crashline.cli.tune import RESENT_FROM, speculation

    draft = tmp_path / "tiny-draft.gguf"
    draft.write_bytes(tiny_moe.read_bytes())
    cfg = C.validate(
        config(str(tiny_moe), 32768, 1024, 12288, None, tmp_path, True, None, 64, str(draft), "ngram-simple"),
        C.load_schema(),
    )
    assert set(cfg["models"]) == {"tiny-moe", "tiny-draft"}
    assert all(entry["models"] == ["tiny-moe"] for entry in cfg["configurations"])
    spec = {
        (g["given"].get("draft_model"), g["given"].get("draft_n_gpu_layers"), g["given"].get("spec_type"))
        for g in C.expand_searches(cfg)
    }
    # as written: draft-simple implied; the draft where llama.cpp puts it, and on the CPU (-ngld 0), its VRAM the
    # model's
    assert spec == {
        (None, None, None),
        ("tiny-draft", None, None),
        ("tiny-draft", 0, None),
        (None, None, "ngram-simple"),
    }
    fits = [i["settings"] for i in C.expand(cfg) if i["settings"].get("fit") == "on"]
    assert sorted(
        (
            f["draft_model"] or "",
            -1 if f["draft_n_gpu_layers"] is None else f["draft_n_gpu_layers"],
            f["spec_type"] or "",
            f["cache_ram"],
        )
        for f in fits
    ) == [
        ("", -1, "", 0),
        ("", -1, "", 8192),
        ("", -1, "ngram-simple", 0),
        ("tiny-draft", -1, "draft-simple", 0),
        ("tiny-draft", 0, "draft-simple", 0),
    ]
    cpu = config(str(tiny_moe), 32768, 1024, None, None, tmp_path, False, None, 64, str(draft), None)
    assert [e["settings"].get("draft_model") for e in cpu["configurations"]] == [None, "tiny-draft"]
    big = "synthetic:qwen3-30b-a3b"  # trained for a deep prompt
    assert config(big, 32768, RESENT_FROM, None, None, tmp_path, False)["workloads"][0]["decode_from"] == "resent"
    with_ngram = config(big, 32768, RESENT_FROM, None, None, tmp_path, False, None, 64, None, "ngram-simple")
    assert "decode_from" not in with_ngram["workloads"][0]
    for bad, said in (
        ((None, "ngram-simple,lookahead"), "--spec 'ngram-simple,lookahead': lookahead is not an n-gram"),
        ((str(tiny_moe), None), "that is the model itself"),
    ):
        with pytest.raises(ConfigError, match=re.escape(said)):
            config(str(tiny_moe), 4096, 1024, None, None, tmp_path, False, None, 64, *bad)
    assert speculation(None, None) == [{}]


@pytest.mark.e2e
def test_tune_runs_the_workflow_and_prints_the_answer(tmp_path, tiny_moe, server_provenance):
    def tune():
        return subprocess.run(
            [sys.executable, "-m", "crashline", "tune", str(tiny_moe), "--ctx", "4096", "--prompt", "1024"]
            + ["--out", str(tmp_path / "t")],
            capture_output=True,
            text=True,
            timeout=900,
            cwd=tmp_path,
        )

    first = tune()
    assert first.returncode == 0, first.stderr[-3000:]
    results = tmp_path / "t" / "results"
    lines = first.stdout.splitlines()
    assert lines[0] == f"config: {tmp_path / 't' / 'tune.yaml'}"
    assert lines[1].startswith("tiny-moe: use ") and lines[-1].startswith(f"report: {results / 'report.md'}")
    # one decision: what tune printed is the report's headline and recommendation.json's answer
    (answer,) = json.loads((results / "recommendation.json").read_text())
    assert lines[1] == f"tiny-moe: use {answer['use']}" and f"  {answer['command']}" in lines[3:6]
    # two ubatch values on 2 CPU cores are often tied: then the line after the speed says why this one
    standing = "tied for the fastest" if answer["tie"] else "the fastest"
    assert lines[2].startswith(f"  end to end {answer['speed']:.1f} t/s, {standing} by ")
    assert (lines[3] == f"  {answer['tie']}") if answer["tie"] else (lines[3] == f"  {answer['reply_length']['text']}")
    # then where the answer would change with the reply length (#40), at the default reply of 512 tokens
    assert f"  {answer['reply_length']['text']}" in lines[3:5] and answer["reply_length"]["gen_tokens"] == 512
    assert f"**Use `{answer['use']}`**" in (results / "report.md").read_text()
    assert answer["winner"] in (results / "report.md").read_text()
    # the short table at the end, as llama-bench -o md prints one: every configuration, the recommendation starred
    table = (results / "summary.md").read_text()
    assert table.rstrip("\n") in first.stdout and f"| ★ `{answer['winner']}` |" in table
    assert "| config | settings that differ | outcome | prefill t/s | decode t/s | end to end t/s |" in table
    searches = pd.read_parquet(results / "tables" / "searches.parquet")
    configs = pd.read_parquet(results / "tables" / "configs.parquet")
    if gpus()["present"]:
        assert sorted(searches["s_ubatch"]) == [512, 2048] and (configs["s_fit"] == "on").sum() == 2
    else:  # every weight is in host memory anyway: no n_cpu_moe search, no --fit on, the two ubatch values
        assert searches.empty and sorted(configs["s_ubatch"]) == [512, 2048] and "on" not in set(configs["s_fit"])
    assert (results / "report.html").exists()
    # the whole run's ETA: its server starts when it begins, and the time left once a start was recorded
    starts = [int(n) for n in re.findall(r"run: about (\d+) more server start", first.stderr)]
    assert len(starts) >= 2 and starts == sorted(starts, reverse=True), first.stderr[-3000:]
    assert re.search(r"run: about \d+ more server start\(s\), [\d.]+ (s|min) left", first.stderr)
    # the console is crashline's lines and Snakemake's step count, not its banner and per-job blocks
    assert re.search(r"^\[measure tiny-moe [0-9a-f]{10}\] llama-server ready in ", first.stderr, re.M)
    assert re.search(r"^\d+ of \d+ steps \(100%\) done$", first.stderr, re.M), first.stderr[-3000:]
    assert "Snakemake version" not in first.stderr and not re.search(r"^\s+(output|reason): ", first.stderr, re.M)
    records = {p: p.stat().st_mtime_ns for p in results.rglob("measure.json")}
    second = tune()  # the same question again: Snakemake finds nothing to do
    assert second.returncode == 0 and "Nothing to be done" in second.stderr
    assert {p: p.stat().st_mtime_ns for p in results.rglob("measure.json")} == records
    assert second.stdout.splitlines()[1] == lines[1]


@pytest.mark.e2e
def test_tune_tries_a_draft_model_and_n_gram_lookup_and_records_the_acceptance(tmp_path, tiny_moe, server_provenance):
    """tune --draft MODEL --spec ngram-simple on this machine (#43 item 2): each configuration is measured with the
    draft, with the n-gram lookup and with neither; the draft's rows carry how many tokens it drafted and the share
    the model accepted (a copy of the model: all of them), and the answer is whichever finishes the request first."""
    draft = tmp_path / "tiny-draft.gguf"
    draft.write_bytes(tiny_moe.read_bytes())
    proc = subprocess.run(
        [sys.executable, "-m", "crashline", "tune", str(tiny_moe), "--ctx", "4096", "--prompt", "1024", "--gen", "64"]
        + ["--ubatch", "512", "--draft", str(draft), "--spec", "ngram-simple", "--out", str(tmp_path / "t")],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = tmp_path / "t" / "results"
    configs = pd.read_parquet(results / "tables" / "configs.parquet").set_index("config_id")
    measurements = pd.read_parquet(results / "tables" / "measurements.parquet").set_index("config_id")
    kinds = {
        cid: tuple("" if pd.isna(v) else v for v in row[["s_draft_model", "s_spec_type"]])
        for cid, row in configs.iterrows()
    }
    assert sorted(kinds.values()) == [("", ""), ("", "ngram-simple"), ("tiny-draft", "draft-simple")]
    (with_draft,) = [cid for cid, kind in kinds.items() if kind[0]]
    assert measurements.loc[with_draft, "draft_drafted"] > 0 and measurements.loc[with_draft, "draft_acceptance"] == 1
    md = (results / "report.md").read_text()
    assert "draft tokens accepted" in md and any(with_draft in line and "100% of" in line for line in md.splitlines())
    (answer,) = json.loads((results / "recommendation.json").read_text())
    best = measurements["e2e_tps_median"].max()
    assert answer["winner"] in kinds and (answer["tie"] or measurements.loc[answer["winner"], "e2e_tps_median"] == best)


@pytest.mark.e2e
def test_tune_gen_is_the_reply_asked_and_the_answer_says_where_it_would_change(tmp_path):
    """tune --gen 300 (#40): the objective's workload generates 300 tokens, and the answer names the reply length at
    which another configuration would finish a request first, or that none would within the replies the context
    leaves (4,096 - 1,024 = 3,072 tokens): the same words in tune's line, recommendation.json and the report."""
    proc = subprocess.run(
        [sys.executable, "-m", "crashline", "tune", "synthetic:tiny-moe", "--ctx", "4096", "--prompt", "1024"]
        + ["--gen", "300", "--out", str(tmp_path / "t")],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    written = yaml.safe_load((tmp_path / "t" / "tune.yaml").read_text())
    assert written["workloads"] == [{"name": "prompt-1024", "prompt_tokens": 1024, "gen_tokens": 300}]
    results = tmp_path / "t" / "results"
    (answer,) = json.loads((results / "recommendation.json").read_text())
    reply = answer["reply_length"]
    assert reply["gen_tokens"] == 300 and reply["range"] == [1, 3072]
    assert reply["text"].startswith("Reply length: ") and "300-token reply asked" in reply["text"]
    assert f"  {reply['text']}" in proc.stdout.splitlines()
    assert reply["text"].replace("`", "").split(" (")[0] in (results / "report.md").read_text().replace("`", "")
    measured = pd.read_parquet(results / "tables" / "measurements.parquet")
    assert set(measured["gen_tokens"]) == {300}


@pytest.mark.parametrize("asked", [["--vram", "8GiB"], ["--gpu", "5"]])
def test_a_card_asked_of_a_machine_without_one_is_refused_at_once(tmp_path, tiny_moe, asked):
    """--vram and --gpu without an NVIDIA GPU ran for minutes and ended in "no configuration survived" (#27)."""
    if gpus()["present"]:
        pytest.skip("this machine has a GPU")
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "crashline", "tune", str(tiny_moe), "--ctx", "4096", "--prompt", "1024", *asked]
        + ["--out", str(tmp_path / "t")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and f"{asked[0]}: this machine has no NVIDIA GPU" in proc.stderr, proc.stderr
    assert time.monotonic() - started < 30 and not (tmp_path / "t" / "tune.yaml").exists()


def test_a_micro_batch_above_the_default_batch_gets_a_batch_as_large(tmp_path, tiny_moe):
    """#41: `tune --ubatch 8192` was refused with "raise batch", which tune has no option for: tune raises it."""
    from crashline.cli.tune import levers

    raw = config(str(tiny_moe), 16384, 4096, None, None, tmp_path, False, levers("8192,512", None, None))
    assert raw["defaults"] == {"ctx": 16384, "batch": 8192}
    cfg = C.validate(raw, C.load_schema())
    assert sorted((i["settings"]["ubatch"], i["settings"]["batch"]) for i in C.expand(cfg)) == [
        (512, 8192),
        (8192, 8192),
    ]
    assert config(str(tiny_moe), 8192, 4096, None, None, tmp_path, False)["defaults"] == {"ctx": 8192}  # as before
