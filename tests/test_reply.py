"""Where the answer changes with the reply length (#40 item 2): a request takes its time to first token plus the reply
over decode, so a configuration that prefills slower and decodes faster finishes first once the reply is long
enough. One computation (tables.reply) behind the report, recommendation.json and tune's line."""

from __future__ import annotations

import json
import sys

import pytest

from crashline.tables.reply import crossover, reply_lengths

from conftest import REPO

# the issue's two configurations at the seed's scale: medians, and each one's range between server starts
PROMPT = 16_000
A = {"prefill_tps_median": 6795.0, "decode_tps_median": 54.3, "decode_tps_start_medians": [53.2, 55.8]}
B = {"prefill_tps_median": 5699.0, "decode_tps_median": 65.5, "decode_tps_start_medians": [58.1, 66.8]}


def measured(speeds: dict, gen: int = 64) -> dict:
    """A measurement row of the objective workload: the time to first token left out, so it is prompt ÷ prefill."""
    starts = speeds["decode_tps_start_medians"]
    return {
        "prompt_tokens": PROMPT,
        "gen_tokens": gen,
        "s_ctx": 32_768,
        "ttft_s_median": None,
        **speeds,
        "prefill_tps_start_medians": [speeds["prefill_tps_median"]] * len(starts),
    }


def test_the_reply_length_where_the_issues_two_configurations_cross():
    """From the medians, -ub 1024 finishes a 16K-token request first once the reply passes about 144 tokens."""
    n = crossover(PROMPT / 6795, 54.3, PROMPT / 5699, 65.5)
    assert n == pytest.approx(143.8, abs=0.1)
    assert crossover(1.0, 50.0, 2.0, 50.0) is None  # alike in decode: they never meet
    found = reply_lengths("a", {"a": measured(A), "b": measured(B)}, {"b": "--n-cpu-moe 17 -ub 1024"})
    longer = found["longer"]
    assert found["shorter"] is None and found["range"] == [1, 4096] and found["gen_tokens"] == 64
    assert longer["config_id"] == "b" and longer["tokens"] == pytest.approx(143.8, abs=0.1)
    # the range over the pairings of server starts: the slowest start of A against the fastest of B, and so on
    assert longer["from"] == "server starts" and longer["low"] < 143.8 < longer["high"]
    assert longer["low"] == pytest.approx(crossover(PROMPT / 6795, 53.2, PROMPT / 5699, 66.8), abs=0.1)
    assert found["text"].startswith(
        f"Reply length: for replies longer than ~144 tokens (~{int(longer['low']) + 1}–{int(longer['high']) + 1} "
        "over each server start's medians), `--n-cpu-moe 17 -ub 1024` finishes a request first; the answer is for "
        "the 64-token reply asked"
    )
    # asked at 300 tokens, the answer would be B: A's crossover lies below it, the other way round
    flipped = reply_lengths("b", {"a": measured(A, 300), "b": measured(B, 300)}, {"a": "--n-cpu-moe 18 -ub 2048"})
    assert flipped["longer"] is None and flipped["shorter"]["tokens"] == pytest.approx(143.8, abs=0.1)
    assert "for replies shorter than ~144 tokens" in flipped["text"]
    # the range holds the medians' own crossing: B's requests pooled decode at 65.5 while each start's median read
    # 56-57, so every pairing of starts crosses past 144 tokens, and the range reaches down to the medians' 144
    apart = {**B, "decode_tps_start_medians": [56.0, 57.0]}
    wide = reply_lengths("a", {"a": measured(A), "b": measured(apart)}, {"b": "-ub 1024"})["longer"]
    assert wide["low"] == wide["tokens"] == pytest.approx(143.8, abs=0.1)  # each pairing alone: 361 and more
    # a configuration slower at both never finishes first; the context bounds the replies asked about
    slow = {**B, "decode_tps_median": 50.0, "decode_tps_start_medians": [49.0, 51.0]}
    never = reply_lengths("a", {"a": {**measured(A), "s_ctx": 18_000}, "b": measured(slow)}, {"b": "-ub 512"})
    assert never["longer"] is None and never["shorter"] is None and never["range"] == [1, 2000]
    assert "at every reply of 1–2,000 tokens: no other configuration finishes a request first" in never["text"]


def test_recommendation_json_the_report_and_tunes_line_carry_the_reply_length(tmp_path):
    """The H200 tune of lease-2026-12-02, rendered again: -ub 512 decodes faster than the answer (-ub 2048), so it
    finishes first past some reply length; recommendation.json, the report's answer and tune's line say the same."""
    sys.path.insert(0, str(REPO / "bench"))
    import rerender

    from crashline.cli.tune import answer

    lease = REPO / "bench" / "results" / "lease-2026-12-02" / "qwen3-30b-a3b" / "tune" / "results"
    md = rerender.rerender(lease, tmp_path / "results").read_text()
    (found,) = json.loads((tmp_path / "results" / "recommendation.json").read_text())
    reply = found["reply_length"]
    assert reply["gen_tokens"] == 64 and reply["range"] == [1, 4096]
    assert reply["longer"]["label"] == "--n-cpu-moe 31 -ub 512" and 64 < reply["longer"]["tokens"] < 4096
    assert reply["text"].startswith(f"Reply length: for replies longer than ~{int(reply['longer']['tokens']) + 1:,}")
    lines = answer({"results_dir": str(tmp_path / "results")})
    assert f"  {reply['text']}" in lines
    assert reply["text"].replace("`", "").split(" (")[0] in md.replace("`", "")


def test_no_sentence_of_the_answer_box_shows_a_literal_backtick_in_html(tmp_path):
    """#41: the tie sentence (and the reply-length one) name configurations in backticks, as tune's line does; the
    HTML sets them as code. The session-17 H200 tune is tied, with an id in backticks."""
    sys.path.insert(0, str(REPO / "bench"))
    import rerender

    results = REPO / "bench" / "results" / "lease-2026-12-03-s17" / "tune30" / "tune" / "results"
    rerender.rerender(results, tmp_path / "out")
    html = (tmp_path / "out" / "report.html").read_text()
    tie = next(p for p in html.split("<p") if "Tied with" in p)
    assert "`" not in html and "<code>3b5e95f382</code>" in tie, tie
