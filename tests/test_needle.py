"""Needle recall against a real llama-server on the real gemma-3-270m: prompts of exact token
lengths with the needle at sentence boundaries, and records that say pass, fail (with the reason)
or not applicable."""

from __future__ import annotations

import json
import random
import re

import psutil
import pytest

from crashline.config.plan import load_schema
from crashline.report import html, markdown, needle as NR
from crashline.config import plan as C
from crashline.jobs import haystack as HS
from crashline.jobs import needle as NJ
from crashline.jobs import spec as S
from crashline.jobs import trials as TR
from crashline.config import needle as NP
from crashline.tables import needle as NT
from crashline.core.atomic import read_json
from crashline.engine.server import ServerProcess
from crashline.core.settings import command_line, resolve
from crashline.engine.workloads import prose_text

from helpers import fetch_record

SCHEMA = load_schema()


@pytest.fixture(scope="module")
def gemma_server(gemma_fetch, server_provenance, tmp_path_factory):
    """One gemma server (ctx 8192, one slot) for the prompt-building tests: tokenizer, template."""
    log = tmp_path_factory.mktemp("needle-server") / "server.log"
    settings = resolve({"ctx": 8192, "threads": 2})
    with ServerProcess(
        command_line(server_provenance["binary"], gemma_fetch["files"][0]["path"], settings), log
    ) as srv:
        assert srv.start_ready(120) == "ready", srv.log_text()[-2000:]
        yield srv


@pytest.fixture(scope="module")
def client(gemma_server) -> HS.NeedleClient:
    return HS.NeedleClient.of(gemma_server, 300)


@pytest.fixture(scope="module")
def haystack(client) -> HS.Haystack:
    return HS.Haystack(client)


def detokenize(client: HS.NeedleClient, ids: list[int]) -> str:
    return client.session.post(f"{client.url}/detokenize", json={"tokens": ids}, timeout=60).json()["content"]


def run(
    tmp_path,
    fetch,
    provenance,
    settings,
    needle,
    *,
    style="continuation",
    source=None,
    name="gemma",
    rng=None,
    measured=None,
):
    cfg = C.validate(
        {
            "models": {name: {"source": source or f"file:{fetch['files'][0]['path']}", "prompt_style": style}},
            "defaults": {"threads": 2},
            "configurations": [{"settings": settings}],
            "workloads": [{"name": "short", "prompt_tokens": 64, "gen_tokens": 8}],
            "server": {"startup_timeout_s": 120, "request_timeout_s": 600},
        },
        SCHEMA,
    )
    cfg["needle"] = needle  # the needle block, before or after the schema knows it
    (item,) = C.expand(cfg)
    record_path = tmp_path / "needle.json"
    rec = NJ.run_needle(
        S.needle_spec(cfg, name, item["id"]),
        S.JobInputs(fetch, {}, provenance, measured=measured(item) if measured else None),
        record_path,
        tmp_path / "needle-server.log",
        rng=rng,
    )
    assert read_json(record_path) == json.loads(json.dumps(rec)), "the record on disk is the one returned"
    assert not list(tmp_path.glob(".*.part")), "no temporary file left behind"
    left = [
        p
        for p in psutil.process_iter(["name", "cmdline"])
        if p.info["name"] == "llama-server" and str(tmp_path) in " ".join(p.info["cmdline"] or [])
    ]
    assert not left, "the server outlived the job"
    return rec


# --------------------------------------------------------------------------- pure functions


def test_answer_must_contain_the_value_exactly():
    assert NP.recalled(" 4821937.\n\nHe said", "4821937")
    assert NP.recalled("The special magic number is 4821937", "4821937")
    assert not NP.recalled(" 48219370.", "4821937"), "part of a longer number is not the value"
    assert not NP.recalled(" 14821937", "4821937")
    assert not NP.recalled(" 482 1937", "4821937")
    assert not NP.recalled("", "4821937") and not NP.recalled(None, "4821937")
    u = "0b7e8c5a-3f1d-4e2b-9a6c-1d2e3f4a5b6c"
    assert NP.recalled(f" {u.upper()}.", u, "uuid")
    assert not NP.recalled(f" {u}0", u, "uuid")


def test_values_are_random_per_trial_and_well_formed():
    rng = random.Random(7)
    numbers = [NP.new_value("number", rng) for _ in range(50)]
    assert all(re.fullmatch(r"[1-9]\d{6}", v) for v in numbers) and len(set(numbers)) == 50
    uuids = [NP.new_value("uuid", rng) for _ in range(5)]
    assert all(re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}", u) for u in uuids)


def test_needle_settings_defaults_required_and_lengths():
    ns = NP.needle_settings({})
    assert ns["lengths"] == [2048, 0.9] and ns["depths"] == [0.1, 0.5, 0.9] and ns["trials"] == 1
    assert ns["required"] == [2048, 0.9], "by default every length is required"
    assert NP.needle_settings({"needle": {"lengths": [512, 0.5], "required": []}})["required"] == []
    with pytest.raises(ValueError, match="not in needle.lengths"):
        NP.needle_settings({"needle": {"lengths": [512], "required": [1024]}})
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        NP.needle_settings({"needle": {"lengths": [1.5]}})
    with pytest.raises(ValueError, match="decimal point"):
        NP.needle_settings({"needle": {"lengths": [1]}})
    assert NP.resolve_length(2048, 1024, 16) == 2048, "an absolute length is never shrunk to fit"
    assert NP.resolve_length(0.5, 8192, 16) == 4096
    assert NP.resolve_length(1.0, 8192, 16) == 8192 - 16 - 1, "a full context leaves room for the answer"
    assert NP.length_label(0.9) == "0.9 of the context" and NP.length_label(2048) == "2048"


def test_verdict_and_grid():
    ns = NP.needle_settings({"needle": {"lengths": [512, 2048], "depths": [0.1, 0.9], "required": [2048]}})
    trials = [
        {
            **TR._trial_base(s, d, 0, 1024),
            "passed": s == 512,
            "length_target": s,
            "value": "1234567",
            "reason": None if s == 512 else "length 2048 exceeds the configuration's context of 1024 tokens per slot",
        }
        for s, d, _ in TR.planned_trials(ns)
    ]
    assert TR.verdict(trials, ns, applicable=True) == ("fail", [2048])
    assert TR.verdict(trials[:2], ns, applicable=True) == ("fail", [2048]), "a length that never ran is no pass"
    assert TR.verdict([t for t in trials if t["passed"]], {**ns, "lengths": [512]}, True) == ("pass", [])
    assert TR.verdict([], ns, applicable=False) == ("not_applicable", [])
    cells = TR.grid(trials, ns)
    assert [(c["length"], c["depth"], c["passed"]) for c in cells] == [
        (512, 0.1, True),
        (512, 0.9, True),
        (2048, 0.1, False),
        (2048, 0.9, False),
    ]
    assert "exceeds" in cells[2]["reason"]


# --------------------------------------------------------------------------- prompts, real tokenizer


def test_sentence_boundaries_end_sentences(client, haystack):
    rng = random.Random(3)
    assert len(haystack.boundaries) > 2000
    for b in rng.sample(haystack.boundaries, 40):
        before = detokenize(client, haystack.ids[max(0, b - 8) : b]).rstrip()
        after = detokenize(client, haystack.ids[b : b + 3])
        assert re.search(r"[.!?][\"')\]]*$", before), before
        assert not re.search(r"\b(Mr|Mrs|Dr|St)\.$", before), before
        assert after[:1].isspace(), after


@pytest.mark.parametrize("style", ["continuation", "chat"])
def test_prompts_have_exactly_the_target_length(client, haystack, style):
    words = NP.wording("number")
    fr = HS.frame(client, style, words)
    bos = client.tokenize("", add_special=True)
    for target, depth, start in [(200, 0.5, 0), (2048, 0.1, 1), (2048, 0.9, 2), (8175, 0.5, 3), (150_000, 0.9, 4)]:
        needle = client.tokenize(words.needle("4821937"))
        prompt = NP.build_prompt(haystack, fr, needle, target, depth, haystack.start(start))
        assert len(prompt.ids) == target and prompt.ids[: len(bos)] == bos
        text = detokenize(client, prompt.ids[len(bos) :])
        # What the server would make of the same prompt sent as text: the very same tokens.
        assert client.tokenize(text, add_special=True) == prompt.ids, (style, target, depth)
        assert text.count("4821937") == 1
        assert text.endswith("The special magic number is")
        assert text.startswith(fr.text_before.removeprefix("<bos>") + "The text below hides a special magic number.")
        if style == "chat":
            assert "<|im_start|>assistant\nThe special magic number is" in text
        if target == 150_000:
            assert prompt.haystack_tokens > len(haystack.ids), "long haystacks wrap around the prose"


def test_needle_sits_at_the_sentence_boundary_nearest_the_depth(client, haystack):
    words = NP.wording("number")
    fr = HS.frame(client, "continuation", words)
    needle = client.tokenize(words.needle("7654321"))
    for depth in (0.0, 0.1, 0.5, 0.9, 1.0):
        prompt = NP.build_prompt(haystack, fr, needle, 2048, depth, haystack.start(5))
        hay, bounds = haystack.window(prompt.haystack_start, prompt.haystack_tokens)
        at = prompt.needle_at - len(fr.head)
        assert at in bounds
        assert all(abs(at - depth * len(hay)) <= abs(b - depth * len(hay)) for b in bounds), "nearest boundary"
        assert abs(prompt.depth_actual - depth) < 0.05
        assert prompt.ids[prompt.needle_at : prompt.needle_at + len(needle)] == needle
        before = detokenize(client, prompt.ids[prompt.needle_at - 6 : prompt.needle_at]).rstrip()
        after = detokenize(client, prompt.ids[prompt.needle_at + len(needle) : prompt.needle_at + len(needle) + 2])
        assert re.search(r"[.!?][\"')\]]*$", before) and after[:1].isspace(), (before, after)


def test_value_never_occurs_in_the_haystack(client):
    hay = HS.Haystack(client, text=prose_text() + "\n\nThe safe held 4821937 guineas and 5550123 pence.\n")
    words = NP.wording("number")

    class Scripted(random.Random):
        values = iter([4821937, 5550123, 7000001])

        def randrange(self, *args):
            return next(self.values)

    assert hay.contains("4821937") and hay.contains("1876"), "the prose's own numbers count too"
    assert HS.pick_value(hay, words, Scripted()) == "7000001"


def test_too_short_a_length_is_refused_before_the_server(client, haystack):
    fr = HS.frame(client, "continuation", NP.wording("number"))
    with pytest.raises(NP.PromptError, match="too short"):
        NP.build_prompt(haystack, fr, client.tokenize(" The special magic number is 1234567."), 40, 0.5, 0)


# --------------------------------------------------------------------------- whole jobs


@pytest.mark.e2e
def test_gemma_recalls_at_2k_and_a_full_8k_context(tmp_path, gemma_fetch, server_provenance):
    # The values come from a fixed seed (chosen before running), so that this test is reproducible:
    # over random values and 8 passages, gemma-3-270m recalled at 8175 tokens and 50% depth in 25
    # trials of 26 (at 10% and 90%: 16 of 16; at 2048 tokens: 30 of 30), so a random draw would
    # fail this test now and then for the model's sake, not crashline's.
    rec = run(
        tmp_path,
        gemma_fetch,
        server_provenance,
        {"ctx": 8192, "ubatch": 512},
        {"lengths": [2048, 1.0], "depths": [0.1, 0.5, 0.9]},
        rng=random.Random(2026),
    )
    assert rec["outcome"] == "ok", rec["message"]
    assert rec["applicable"] and rec["slot_ctx"] == 8192 and rec["placement"]["n_ctx_slot"] == 8192
    summary = [(t["length_target"], t["depth"], t["passed"], t["answer"]) for t in rec["trials"]]
    assert [(t, d) for t, d, _, _ in summary] == [
        (2048, 0.1),
        (2048, 0.5),
        (2048, 0.9),
        (8175, 0.1),
        (8175, 0.5),
        (8175, 0.9),
    ]
    assert all(t["prompt_n"] == t["length_target"] for t in rec["trials"]), "prompt_n is the intended length"
    assert all(p for _, _, p, _ in summary), summary
    assert len({t["value"] for t in rec["trials"]}) == 6
    assert rec["recall"] == "pass" and rec["failed_required"] == []
    assert [(c["length"], c["depth"], c["passed"]) for c in rec["grid"]] == [
        (2048, 0.1, True),
        (2048, 0.5, True),
        (2048, 0.9, True),
        (1.0, 0.1, True),
        (1.0, 0.5, True),
        (1.0, 0.9, True),
    ]
    assert rec["command"][rec["command"].index("-c") + 1] == "8192"
    assert rec["kind"] == "needle" and rec["host"]["cpu_model"] and rec["server"]["sha256"]


def test_a_context_too_small_for_the_length_fails_with_the_reason(tmp_path, gemma_fetch, server_provenance):
    rec = run(
        tmp_path,
        gemma_fetch,
        server_provenance,
        {"ctx": 1024},
        {"lengths": [512, 2048], "depths": [0.1, 0.5, 0.9], "required": [2048]},
    )
    assert rec["outcome"] == "ok" and rec["slot_ctx"] == 1024
    short = [t for t in rec["trials"] if t["length"] == 512]
    long = [t for t in rec["trials"] if t["length"] == 2048]
    assert all(t["passed"] and t["prompt_n"] == 512 for t in short), short
    assert [t["passed"] for t in long] == [False, False, False]
    assert {t["reason"] for t in long} == {"length 2048 exceeds the configuration's context of 1024 tokens per slot"}
    assert rec["recall"] == "fail" and rec["failed_required"] == [2048]


def test_a_fit_aimed_at_the_margin_is_checked_at_the_target_its_measurement_settled_on(
    tmp_path, gemma_fetch, server_provenance
):
    """The H200 lease of session 16 measured --fit on at --fit-target 1216 (1024 left 840 MiB, under the margin) but
    checked its recall at 1024: recall and speed were of two placements. The needle job reads the measure record."""
    from crashline.core import records

    def measured(item):
        settled = {**item["settings"], "fit_target": item["settings"]["fit_target"] + 192}
        aim = {"margin_mib": 1024, "asked_fit_target": item["settings"]["fit_target"], "attempts": []}
        record = {"config_id": item["id"], "settings": settled, "fit_aim": aim, "outcome": "ok"}
        return records.write(tmp_path / "measure.json", "measure", record) and tmp_path / "measure.json"

    short = {"lengths": [512], "depths": [0.5]}
    rec = run(tmp_path, gemma_fetch, server_provenance, {"fit": "on", "ctx": 1024}, short, measured=measured)
    assert rec["settings"]["fit_target"] == 1024 + 192
    log = (tmp_path / "needle-server.log").read_text()
    assert ">= 1216 MiB" in log and rec["recall"] == "pass"  # llama.cpp aimed at it: "will leave N >= 1216 MiB"


def test_a_prompt_the_server_refuses_is_a_failure(tmp_path, gemma_fetch, server_provenance, monkeypatch):
    # Pretend the server claimed a larger slot: the server itself must then refuse the prompt.
    monkeypatch.setattr(HS.NeedleClient, "slot_context", lambda self: 4096)
    rec = run(tmp_path, gemma_fetch, server_provenance, {"ctx": 1024}, {"lengths": [2048], "depths": [0.5]})
    (trial,) = rec["trials"]
    assert not trial["passed"] and trial["prompt_n"] is None
    assert "exceeds" in trial["reason"] and "server refused it (HTTP 400" in trial["reason"]
    assert rec["recall"] == "fail" and rec["failed_required"] == [2048]


def test_chat_style_through_the_servers_template(tmp_path, gemma_fetch, server_provenance):
    rec = run(
        tmp_path, gemma_fetch, server_provenance, {"ctx": 2048}, {"lengths": [1024], "depths": [0.5]}, style="chat"
    )
    assert rec["prompt_style"] == "chat"
    (trial,) = rec["trials"]
    assert trial["prompt_n"] == 1024 and trial["passed"], trial


def test_synthetic_model_is_not_applicable_and_starts_no_server(tmp_path, tiny_moe, monkeypatch):
    def no_server(self):
        raise AssertionError("no server may start for a synthetic model")

    monkeypatch.setattr(ServerProcess, "start", no_server)
    fetch = {
        "source": "synthetic:tiny-moe",
        "sha256": "0" * 64,
        "files": [{"name": tiny_moe.name, "path": str(tiny_moe), "bytes": 0, "sha256": "0" * 64}],
    }
    rec = run(
        tmp_path, fetch, {"binary": "/nonexistent/llama-server"}, {}, {}, source="synthetic:tiny-moe", name="tiny-moe"
    )
    assert rec["recall"] == "not_applicable" and rec["applicable"] is False and rec["outcome"] == "not_applicable"
    assert rec["trials"] == [] and rec["failed_required"] == [] and rec["command"] is None
    assert "synthetic" in rec["message"]
    assert "no llama-server started" in (tmp_path / "needle-server.log").read_text()


def test_a_server_that_does_not_load_fails_every_length(tmp_path, server_provenance):
    bogus = tmp_path / "bogus.gguf"
    bogus.write_bytes(b"this is not a model\n" * 100)
    fetch = fetch_record(bogus)
    rec = run(tmp_path, fetch, server_provenance, {}, {"lengths": [512, 0.5], "depths": [0.5]})
    assert rec["outcome"] == "load_failed" and rec["recall"] == "fail" and rec["failed_required"] == [512, 0.5]
    assert len(rec["trials"]) == 2 and all("load_failed" in t["reason"] for t in rec["trials"])


# --------------------------------------------------------------------------- table and section


def test_table_and_section_show_the_grid(tmp_path, gemma_fetch, server_provenance, tiny_moe):
    small = tmp_path / "small"
    small.mkdir()
    run(
        small,
        gemma_fetch,
        server_provenance,
        {"ctx": 1024},
        {"lengths": [512, 2048], "depths": [0.5], "required": [2048]},
    )
    synth = tmp_path / "synth"
    synth.mkdir()
    fetch = {
        "source": "synthetic:tiny-moe",
        "sha256": "0" * 64,
        "files": [{"name": tiny_moe.name, "path": str(tiny_moe), "bytes": 0, "sha256": "0" * 64}],
    }
    run(synth, fetch, {"binary": "/nonexistent"}, {}, {}, source="synthetic:tiny-moe", name="tiny-moe")
    path = tmp_path / "tables" / "needle.parquet"
    NT.write_table([small / "needle.json", synth / "needle.json"], path)
    import pandas as pd

    import pyarrow.parquet as pq
    from crashline.core import columns as cols

    # the registry's columns and types, the lengths as lists of length keys: no JSON text inside Parquet
    assert pq.read_schema(path).remove_metadata() == cols.schema(cols.NEEDLE)
    frame = pd.read_parquet(path)
    assert [list(v) for v in frame["required"]] == [["2048"]] * 2 + [["2048", "0.9"]]  # tiny-moe's: the defaults
    ctx = NT.recall_grid(frame)
    assert [m["name"] for m in ctx] == ["gemma", "tiny-moe"] and not ctx[1]["applicable"]
    (cfg,) = ctx[0]["configs"]
    assert cfg["recall"] == "fail" and cfg["failed_required"] == ["2048"] and cfg["depths"] == [0.5]
    assert [r["length"] for r in cfg["rows"]] == ["512", "2048"] and [r["required"] for r in cfg["rows"]] == [
        False,
        True,
    ]
    assert cfg["rows"][0]["cells"][0]["passed"] and not cfg["rows"][1]["cells"][0]["passed"]
    skip = NT.recall_failures(frame)
    assert list(skip) == [("gemma", cfg["config_id"])]
    assert (
        "required length 2048" in skip[("gemma", cfg["config_id"])] and "exceeds" in skip[("gemma", cfg["config_id"])]
    )

    md = markdown.block(NR.section(ctx))
    assert "| length (prompt tokens) | depth 50% |" in md
    assert "| 2048 ★ | ✗ length 2048 exceeds the configuration's context of 1024 tokens per slot |" in md
    assert re.search(r"\| 512 \| ✓ recalled `\d{7}` \|", md)
    assert "Not applicable: random-weight synthetic model" in md
    page = html.block(NR.section(ctx))
    assert '<td class="fail"' in page and "exceeds the configuration&#39;s context" in page
    assert NR.section([]) is None  # no needle records: no section


def _trials(rows: list[tuple[str, int, bool]]):
    """A needle table of (config_id, length_target, passed) trials of one model, every length required."""
    import pandas as pd

    return pd.DataFrame(
        {
            "model": "m",
            "config_id": [c for c, _, _ in rows],
            "length_target": [n for _, n, _ in rows],
            "length": [str(n) for _, n, _ in rows],
            "depth": 0.5,
            "passed": [p for _, _, p in rows],
            "applicable": True,
            "failed_required": [sorted({str(n) for c2, n, p in rows if c2 == c and not p}) for c, _, _ in rows],
            "reason": "not recalled",
        }
    )


def test_a_model_that_fails_the_baseline_refuses_no_configuration_for_recall():
    """No trial at the shortest length passed, in any configuration: the model's failure. Recall then refuses
    nothing; where one configuration recalled there, the others' failures are theirs."""
    cannot = _trials([("a", 2048, False), ("a", 8192, False), ("b", 2048, False), ("b", 8192, False)])
    assert NT.recall_failures(cannot) == {}
    assert "does not recall a needle even at 2,048 tokens (on `a`, `b`)" in NT.uninformative(cannot)["m"]
    can = _trials([("a", 2048, True), ("a", 8192, False), ("b", 2048, False), ("b", 8192, False)])
    assert NT.uninformative(can) == {} and set(NT.recall_failures(can)) == {("m", "a"), ("m", "b")}
    # a model recall does not apply to has no trials, and no trial columns in its table
    import pandas as pd

    untried = pd.DataFrame({"model": ["t"], "config_id": ["x"], "applicable": [False], "failed_required": [[]]})
    assert NT.uninformative(untried) == {} and NT.recall_failures(untried) == {}


def test_default_lengths_leave_out_what_the_context_cannot_hold():
    """At -c 2048 crashline's default 2048-token needle left no room for the answer, so every configuration of
    any model failed recall there (issue #26); the user's own lengths stay as given (a misfit is a measurement)."""
    defaults = NP.needle_settings({})
    at_2k = NP.fitted(defaults, 2048)
    assert at_2k["lengths"] == [0.9] and at_2k["required"] == [0.9]
    assert NP.fitted(defaults, 4096)["lengths"] == [2048, 0.9]
    given = NP.needle_settings({"needle": {"lengths": [2048, 0.5]}})
    assert NP.fitted(given, 1024) == given and NP.fitted(defaults, None) == defaults


def test_a_configuration_that_runs_the_same_server_shares_its_twin_s_recall():
    """The demo's cold-page-cache configuration runs exactly the llama-server of its warm twin: recall cannot differ,
    so the twin's needle record stands for it (it cost a minute of the demo run on 2 cores)."""
    from crashline.config import plan as C
    from conftest import REPO

    cfg = C.load(REPO / "config" / "config.yaml")
    items = {(i["model"], i["id"]): i for i in C.expand(cfg)}
    twins = {key: C.needle_twin(cfg, *key) for key in items}
    shared = {key: twin for key, twin in twins.items() if twin}
    assert len(shared) == 1
    ((model, cold), warm) = shared.popitem()
    assert items[(model, cold)]["settings"]["page_cache"] == "cold"
    assert (
        items[(model, warm)]["settings"]["page_cache"] == "warm" and items[(model, warm)]["settings"]["ubatch"] == 512
    )


@pytest.mark.server
def test_a_model_that_recalls_nothing_at_the_shortest_length_is_not_asked_longer_ones(
    tmp_path, tiny_moe, server_provenance, monkeypatch
):
    """The baseline first: random weights recall no needle at the shortest length, so the longer (slower) trials
    say nothing of the configuration and are not run. On the H200 the three recall checks of one tune spent 115 s
    on a model that cannot recall (#25). The tiny MoE stands for a real model that recalls nothing: its header is
    not taken as crashline's random weights here."""
    from crashline.models import synthetic

    monkeypatch.setattr(synthetic, "NAME_RE", re.compile(r"^$"))
    rec = run(
        tmp_path,
        fetch_record(tiny_moe),
        server_provenance,
        {"ctx": 2048},
        {"lengths": [0.9, 512], "depths": [0.1, 0.5]},
        source=f"file:{tiny_moe}",
        name="tiny",
        rng=random.Random(7),
    )
    assert rec["applicable"] and rec["outcome"] == "ok", rec.get("message")
    assert [(t["length_target"], t["depth"]) for t in rec["trials"]] == [(512, 0.1), (512, 0.5)]  # shortest first
    assert all(t["answer"] is not None and not t["passed"] for t in rec["trials"])
    assert rec["recall"] == "fail"
