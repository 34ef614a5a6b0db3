"""Conversations against a real llama-server on the real gemma-3-270m: the history grows turn by turn with the
prompt cache on, the server reuses it, the restart case sends it to a fresh server in one request, and a
conversation that outgrows the context is classified at its turn (the server lives on)."""

from __future__ import annotations

import re

import pytest

import pyarrow.parquet as pq

from crashline.tables import aggregate
from crashline.report import memory_figures
from crashline.core.records import Outcome
from crashline.engine import planner
from crashline.models.manifest import inspect_gguf

from helpers import measure_gemma

pytestmark = pytest.mark.e2e


def measure_talk(tmp_path, gemma_fetch, provenance, settings, conversation) -> dict:
    config = {
        "models": {"gemma": {"source": f"file:{gemma_fetch['files'][0]['path']}"}},
        "defaults": {"threads": 2},
        "configurations": [{"settings": settings}],
        "workloads": [{"name": "short", "prompt_tokens": 64, "gen_tokens": 8}],
        "conversations": [{"name": "chat", **conversation}],
        "repetitions": 1,
    }
    return measure_gemma(tmp_path, gemma_fetch, provenance, config)


def test_a_conversation_reuses_its_history_and_survives_a_restart(tmp_path, gemma_fetch, server_provenance):
    rec = measure_talk(
        tmp_path,
        gemma_fetch,
        server_provenance,
        {"ctx": 4096},
        {"turn_tokens": 256, "reply_tokens": 32, "depth_tokens": 2048},
    )
    assert rec["outcome"] == Outcome.OK, rec["message"]
    (talk,) = rec["conversations"]
    assert (talk["outcome"], talk["turns_planned"], talk["turns_done"]) == (Outcome.OK, 7, 7)
    turns = [t for t in talk["turns"] if t["turn"] != "restart"]
    assert [t["history_tokens"] for t in turns] == [256 + 288 * k for k in range(7)]
    for before, t in zip(turns, turns[1:]):
        # the server evaluates what its slot does not hold: at most the new turn, the last reply token (never
        # evaluated) and, on gemma's sliding-window layers, what lies past llama.cpp's last context checkpoint
        assert t["cache_n"] + t["prompt_n"] == t["history_tokens"]
        assert t["cache_n"] >= before["history_tokens"] - 64 and t["prompt_n"] < 256 + 32 + 64
    assert talk["reused_median"] > 0.9  # of what had been sent before: all but the last reply token, here
    restart = talk["restart_turn"]
    assert restart["phase"] == "chat:restart" and restart["history_tokens"] == turns[-1]["history_tokens"] + 32 + 256
    assert (restart["cache_n"], restart["prompt_n"]) == (0, restart["history_tokens"]), "a fresh server has no cache"
    # every turn has its phase's memory; the server was started twice, in one log
    phases = rec["memory"]["per_phase"]
    assert all(phases[t["phase"]]["rss_mib"] > 0 and t["rss_mib"] == phases[t["phase"]]["rss_mib"] for t in turns)
    assert "chat:restart-load" in phases and talk["rss_mib_per_1k"] is not None
    assert (tmp_path / "server.log").read_text().count("llama_server: listening on") == 2
    # the table says what the record says; the figure draws every turn
    tables = {name: tmp_path / f"{name}.parquet" for name in ("configs", "measurements", "conversations")}
    aggregate.write(
        [tmp_path / "measure.json"], tables["configs"], tables["measurements"], [], None, tables["conversations"]
    )
    (row,) = pq.read_table(tables["conversations"]).to_pylist()
    assert (row["conversation"], row["conversation_outcome"], row["turns_done"], row["at_once"]) == ("chat", "ok", 7, 1)
    assert [(t["turn"], t["cache_n"], t["rss_mib"]) for t in row["turn_rows"]] == [
        (str(t["turn"]), t["cache_n"], t["rss_mib"]) for t in talk["turns"]
    ]
    assert (row["restart_ttft_s"], row["rss_mib_per_1k"]) == (restart["ttft_s"], talk["rss_mib_per_1k"])
    (figure,) = memory_figures.conversation_memory_figures("gemma", pq.read_table(tables["conversations"]).to_pandas())
    assert figure.kind == "conversation" and len(figure.series) == 1 and "peak host RSS" in figure.svg


def test_a_conversation_that_outgrows_the_context_is_classified_at_its_turn(tmp_path, gemma_fetch, server_provenance):
    rec = measure_talk(
        tmp_path,
        gemma_fetch,
        server_provenance,
        {"ctx": 1024},
        {"turn_tokens": 256, "reply_tokens": 32, "depth_tokens": 4096},
    )
    (talk,) = rec["conversations"]
    # turn 4 sends 1120 tokens to a 1024-token context
    assert (talk["outcome"], talk["failed_at"], talk["turns_done"]) == (Outcome.CONTEXT_EXCEEDED, "chat:turn-4", 3)
    assert (rec["outcome"], rec["phase"]) == (Outcome.CONTEXT_EXCEEDED, "chat:turn-4")
    assert talk["restart_turn"] is None, "a conversation that failed is not restarted"
    last = talk["turns"][-1]  # the failed turn is recorded: what it sent, no answer, its phase's peaks
    assert (last["turn"], last["history_tokens"], last["outcome"], last["prompt_n"]) == (
        4,
        1120,
        "context_exceeded",
        None,
    )
    assert last["rss_mib"] > 0 and talk["depth_reached"] == 832 + 32
    assert rec["returncode"] == 0, "crashline stopped the server, which lived on after the refused turn"


@pytest.mark.parametrize("cache_ram, reused", [(None, True), (0, False)])
def test_two_conversations_on_one_slot_restore_from_the_host_cache(
    tmp_path, gemma_fetch, server_provenance, cache_ram, reused
):
    """Two conversations take turns on one slot: each turn finds the other's history in the slot. With the host
    prompt cache (llama.cpp's default 8192 MiB) the slot is restored from it; with --cache-ram 0 it is not."""
    settings = {"ctx": 4096, "parallel": 1, **({"cache_ram": cache_ram} if cache_ram is not None else {})}
    rec = measure_talk(
        tmp_path,
        gemma_fetch,
        server_provenance,
        settings,
        {"turn_tokens": 256, "reply_tokens": 16, "depth_tokens": 1400, "at_once": 2, "restart": False},
    )
    assert rec["outcome"] == Outcome.OK, rec["message"]
    assert ("--cache-ram" in rec["command"]) == (cache_ram is not None)
    (talk,) = rec["conversations"]
    assert (talk["conversations"], talk["turns_done"]) == (2, 5)
    for k in range(2, 6):
        pair = [t for t in talk["turns"] if t["turn"] == k]
        before = {t["conversation"]: t["history_tokens"] for t in talk["turns"] if t["turn"] == k - 1}
        if reused:  # each turn finds its own history, saved when the other conversation took the slot
            assert all(t["cache_n"] >= before[t["conversation"]] - 64 for t in pair), pair
        else:  # only a conversation served twice in a row (last of one round, first of the next) finds its own
            assert min(t["cache_n"] for t in pair) == 0, pair


def test_a_soak_keeps_starting_conversations_of_varied_depth_until_its_time(tmp_path, gemma_fetch, server_provenance):
    soak_s = 8
    rec = measure_talk(
        tmp_path,
        gemma_fetch,
        server_provenance,
        {"ctx": 4096},
        {"turn_tokens": 256, "reply_tokens": 16, "depth_tokens": 600, "soak_s": soak_s, "restart": False},
    )
    assert rec["outcome"] == Outcome.OK, rec["message"]
    (talk,) = rec["conversations"]
    assert (talk["turns_planned"], talk["turns_done"]) == (2, 2)
    by_set: dict[int, list[dict]] = {}
    for t in talk["turns"]:
        by_set.setdefault(t["soak"], []).append(t)
    assert sorted(by_set) == list(range(talk["soak_sets"] + 1))
    # each set is a new conversation (its own prose, nothing to reuse at its first turn), to its own depth:
    # a quarter, all, half, three quarters of depth_tokens in turn (turns of 272 tokens: 1, 2, 1, 1)
    for number, turns in by_set.items():
        planned = 2 if number == 0 else [1, 2, 1, 1][(number - 1) % 4]
        assert len({t["conversation"] for t in turns}) == 1 and len(turns) == planned
        assert turns[0]["cache_n"] <= 1 and all(t["phase"].startswith(f"chat:soak-{number}:") for t in turns if number)
    times = [t["t_s"] for t in talk["turns"]]
    assert times == sorted(times) and talk["ran_s"] == times[-1]
    # a set starts only while the soak's time lasts, and none is left out once it is up (whatever the speed)
    assert all(by_set[k - 1][-1]["t_s"] < soak_s + 0.5 for k in range(1, talk["soak_sets"] + 1))
    assert talk["ran_s"] >= soak_s - 0.5
    if by_set[0][-1]["t_s"] < soak_s - 0.5:
        assert talk["soak_sets"] >= 1 and talk["rss_mib_per_hour"] is not None


@pytest.mark.parametrize("swa_full", [None, True])
def test_gemma_s_sliding_window_layers_make_context_checkpoints_each_turn(
    tmp_path, gemma_fetch, server_provenance, swa_full
):
    """gemma-3 has sliding-window layers: llama.cpp makes context checkpoints as each turn's prompt is evaluated,
    and the record counts them per turn from the server's log, with their size and the RSS after the turn. With
    --swa-full (the whole KV kept for those layers) it makes none."""
    settings = {"ctx": 4096, **({"swa_full": swa_full} if swa_full else {})}
    rec = measure_talk(
        tmp_path,
        gemma_fetch,
        server_provenance,
        settings,
        {"turn_tokens": 512, "reply_tokens": 16, "depth_tokens": 2200, "restart": False},
    )
    assert rec["outcome"] == Outcome.OK, rec["message"]
    assert ("--swa-full" in rec["command"]) == bool(swa_full)
    # the planner's KV cache is what this server allocated (gemma's sliding-window layers keep their window alone)
    allocated = sum(
        map(float, re.findall(r"llama_kv_cache: size =\s+([\d.]+) MiB", (tmp_path / "server.log").read_text()))
    )
    ran = {"cache_type_k": "f16", "cache_type_v": "f16", "ubatch": 512, "parallel": 1, **settings}
    assert allocated == pytest.approx(planner.kv_mib(inspect_gguf(gemma_fetch["files"][0]["path"]), ran), abs=0.01)
    (talk,) = rec["conversations"]
    turns = talk["turns"]
    assert len(turns) == 4 and all(t["rss_mib"] > 0 for t in turns)
    made = [t["checkpoints_created"] for t in turns]
    log = (tmp_path / "server.log").read_text()
    # the short workload before it makes some too (counted in no turn)
    assert log.count("created context checkpoint") >= sum(made) == talk["checkpoints_created"]
    if swa_full:
        assert sum(made) == 0 and talk["checkpoints_held"] == 0
        return
    assert all(n >= 1 for n in made), made  # every turn's new 512 tokens made at least one
    held = [t["checkpoints_held"] for t in turns]
    assert held == sorted(held) and held[-1] == sum(made) == talk["checkpoints_held"]  # none erased under 32
    assert all(t["checkpoint_mib"] > 0 for t in turns) and talk["checkpoint_mib"] == max(
        t["checkpoint_mib"] for t in turns
    )
    tables = {name: tmp_path / f"{name}.parquet" for name in ("configs", "measurements", "conversations")}
    aggregate.write(
        [tmp_path / "measure.json"], tables["configs"], tables["measurements"], [], None, tables["conversations"]
    )
    (row,) = pq.read_table(tables["conversations"]).to_pylist()
    assert row["checkpoints_created"] == sum(made) and [t["checkpoints_created"] for t in row["turn_rows"]] == made
