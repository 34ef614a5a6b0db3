"""Config validation and expansion: errors name the key and the value; ids are canonical."""

from __future__ import annotations

import copy

import pytest

from crashline.config import load_schema
from crashline import config as C
from crashline import settings as S

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
    from crashline import claims_load as K

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
