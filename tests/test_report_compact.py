"""Saying things once (present.compact): settings common to every configuration, the ones that set the
winner apart, constant table columns, runs of planner values, and the wrapped command a shell still
reads as the same arguments."""

from __future__ import annotations

import subprocess

from crashline.report.compact import constant_columns, distinguishing, runs, setting_units, split_common, wrapped
from crashline.report.doc import Cell, Code
from crashline.report.searches import planner_ranges

H200_ARGS = [  # the H200 run's configurations (tests/fixtures/h200-records): one --fit on, six --n-cpu-moe
    "-c 32768 -b 2048 -ub 2048 -ctk f16 -ctv f16 -fa auto -np 1 -lm auto --fit on -cb",
    *(
        f"-ngl 999 --n-cpu-moe {n} -c 32768 -b 2048 -ub 2048 -ctk f16 -ctv f16 -fa auto -np 1 -lm auto --fit off -cb"
        for n in (12, 14, 23, 25, 29, 31)
    ),
]


def test_settings_are_flags_with_their_values():
    assert setting_units("llama-server -m 'my model.gguf' -ngl 999 -cb -ot 'exps=CPU' --n-cpu-moe -1") == [
        "llama-server",
        "-m 'my model.gguf'",
        "-ngl 999",
        "-cb",
        "-ot exps=CPU",
        "--n-cpu-moe -1",
    ]


def test_a_measurement_setting_after_the_arguments_is_a_setting_of_its_own():
    cold = "-c 8192 -ub 512 -cb · cold page cache"
    assert setting_units(cold) == ["-c 8192", "-ub 512", "-cb", "· cold page cache"]
    assert split_common([cold, "-c 8192 -ub 512 -cb"]) == ("-c 8192 -ub 512 -cb", ["· cold page cache", ""])


def test_common_settings_are_said_once_and_each_row_keeps_the_rest():
    common, rest = split_common(H200_ARGS)
    assert common == "-c 32768 -b 2048 -ub 2048 -ctk f16 -ctv f16 -fa auto -np 1 -lm auto -cb"
    assert rest[0] == "--fit on" and rest[-1] == "-ngl 999 --n-cpu-moe 31 --fit off"
    assert split_common(["-c 4096"]) == ("-c 4096", [""])


def test_the_answer_names_what_sets_the_winner_apart():
    assert distinguishing(H200_ARGS[-1], H200_ARGS) == "--n-cpu-moe 31 --fit off"
    two = ["-c 4096 -ub 512", "-c 4096 -ub 2048 -ctk q8_0", "-c 4096 -ub 512"]
    assert distinguishing(two[1], two) == "-ub 2048 -ctk q8_0"  # a flag only the winner gives sets it apart
    assert distinguishing("-c 4096", ["-c 4096"]) == ""


def test_a_wrapped_command_is_the_same_command_to_a_shell():
    command = "llama-server -m '/models/a b.gguf' " + H200_ARGS[-1] + " --host 127.0.0.1 --port 8080"
    text = wrapped(command, width=60)
    assert len(text.splitlines()) > 2 and all(len(line) <= 62 for line in text.splitlines())
    argv = subprocess.run(
        ["bash", "-c", 'printf "%s\\0" ' + text.removeprefix("llama-server ")], capture_output=True, text=True
    )
    expected = ["-m", "/models/a b.gguf", *H200_ARGS[-1].split(), "--host", "127.0.0.1", "--port", "8080"]
    assert argv.stdout.split("\0")[:-1] == expected


def test_constant_columns_are_said_once_and_blank_ones_left_out():
    header = ["config", "workload", "requests at once", "aggregate", "decode"]
    rows = [
        [Code("a"), "short", "1", "–", "10"],
        [Code("b"), "–", "–", "–", "–"],  # failed before any workload
        [Code("c"), "short", "1", "–", Cell("12", "fail")],
    ]
    shown, once = constant_columns(header, rows, keep=frozenset({0, 1}))
    assert shown == [0, 1, 4] and once == [("requests at once", "1")]
    assert constant_columns(header, rows[:1], keep=frozenset()) == ([0, 1, 2, 3, 4], [])


def test_runs_join_equal_neighbours_but_never_a_none_key():
    assert runs([1, 1, 2, None, None, 1], lambda x: x) == [(0, 1, 1), (2, 2, 2), (3, 3, None), (4, 4, None), (5, 5, 1)]


def test_planner_values_read_as_ranges():
    limit, margin = 12288, 1024
    values = [
        *(
            {"n_cpu_moe": n, "predicted_mib": 12288 + 846 + (15 - n) * 324, "status": "skipped: predicted ..."}
            for n in range(0, 16)
        ),
        {"n_cpu_moe": 16, "predicted_mib": 12000, "status": "measured"},
        {"n_cpu_moe": 17, "predicted_mib": 11700, "status": "measured"},
        {"n_cpu_moe": 18, "predicted_mib": 11400, "status": "measured"},
        *(
            {
                "n_cpu_moe": n,
                "predicted_mib": 11000 - n,
                "status": "not measured: above the boundary, fits by the same prediction",
            }
            for n in range(19, 48)
        ),
    ]
    probed = {
        16: {"outcome": "oom", "failure": "oom", "phase": "warmup", "headroom_mib": 10},
        17: {"outcome": "ok", "failure": None, "phase": None, "headroom_mib": 300.0},
        18: {"outcome": "ok", "failure": None, "phase": None, "headroom_mib": 1500.0},
    }
    assert planner_ranges(values, probed, limit, 18, margin) == [
        f"0–15 skipped: predicted 846–{846 + 15 * 324:,} MiB over the budget",
        "16 ✗ oom at warmup",
        "17 ✓ risky: 300 MiB headroom, under the 1,024 MiB margin",
        "18 ✓ chosen (1,500 MiB headroom)",
        "19–47 fit by the same prediction (not measured)",
    ]


def test_what_if_other_cards_from_the_h200_search_calibration():
    """The report's what-if table: the H200 search's calibration and its model's manifest predict the lowest
    safe n_cpu_moe for other cards; at 12 GiB and the search's own context it is suggest's 28."""
    import json

    import pandas as pd

    from conftest import FIXTURES
    from crashline.tables import aggregate
    from crashline.report import searches as report
    from crashline.report import markdown, model_sections

    table = aggregate.search_table([FIXTURES / "h200-search" / "search.json"])
    manifest = json.loads((FIXTURES / "h200-telemetry" / "manifest.json").read_text())
    (search,) = report.searches(table, "moe-synthetic", pd.DataFrame(columns=["model", "config_id", "s_n_cpu_moe"]))
    assert search["what_if"] is None  # no manifest, no prediction
    (search,) = report.searches(table, "moe-synthetic", pd.DataFrame(columns=["model", "config_id"]), manifest)
    md = markdown.block(model_sections.what_if(search["what_if"]))
    assert "a prediction from this search's calibration, not measured; -ub 2048, 1,024 MiB margin" in md
    assert "| 12 GB (12,288 MiB) | 21 | 29 | does not fit |" in md  # 29: what the search measured (#40 item 4)
    assert "calibrated by search moe-synthetic/bench (ctx 32768)" in md


def test_bold_keeps_its_spaces_outside_the_stars():
    """ "**qwen3-30b-a3b: **the model does not recall…" showed its stars: a closing ** may not follow a space."""
    from crashline.report import markdown
    from crashline.report.doc import Code, Strong

    assert markdown.inline([Strong("qwen3: "), "the model"]) == "**qwen3:** the model"
    assert markdown.inline(["a", Strong(" b "), "c"]) == "a **b** c"
    assert markdown.inline(Strong(["Use ", Code("-ub 512")])) == "**Use `-ub 512`**"
    assert markdown.inline(Strong(" ")) == " "


def test_a_long_flag_value_in_a_table_cell_may_break_at_its_dots():
    """Session 30's 100K run drew its measurements table 55 px past a 1280-px window: the partial placement's -ot
    regex was one unbreakable group. A long value now breaks after its dots and underscores (<wbr>, no text of its
    own); short flags stay whole, and the text read or copied is the command."""
    import html as stdlib_html
    import re

    from crashline.report import html
    from crashline.report.doc import Code

    cell = html.inline(Code(r"-ngl 999 --n-cpu-moe 17 -ub 2048 -ot blk\.17\.ffn_(gate|down)_exps=CPU"), in_cell=True)
    groups = re.findall(r"<span>(.*?)</span>", cell)
    assert groups[:3] == ["-ngl 999", "--n-cpu-moe 17", "-ub 2048"]
    assert groups[3].count("<wbr>") == 4 and groups[3].startswith(r"-ot blk\.<wbr>17\.<wbr>")
    text = stdlib_html.unescape(re.sub(r"<[^>]+>", "", cell))
    assert text == r"-ngl 999 --n-cpu-moe 17 -ub 2048 -ot blk\.17\.ffn_(gate|down)_exps=CPU"
