"""crashline.engine.logparse against real llama-server logs.

cuda-logs/: captured on an H200 (see its README.md and runs.json).
cpu-logs/: a CPU build of the same llama.cpp (11434.0.0) on 2 cores / 24 GiB, model gemma-3-270m Q4_K_M:
  ok-cpu-gemma3-270m.log         -lv 4 -c 4096; one /completion, then SIGINT (the server exits 0)
  loadfail-kv-cache-ctx16m.log   -lv 4 -c 16000000 -np 1 --fit off: 46875 MB KV malloc refused, exit 1
  loadfail-not-gguf.log          -m /etc/hostname: "failed to read magic", exit 1
  ok-tiny-moe-draft.log          the synthetic tiny-moe with a 1-layer draft of its vocabulary (-md), -lv 4 -c 2048,
                                 stopped by SIGTERM once ready
"""

import json
from pathlib import Path

import pytest

from crashline.engine.logparse import accelerator_share, classify, on_host, parse_log, summarize

FIXTURES = Path(__file__).parent / "fixtures"
CUDA = FIXTURES / "cuda-logs"
CPU = FIXTURES / "cpu-logs"
RUNS = {run["file"]: run for run in json.loads((CUDA / "runs.json").read_text())}


def read(path: Path) -> str:
    return path.read_text()


# file, exit status seen by the capturing script, expected (outcome, failure, phase)
CUDA_CASES = [
    ("ok-full-gpu.log", -2, ("ok", None, None)),
    ("ok-ncmoe28-budget12g.log", -2, ("ok", None, None)),
    ("ok-ncmoe26-ub512-budget12g.log", -2, ("ok", None, None)),
    ("loadfail-model-buffer.log", 1, ("load_failed", "weights", "load")),
    ("loadfail-kv-cache.log", 1, ("load_failed", "kv_cache", "load")),
    ("loadfail-compute-buffer.log", 1, ("load_failed", "compute_buffer", "load")),
    ("oom-abort-at-warmup.log", -6, ("oom", "oom", "warmup")),
]
CUDA_IDS = [c[0] for c in CUDA_CASES]


def _triple(result: dict) -> tuple:
    return result["outcome"], result["failure"], result["phase"]


@pytest.mark.parametrize("name, rc, expected", CUDA_CASES, ids=CUDA_IDS)
def test_cuda_classify_with_returncode(name, rc, expected):
    result = classify(read(CUDA / name), rc)
    assert _triple(result) == expected
    assert (result["message"] is None) == (expected[0] == "ok")


@pytest.mark.parametrize("name, rc, expected", CUDA_CASES, ids=CUDA_IDS)
def test_cuda_summarize_without_returncode(name, rc, expected):
    summary = summarize(CUDA / name)
    assert _triple(summary["classification"]) == expected
    json.dumps(summary)  # JSON-serialisable


@pytest.mark.parametrize("name", CUDA_IDS)
def test_cuda_buffers_match_runs_json(name):
    placement = parse_log(read(CUDA / name))
    expected = {key.split(":")[0] + ":" + key.split(":")[1].lower(): mib for key, mib in RUNS[name]["bufs"].items()}
    # runs.json's script skipped the 0.00 MiB output buffer; everything else must agree exactly
    got = {key: mib for key, mib in placement["buffers_mib"].items() if not key.endswith(":output")}
    assert got.keys() == expected.keys()
    for key, mib in expected.items():
        assert got[key] == pytest.approx(mib, abs=0.01), key
    assert {f"{b['device']}:{b['kind']}": b["mib"] for b in placement["buffers"]} == placement["buffers_mib"]


@pytest.mark.parametrize("name", CUDA_IDS)
def test_cuda_settings(name):
    run = RUNS[name]
    p = parse_log(read(CUDA / name))
    assert p["n_threads"] == 16 and p["n_threads_batch"] == 16
    assert p["build"] == "0 (unknown) with GNU 13.3.0 for Linux x86_64"
    assert p["devices"][0]["name"] == "CUDA0" and p["devices"][0]["total_mib"] == 143155
    assert p["devices"][0]["free_mib"] == (142629 if run["vram_budget_mib"] is None else 11237)
    if name == "loadfail-model-buffer.log":  # died inside load_tensors: no layer or context lines
        assert p["layers_offloaded"] is None and p["n_ctx"] is None and p["n_ubatch"] is None
        return
    assert (p["layers_offloaded"], p["layers_total"]) == (49, 49)
    assert p["n_ctx"] == p["n_ctx_seq"] == run["-c"]
    assert p["n_ubatch"] == run["-ub"] and p["n_batch"] == 2048
    assert p["n_seq_max"] == 1
    assert p["flash_attn"] == "auto"
    if name == "loadfail-kv-cache.log":  # KV allocation failed before its size/type line
        assert p["type_k"] is None and p["flash_attn_resolved"] is None
    else:
        assert (p["type_k"], p["type_v"]) == ("f16", "f16")
        assert p["flash_attn_resolved"] == "enabled"
    served = name.startswith("ok-")
    assert p["n_parallel"] == (1 if served else None)
    assert p["n_ctx_slot"] == (run["-c"] if served else None)


BREAKDOWNS = {
    "ok-full-gpu.log": [
        ("CUDA0", 143155, 122795, 19623, 16087, 3072, 464, 737),
        ("Host", None, None, 192, 0, 0, 192, None),
    ],
    "ok-ncmoe28-budget12g.log": [
        ("CUDA0", 143155, 465, 10563, 7015, 3072, 476, 132127),
        ("Host", None, None, 9576, 9384, 0, 192, None),
    ],
    "ok-ncmoe26-ub512-budget12g.log": [
        ("CUDA0", 143155, 119, 10935, 7663, 3072, 200, 132101),
        ("Host", None, None, 8762, 8714, 0, 48, None),
    ],
}
COLUMNS = ("device", "total", "free", "self", "model", "context", "compute", "unaccounted")


@pytest.mark.parametrize("name", CUDA_IDS)
def test_cuda_memory_breakdown(name):
    rows = parse_log(read(CUDA / name))["memory_breakdown"]
    expected = [dict(zip(COLUMNS, row)) for row in BREAKDOWNS.get(name, [])]
    assert [{k: r[k] for k in COLUMNS} for r in rows] == expected
    if rows:
        assert rows[0]["description"] == "H200"


@pytest.mark.parametrize(
    "name, needle",
    [
        ("loadfail-model-buffer.log", "unable to allocate CUDA0 buffer"),
        ("loadfail-kv-cache.log", "failed to allocate buffer for kv cache"),
        ("loadfail-compute-buffer.log", "failed to allocate compute buffers"),
        ("oom-abort-at-warmup.log", "CUDA error: out of memory"),
    ],
)
def test_cuda_errors_and_message(name, needle):
    text = read(CUDA / name)
    errors = parse_log(text)["errors"]
    assert any(needle in e for e in errors)
    assert all(not e.startswith("0.") for e in errors)  # timestamp/level prefix stripped
    assert needle in classify(text, None)["message"]


def test_ok_logs_have_no_errors_and_tail_is_last_40_lines():
    text = read(CUDA / "ok-ncmoe28-budget12g.log")
    p = parse_log(text)
    assert p["errors"] == []
    assert p["tail"].splitlines() == text.splitlines()[-40:]


# --- classify rules on edited real logs ----------------------------------------------------------

OK_TEXT = read(CUDA / "ok-ncmoe28-budget12g.log")
# the ok log up to and including "all slots are idle" after the first request: no shutdown yet
SERVING_TEXT = OK_TEXT[: OK_TEXT.index("cleaning up before exit")].rsplit("\n", 1)[0] + "\n"


@pytest.mark.parametrize("rc", [0, -2, 130, -15, 143])
def test_clean_exits_are_ok(rc):
    assert classify(OK_TEXT, rc) == {"outcome": "ok", "failure": None, "phase": None, "message": None}


@pytest.mark.parametrize("rc, signame", [(-11, "SIGSEGV"), (-9, "SIGKILL"), (-6, "SIGABRT")])
def test_signal_during_serving_is_crash(rc, signame):
    result = classify(SERVING_TEXT, rc, phase_hint="depth-8192")
    assert _triple(result) == ("crashed", "signal", "depth-8192")
    assert signame in result["message"]


def test_positive_exit_before_listening_is_unknown_load_failure():
    text = OK_TEXT[: OK_TEXT.index("warming up the model")]
    assert _triple(classify(text, 1)) == ("load_failed", "unknown", "load")


def test_positive_exit_after_listening_is_crash():
    assert _triple(classify(SERVING_TEXT, 1)) == ("crashed", "exit_code", "serving")


def test_oom_while_serving_takes_phase_hint():
    text = SERVING_TEXT + (
        "0.05.000.000 E ggml_backend_cuda_buffer_type_alloc_buffer: allocating 900.00 MiB on device 0: "
        "cudaMalloc failed: out of memory\n"
        "0.05.000.001 E CUDA error: out of memory\n"
    )
    result = classify(text, -6, phase_hint="depth-8192")
    assert _triple(result) == ("oom", "oom", "depth-8192")
    assert "900.00 MiB" in result["message"]
    assert classify(text, -6)["phase"] == "serving"


@pytest.mark.parametrize(
    "text, hint, expected",
    [
        (SERVING_TEXT, "depth-32768", ("timeout", "timeout", "depth-32768")),
        (OK_TEXT[: OK_TEXT.index("warming up the model")], None, ("timeout", "timeout", "load")),
    ],
)
def test_timeout(text, hint, expected):
    assert _triple(classify(text, None, phase_hint=hint, timed_out=True)) == expected


def test_recognised_failure_wins_over_timeout_and_returncode():
    text = read(CUDA / "oom-abort-at-warmup.log")
    assert _triple(classify(text, 0, timed_out=True)) == ("oom", "oom", "warmup")


@pytest.mark.parametrize(
    "text, expected",
    [
        (SERVING_TEXT, ("crashed", "unknown", "serving")),  # log stops mid-serving: SIGKILL / OOM killer
        (OK_TEXT[: OK_TEXT.index("warming up the model")], ("load_failed", "unknown", "load")),
        (OK_TEXT, ("ok", None, None)),
    ],
    ids=["stops-while-serving", "stops-while-loading", "shutdown-lines"],
)
def test_log_without_exit_status(text, expected):
    result = classify(text, None)
    assert _triple(result) == expected
    assert (result["message"] is None) == (expected[0] == "ok")


# --- CPU logs ------------------------------------------------------------------------------------

CPU_CASES = [
    ("ok-cpu-gemma3-270m.log", 0, ("ok", None, None), None),
    ("loadfail-kv-cache-ctx16m.log", 1, ("load_failed", "kv_cache", "load"), "46875.00 MB"),
    ("loadfail-not-gguf.log", 1, ("load_failed", "model_file", "load"), "failed to read magic"),
]


@pytest.mark.parametrize("name, rc, expected, needle", CPU_CASES, ids=[c[0] for c in CPU_CASES])
def test_cpu_classify(name, rc, expected, needle):
    text = read(CPU / name)
    for result in (classify(text, rc), summarize(CPU / name)["classification"]):
        assert _triple(result) == expected
        assert result["message"] is None if needle is None else needle in result["message"]


CPU_PLACEMENT = {
    "ok-cpu-gemma3-270m.log": {
        "buffers_mib": {
            "CPU_Mapped:model": 235.16,
            "CPU_REPACK:model": 12.66,
            "CPU:output": 4.0,
            "CPU:kv": 12.0,
            "CPU:kv_swa": 37.5,
            "CPU:compute": 24.78,
        },
        "n_ctx": 4096,
        "n_ctx_seq": 4096,
        "n_ctx_slot": 4096,
        "n_batch": 2048,
        "n_ubatch": 512,
        "n_seq_max": 4,
        "n_parallel": 4,
        "flash_attn": "auto",
        "flash_attn_resolved": "enabled",
        "type_k": "f16",
        "type_v": "f16",
    },
    "loadfail-kv-cache-ctx16m.log": {
        "buffers_mib": {"CPU_Mapped:model": 235.16, "CPU_REPACK:model": 12.66, "CPU:output": 1.0},
        "n_ctx": 16000000,
        "n_ctx_seq": 16000000,
        "n_ctx_slot": None,
        "n_batch": 2048,
        "n_ubatch": 512,
        "n_seq_max": 1,
        "n_parallel": None,
        "flash_attn": "auto",
        "flash_attn_resolved": None,
        "type_k": None,
        "type_v": None,
    },
    "loadfail-not-gguf.log": {
        "buffers_mib": {},
        "n_ctx": None,
        "n_ubatch": None,
        "flash_attn": None,
        "type_k": None,
    },
}


@pytest.mark.parametrize("name", list(CPU_PLACEMENT))
def test_cpu_placement(name):
    p = parse_log(read(CPU / name))
    for key, value in CPU_PLACEMENT[name].items():
        if key == "buffers_mib":
            assert p[key].keys() == value.keys()
            for buf, mib in value.items():
                assert p[key][buf] == pytest.approx(mib, abs=0.01), buf
        else:
            assert p[key] == value, key
    # CPU build: no "offloaded N/M layers" line, and device_info lists only the CPU
    assert p["layers_offloaded"] is None and p["layers_total"] is None
    assert p["devices"] == []
    assert (p["n_threads"], p["n_threads_batch"]) == (2, 2)
    assert p["build"] == "0 (unknown) with GNU 12.2.0 for Linux x86_64"
    json.dumps(p)


def test_cpu_breakdown_is_the_exit_table_not_the_fit_projection():
    text = read(CPU / "ok-cpu-gemma3-270m.log")
    assert text.count("memory breakdown [MiB]") == 2  # --fit prints a projection before loading
    rows = parse_log(text)["memory_breakdown"]
    assert [{k: r[k] for k in COLUMNS} for r in rows] == [
        dict(zip(COLUMNS, ("Host", None, None, 309, 235, 49, 24, None))),
        dict(zip(COLUMNS, ("CPU_REPACK", None, None, 12, 12, 0, 0, None))),
    ]


def test_cpu_errors():
    errors = parse_log(read(CPU / "loadfail-not-gguf.log"))["errors"]
    assert errors[0] == "gguf_init_from_reader: failed to read magic"
    assert errors[-1] == "srv  llama_server: exiting due to model loading error"
    assert parse_log(read(CPU / "ok-cpu-gemma3-270m.log"))["errors"] == []


# --- what went to the GPU, for the decode bound ------------------------------------------------------


@pytest.mark.parametrize(
    "name, weights_mib, kv_mib",
    [
        ("ok-full-gpu.log", 16087.10, 3072.0),
        ("ok-ncmoe28-budget12g.log", 7015.09, 3072.0),
        ("ok-ncmoe26-ub512-budget12g.log", 7663.09, 3072.0),
        ("loadfail-kv-cache.log", 8311.10, 0.0),  # the weights were placed, the KV cache never was
    ],
)
def test_accelerator_share_of_the_real_cuda_logs(name, weights_mib, kv_mib):
    share = accelerator_share(parse_log(read(CUDA / name)))
    assert share["weights_mib"] == pytest.approx(weights_mib, abs=0.005)
    assert share["kv_mib"] == kv_mib and share["layers_offloaded"] == 49
    assert share["kv_total_mib"] == (kv_mib or None)


def test_accelerator_share_of_a_cpu_log_and_of_a_load_that_placed_nothing():
    cpu = accelerator_share(parse_log(read(CPU / "ok-cpu-gemma3-270m.log")))
    assert cpu == {"weights_mib": 0, "kv_mib": 0, "kv_total_mib": 49.5, "layers_offloaded": None}
    assert accelerator_share(parse_log(read(CUDA / "loadfail-model-buffer.log"))) is None
    assert accelerator_share(None) is None and accelerator_share({"buffers": []}) is None


def test_host_buffers_are_ram_and_the_others_accelerators():
    assert all(map(on_host, ["CPU", "CPU_Mapped", "CPU_REPACK", "CUDA_Host", "Vulkan_Host", "AMX"]))
    assert not any(map(on_host, ["CUDA0", "CUDA1", "ROCm0", "Vulkan0", "Metal", "SYCL0"]))


def test_what_fit_projected_to_leave_free_is_its_last_placement_line():
    """--fit prints a placement line per device at each step (the dense-only step first: 25,310 MiB free); the one it
    loads is the last. A log of --fit off has none."""
    log = (CUDA / "fit-on-seed-100k-target-1024.log").read_text()
    assert parse_log(log)["fit_free_mib"] == {"CUDA0": 1184}
    assert parse_log((CUDA / "ok-ncmoe28-budget12g.log").read_text())["fit_free_mib"] is None


def test_a_draft_models_buffers_and_context_are_read_apart_from_the_models():
    """A speculative draft prints its buffers, KV cache and context lines as the model does, after it: read together,
    the draft's stood for the model's (KV 1.00 MiB instead of 4.00, compute 3.89 instead of 5.52), and the search's
    calibration took the draft's compute buffer for the model's."""
    placement = parse_log(read(CPU / "ok-tiny-moe-draft.log"))
    mib = placement["buffers_mib"]
    assert (mib["CPU:kv"], mib["CPU:compute"], mib["CPU_Mapped:model"]) == (4.0, 5.52, 1.8)
    draft = {f"{b['device']}:{b['kind']}": b["mib"] for b in placement["draft_buffers"]}
    assert (draft["CPU:kv"], draft["CPU:compute"], draft["CPU_Mapped:model"]) == (1.0, 3.89, 0.05)
    assert placement["n_ctx"] == 2048 and placement["n_parallel"] == 4  # the slots' line after the draft's load
    assert parse_log(read(CPU / "ok-cpu-gemma3-270m.log"))["draft_buffers"] == []
    # on a GPU (H100, lease of session 25): the model's compute buffer is its own, and the draft's VRAM is its
    # weights, KV cache and compute buffer on the card (542.80 MiB, the report's draft column)
    from crashline.tables.aggregate import draft_vram_mib

    cuda = parse_log(read(CUDA / "ok-draft-s8-ncmoe8.log"))
    assert (cuda["buffers_mib"]["CUDA0:kv"], cuda["buffers_mib"]["CUDA0:compute"]) == (1024.0, 604.05)
    assert draft_vram_mib(cuda) == 30.75 + 128.0 + 384.05 and cuda["layers_offloaded"] == 9
