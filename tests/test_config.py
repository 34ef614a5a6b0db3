"""Config validation and expansion: errors name the key and the value; ids are canonical."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from crashline.config.plan import load_schema
from crashline.config import plan as C
from crashline.core import settings as S

from conftest import REPO

SCHEMA = load_schema()


def base() -> dict:
    return {
        "models": {"m": {"source": "file:/x.gguf"}, "n": {"source": "synthetic:n"}},
        "configurations": [{"grid": {"ubatch": [128, 512]}}],
        "workloads": [{"name": "short", "prompt_tokens": 128, "gen_tokens": 16}],
    }


def test_default_config_is_valid_and_expands():
    cfg = C.load(REPO / "config" / "config.yaml")
    items = C.expand(cfg)
    assert len(items) == len({(i["model"], i["id"]) for i in items}) >= 4
    assert {i["model"] for i in items} == set(cfg["models"])
    assert cfg["repetitions"] >= 1 and cfg["budget"]["margin_mib"] == 1024


def test_defaults_filled():
    cfg = C.validate(base(), SCHEMA)
    assert cfg["repetitions"] == 3
    assert cfg["server"]["startup_timeout_s"] == 300
    assert cfg["models"]["m"]["prompt_style"] == "continuation"
    assert cfg["results_dir"] == "results"


@pytest.mark.parametrize(
    "mutate, expected",
    [
        (lambda c: c.update(bogus=1), "bogus"),
        (lambda c: c["workloads"][0].update(prompt_tokens="many"), "workloads.0.prompt_tokens = 'many'"),
        (lambda c: c["models"]["m"].update(source="ftp://x"), "models.m.source = 'ftp://x'"),
        (lambda c: c["models"]["m"].update(sha256="abc"), "models.m.sha256 = 'abc'"),
        (lambda c: c.update(repetitions=0), "repetitions = 0"),
        (lambda c: c["configurations"][0].update(models=["nope"]), "unknown model 'nope'"),
        (lambda c: c["workloads"].append(dict(c["workloads"][0])), "duplicate workload name(s) short"),
        (lambda c: c.update(objective={"workload": "long"}), "objective.workload = 'long'"),
    ],
)
def test_invalid_config_names_key_and_value(mutate, expected):
    cfg = base()
    mutate(cfg)
    with pytest.raises(C.ConfigError) as err:
        C.validate(cfg, SCHEMA)
    assert expected in str(err.value)


def test_unknown_setting_names_the_known_ones():
    cfg = base()
    cfg["configurations"][0]["settings"] = {"ubatchh": 128}
    with pytest.raises(C.ConfigError) as err:
        C.validate(cfg, SCHEMA)
    assert "'ubatchh'" in str(err.value) and "did you mean 'ubatch'?" in str(err.value)  # a near miss
    cfg["configurations"][0]["settings"] = {"speed": 128}
    with pytest.raises(C.ConfigError) as err:
        C.validate(cfg, SCHEMA)
    assert "'speed'" in str(err.value) and "known settings: n_gpu_layers, n_cpu_moe" in str(err.value)


def test_bad_setting_value():
    with pytest.raises(S.SettingsError, match="setting 'flash_attn'.*one of on, off, auto.*'maybe'"):
        S.resolve({"flash_attn": "maybe"})
    with pytest.raises(S.SettingsError, match="'n_cpu_moe'.*non-negative integer"):
        S.resolve({"n_cpu_moe": -1})


def test_id_is_canonical_and_changes_with_settings():
    explicit_default = S.resolve({"ubatch": 512})
    implicit = S.resolve({})
    assert S.config_id("m", explicit_default) == S.config_id("m", implicit)
    assert S.config_id("m", S.resolve({"ubatch": 256})) != S.config_id("m", implicit)
    assert S.config_id("n", implicit) != S.config_id("m", implicit)


def test_expand_deduplicates_and_editing_one_changes_one_id():
    cfg = C.validate(base(), SCHEMA)
    cfg2 = copy.deepcopy(cfg)
    cfg2["configurations"].append({"settings": {"ubatch": 512}})  # same as a grid point
    assert len(C.expand(cfg2)) == len(C.expand(cfg)) == 4
    edited = copy.deepcopy(cfg)
    edited["configurations"][0]["grid"]["ubatch"] = [128, 1024]
    before = {(i["model"], i["id"]) for i in C.expand(cfg)}
    after = {(i["model"], i["id"]) for i in C.expand(edited)}
    assert len(before - after) == 2 and len(after - before) == 2  # only the ubatch=512 ones changed


def test_server_args_cover_every_setting():
    r = S.resolve(
        {
            "n_cpu_moe": 26,
            "ubatch": 1024,
            "ctx": 32768,
            "cache_type_k": "q8_0",
            "flash_attn": True,
            "threads": 8,
            "override_tensor": "exps=CPU",
            "kv_unified": False,
            "extra_args": "--no-warmup",
        }
    )
    args = S.server_args(r)
    joined = " ".join(args)
    for expected in [
        "--n-cpu-moe 26",
        "-ub 1024",
        "-c 32768",
        "-ctk q8_0",
        "-fa on",
        "-t 8",
        "-ot exps=CPU",
        "-no-kvu",
        "--fit off",
        "-cb",
    ]:
        assert expected in joined
    assert args[-1] == "--no-warmup"


def test_flags_an_older_build_lacks_are_left_out_unless_asked_for():
    # A build from before -lm and --fit: crashline's defaults for them are the build's own behaviour.
    old = {"-ngl", "--n-cpu-moe", "-c", "-b", "-ub", "-ctk", "-ctv", "-fa", "-np", "-t", "-cb", "-nocb"}
    given = {"ubatch": 128, "threads": 2}
    kept, left_out = S.for_binary(S.resolve(given), given, old, "b5000")
    assert left_out == {"load_mode": "-lm", "fit": "--fit"}
    args = S.server_args(kept)
    assert "-lm" not in args and "--fit" not in args and "-ub 128" in " ".join(args)
    given = {"load_mode": "mmap"}
    with pytest.raises(
        S.SettingsError,
        match=r"setting load_mode = 'mmap' needs llama-server's -lm flag, "
        r"which this build \(b5000\) does not have",
    ):
        S.for_binary(S.resolve(given), given, old, "b5000")
    assert S.for_binary(S.resolve(given), given, None, "unknown")[1] == {}  # flags unknown: pass all


def test_check_flags_covers_configurations_and_searches():
    cfg = C.validate(
        {
            "models": {"m": {"source": "synthetic:tiny-moe"}},
            "configurations": [{"search": {"n_cpu_moe": [0, 4]}}],
            "workloads": [{"name": "w", "prompt_tokens": 8, "gen_tokens": 8}],
        },
        SCHEMA,
    )
    flags = set(S.server_args(S.resolve({"n_cpu_moe": 1}))) | {"-nocb"}
    C.check_flags(cfg, {f for f in flags if f.startswith("-")}, "new")
    with pytest.raises(S.SettingsError, match="n_cpu_moe = 4 needs llama-server's --n-cpu-moe flag"):
        C.check_flags(cfg, {f for f in flags if f.startswith("-") and f != "--n-cpu-moe"}, "old")


def test_fit_on_leaves_placement_to_llama_cpp():
    args = S.server_args(S.resolve({"fit": "on", "ctx": 8192}))
    assert "--fit on" in " ".join(args) and "-ngl" not in args and "--n-cpu-moe" not in args
    with pytest.raises(S.SettingsError, match="remove n_cpu_moe"):
        S.resolve({"fit": "on", "n_cpu_moe": 4})


def test_claims_add_their_configurations_and_workloads_once():
    from crashline.config import claims as K

    from conftest import FIXTURES

    cfg = base()
    cfg["claims"] = [str(FIXTURES / "claims" / "mixed.yaml")]
    v = C.validate(cfg, SCHEMA)
    assert [w["name"] for w in v["workloads"]] == ["short", "claim-pp512-tg64", "claim-pp512-tg64-c4"]
    assert C.validate(v, SCHEMA)["workloads"] == v["workloads"]  # reloading the effective config adds nothing
    items = C.expand(v)
    claim_ids = {(i["model"], i["id"]) for i in K.claim_configurations(K.load_claims(v["claims"], v))}
    assert claim_ids <= {(i["model"], i["id"]) for i in items}
    assert len(items) == len({(i["model"], i["id"]) for i in items}) == 2 * 2 + 1  # ub 128/512 x 2 models, np 4
    with pytest.raises(C.ConfigError, match="claims file"):
        C.validate({**base(), "claims": ["nowhere.yaml"]}, SCHEMA)


# -- the objective: a metric at a workload under one load, with limits per request ----------------------------------


def slot_sweep(objective: dict, parallel=(1, 4)) -> dict:
    """-np 1 and 4 at a `concurrency: slots` workload; with more slots, a workload of 4 requests at once too."""
    cfg = base()
    cfg["configurations"] = [{"grid": {"parallel": list(parallel)}, "settings": {"ctx": 8192}}]
    cfg["workloads"].append({"name": "slots", "prompt_tokens": 512, "gen_tokens": 64, "concurrency": "slots"})
    if min(parallel) >= 4:
        cfg["workloads"].append({"name": "c4", "prompt_tokens": 256, "gen_tokens": 64, "concurrency": 4})
    cfg["objective"] = objective
    return cfg


@pytest.mark.parametrize(
    "objective, resolved",
    [
        ({}, {"metric": "e2e_tps", "workload": "slots", "concurrency": 1}),  # slots: 1 request at once
        ({"concurrency": 4}, {"workload": "slots", "concurrency": 4}),  # the longest prompt run at 4 at once
        (
            {"metric": "aggregate_tps", "concurrency": 4, "min_decode_tps": 20, "max_ttft_s": 2.0},
            {"metric": "aggregate_tps", "concurrency": 4, "min_decode_tps": 20, "max_ttft_s": 2.0},
        ),
        ({"workload": "short"}, {"workload": "short", "concurrency": 1, "min_decode_tps": None, "max_ttft_s": None}),
    ],
)
def test_the_objective_resolves_its_load(objective, resolved):
    cfg = C.validate(slot_sweep(objective), SCHEMA)
    got = C.resolve_objective(cfg)
    assert {k: got[k] for k in resolved} == resolved
    assert C.objective_workload(cfg) == got["workload"]


def test_a_fixed_load_or_one_slot_count_is_the_objective_s_load():
    assert C.resolve_objective(C.validate(slot_sweep({"workload": "c4"}, (4, 8)), SCHEMA))["concurrency"] == 4
    assert C.resolve_objective(C.validate(slot_sweep({}, (4,)), SCHEMA))["concurrency"] == 4  # every -np alike
    # an explicit load picks the longest workload run at that load
    cfg = C.validate(slot_sweep({"concurrency": 8}, (4, 8)), SCHEMA)
    assert (C.objective_workload(cfg), C.resolve_objective(cfg)["concurrency"]) == ("slots", 8)
    bare = {"objective": cfg["objective"], "workloads": cfg["workloads"]}  # as the search asks, without configurations
    assert C.objective_workload(bare) == "slots"
    with pytest.raises(C.ConfigError, match="objective.concurrency = 8: workload 'c4' sends 4 request"):
        C.validate(slot_sweep({"workload": "c4", "concurrency": 8}, (4, 8)), SCHEMA)


def test_objective_workload_without_a_load_is_still_the_longest_prompt():
    cfg = C.validate(base(), SCHEMA)
    cfg["workloads"].append({"name": "long", "prompt_tokens": 4096, "gen_tokens": 16})
    assert C.objective_workload(cfg) == "long"
    cfg["objective"]["workload"] = "short"
    assert C.objective_workload(cfg) == "short"


@pytest.mark.parametrize(
    "objective, parallel, expected",
    [
        (
            {"metric": "speed"},
            (1, 4),
            "config key objective.metric = 'speed': unknown metric; expected one of e2e_tps (end-to-end t/s per "
            "request: its prompt and generated tokens over the whole time it took, as a user waits for it, so "
            "prefill and decode both count), decode_tps (decode t/s per request), prefill_tps (prefill t/s per "
            "request), aggregate_tps",
        ),
        (
            {"metric": "aggregate_tp"},
            (1, 4),
            "objective.metric = 'aggregate_tp': unknown metric; did you mean 'aggregate_tps'?",
        ),
        (
            {"min_decode_tps": 20},
            (1, 4),
            "config key objective.min_decode_tps = 20: a limit per request depends on how many requests run at once; "
            "set objective.concurrency",
        ),
        ({"max_ttft_s": 2.0}, (1, 4), "config key objective.max_ttft_s = 2.0: a limit per request depends"),
        ({"metric": "aggregate_tps"}, (1, 4), "objective.metric = 'aggregate_tps': aggregate throughput depends on"),
        ({"concurrency": 2}, (1, 4), "config key objective.concurrency = 2: no workload runs 2 request(s) at once"),
        (
            {"workload": "short", "concurrency": 4},
            (1, 4),
            "config key objective.concurrency = 4: workload 'short' sends 1 request(s) at once",
        ),
        (
            {"workload": "slots", "concurrency": 2},
            (1, 4),
            "workload 'slots' sends one request per slot, and no configuration has parallel = 2 (they have 1, 4)",
        ),
        (
            {},
            (2, 4),
            "config key objective.concurrency: the default objective workload (the longest prompt) 'slots' sends one "
            "request per slot, so the configurations run it at 2, 4 requests at once",
        ),
        ({"concurrency": 0}, (1, 4), "config key objective.concurrency = 0: 0 is less than the minimum of 1"),
        ({"min_decode_tps": -5, "concurrency": 4}, (1, 4), "config key objective.min_decode_tps = -5"),
        ({"speed": 1}, (1, 4), "config key objective.speed = 1: unknown key"),
    ],
)
def test_objective_errors_name_the_key(objective, parallel, expected):
    with pytest.raises(C.ConfigError) as err:
        C.validate(slot_sweep(objective, parallel), SCHEMA)
    assert expected in str(err.value)


def test_every_objective_key_is_described():
    block = SCHEMA["properties"]["objective"]
    assert block.get("description")
    assert set(block["properties"]) == {"metric", "workload", "concurrency", "min_decode_tps", "max_ttft_s"}
    assert all(p.get("description") for p in block["properties"].values())


# -- llama.cpp's --fit aims at crashline's headroom ------------------------------------------------------------------


def test_fit_on_is_passed_crashline_s_margin_and_ctx():
    args = " ".join(S.server_args(S.aim_fit(S.resolve({"fit": "on", "ctx": 8192}), 1536)))
    assert "--fit on --fit-target 1536 --fit-ctx 8192" in args
    # what the user sets wins (in the settings: extra_args may not pass them, core/serverflags.py)
    given = {"fit": "on", "fit_target": 256, "fit_ctx": 2048, "ctx": 8192}
    assert "--fit-target 256 --fit-ctx 2048" in " ".join(S.server_args(S.aim_fit(S.resolve(given), 1536)))
    with pytest.raises(S.SettingsError, match="passes -fitt, which crashline's setting 'fit_target' sets"):
        S.resolve({"fit": "on", "extra_args": ["-fitt", "512"]})
    # fit off: nothing added, and the aims alone are an error
    assert S.aim_fit(S.resolve({"ubatch": 128}), 1536) == S.resolve({"ubatch": 128})
    with pytest.raises(S.SettingsError, match="fit_target = 512 aims llama.cpp's --fit placement.*set fit: on"):
        S.resolve({"fit_target": 512})
    with pytest.raises(S.SettingsError, match="'fit_ctx'.*integer from 1 to 16777216"):
        S.resolve({"fit": "on", "fit_ctx": 0})


def test_the_new_fit_settings_change_no_id():
    """Ids as crashline computed them before fit_target and fit_ctx existed (pinned): only fit on changes."""
    before = {
        "a06b1cee2d": {},
        "59f0e27e24": {"ubatch": 128, "ctx": 8192},
        "6b7c13c6a6": {"n_cpu_moe": 31, "ctx": 32768, "ubatch": 2048},
        "51dbfd8212": {"parallel": 4, "ctx": 16384, "page_cache": "cold"},
    }
    for cid, given in before.items():
        assert S.config_id("m", S.aim_fit(S.resolve(given), 1024)) == cid
    fit = S.resolve({"fit": "on", "ctx": 32768})
    assert S.config_id("m", fit) == "e1d25118c7" != S.config_id("m", S.aim_fit(fit, 1024))


def test_expand_aims_fit_at_the_budget_margin():
    cfg = base()
    cfg["configurations"] = [{"models": ["m"], "settings": {"fit": "on", "ctx": 8192}}, {"models": ["m"]}]
    cfg["budget"] = {"margin_mib": 2048}
    fit, plain = C.expand(C.validate(cfg, SCHEMA))
    assert (fit["settings"]["fit_target"], fit["settings"]["fit_ctx"]) == (2048, 8192)
    assert "fit_target" not in fit["given"] and "fit_ctx" not in fit["given"]  # crashline's, not the user's
    assert (plain["settings"]["fit_target"], plain["settings"]["fit_ctx"]) == (None, None)
    cfg["budget"] = {"margin_mib": 512}  # another margin is another command line, so another id
    assert C.expand(C.validate(cfg, SCHEMA))[0]["id"] != fit["id"]


def test_an_entry_s_starts_reach_its_measurement_only():
    """``starts`` (#22): its configurations' items carry it (the most any entry listing one asks for), the
    measurement's spec with them, the recall check's not (one check however often it is measured); the id is the
    server's, so the same; an entry with a search is refused, naming search.starts."""
    from crashline.engine import eta
    from crashline.jobs import spec

    cfg = base()
    cfg["configurations"] = [{"models": ["m"], "grid": {"ubatch": [128, 512]}, "starts": 2}, {"models": ["m"]}]
    items = {i["settings"]["ubatch"]: i for i in C.expand(C.validate(copy.deepcopy(cfg), SCHEMA))}
    assert (items[128]["starts"], items[512]["starts"]) == (2, 2)  # 512 is also the second entry's: the most wins
    cfg["configurations"][0].pop("starts")
    alone = {i["settings"]["ubatch"]: i for i in C.expand(C.validate(copy.deepcopy(cfg), SCHEMA))}
    assert "starts" not in alone[512] and alone[512]["id"] == items[512]["id"]
    cfg["configurations"][0]["starts"] = 2
    valid = C.validate(cfg, SCHEMA)
    assert spec.measure_spec(valid, "m", items[128]["id"]).item.starts == 2
    assert spec.needle_spec(valid, "m", items[128]["id"]).item.starts == 1
    assert "starts" not in spec.needle_spec(valid, "m", items[128]["id"]).to_dict()["item"]
    measured = [Path(j["out"]) for j in eta.plan(valid) if j["job"] == "measure"]  # a job per start
    assert sorted(p.relative_to(measured[0].parent).as_posix() for p in measured[:2]) == [
        "measure.json",
        "start-2/measure.json",
    ]
    assert len(measured) == 4
    with pytest.raises(C.ConfigError, match=r"measure --start 3: configuration .* has 2 server start\(s\)"):
        spec.measure_spec(valid, "m", items[128]["id"], start=3)
    cfg["configurations"][0]["search"] = {"n_cpu_moe": [0, 8]}
    with pytest.raises(C.ConfigError, match=r"configurations.0.starts = 2: .* move it to search.starts"):
        C.validate(cfg, SCHEMA)


def test_a_build_without_the_fit_aims_runs_fit_on_without_them():
    """llama.cpp builds from before --fit-target/--fit-ctx: crashline's aims are left out; asked ones are an error."""
    newer = set(S.server_args(S.aim_fit(S.resolve({"fit": "on"}), 1024))) | {"-nocb"}
    older = {f for f in newer if f.startswith("-") and f not in ("--fit-target", "--fit-ctx")}
    given = {"fit": "on"}
    kept, left_out = S.for_binary(S.aim_fit(S.resolve(given), 1024), given, older, "b7000")
    assert left_out == {"fit_target": "--fit-target", "fit_ctx": "--fit-ctx"}
    assert "--fit on" in " ".join(S.server_args(kept)) and "--fit-target" not in S.server_args(kept)
    given = {"fit": "on", "fit_target": 512}
    with pytest.raises(S.SettingsError, match=r"fit_target = 512 needs llama-server's --fit-target flag.*\(b7000\)"):
        S.for_binary(S.aim_fit(S.resolve(given), 1024), given, older, "b7000")


def test_the_pinned_build_has_the_fit_aims(server_provenance):
    assert {"--fit", "--fit-target", "-fitt", "--fit-ctx", "-fitc"} <= set(server_provenance["help_flags"])


def test_the_default_objective_is_the_whole_request_in_the_schema_and_the_code():
    """One default: the schema's objective.metric is plan.DEFAULT_METRIC, and a bare objective resolves to it."""
    schema_default = load_schema()["properties"]["objective"]["properties"]["metric"]["default"]
    assert schema_default == C.DEFAULT_METRIC == "e2e_tps"
    cfg = C.load(REPO / "config" / "config.yaml")
    assert C.resolve_objective({**cfg, "objective": {}})["metric"] == "e2e_tps"


def test_every_problem_of_each_key_is_said_at_once_and_each_once(tmp_path):
    """#41: config errors arrived stage by stage (the schema's, then one model's, then one setting's), so a config
    took as many runs as it had mistakes; an unknown grid setting was named once per value."""
    raw = base()
    raw["repetitons"] = 3  # the schema's
    raw["workloads"][0]["prompt_tokens"] = -5  # the schema's
    raw["models"]["m"]["source"] = "nope:x"  # a model's
    raw["defaults"] = {"ubatchh": 5}  # a setting's
    raw["configurations"] = [{"grid": {"ubacth": [128, 512]}}, {"models": ["nomodel"]}]
    raw["results_dir"] = str(tmp_path / "file")
    (tmp_path / "file").write_text("")  # a place's
    with pytest.raises(C.ConfigError) as caught:
        C.validate(raw, SCHEMA)
    lines = str(caught.value).splitlines()
    assert lines[0] == "invalid configuration:"
    said = [line.strip().split(" = ")[0].split(":")[0] for line in lines[1:]]
    assert said == [
        "config key repetitons",
        "config key workloads.0.prompt_tokens",
        "config key models.m.source",
        "config key defaults.ubatchh",
        "config key configurations.0.grid.ubacth",
        "config key configurations.1.models",
        "config key results_dir",
    ], lines
