"""The bad-input catalogue (issue #13): every bad input in a config or claims file fails when the file is
loaded, with one line that names the key, the bad value and what would be right. Inputs that only look odd
(a prompt longer than one configuration's context, shell characters in a path or an argument) load."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from crashline.config import claims as K
from crashline.config import plan as C
from crashline.jobs import spec as jobs
from crashline.engine import provision
from crashline.core import settings as S

from conftest import FIXTURES, REPO

SCHEMA = C.load_schema()
MIXED = FIXTURES / "claims" / "mixed.yaml"
ANY_SOURCE = "unknown kind; expected pypi:, hf:, https://, http://, file: or synthetic:"
HF_FORM = "expected hf:OWNER/REPO/PATH/IN/REPO.gguf[@REVISION]"
MODEL_NAME = (
    "the name {!r} is not allowed; expected a name that can be a folder and a Snakemake wildcard: "
    "a letter or digit, then letters, digits, '.', '_' or '-'"
)


def base() -> dict:
    return {
        "models": {"m": {"source": "file:/x.gguf"}, "n": {"source": "synthetic:n"}},
        "configurations": [{"grid": {"ubatch": [128, 512]}}],
        "workloads": [{"name": "short", "prompt_tokens": 128, "gen_tokens": 16}],
    }


def error_of(mutate) -> str:
    cfg = base()
    mutate(cfg)
    with pytest.raises(C.ConfigError) as err:
        C.validate(cfg, SCHEMA)
    return str(err.value)


def setting(where: str, **values):
    """A mutation that writes ``values`` into defaults, configurations.0.settings or .grid."""

    def mutate(cfg):
        if where == "defaults":
            cfg["defaults"] = values
        else:
            cfg["configurations"][0][where] = values

    return mutate


def model(name: str, **entry):
    return lambda c: c["models"].update({name: entry})


def shape(**values):
    return lambda c: c["models"]["n"].update(synthetic=values)


def workload(**values):
    return lambda c: c["workloads"][0].update(values)


# (mutation of base(), the message; each is one line that starts "config key KEY = VALUE" or names the key)
BAD = {
    # unknown keys, with "did you mean" for a near miss
    "top-level near miss": (
        lambda c: c.update(result_dir="out"),
        "config key result_dir = 'out': unknown key; did you mean 'results_dir'?",
    ),
    "top-level unknown": (
        lambda c: c.update(colour="red"),
        "config key colour = 'red': unknown key; known keys: results_dir, merge_results, cache_dir, models,",
    ),
    "nested near miss": (
        lambda c: c.update(server={"binry": "/x"}),
        "config key server.binry = '/x': unknown key; did you mean 'binary'?",
    ),
    "setting in defaults": (
        setting("defaults", ubtach=256),
        "config key defaults.ubtach = 256: unknown server setting(s) 'ubtach'; did you mean 'ubatch'?",
    ),
    "setting in settings": (
        setting("settings", n_cpu_mo=4),
        "config key configurations.0.settings.n_cpu_mo = 4: unknown server setting(s) "
        "'n_cpu_mo'; did you mean 'n_cpu_moe'?",
    ),
    "setting in grid": (
        setting("grid", ubtach=[128]),
        "config key configurations.0.grid.ubtach = [128]: unknown server setting(s) 'ubtach'; did you mean 'ubatch'?",
    ),
    "setting unlike any": (
        setting("defaults", speed=1),
        "config key defaults.speed = 1: unknown server setting(s) 'speed'; "
        "known settings: n_gpu_layers, n_cpu_moe, ctx,",
    ),
    # wrong types
    "string for an int": (
        workload(prompt_tokens="many"),
        "config key workloads.0.prompt_tokens = 'many': expected an integer",
    ),
    "string for a setting": (
        setting("defaults", ctx="8k"),
        "config key defaults.ctx = '8k': expected an integer from 1 to 16777216",
    ),
    "list for defaults": (
        lambda c: c.update(defaults=["ctx", 8192]),
        "config key defaults = ['ctx', 8192]: expected a mapping (KEY: VALUE)",
    ),
    "list for settings": (
        lambda c: c["configurations"][0].update(settings=["ctx"]),
        "config key configurations.0.settings = ['ctx']: expected a mapping (KEY: VALUE)",
    ),
    "list for models": (lambda c: c.update(models=["m"]), "config key models = ['m']: expected a mapping"),
    "string for a grid": (
        setting("grid", ubatch=512),
        "config key configurations.0.grid.ubatch = 512: expected a list",
    ),
    # zero, negative and absurd sizes
    "ctx 0": (setting("defaults", ctx=0), "config key defaults.ctx = 0: expected an integer from 1 to 16777216"),
    "batch 0": (
        setting("settings", batch=0),
        "config key configurations.0.settings.batch = 0: expected an integer of at least 1",
    ),
    "ubatch 0": (
        setting("grid", ubatch=[128, 0]),
        "config key configurations.0.grid.ubatch.1 = 0: expected an integer of at least 1",
    ),
    "parallel 0": (
        setting("settings", parallel=0),
        "config key configurations.0.settings.parallel = 0: expected an integer from 1 to 256",
    ),
    "parallel negative": (
        setting("defaults", parallel=-2),
        "config key defaults.parallel = -2: expected an integer from 1 to 256",
    ),
    "parallel past llama.cpp's 256 sequences": (
        setting("defaults", parallel=4096),
        "config key defaults.parallel = 4096: expected an integer from 1 to 256",
    ),
    "a null that would drop a flag crashline passes": (
        setting("settings", batch=None),
        "batch = null would leave out -b, which crashline passes as 2048 by default; remove the key",
    ),
    "threads negative": (
        setting("defaults", threads=-1),
        "config key defaults.threads = -1: expected an integer from 1 to 4096",
    ),
    "n_cpu_moe negative": (
        setting("defaults", n_cpu_moe=-1),
        "config key defaults.n_cpu_moe = -1: expected a non-negative integer",
    ),
    "repetitions 0": (lambda c: c.update(repetitions=0), "config key repetitions = 0: 0 is less than the minimum of 1"),
    "prompt_tokens 0": (
        workload(prompt_tokens=0),
        "config key workloads.0.prompt_tokens = 0: 0 is less than the minimum of 1",
    ),
    "gen_tokens negative": (
        workload(gen_tokens=-5),
        "config key workloads.0.gen_tokens = -5: -5 is less than the minimum of 1",
    ),
    "concurrency 0": (
        workload(concurrency=0),
        "config key workloads.0.concurrency = 0: expected an integer from 1 to 1024 or 'slots'",
    ),
    "ctx 1e12": (
        setting("defaults", ctx=1e12),
        "config key defaults.ctx = 1000000000000.0: expected an integer from 1 to 16777216",
    ),
    "ctx 10**12": (
        setting("defaults", ctx=10**12),
        "config key defaults.ctx = 1000000000000: expected an integer from 1 to 16777216",
    ),
    "batch above a C int": (
        setting("defaults", batch=2**40),
        f"config key defaults.batch = {2**40}: expected an integer from 1 to 2147483647",
    ),
    # ubatch above batch: llama.cpp would clamp it
    "ubatch above batch": (
        setting("defaults", batch=256),
        "config key configurations.0: setting ubatch = 512 is above batch = 256: llama.cpp "
        "silently clamps ubatch to batch, so the server would run with ubatch 256; raise batch "
        "to at least 512 or lower ubatch to 256",
    ),
    # model names become folder names and Snakemake wildcards
    "model name with /": (model("a/b", source="file:/x"), "config key models: " + MODEL_NAME.format("a/b")),
    "model name ..": (model("..", source="file:/x"), "config key models: " + MODEL_NAME.format("..")),
    "model name with a space": (model("a b", source="file:/x"), "config key models: " + MODEL_NAME.format("a b")),
    "model name with a leading .": (model(".m", source="file:/x"), "config key models: " + MODEL_NAME.format(".m")),
    "model name with a leading -": (model("-rf", source="file:/x"), "config key models: " + MODEL_NAME.format("-rf")),
    "workload name with /": (workload(name="a/b"), "config key workloads.0.name = 'a/b': expected a letter or digit"),
    # sources: sources.parse_source at load
    "ftp source": (model("m", source="ftp://x"), f"config key models.m.source = 'ftp://x': {ANY_SOURCE}"),
    "s3 source": (
        model("m", source="s3:bucket/m.gguf"),
        f"config key models.m.source = 's3:bucket/m.gguf': {ANY_SOURCE}",
    ),
    "hf without a file": (model("m", source="hf:"), f"config key models.m.source = 'hf:': {HF_FORM}"),
    "hf repo only": (model("m", source="hf:owner/repo"), f"config key models.m.source = 'hf:owner/repo': {HF_FORM}"),
    "synthetic path": (
        model("n", source="synthetic:../x"),
        "config key models.n.source = 'synthetic:../x': '../x' is not a plain file name",
    ),
    "sha256 not hex": (
        lambda c: c["models"]["m"].update(sha256="abc"),
        "config key models.m.sha256 = 'abc': expected 64 lowercase hex digits or a list of them",
    ),
    # workloads against configurations
    "concurrency above the slots": (
        workload(concurrency=4),
        "config key workloads.0.concurrency = 4: workload 'short' sends 4 requests at "
        "once, but configurations.0 has parallel = 1 slot(s), so 3 would wait in the "
        "queue; write `concurrency: slots` (one request per slot) or raise parallel to 4",
    ),
    "a re-sent decode of several requests at once": (
        workload(concurrency="slots", decode_from="resent"),
        "config key workloads.0.decode_from = 'resent': workload 'short' sends slots request(s) at once, and a "
        "re-sent prompt is one request's; write `concurrency: 1` or `decode_from: fresh`",
    ),
    "an unknown decode source": (
        workload(decode_from="cached"),
        "config key workloads.0.decode_from = 'cached'",
    ),
    "needle longer than every context": (
        lambda c: c.update(needle={"lengths": [8192, 0.5]}, defaults={"ctx": 4096}),
        "config key needle.lengths.0 = 8192: a prompt of 8192 tokens and the "
        "16-token answer fit no configuration; the largest context per slot is "
        "4096 tokens (ctx 4096, parallel 1); give fewer than 4080 tokens or a "
        "fraction of the context such as 0.9",
    ),
    "needle length too short": (
        lambda c: c.update(needle={"lengths": [10]}),
        "config key needle: needle length 10: a token count must be at least 64",
    ),
    "draft model not in models": (
        setting("defaults", draft_model="nope"),
        "config key defaults.draft_model = 'nope': no such model; models are m, n",
    ),
    "draft model in a grid": (
        setting("grid", draft_model=["n", "tiny"]),
        "config key configurations.0.grid.draft_model.1 = 'tiny': no such model; models are m, n",
    ),
    "unknown model of an entry": (
        lambda c: c["configurations"][0].update(models=["mm"]),
        "config key configurations.0.models: unknown model 'mm'; did you mean 'm'?",
    ),
    # where results go
    "results_dir under /proc": (
        lambda c: c.update(results_dir="/proc/crashline"),
        "config key results_dir = '/proc/crashline': cannot write there: /proc/crashline is "
        "under /proc, a kernel file system, not a place for files; choose a folder this user "
        "can write",
    ),
    "results_dir under /sys": (
        lambda c: c.update(results_dir="/sys/results"),
        "config key results_dir = '/sys/results': cannot write there: /sys/results is under /sys",
    ),
    # the objective
    "objective workload": (
        lambda c: c.update(objective={"workload": "shrot"}),
        "config key objective.workload = 'shrot': no such workload; did you mean 'short'?",
    ),
    # results_dir that spilled into the clone or mixed with the cache (#26)
    "empty results_dir": (
        lambda c: c.update(results_dir=""),
        "config key results_dir = '': empty; give a folder for records and reports (default results)",
    ),
    "results_dir in the cache": (
        lambda c: c.update(results_dir="/tmp/crashline-cache-x/results", cache_dir="/tmp/crashline-cache-x"),
        "config key results_dir = '/tmp/crashline-cache-x/results' is nested with the cache (/tmp/crashline-cache-x)",
    ),
    # a whole number written as 2.0 passes JSON Schema's integer and then crashed every job (#26)
    "repetitions as a float": (
        lambda c: c.update(repetitions=2.0),
        "config key repetitions = 2.0: expected an integer",
    ),
    "prompt tokens as a float": (
        lambda c: c["workloads"][0].update(prompt_tokens=64.0),
        "config key workloads.0.prompt_tokens = 64.0: expected an integer",
    ),
    "objective metric": (
        lambda c: c.update(objective={"metric": "speed"}),
        "config key objective.metric = 'speed': unknown metric; expected one of e2e_tps (end-to-end t/s per request: "
        "its prompt and generated tokens over the whole time it took, as a user waits for it, so prefill and decode "
        "both count), decode_tps (decode t/s per request), prefill_tps (prefill t/s per request), aggregate_tps "
        "(generated t/s of all requests at once together)",
    ),
    # synthetic shapes: synthetic.resolve_shape at load
    "more experts used than there are": (
        shape(n_expert_used=9),
        "config key models.n.synthetic.n_expert_used = 9: more than n_expert (8)",
    ),
    "heads not divisible": (
        shape(n_head=4, n_head_kv=3),
        "config key models.n.synthetic.n_head_kv = 3: must divide n_head (4)",
    ),
    "no layers": (shape(layers=0), "config key models.n.synthetic.layers = 0: must be a positive integer"),
    "shape key near miss": (
        shape(layer=2),
        "config key models.n.synthetic.layer = 2: unknown key; did you mean 'layers'?",
    ),
    "shape seed": (shape(seed="x"), "config key models.n.synthetic.seed = 'x': expected a non-negative integer"),
    "shape of a file model": (
        lambda c: c["models"]["m"].update(synthetic={"layers": 2}),
        "config key models.m.synthetic: only synthetic: sources take a shape; remove it or make "
        "models.m.source synthetic:NAME",
    ),
    # names used twice, ranges upside down
    "duplicate workload names": (
        lambda c: c["workloads"].append(dict(c["workloads"][0])),
        "config key workloads: duplicate workload name(s) short; each workload needs its own name",
    ),
    "search LOW above HIGH": (
        lambda c: c["configurations"].append({"search": {"n_cpu_moe": [8, 2]}}),
        "config key configurations.1.search.n_cpu_moe = [8, 2]: the range is [LOW, HIGH] and 8 "
        "is above 2; write [2, 8]",
    ),
    "search negative": (
        lambda c: c["configurations"].append({"search": {"n_cpu_moe": [-1, 2]}}),
        "config key configurations.1.search.n_cpu_moe.0 = -1: -1 is less than the minimum of 0",
    ),
}


@pytest.mark.parametrize("mutate, expected", list(BAD.values()), ids=list(BAD))
def test_bad_config_names_key_value_and_what_is_right(mutate, expected):
    message = error_of(mutate)
    assert expected in message
    assert "\n" not in message  # one problem, one line


def test_several_schema_problems_are_listed_one_a_line():
    message = error_of(lambda c: (c.update(repetitions=0), c["workloads"][0].update(gen_tokens=0)))
    assert message.splitlines() == [
        "invalid configuration:",
        "  config key repetitions = 0: 0 is less than the minimum of 1",
        "  config key workloads.0.gen_tokens = 0: 0 is less than the minimum of 1",
    ]


def test_unwritable_results_dir(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("")
    assert error_of(lambda c: c.update(results_dir=str(tmp_path / "file" / "results"))).endswith(
        f"cannot write there: {tmp_path / 'file'} is a file, not a folder; choose a folder this user can write"
    )
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    real_access = os.access  # root may write anywhere: pretend to be a user without the right

    monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == locked else real_access(p, mode))
    assert (
        f"config key results_dir = '{locked}/r': cannot write there: {locked} is not writable by this user, so "
        f"{locked}/r cannot be made"
    ) in error_of(lambda c: c.update(results_dir=f"{locked}/r"))


def test_server_binary_that_cannot_run(tmp_path):
    assert (
        f"config key server.binary = '{tmp_path}': it is a directory; give the llama-server executable itself"
        in error_of(lambda c: c.update(server={"binary": str(tmp_path)}))
    )
    plain = tmp_path / "llama-server"
    plain.write_text("#!/bin/sh\n")
    plain.chmod(0o644)
    assert (
        f"config key server.binary = '{plain}': it is not executable (mode 644); chmod +x it or give the "
        "llama-server executable"
    ) in error_of(lambda c: c.update(server={"binary": str(plain)}))
    # one that is not there yet is provision's to report (the config may be read where it is not built)
    assert C.validate({**base(), "server": {"binary": str(tmp_path / "later")}}, SCHEMA)
    with pytest.raises(provision.ProvisionError, match=re.escape(f"server.binary = '{tmp_path}'")):
        provision._given_binary({"binary": str(tmp_path)})


# -- inputs that look odd but are fine -----------------------------------------------------------


def test_a_prompt_longer_than_the_context_per_slot_is_a_measured_failure_not_an_error():
    cfg = base()
    cfg["configurations"] = [{"settings": {"ctx": 1024}}, {"settings": {"ctx": 8192, "parallel": 4}}]
    cfg["workloads"] = [{"name": "depth-2k", "prompt_tokens": 2048, "gen_tokens": 64}]  # 1024 and 2048 per slot
    assert C.validate(cfg, SCHEMA)["workloads"][0]["prompt_tokens"] == 2048
    demo = C.load(REPO / "config" / "config.yaml")  # its ctx 1024 configuration fails depth-2k, on purpose
    assert any(i["settings"]["ctx"] == 1024 for i in C.expand(demo))
    assert {w["name"]: w["concurrency"] for w in demo["workloads"]}["concurrent"] == "slots"


def test_a_needle_length_one_configuration_cannot_hold_is_a_measured_failure():
    cfg = base()
    cfg["configurations"] = [{"settings": {"ctx": 1024}}, {"settings": {"ctx": 8192}}]
    cfg["needle"] = {"lengths": [2048, 0.5]}  # 2048 fails in ctx 1024, as the demo's does
    assert C.validate(cfg, SCHEMA)["needle"]["lengths"] == [2048, 0.5]


def test_concurrency_slots_and_claims_workloads_are_not_above_the_slots():
    cfg = base()
    cfg["workloads"][0]["concurrency"] = "slots"
    cfg["configurations"].append({"settings": {"parallel": 4}})
    cfg["workloads"].append({"name": "four", "prompt_tokens": 8, "gen_tokens": 8, "concurrency": 4})
    with pytest.raises(
        C.ConfigError, match="workloads.1.concurrency = 4: workload 'four'.* configurations.0 has parallel = 1 slot"
    ):
        C.validate(cfg, SCHEMA)
    cfg["workloads"].pop()
    cfg["claims"] = [str(MIXED)]  # a published row of 4 users adds a workload of 4 requests at once: as published,
    added = C.validate(cfg, SCHEMA)["workloads"][-1]  # on that row's configuration (4 slots) only
    assert {k: v for k, v in added.items() if k != "configs"} == {
        "name": "claim-pp512-tg64-c4",
        "prompt_tokens": 512,
        "gen_tokens": 64,
        "concurrency": 4,
    }
    (row,) = [i for i in C.expand(C.validate(cfg, SCHEMA)) if i["id"] in added["configs"]]
    assert row["settings"]["parallel"] == 4


def test_a_workload_scoped_to_no_configuration_is_refused():
    cfg = base()
    (item, *_) = C.expand(C.validate(cfg, SCHEMA))
    cfg["workloads"].append({"name": "mine", "prompt_tokens": 8, "gen_tokens": 8, "configs": [item["id"], "0123abcd"]})
    with pytest.raises(C.ConfigError, match=r"workloads.1.configs.1 = '0123abcd': no configuration has that id"):
        C.validate(cfg, SCHEMA)
    cfg["workloads"][-1]["configs"].pop()
    valid = C.validate(cfg, SCHEMA)
    assert [w["name"] for w in jobs.spec("measure", valid, item["model"], item["id"]).measurement.workloads] == [
        *(w["name"] for w in cfg["workloads"])
    ]


def test_the_same_configuration_twice_is_measured_once():
    cfg = base()
    cfg["configurations"] += [{"settings": {"ubatch": 512}}, {"grid": {"ubatch": [512, 128]}}]
    items = C.expand(C.validate(cfg, SCHEMA))
    assert len(items) == 4 and len({(i["model"], i["id"]) for i in items}) == 4


def test_shell_characters_stay_one_argument_and_never_reach_a_shell():
    cfg = base()
    cfg["defaults"] = {"extra_args": ["-C", "; touch /tmp/PWNED", "--cpu-range", "$(reboot)"]}
    (item, *_) = C.expand(C.validate(cfg, SCHEMA))
    args = S.server_args(item["settings"])
    assert args[-4:] == ["-C", "; touch /tmp/PWNED", "--cpu-range", "$(reboot)"]
    command = S.command_line("llama-server", "/m.gguf", item["settings"])
    assert command[-4:] == ["-C", "; touch /tmp/PWNED", "--cpu-range", "$(reboot)"]
    # where a flag belongs, shell text is refused: llama-server would not start
    cfg["defaults"] = {"extra_args": ["; touch /tmp/PWNED"]}
    with pytest.raises(C.ConfigError, match="passes '; touch /tmp/PWNED' where a flag belongs"):
        C.validate(cfg, SCHEMA)


def test_spaces_and_shell_characters_in_results_dir_are_accepted(tmp_path):
    odd = f"{tmp_path}/my results/$(touch PWNED); `id`"
    assert C.validate({**base(), "results_dir": odd}, SCHEMA)["results_dir"] == odd
    assert not (tmp_path / "PWNED").exists() and not (tmp_path / "my results").exists()  # nothing made at load


def test_synthetic_seed_and_yaml_merge_keys_are_fine(tmp_path):
    assert C.validate(
        {**base(), "models": {"n": {"source": "synthetic:n", "synthetic": {"seed": 3, "layers": 2}}}}, SCHEMA
    )
    path = tmp_path / "merge.yaml"
    path.write_text("shared: &s {source: 'file:/x.gguf'}\nother:\n  <<: *s\n  source: 'file:/y.gguf'\n")
    assert C.read_yaml(path, "file") == {"shared": {"source": "file:/x.gguf"}, "other": {"source": "file:/y.gguf"}}


# -- files ---------------------------------------------------------------------------------------

GOOD = (
    "models:\n  m: {source: 'file:/x.gguf'}\nconfigurations:\n  - settings: {ctx: 4096}\n"
    "workloads:\n  - {name: w, prompt_tokens: 8, gen_tokens: 8}\n"
)


def config_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


def load_error(path) -> str:
    with pytest.raises(C.ConfigError) as err:
        C.load(path)
    assert "\n" not in str(err.value)
    return str(err.value)


def test_malformed_yaml_names_the_file_and_the_line(tmp_path):
    path = config_file(tmp_path, GOOD.replace("- settings: {ctx: 4096}", "- settings: {ctx: 4096"))
    assert load_error(path) == (
        f"configuration file {path} is not valid YAML: line 5, column 10: expected ',' or "
        "'}', but got ':' (while parsing a flow mapping at line 4)"
    )
    path = config_file(tmp_path, "models:\n  m:\n source: x\n")
    assert load_error(path).startswith(f"configuration file {path} is not valid YAML: line 3, column 2: ")


def test_a_key_written_twice_is_refused_anywhere_in_the_file(tmp_path):
    path = config_file(tmp_path, GOOD.replace("models:\n", "models:\n  m: {source: 'file:/y.gguf'}\n"))
    assert load_error(path) == (
        f"configuration file {path} is not valid YAML: line 3, column 3: duplicate key 'm' "
        "(first at line 2); a key may appear once in a mapping"
    )
    path = config_file(tmp_path, GOOD.replace("{name: w,", "{name: w, name: x,"))
    assert "line 6, column 15: duplicate key 'name' (first at line 6)" in load_error(path)


def test_a_config_file_that_is_no_file_or_no_mapping(tmp_path):
    assert load_error(tmp_path) == f"configuration file {tmp_path} cannot be read: Is a directory"
    assert load_error(tmp_path / "nope.yaml") == f"configuration file not found: {tmp_path / 'nope.yaml'}"
    assert load_error(config_file(tmp_path, "- models\n")).endswith(
        "must hold a mapping of keys (models, configurations, workloads, ...), got list"
    )
    path = tmp_path / "latin1.yaml"
    path.write_bytes(b"models: caf\xe9\n")
    assert load_error(path) == f"configuration file {path} is not UTF-8 text (byte 11: invalid continuation byte)"


# -- claims files --------------------------------------------------------------------------------


def claims_file(tmp_path: Path, mutate, copy_upstream: bool = True) -> Path:
    raw = yaml.safe_load(MIXED.read_text())
    mutate(raw)
    if copy_upstream:
        shutil.copy(MIXED.parent / "upstream-README.md", tmp_path / "upstream-README.md")
    path = tmp_path / "claims.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def claims_error(path) -> str:
    cfg = C.validate({**base(), "models": {"m": {"source": "file:/x.gguf"}}}, SCHEMA)
    with pytest.raises(K.ClaimsError) as err:
        K.load_claims([path], cfg)
    assert "\n" not in str(err.value)
    return str(err.value)


@pytest.mark.parametrize(
    "mutate, expected",
    [
        (
            lambda c: c["rows"][0]["stated"].update(ubtach=64),
            "key rows.0.stated.ubtach = 64: unknown server setting(s) 'ubtach'; did you mean 'ubatch'?",
        ),
        (
            lambda c: c["defaults"].update(n_cpu_mo=4),
            "key defaults.n_cpu_mo = 4: unknown server setting(s) 'n_cpu_mo'; did you mean 'n_cpu_moe'?",
        ),
        (
            lambda c: c["rows"][0]["unknown"].append("thread"),
            "key rows.0.unknown = 'thread': unknown setting; did you mean 'threads'?",
        ),
        (
            lambda c: c["rows"][2]["stated"].update(ctx=0),
            "key rows.2.stated.ctx = 0: expected an integer from 1 to 16777216",
        ),
        (
            lambda c: c["rows"][0]["stated"].update(ubatch=4096),
            "key rows.0: setting ubatch = 4096 is above batch = 2048: llama.cpp silently clamps ubatch to batch, "
            "so the server would run with ubatch 2048; raise batch to at least 4096 or lower ubatch to 2048",
        ),
        (
            lambda c: c["rows"][0]["stated"].update(draft_model="tiny"),
            "key rows.0.stated.draft_model = 'tiny': no such model; models are m",
        ),
        (lambda c: c.update(titel="x"), "key titel = 'x': unknown key; did you mean 'title'?"),
        (
            lambda c: c["source"].update(local_copy="missing.md"),
            "key source.local_copy = 'missing.md': no file {dir}/missing.md (local_copy is relative to the claims "
            "file's folder)",
        ),
    ],
)
def test_bad_claims_name_file_key_value_and_what_is_right(tmp_path, mutate, expected):
    path = claims_file(tmp_path, mutate)
    assert claims_error(path) == f"claims file {path}: " + expected.format(dir=tmp_path)


def test_claims_file_not_found_or_with_a_key_twice(tmp_path):
    message = error_of(lambda c: c.update(claims=["nowhere.yaml"]))
    assert message == (
        f"config key claims.0 = 'nowhere.yaml': claims file not found: nowhere.yaml (read from {Path.cwd()})"
    )
    path = claims_file(tmp_path, lambda c: None)
    path.write_text(path.read_text().replace("model: m\n", "model: m\nmodel: n\n"))
    assert claims_error(path).startswith(f"claims file {path} is not valid YAML: line ")
    assert "duplicate key 'model' (first at line" in claims_error(path)


# -- the command line: exit status 2 and one line, no traceback ----------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        (GOOD.replace("{ctx: 4096}", "{ctx: 4096"), "is not valid YAML: line 5, column 10: expected ',' or '}'"),
        (GOOD.replace("models:\n", "models:\n  m: {source: 'file:/y.gguf'}\n"), "line 3, column 3: duplicate key 'm'"),
        (
            GOOD.replace("{ctx: 4096}", "{ctx: 4096, batch: 256, ubatch: 512}"),
            "config key configurations.0: setting ubatch = 512 is above batch = 256",
        ),
        (GOOD.replace("{ctx: 4096}", "{ctx: 0}"), "config key configurations.0.settings.ctx = 0: expected an integer"),
        (GOOD.replace("'file:/x.gguf'", "'ftp://x'"), f"config key models.m.source = 'ftp://x': {ANY_SOURCE}"),
        (None, "cannot be read: Is a directory"),
    ],
)
def test_plan_exits_2_with_one_line(tmp_path, text, expected):
    path = tmp_path if text is None else config_file(tmp_path, text)
    proc = subprocess.run(
        [sys.executable, "-m", "crashline", "plan", "--config", str(path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("crashline plan: error: ") and expected in proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


def test_the_demo_still_loads_and_plans():
    cfg = C.load(REPO / "config" / "config.yaml")
    assert len(C.expand(cfg)) == 7 and C.expand_searches(cfg) == []


def test_extra_args_may_not_set_what_crashline_sets_itself():
    message = error_of(setting("defaults", extra_args=["--host=0.0.0.0", "--port", "80"]))
    assert "passes --host, which crashline sets itself (loopback only, a free port" in message


def test_a_results_dir_under_home_is_expanded_as_a_shell_would():
    cfg = C.load(REPO / "config" / "config.yaml")
    raw = {k: cfg[k] for k in ("models", "configurations", "workloads")}
    expanded = C.validate({**raw, "results_dir": "~/crashline-results-x"}, C.load_schema())
    assert expanded["results_dir"] == str(Path.home() / "crashline-results-x") and "~" not in expanded["results_dir"]


@pytest.mark.parametrize(
    "given, expected",
    [
        # "crashed at load" with nothing pointing at the thread count (#26)
        ({"threads": 100000}, "config key defaults.threads = 100000: expected an integer from 1 to 4096"),
        # llama.cpp reads "a,b" as zeros and splits nothing (#26)
        ({"tensor_split": "a,b", "gpus": 2}, "tensor_split = 'a,b': expected a share per GPU as numbers, e.g. 3,1"),
    ],
)
def test_settings_that_pass_their_type_but_cannot_run_are_named(given, expected):
    assert expected in error_of(setting("defaults", **given))


def test_a_prompt_past_any_model_s_context_is_refused_before_anything_runs():
    """prompt_tokens 400000000 passed the schema and every job built the token list until the OOM killer came
    (issue #26); 10M tokens is the most any model takes. A prompt longer than a configuration's context stays that
    configuration's measured failure."""
    cfg = base()
    cfg["workloads"] = [{"name": "huge", "prompt_tokens": 400_000_000, "gen_tokens": 8}]
    with pytest.raises(C.ConfigError, match="prompt_tokens = 400000000: .* maximum of 10000000"):
        C.validate(cfg, SCHEMA)


@pytest.mark.parametrize(
    "key,value,limit",
    [
        (("repetitions",), 10**12, "maximum of 1000"),
        (("budget", "margin_mib"), 10**12, "maximum of 1048576"),
        (("soak", "duration_s"), 10**12, "maximum of 604800"),
        (("telemetry", "interval_s"), 5.0e-05, "minimum of 0.01"),  # was accepted and written back as a string
    ],
)
def test_sizes_that_would_exhaust_the_machine_are_refused(key, value, limit):
    cfg = base()
    target = cfg
    for k in key[:-1]:
        target = target.setdefault(k, {})
    target[key[-1]] = value
    with pytest.raises(C.ConfigError, match=f"config key {'.'.join(key)} = .*{limit}"):
        C.validate(cfg, SCHEMA)
