"""The prediction from the GGUF alone (crashline.engine.suggest) against what the H200 search measured and predicted,
against llama.cpp's own buffers on a real small GGUF, and its input parsing."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from crashline.cli import suggest as suggest_cli
from crashline.engine import logparse, planner, suggest, suggest_inputs
from crashline.models import synthetic
from crashline.models.manifest import inspect_gguf
from crashline.engine.server import ServerProcess
from crashline.core.settings import SettingsError

from conftest import FIXTURES

SEARCH_JSON = FIXTURES / "h200-search" / "search.json"
MANIFEST_JSON = FIXTURES / "h200-telemetry" / "manifest.json"
SEARCH = json.loads(SEARCH_JSON.read_text())
QWEN = json.loads(MANIFEST_JSON.read_text())  # the synthetic Qwen3-30B-A3B shape the H200 search ran
CTX, UB = SEARCH["settings"]["ctx"], SEARCH["settings"]["ubatch"]  # 32768, 2048


def row(result: dict, ubatch: int) -> dict:
    return next(r for r in result["ubatches"] if r["ubatch"] == ubatch)


# -- against the H200 search ----------------------------------------------------------------------------------------


def test_calibrated_by_the_search_it_reproduces_the_searchs_prediction_value_by_value():
    # The search's predicted_lowest is the lowest value predicted to fit the limit itself (no margin).
    result = suggest.suggest(QWEN, SEARCH["limit_mib"], CTX, ubatches=[UB], margin_mib=0, calibration=SEARCH_JSON)
    ub = row(result, UB)
    assert ub["n_cpu_moe"] == SEARCH["predicted_lowest"] == 25
    assert ub["status"] == suggest.FITS
    assert ub["values"] == [
        {"n_cpu_moe": v["n_cpu_moe"], "predicted_mib": v["predicted_mib"]} for v in SEARCH["values"]
    ]
    assert ub["predicted_mib"] == 12128.0 and ub["headroom_mib"] == 160.0
    assert ub["compute_from"] == f"measured at -ub {UB}"
    assert result["calibrated"] and result["kind"] == "prediction" and result["measured"] is False


def test_with_crashlines_margin_it_lands_between_the_measured_boundary_and_the_measured_answer():
    result = suggest.suggest(MANIFEST_JSON, 12288, CTX, ubatches=[UB], calibration=SEARCH_JSON)
    assert result["margin_mib"] == suggest_inputs.default_margin_mib() == SEARCH["margin_mib"] == 1024
    ub = row(result, UB)
    assert ub["n_cpu_moe"] == 28
    values = {v["n_cpu_moe"]: v["predicted_mib"] for v in SEARCH["values"]}
    assert values[28] + 1024 <= 12288 < values[27] + 1024  # the lowest with the margin, by the search's own numbers
    # Measured: 25 survived (the boundary), 29 was the lowest with the margin to spare; 28's serving peak was
    # ~150 MiB above its load peak, which is what the prediction is of.
    assert SEARCH["boundary"] <= ub["n_cpu_moe"] <= SEARCH["recommended_n_cpu_moe"]
    assert ub["args"][:4] == ["-ngl", "999", "--n-cpu-moe", "28"]
    assert ub["all_on_gpu"] == {
        "n_cpu_moe": 0,
        "predicted_mib": 20228.0,
        "fits": False,
        "arithmetic": planner.arithmetic(
            {"weights_mib": 16087.4, "kv_mib": 3072.0, "compute_mib": 668.1, "rest_mib": 400.8, "total_mib": 20228.0},
            12288,
            1024,
        ),
    }
    assert ub["all_experts_on_cpu"]["fits"] and ub["all_experts_on_cpu"]["n_cpu_moe"] == 48


@pytest.mark.parametrize("name", ["ncmoe25", "ncmoe26", "ncmoe29", "ncmoe31"])
def test_the_calibrated_prediction_is_the_load_peak_of_the_h200_records(name):
    rec = json.loads((FIXTURES / "h200-records" / f"{name}.json").read_text())
    n = rec["settings"]["n_cpu_moe"]
    ub = row(suggest.suggest(QWEN, 12288, CTX, ubatches=[UB], calibration=SEARCH_JSON), UB)
    predicted = ub["values"][n]["predicted_mib"]
    assert predicted == pytest.approx(rec["memory"]["per_phase"]["load"]["gpu_mib"], abs=5)
    assert 0 < rec["memory"]["peak_gpu_mib"] - predicted < 160  # serving adds CUDA's pool: the margin's job


def test_what_if_12_gb_row_is_the_suggestion_for_a_12288_mib_card():
    table = suggest.what_if(QWEN, SEARCH_JSON)
    rows = table["rows"]
    assert len(rows) == len(suggest.CARDS) * len(suggest.WHAT_IF_CTXS) * len(suggest.DEFAULT_UBATCHES)
    assert set(rows[0]) == {"card", "vram_mib", "ctx", "ubatch", "n_cpu_moe", "status", "predicted_mib", "headroom_mib"}
    twelve = next(r for r in rows if r["card"] == "12 GB" and r["ctx"] == CTX and r["ubatch"] == UB)
    ub = row(suggest.suggest(QWEN, SEARCH["limit_mib"], CTX, ubatches=[UB], calibration=SEARCH_JSON), UB)
    assert twelve["vram_mib"] == SEARCH["limit_mib"] == 12288
    assert (twelve["n_cpu_moe"], twelve["predicted_mib"], twelve["status"]) == (28, ub["predicted_mib"], suggest.FITS)
    # Plain data, consistent with itself: a larger card never needs more experts on the CPU, a longer context never
    # fewer; the status says the same as n_cpu_moe.
    for r in rows:
        assert r["status"] == {None: suggest.NO_FIT, 0: suggest.ALL_ON_GPU}.get(r["n_cpu_moe"], suggest.FITS)
        assert r["headroom_mib"] == pytest.approx(r["vram_mib"] - r["predicted_mib"])
        if r["n_cpu_moe"] is not None:
            assert r["headroom_mib"] >= table["margin_mib"]

    def lowest(card, ctx, ub=UB):
        n = next(r["n_cpu_moe"] for r in rows if (r["card"], r["ctx"], r["ubatch"]) == (card, ctx, ub))
        return 49 if n is None else n

    cards = [label for label, _ in suggest.CARDS]
    for ctx in suggest.WHAT_IF_CTXS:
        assert [lowest(c, ctx) for c in cards] == sorted((lowest(c, ctx) for c in cards), reverse=True)
    for card in cards:
        assert [lowest(card, c) for c in suggest.WHAT_IF_CTXS] == sorted(lowest(card, c) for c in suggest.WHAT_IF_CTXS)
    assert lowest("8 GB", 131072) == 49 and lowest("80 GB", 131072) == 0
    assert table["assumptions"][0].startswith("cards as marketed: N GB = N × 1024 MiB")
    assert any("above the model's trained context (40,960)" in a for a in table["assumptions"])
    json.dumps(table)  # plain data


def test_a_calibration_at_one_ubatch_and_context_serves_the_others():
    cal = suggest_inputs.calibration_from(SEARCH_JSON)
    assert (cal.compute_mib, cal.rest_mib, cal.ctx) == ({2048: 668.12}, 400.8, 32768)
    # Below the measured ubatch: the measured value (an upper bound); at 128K the KQ mask grows by
    # (131072 - 32768) × 2048 × 2 bytes = 384 MiB.
    assert suggest.calibrated_compute_mib(QWEN, cal, 512, 32768)[0] == 668.12
    assert suggest.calibrated_compute_mib(QWEN, cal, 2048, 131072)[0] == pytest.approx(668.12 + 384)
    assert suggest.calibrated_compute_mib(QWEN, cal, 512, 131072)[0] == pytest.approx(668.12 + 384)
    # Above it: the measured value plus the estimate's growth per token; between two measured: linear.
    per_token = (4 * suggest.activation_floats_per_token(QWEN) + 2 * 32768) / planner.MIB
    assert suggest.calibrated_compute_mib(QWEN, cal, 4096, 32768)[0] == pytest.approx(668.12 + 2048 * per_token)
    two = suggest_inputs.Calibration({512: 248.0, 2048: 668.0}, 400.0, 32768)
    compute, how = suggest.calibrated_compute_mib(QWEN, two, 1024, 32768)
    assert compute == pytest.approx(248 + 420 / 3) and how == "between -ub 512 and -ub 2048, linearly"
    # The H200's real buffers (CUDA0 + CUDA_Host compute, as search.calibration sums them) at ubatch 512: 248 MiB.
    assert suggest.calibrated_compute_mib(QWEN, cal, 512, 32768)[0] >= 200.01 + 48.02


# -- uncalibrated ---------------------------------------------------------------------------------------------------


def test_uncalibrated_estimate_is_above_every_h200_measurement():
    runs = {r["file"]: r for r in json.loads((FIXTURES / "cuda-logs" / "runs.json").read_text())}
    assert suggest.estimated_compute_mib(QWEN, 2048, CTX) >= runs["ok-ncmoe28-budget12g.log"]["bufs"]["CUDA0:compute"]
    assert (
        suggest.estimated_compute_mib(QWEN, 512, CTX) >= runs["ok-ncmoe26-ub512-budget12g.log"]["bufs"]["CUDA0:compute"]
    )
    for folder in ("h200-records", "h200-records-11761"):
        for path in sorted((FIXTURES / folder).glob("*.json")):
            rec = json.loads(path.read_text())
            s = rec.get("settings") or {}
            if rec.get("outcome") != "ok" or s.get("n_cpu_moe") is None:
                continue
            ub = row(suggest.suggest(QWEN, 12288, s["ctx"], ubatches=[s["ubatch"]]), s["ubatch"])
            predicted = ub["values"][s["n_cpu_moe"]]["predicted_mib"]
            assert rec["memory"]["peak_gpu_mib"] <= predicted <= rec["memory"]["peak_gpu_mib"] + 400, path.name


def test_uncalibrated_it_says_so_and_is_no_bolder_than_the_measured_answer():
    result = suggest.suggest(QWEN, 12288, CTX, ubatches=[UB])
    assert not result["calibrated"] and result["calibration"] is None
    n = row(result, UB)["n_cpu_moe"]
    assert SEARCH["recommended_n_cpu_moe"] <= n <= SEARCH["recommended_n_cpu_moe"] + 2
    out = suggest_cli.text(result)
    assert out.startswith("Prediction (not measured, uncalibrated) for qwen3-30b-a3b on a 12 GiB card (12,288 MiB)")
    assert "uncalibrated: the compute buffer is estimated" in out and f"{suggest.REST_ESTIMATE_MIB} MiB" in out


# -- a real GGUF ----------------------------------------------------------------------------------------------------


def test_from_a_gguf_path_lowest_all_on_gpu_and_does_not_fit(tiny_moe):
    manifest = inspect_gguf(tiny_moe)
    layers = manifest["layers"]
    base = suggest.suggest(tiny_moe, 10**6, 8192, margin_mib=0)
    assert base["model"] == "tiny-moe" and base["layers"] == layers and base["expert_layers"] == layers
    ub = row(base, 512)
    assert ub["status"] == suggest.ALL_ON_GPU and ub["n_cpu_moe"] == 0
    totals = [v["predicted_mib"] for v in ub["values"]]
    assert totals == sorted(totals, reverse=True) and totals[0] > totals[2] > totals[-1]
    expected_kv = planner.kv_mib(manifest, {"ctx": 8192, "cache_type_k": "f16", "cache_type_v": "f16"})
    assert ub["prediction"]["kv_mib"] == pytest.approx(expected_kv, abs=0.1)
    assert ub["prediction"]["rest_mib"] == suggest.REST_ESTIMATE_MIB

    # A card that holds exactly the prediction at n_cpu_moe 2: 2 is the lowest; 0.1 MiB less: 3.
    two = suggest.suggest(tiny_moe, totals[2], 8192, ubatches=[512], margin_mib=0)
    assert row(two, 512)["n_cpu_moe"] == 2 and row(two, 512)["status"] == suggest.FITS
    assert row(suggest.suggest(tiny_moe, totals[2] - 0.1, 8192, ubatches=[512], margin_mib=0), 512)["n_cpu_moe"] == 3
    out = suggest_cli.text(two)
    assert "  -ub 512: --n-cpu-moe 2 (predicted" in out and "Everything on the GPU (--n-cpu-moe 0) would need" in out

    small = suggest.suggest(tiny_moe, 900, 8192, ubatches=[512, 2048], margin_mib=0)
    for ub in small["ubatches"]:
        assert ub["status"] == suggest.NO_FIT and ub["n_cpu_moe"] is None and ub["args"] is None
        assert ub["predicted_mib"] == ub["all_experts_on_cpu"]["predicted_mib"] > 900
        assert not ub["all_experts_on_cpu"]["fits"] and "does not fit" in ub["arithmetic"]
    out = suggest_cli.text(small)
    assert f"does not fit, even with every expert layer on the CPU (--n-cpu-moe {layers}:" in out
    assert "To fit:" in out


def _compute_buffer(server_binary, model, tmp_path, ctx: int, ubatch: int) -> dict:
    command = [server_binary, "-m", str(model), "-c", str(ctx), "-b", str(ubatch), "-ub", str(ubatch)]
    command += ["-np", "1", "-t", "2", "-fa", "on"]
    with ServerProcess(command, tmp_path / f"server-{ctx}-{ubatch}.log") as server:
        assert server.start_ready(120) == "ready", server.log_text()[-2000:]
        return logparse.parse_log(server.log_text())["buffers_mib"]


@pytest.mark.parametrize(
    "shape",
    [
        synthetic.DEFAULT_TINY,
        {"layers": 2, "n_embd": 1024, "n_head": 8, "n_head_kv": 2, "head_dim": 128, "n_expert": 8, "n_expert_used": 4,
         "expert_ffn": 512, "ffn": 512},
    ],
    ids=["tiny", "wider"],
)  # fmt: skip
def test_estimate_holds_against_llama_cpps_own_buffers(server_binary, tmp_path, shape):
    """The CPU build reports the compute buffer of the same graph: the estimate less its CUDA allowance is at or
    above it, by less than half; the KV cache is the planner's to the MiB."""
    path = tmp_path / "model.gguf"
    synthetic.write_moe_gguf(path, shape)
    manifest = inspect_gguf(path)
    for ctx, ubatch in [(4096, 512), (16384, 1024)]:
        buffers = _compute_buffer(server_binary, path, tmp_path, ctx, ubatch)
        measured = buffers["CPU:compute"]
        estimate = suggest.estimated_compute_mib(manifest, ubatch, ctx) - suggest.COMPUTE_ALLOWANCE_MIB
        assert measured <= estimate <= 1.5 * measured, (ctx, ubatch, measured, estimate)
        kv = row(suggest.suggest(manifest, 10**6, ctx, ubatches=[ubatch]), ubatch)["prediction"]["kv_mib"]
        assert kv == pytest.approx(buffers["CPU:kv"], abs=0.1)


# -- input ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, mib",
    [
        ("24GiB", 24576),
        ("24GB", 24576),
        ("24 gb", 24576),
        ("24G", 24576),
        ("24576MiB", 24576),
        ("24576MB", 24576),
        ("24576", 24576),
        (24576, 24576),
        ("23.5GiB", 24064),
        (" 12GiB ", 12288),
    ],
)
def test_size_parser_reads_what_people_write(text, mib):
    assert suggest_inputs.parse_size_mib(text, "--vram") == mib


@pytest.mark.parametrize(
    "text, why",
    [
        ("24XB", "has an unknown unit 'XB'"),
        ("24TB", "has an unknown unit 'TB'"),
        ("lots", "is not a size"),
        ("", "is not a size"),
        ("-24GiB", "is negative"),
        ("0", "is 0 MiB, less than 1 MiB"),
        ("0.0001GiB", "is 0 MiB, less than 1 MiB"),
        ("24GiB24", "is not a size"),
        (None, "is not a size"),
        (True, "is not a size"),
    ],
)
def test_size_parser_names_the_bad_value(text, why):
    with pytest.raises(suggest_inputs.SuggestError) as e:
        suggest_inputs.parse_size_mib(text, "--vram")
    message = str(e.value)
    assert message.startswith(f"--vram {text!r} {why}") and "24GiB, 24GB, 24576MiB or 24576" in message


def test_a_margin_may_be_zero_and_ubatches_are_a_list():
    assert suggest_inputs.parse_size_mib("0", "--margin", minimum=0) == 0
    assert suggest_inputs.parse_ubatches("2048, 512,512") == (512, 2048)
    assert suggest_inputs.parse_ubatches(1024) == (1024,)
    for bad in ("512,x", "0", "", "512,,2048"):
        with pytest.raises(suggest_inputs.SuggestError, match=re.escape(f"--ubatch {bad!r}")):
            suggest_inputs.parse_ubatches(bad)


def test_allocated_context_is_llama_cpps():
    assert suggest.allocated_ctx(32768) == 32768
    assert suggest.allocated_ctx(1000) == 1024
    assert suggest.allocated_ctx(1000, 3) == 1536  # 1024 / 3 slots = 341, rounded up to 512 each


def test_bad_model_calibration_and_settings_are_named(tmp_path):
    with pytest.raises(suggest_inputs.SuggestError, match="model '/nowhere.gguf': no such file"):
        suggest.suggest("/nowhere.gguf", 24576, 8192)
    with pytest.raises(suggest_inputs.SuggestError, match="lacks head_dim"):
        suggest.suggest({**QWEN, "head_dim": None}, 24576, 8192)
    with pytest.raises(suggest_inputs.SuggestError, match="calibration '/nowhere.json': no such file"):
        suggest.suggest(QWEN, 24576, 8192, calibration="/nowhere.json")
    # a folder and a GGUF where a file and a search.json belong (#26: "no such file", a UnicodeDecodeError)
    with pytest.raises(suggest_inputs.SuggestError, match=f"model '{tmp_path}': a folder; give the GGUF file in it"):
        suggest.suggest(str(tmp_path), 24576, 8192)
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF\x03\x00\x00\x00\xff\xfe" + bytes(range(256)))
    with pytest.raises(
        suggest_inputs.SuggestError, match="not a record: not text .* give the search.json a search wrote"
    ):
        suggest.suggest(QWEN, 24576, 8192, calibration=str(gguf))
    table_row = {k: v for k, v in SEARCH.items() if k not in ("compute_mib", "rest_mib")}
    with pytest.raises(suggest_inputs.SuggestError, match="has no compute_mib or rest_mib: give the search.json"):
        suggest_inputs.calibration_from(table_row)
    with pytest.raises(SettingsError, match="cache_type_k"):
        suggest.suggest(QWEN, 24576, 8192, cache_type_k="q3_k")
    with pytest.raises(suggest_inputs.SuggestError, match="vram_mib '24GiB' must be a positive number of MiB"):
        suggest.suggest(QWEN, "24GiB", 8192)
    # A row with the calibration's fields as JSON text (as a table might keep them) is read like the record.
    as_text = {**SEARCH, "compute_mib": json.dumps(SEARCH["compute_mib"]), "settings": json.dumps(SEARCH["settings"])}
    assert suggest_inputs.calibration_from(as_text) == suggest_inputs.Calibration(
        {2048: 668.12}, 400.8, 32768, "search moe-synthetic/bench"
    )


def test_from_cli_prints_the_prediction():
    out = suggest_cli.from_cli(str(MANIFEST_JSON), "12GiB", CTX, ubatch="2048", calibration=str(SEARCH_JSON))
    assert (
        out.splitlines()[0]
        == "Prediction (not measured) for qwen3-30b-a3b on a 12 GiB card (12,288 MiB), ctx 32768, f16 KV:"
    )
    assert out.splitlines()[1] == "  -ub 2048: --n-cpu-moe 28 (predicted 11,156 MiB of 12,288 with a 1,024 MiB margin)"
    assert "weights 7,015 + KV 3,072 + compute 668 + rest 401 = 11,156 MiB" in out.splitlines()[2]
    with pytest.raises(suggest_inputs.SuggestError, match="--vram '12 lots'"):
        suggest_cli.from_cli(str(MANIFEST_JSON), "12 lots", CTX)
    q8 = suggest_cli.from_cli(str(MANIFEST_JSON), "24GB", 131072, cache_type="q8_0", margin="512")
    assert "24 GiB card" in q8 and "q8_0 KV" in q8 and "with a 512 MiB margin" in q8 and "uncalibrated" in q8


def test_suggest_from_the_command_line():
    """What a user types: the H200 model's manifest and its search as the calibration."""
    import subprocess
    import sys

    fixtures = Path(__file__).parent / "fixtures"
    proc = subprocess.run(
        [sys.executable, "-m", "crashline", "suggest", str(fixtures / "h200-telemetry" / "manifest.json")]
        + ["--vram", "12GiB", "--ctx", "32768", "--calibration", str(fixtures / "h200-search" / "search.json")],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("Prediction (not measured) for qwen3-30b-a3b on a 12 GiB card (12,288 MiB)")
    assert "-ub 2048: --n-cpu-moe 28 (predicted 11,156 MiB of 12,288 with a 1,024 MiB margin)" in proc.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "crashline", "suggest", "nothing.gguf", "--vram", "12GiB", "--ctx", "4096"],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "nothing.gguf" in bad.stderr


def test_a_ubatch_past_the_context_is_labelled_as_llama_cpp_runs_it_and_a_margin_past_the_card_is_named():
    """--ubatch 99999999 was predicted as clamped but labelled with the asked value; a margin larger than the card
    ended in "does not fit" without naming the margin (issue #26)."""
    result = suggest.suggest(QWEN, 12288, 4096, ubatches=[512, 99_999_999])
    assert [r["ubatch"] for r in result["ubatches"]] == [512, 4096]
    assert row(result, 4096)["asked_ubatch"] == 99_999_999 and row(result, 512)["asked_ubatch"] is None
    said = suggest_cli.text(result)
    assert "asked -ub 99999999" in said and "  -ub 99999999:" not in said and "  -ub 4096:" in said
    with pytest.raises(suggest_inputs.SuggestError, match="--margin 102,400 MiB is not less than the card's 8,192 MiB"):
        suggest.suggest(QWEN, 8192, 4096, margin_mib=102_400)


def test_tune_names_a_margin_past_the_card_before_anything_runs(tmp_path):
    from crashline.cli.tune import config
    from crashline.config.file import ConfigError

    with pytest.raises(ConfigError, match="--margin 1,024 MiB is not less than --vram 1,000 MiB"):
        config("synthetic:tiny-moe", 4096, 1024, 1000, None, tmp_path)


def test_the_answer_is_a_command_to_paste_and_the_card_is_read_where_there_is_one(tiny_moe):
    """suggest printed no llama-server line, and needed --vram even where it could read the card (issue #27)."""
    from crashline.core.host import gpus

    said = suggest_cli.from_cli(str(tiny_moe), "8GiB", 4096, "512")
    (line,) = [x.strip() for x in said.splitlines() if x.strip().startswith("llama-server ")]
    assert line.startswith(f"llama-server -m {tiny_moe} -ngl 999 --n-cpu-moe 0 -c 4096") and " -ub 512 " in line
    if gpus()["present"]:
        assert "on a " in suggest_cli.from_cli(str(tiny_moe), None, 4096)
    else:  # #41: suggest needed --vram on a machine without a GPU; it answers for the CPU alone
        said = suggest_cli.from_cli(str(tiny_moe), None, 4096, "512,2048")
        assert said.splitlines()[0].startswith("Prediction (not measured) for tiny-moe on this machine (no GPU")
        lines = [x.strip() for x in said.splitlines() if "llama-server " in x]
        assert [x.split(":")[0] for x in lines] == ["-ub 512", "-ub 2048"]
        assert all(" -ngl 0 " in x and f"-m {tiny_moe} " in x for x in lines), lines
        assert said.count("host memory: weights on the CPU ") == 2


def test_a_dense_model_that_does_not_fit_gets_the_most_layers_that_do(gemma_fetch):
    """#41: for a model without experts that did not fit the card, suggest said only "does not fit"; llama.cpp's
    answer is -ngl N, the rest of the layers on the CPU."""
    gguf = gemma_fetch["files"][0]["path"]
    layers = inspect_gguf(Path(gguf))["layers"]
    whole = row(suggest.suggest(gguf, 10**6, 4096, ubatches=[512], margin_mib=0), 512)
    assert whole["status"] == suggest.ALL_ON_GPU and whole["n_gpu_layers"] is None
    by_layers, _ = suggest.predictions(inspect_gguf(Path(gguf)), 4096, 512, "f16", "f16", None, vary="n_gpu_layers")
    half = by_layers[layers // 2]["total_mib"]  # a card that holds half the layers exactly
    part = row(suggest.suggest(gguf, half, 4096, ubatches=[512], margin_mib=0), 512)
    assert (part["status"], part["n_gpu_layers"], part["predicted_mib"]) == (suggest.PART_ON_GPU, layers // 2, half)
    assert part["args"][:2] == ["-ngl", str(layers // 2)]
    said = suggest_cli.text(suggest.suggest(gguf, half, 4096, ubatches=[512], margin_mib=0))
    assert f"offload {layers // 2} of its {layers} layers (-ngl {layers // 2}: predicted" in said
    assert f" -ngl {layers // 2} " in said
    none = row(suggest.suggest(gguf, by_layers[0]["total_mib"] - 1, 4096, ubatches=[512], margin_mib=0), 512)
    assert none["status"] == suggest.NO_FIT and none["args"] is None  # not even the runtime fits
