"""Claims files: validation (errors name the key and the value), rows into configurations with
assumed settings, ids shared with identical sweep configurations, the comparability check, and
the correction table from small tables shaped like the real ones."""

from __future__ import annotations

import copy
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest
import yaml

from crashline.config.plan import load_schema
from crashline.tables import aggregate, claims as KC
from crashline.config import claims as K, plan as C
from crashline.jobs import spec as jobs
from crashline.core import settings as S
from crashline.report import correction as KP

from conftest import FIXTURES, REPO

SCHEMA = load_schema()
MIXED = FIXTURES / "claims" / "mixed.yaml"


def _raw() -> dict:
    return {
        "models": {"m": {"source": "file:/x.gguf"}},
        "defaults": {"threads": 2},
        "configurations": [{"grid": {"ubatch": [128, 512]}}, {"settings": {"parallel": 4, "ctx": 16384}}],
        "workloads": [{"name": "short", "prompt_tokens": 128, "gen_tokens": 16}],
    }


def run_config() -> dict:
    return C.validate(_raw(), SCHEMA)


@pytest.fixture
def mixed() -> dict:
    return K.load_claims([MIXED], run_config())[0]


def write_claims(tmp_path: Path, mutate) -> Path:
    raw = yaml.safe_load(MIXED.read_text())
    mutate(raw)
    shutil.copy(MIXED.parent / "upstream-README.md", tmp_path / "upstream-README.md")
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.mark.parametrize(
    "mutate, expected",
    [
        (lambda c: c.update(bogus=1), "key bogus = 1: unknown key; known keys: title, note, source"),
        (lambda c: c["rows"][0]["claimed"].update(decode_tps="fast"), "key rows.0.claimed.decode_tps = 'fast'"),
        (lambda c: c["rows"][0]["claimed"].update(tokens_per_s=3), "key rows.0.claimed.tokens_per_s = 3: unknown key"),
        (lambda c: c["rows"][1].update(claimed={}), "key rows.1.claimed = {}"),
        (lambda c: c["workload"].update(prompt_tokens=0), "key workload.prompt_tokens = 0"),
        (lambda c: c.update(model="nope"), "key model = 'nope': no such model"),
        (
            lambda c: c["rows"][0]["stated"].update(ubatchsize=64),
            "key rows.0.stated.ubatchsize = 64: unknown server setting(s) 'ubatchsize'; did you mean 'ubatch'?",
        ),
        (lambda c: c["rows"][0]["stated"].update(ubatch=-1), "key rows.0.stated.ubatch = -1"),
        (lambda c: c["rows"][2]["stated"].update(flash_attn="maybe"), "key rows.2.stated.flash_attn = 'maybe'"),
        (lambda c: c["defaults"].update(cache_type_k="q3"), "key defaults.cache_type_k = 'q3'"),
        (lambda c: c["rows"][0]["unknown"].append("speed"), "key rows.0.unknown = 'speed': unknown setting"),
        (lambda c: c["rows"][0]["unknown"].append("ubatch"), "key rows.0.unknown = ['ubatch']: also stated"),
        (lambda c: (c.pop("workload"), c["rows"][0].pop("workload", None)), "key rows.0.workload: no workload"),
        (lambda c: c["source"].update(local_copy="missing.md"), "key source.local_copy = 'missing.md'"),
        (lambda c: c["source"].update(hf_repo="no slash"), "key source.hf_repo = 'no slash'"),
        (lambda c: c["rows"][1].update(label="ub 512"), "key rows.1.label = 'ub 512': rows.0 has the same label"),
        (lambda c: c["rows"][0]["stated"].update(fit="on", n_gpu_layers=10), "key rows.0: setting fit = 'on'"),
    ],
)
def test_invalid_claims_name_key_and_value(tmp_path, mutate, expected):
    path = write_claims(tmp_path, mutate)
    with pytest.raises(K.ClaimsError) as err:
        K.load_claims([path], run_config())
    assert expected in str(err.value) and str(path) in str(err.value)
    assert isinstance(err.value, C.ConfigError)  # the CLI reports it like any config error


def test_rows_become_configurations_with_assumed_settings(mixed):
    items = K.claim_configurations([mixed])
    assert [i["label"] for i in items] == ["ub 512", "ub 128", "np 4, 4 users"]
    ub512 = items[0]
    # the run's defaults, then the claim's, then what the source states
    assert ub512["settings"] == {"threads": 2, "ctx": 4096, "ubatch": 512}
    assert ub512["assumed"] == ["ctx", "parallel", "threads"]
    assert ub512["resolved"]["parallel"] == 1 and ub512["resolved"]["batch"] == 2048
    np4 = items[2]
    # a stated value wins over the claim's default and is not assumed
    assert np4["settings"] == {"threads": 2, "ctx": 16384, "parallel": 4}
    assert np4["assumed"] == ["threads", "ubatch"] and np4["resolved"]["ubatch"] == 512
    assert np4["workload"] == {"prompt_tokens": 512, "gen_tokens": 64, "concurrency": 4}
    assert mixed["rows"][2]["build"] == "b5100" and mixed["rows"][0]["build"] == "b5000"
    assert all(i["id"] == S.config_id("m", S.resolve(i["settings"])) for i in items)


def test_identical_sweep_configuration_shares_the_id(mixed):
    cfg = run_config()
    sweep = {(i["model"], i["id"]) for i in C.expand(cfg)}
    claim_ids = [(i["model"], i["id"]) for i in K.claim_configurations([mixed])]
    # ub 512 and ub 128 are the sweep's grid points; np 4 is its fixed entry (ubatch default 512)
    assert set(claim_ids) <= sweep
    # config.expand adds claim configurations with setdefault on (model, id): nothing new here
    merged = {key: None for key in [*sweep, *claim_ids]}
    assert len(merged) == len(sweep)
    # a row whose assumed context differs from the sweep's is a new configuration
    cfg["defaults"] = {"threads": 2, "ctx": 8192}
    other = K.claim_configurations(K.load_claims([MIXED], cfg))
    assert other[0]["settings"]["ctx"] == 4096  # the claim's default wins over the run's
    cfg["defaults"] = {"threads": 4}
    moved = K.claim_configurations(K.load_claims([MIXED], cfg))
    assert not {(i["model"], i["id"]) for i in moved} & sweep


def test_claim_workloads_added_once_and_only_where_missing(mixed):
    cfg = run_config()
    added = K.claim_workloads([mixed], cfg["workloads"])
    ub512, ub128, np4 = (i["id"] for i in K.claim_configurations([mixed]))
    assert added == [  # each runs on its rows' configurations only
        {
            "name": "claim-pp512-tg64",
            "prompt_tokens": 512,
            "gen_tokens": 64,
            "concurrency": 1,
            "configs": [ub512, ub128],
        },
        {"name": "claim-pp512-tg64-c4", "prompt_tokens": 512, "gen_tokens": 64, "concurrency": 4, "configs": [np4]},
    ]
    assert K.claim_workloads([mixed], cfg["workloads"] + added) == []  # idempotent: a reload adds nothing
    # "slots" sends one request per slot: it covers the 4-slot row at 4 requests and the others at 1
    slots = [{"name": "w", "prompt_tokens": 512, "gen_tokens": 64, "concurrency": "slots"}]
    assert K.claim_workloads([mixed], slots) == []


def test_a_claims_workload_runs_on_its_rows_configurations_only(tmp_path):
    """A claims row at 100K tokens made every configuration, the user's own too, context_exceeded (#26): its
    workload runs on the row's configuration, and the user's configurations measure their own workloads alone."""

    def mutate(c):
        c["rows"][0]["stated"].update(ctx=131072)
        c["rows"][0]["unknown"].remove("ctx")

    path = write_claims(tmp_path, mutate)
    raw = {**_raw(), "claims": [str(path)], "defaults": {"threads": 2}}
    cfg = C.validate(raw, SCHEMA)
    row = K.claim_configurations(K.load_claims([path], cfg))[0]
    added = next(w for w in cfg["workloads"] if w["name"] == "claim-pp512-tg64")
    assert added["configs"][0] == row["id"] and len(added["configs"]) == 2  # rows 0 and 1
    for item in C.expand(cfg):
        names = [w["name"] for w in jobs.spec("measure", cfg, item["model"], item["id"]).measurement.workloads]
        wanted = ["short"] + [w["name"] for w in cfg["workloads"] if item["id"] in w.get("configs", [])]
        assert names == wanted, item["id"]
        assert all("configs" not in w for w in jobs.spec("measure", cfg, "m", item["id"]).measurement.workloads)
    own = [i for i in C.expand(cfg) if not any(i["id"] in w.get("configs", []) for w in cfg["workloads"])]
    assert len(own) == 1  # the sweep's ub 512 point, row 0's settings at another context: the user's own only
    assert C.objective_workload(cfg) == "short"


def test_a_claims_row_sending_more_requests_than_its_slots_is_refused(tmp_path):
    path = write_claims(tmp_path, lambda c: c["rows"][2]["stated"].update(parallel=2))
    with pytest.raises(K.ClaimsError) as err:
        C.validate({**_raw(), "claims": [str(path)]}, SCHEMA)
    assert (
        "key rows.2.workload.concurrency = 4: the row sends 4 requests at once, but its configuration has "
        in (str(err.value))
        and "parallel = 2 slot(s)" in str(err.value)
        and str(path) in str(err.value)
    )


def test_example_claims_match_the_default_sweep():
    """The shipped example runs in the default job without one extra measurement."""
    cfg = C.load(REPO / "config" / "config.yaml")
    claims = K.load_claims([REPO / "config" / "claims" / "example.yaml"], cfg)
    sweep = {(i["model"], i["id"]) for i in C.expand(cfg)}
    items = K.claim_configurations(claims)
    assert len(items) in (3, 4) and {(i["model"], i["id"]) for i in items} <= sweep
    assert K.claim_workloads(claims, cfg["workloads"]) == []
    assert all(i["workload"]["prompt_tokens"] <= 512 and i["workload"]["gen_tokens"] <= 64 for i in items)
    settings = {(i["resolved"]["ubatch"], i["resolved"]["parallel"]) for i in items}
    assert {128, 512} <= {u for u, _ in settings} and {1, 2} <= {p for _, p in settings}
    assert "not a real publication" in (REPO / "config" / "claims" / "example-upstream-README.md").read_text()


def test_comparability_names_ubatch_parallel_and_assumed_values(mixed):
    flags = {(f["a"], f["b"]): f for f in KC.comparability(mixed["rows"])}
    assert set(flags) == {("ub 512", "ub 128"), ("ub 512", "np 4, 4 users"), ("ub 128", "np 4, 4 users")}
    assert flags[("ub 512", "ub 128")]["settings"] == ["ubatch"]
    assert flags[("ub 512", "ub 128")]["text"] == "ubatch (-ub) 512 vs 128"
    np4 = flags[("ub 512", "np 4, 4 users")]
    # ubatch: stated 512 against an assumed 512 is the same value, so not a difference
    assert np4["settings"] == ["parallel", "ctx", "build", "concurrency"]
    assert "parallel (-np) 1 (assumed) vs 4" in np4["text"] and "ctx (-c) 4096 (assumed) vs 16384" in np4["text"]
    assert "build b5000 vs b5100" in np4["text"] and "requests at once 1 vs 4" in np4["text"]
    assert flags[("ub 128", "np 4, 4 users")]["settings"][:2] == ["ubatch", "parallel"]
    assert "ubatch (-ub) 128 vs 512 (assumed)" in flags[("ub 128", "np 4, 4 users")]["text"]
    per_row = KC.row_flags(mixed["rows"])
    assert per_row["ub 512"] == ["ub 128 (ubatch)", "np 4, 4 users (parallel, ctx, build, requests at once)"]
    # the same check on claim_configurations items
    assert [f["settings"] for f in KC.comparability(K.claim_configurations([mixed]))][0] == ["ubatch"]


def test_comparability_of_identical_rows_and_unverifiable_settings(mixed):
    same = [copy.deepcopy(mixed["rows"][0]), copy.deepcopy(mixed["rows"][0])]
    same[1]["label"] = "again"
    assert KC.comparability(same) == []
    silent = {u["setting"]: u for u in KC.unverifiable(mixed["rows"])}
    assert silent["threads"]["all"] and silent["threads"]["assumed_values"] == ["2"]
    assert silent["parallel"]["rows"] == ["ub 512", "ub 128"]
    assert "build" not in silent  # every row has one (the file's or its own)


# -- correction table ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def real_tables():
    """A real configs row and measurements row (from records crashline wrote), to copy the shape."""
    records = sorted(p for p in (FIXTURES / "h200-records").glob("*.json") if p.name != "provenance.json")
    configs, measurements = aggregate.tables(records)
    return configs.iloc[0].to_dict(), measurements.iloc[0].to_dict()


def tables_for(claim: dict, real_tables, stats: dict, failed: dict | None = None):
    """configs / measurements frames with the real columns: one row per (row index, concurrency)."""
    config_row, meas_row = real_tables
    configs, measurements = [], []
    for r in claim["rows"]:
        base = {
            "model": claim["model"],
            "config_id": r["id"],
            "server_version": "0.6.0-dev (build 0)",
            "server_sha256": "ab" * 32,
            "cpu_model": "Test CPU",
            "gpu": "no GPU",
            "repetitions": 3,
            **{f"s_{k}": v for k, v in r["resolved"].items()},
        }
        if failed and r["index"] in failed:
            configs.append(
                {
                    **config_row,
                    **base,
                    "outcome": failed[r["index"]][0],
                    "phase": failed[r["index"]][1],
                    "message": "out of memory",
                }
            )
            continue
        configs.append({**config_row, **base, "outcome": "ok", "phase": None, "message": None})
        for (index, conc), values in stats.items():
            if index != r["index"]:
                continue
            row = {
                **meas_row,
                **base,
                "workload": f"w{conc}",
                "prompt_tokens": r["workload"]["prompt_tokens"],
                "gen_tokens": r["workload"]["gen_tokens"],
                "concurrency": conc,
                "workload_outcome": "ok",
                "workload_message": None,
            }
            for metric in ("prefill_tps", "decode_tps", "aggregate_tps"):
                lo, med, hi = values.get(metric, (None, None, None))
                row.update(
                    {
                        f"{metric}_min": lo,
                        f"{metric}_median": med,
                        f"{metric}_max": hi,
                        f"{metric}_n": 3 if med else None,
                    }
                )
            measurements.append(row)
    return pd.DataFrame(configs), pd.DataFrame(measurements)


STATS = {
    (0, 1): {"prefill_tps": (580.0, 600.0, 640.0), "decode_tps": (48.0, 52.0, 55.0), "aggregate_tps": (40, 41, 42)},
    (1, 1): {"prefill_tps": (300.0, 310.0, 330.0), "decode_tps": (60.0, 61.0, 62.0), "aggregate_tps": (50, 51, 52)},
    # the 4-slot configuration, measured with one request and with four at once
    (2, 1): {"prefill_tps": (900.0, 910.0, 920.0), "decode_tps": (70.0, 71.0, 72.0), "aggregate_tps": (60, 61, 62)},
    (2, 4): {"prefill_tps": (400.0, 420.0, 430.0), "decode_tps": (30.0, 31.0, 32.0), "aggregate_tps": (110, 120, 125)},
}


def test_correction_table_claimed_against_measured(mixed, real_tables):
    configs, measurements = tables_for(mixed, real_tables, STATS)
    assert set(real_tables[1]) <= set(measurements.columns)  # the real table's shape (and every setting)
    table = KC.correction_table([mixed], configs, measurements)
    by = {(t["label"], t["metric"]): t for t in table}
    assert list(by) == [
        ("ub 512", "prefill_tps"),
        ("ub 512", "decode_tps"),
        ("ub 128", "prefill_tps"),
        ("ub 128", "decode_tps"),
        ("np 4, 4 users", "prefill_tps"),
        ("np 4, 4 users", "aggregate_tps"),
    ]
    pre = by[("ub 512", "prefill_tps")]
    assert pre["median"] == 600.0 and pre["n"] == 3 and pre["diff_pct"] == pytest.approx(-40.0)
    assert pre["measured_text"] == "600.0 [580.0–640.0] n=3" and pre["diff_text"] == "-40.0%"
    dec = by[("ub 512", "decode_tps")]
    assert dec["within_range"] and dec["diff_text"] == "+4.0% (within range)"
    assert pre["assumed"] == ["ctx=4096", "parallel=1", "threads=2"] and pre["stated"] == {"ubatch": "512"}
    assert pre["settings"] == S.label(mixed["rows"][0]["resolved"]) and "-ub 512" in pre["settings"]
    assert pre["not_comparable_with"] == ["ub 128 (ubatch)", "np 4, 4 users (parallel, ctx, build, requests at once)"]
    assert pre["build"] == "0.6.0-dev (build 0) (sha256 abababababab…)" and pre["host"] == "Test CPU; no GPU"
    assert pre["build_claimed"] == "b5000" and pre["config_id"] == mixed["rows"][0]["id"]


def test_aggregate_claim_compares_with_the_aggregate_at_its_concurrency(mixed, real_tables):
    configs, measurements = tables_for(mixed, real_tables, STATS)
    by = {(t["label"], t["metric"]): t for t in KC.correction_table([mixed], configs, measurements)}
    agg = by[("np 4, 4 users", "aggregate_tps")]
    # 4 requests at once, all of them together: never the per-request decode, never the 1-request run
    assert agg["median"] == 120.0 and agg["diff_pct"] == pytest.approx(-20.0)
    assert agg["workload_text"] == "pp512 tg64, 4 requests at once"
    assert by[("np 4, 4 users", "prefill_tps")]["median"] == 420.0  # per request, at 4 at once
    assert agg["metric_title"].startswith("aggregate")


def test_correction_table_says_why_a_row_has_no_measurement(mixed, real_tables):
    configs, measurements = tables_for(
        mixed, real_tables, {k: v for k, v in STATS.items() if k != (2, 4)}, failed={0: ("oom", "warmup")}
    )
    by = {(t["label"], t["metric"]): t for t in KC.correction_table([mixed], configs, measurements)}
    assert by[("ub 512", "prefill_tps")]["measured_text"] == "oom at warmup: out of memory"
    assert by[("ub 512", "prefill_tps")]["median"] is None and by[("ub 512", "prefill_tps")]["diff_text"] == "–"
    assert (
        "no workload of 512 prompt / 64 generated tokens at 4 request(s)"
        in by[("np 4, 4 users", "aggregate_tps")]["measured_text"]
    )
    empty = KC.correction_table([mixed], configs.iloc[0:0], measurements.iloc[0:0])
    assert all(t["measured_text"].startswith("not measured: no record") for t in empty)


def test_section_markdown_and_html(mixed, real_tables):
    configs, measurements = tables_for(mixed, real_tables, STATS)
    md = KP.section(mixed, configs, measurements)
    assert md.startswith(KP.START_MARKER + "\n### Re-measured: Test table") and md.rstrip().endswith(KP.END_MARKER)
    prose = " ".join(md.split())
    assert "prompt cache off" in prose and "median of n" in prose and "ran 3 times" in prose
    assert "The source measured on a test machine" in prose
    assert "Test CPU; no GPU, llama-server 0.6.0-dev (build 0) (sha256 abababababab…)" in prose
    # one line per published row, as upstream: each claimed number beside the measured one, its range and difference
    # (the brackets escaped: a range is never read as a Markdown link)
    assert (
        "| ub 512 | pp512 tg64 | 1,000.0 | 600.0 \\[580.0–640.0\\] n=3, -40.0% | 50.0 | 52.0 \\[48.0–55.0\\] n=3 ⚠, "
        "+4.0% (within range) | – | – |" in md
    )
    assert "| np 4, 4 users | pp512 tg64, 4 requests at once | 500.0 |" in md and "| 150.0 | 120.0 " in md
    assert "- ub 512 vs ub 128: ubatch (-ub) 512 vs 128" in md
    assert "**Not stated, so not checkable:** ubatch (-ub) (not stated for np 4, 4 users; assumed 512)" in md
    assert "threads (-t) (no row states it; assumed 2)." in md
    # a line of full settings for every measured row
    assert re.search(
        r"^- ub 128: stated ubatch=128; build b5000; assumed ctx=4096, parallel=1, threads=2; "
        r"measured with `[^`]*-ub 128",
        md,
        re.M,
    )
    widths = {line.count(" | ") for line in md.splitlines() if line.startswith("| ")}
    assert len(widths) == 1  # every table row has as many cells as its header
    html = KP.section(mixed, configs, measurements, fmt="html")
    assert html.startswith('<section class="correction"') and "<table>" in html and "{{" not in html
    assert "&lt;!-- crashline:correction:start --&gt;" in html  # the Markdown to send, escaped
    # the report's own table has the upstream section's layout: claimed beside measured, a line of settings per row
    visible = html[: html.index("<details")]
    assert "prefill t/s: claimed</th>" in visible and "decode t/s: measured here, median [min–max] n</th>" in visible
    assert "<li>ub 128: stated ubatch=128; build b5000; assumed ctx=4096, parallel=1, threads=2; measured" in visible


def test_section_escapes_labels(mixed, real_tables):
    claim = copy.deepcopy(mixed)
    claim["rows"][0]["label"] = "<b>ub|512</b>"
    configs, measurements = tables_for(claim, real_tables, STATS)
    md = KP.section(claim, configs, measurements)
    assert "| &lt;b&gt;ub\\|512&lt;/b&gt; | pp512 tg64 |" in md  # no cell split by a pipe, no tag upstream
    html = KP.section(claim, configs, measurements, fmt="html")
    assert "<td>&lt;b&gt;ub|512&lt;/b&gt;</td>" in html and "<b>ub|512</b>" not in html


def test_changes_between_rows_and_untrustworthy_numbers(mixed, real_tables):
    configs, measurements = tables_for(mixed, real_tables, STATS)
    measurements.loc[measurements["config_id"] == mixed["rows"][1]["id"], "cpu_other_cores"] = 1.2
    table = KC.correction_table([mixed], configs, measurements)
    by = {(t["label"], t["metric"]): t for t in table}
    assert by[("ub 512", "decode_tps")]["warnings"] == {"spread_pct": pytest.approx(7 / 52 * 100)}
    assert by[("ub 512", "decode_tps")]["measured_text"].endswith(" ⚠")
    assert by[("ub 128", "prefill_tps")]["warnings"] == {"other_cores": 1.2}
    assert by[("ub 512", "prefill_tps")]["warnings"] == {}
    pairs = {(p["a"], p["b"]): p for p in KC.pair_changes(table, KC.comparability(mixed["rows"]))}
    ub = {c["metric"]: c for c in pairs[("ub 512", "ub 128")]["changes"]}
    # the table: ub 128 decodes 10% faster; measured here while other processes used 1.2 cores: no change is drawn
    # (#41; it said 17% faster, ranges apart)
    assert ub["decode_tps"]["claimed_pct"] == pytest.approx(10.0)
    assert ub["decode_tps"]["inconclusive"] and ub["decode_tps"]["measured_pct"] is None
    busy = by[("ub 128", "prefill_tps")]
    assert busy["diff_pct"] is None and busy["diff_text"].startswith("inconclusive: other processes used 1.2 ")
    assert [c["metric"] for c in pairs[("ub 512", "np 4, 4 users")]["changes"]] == [
        "prefill_tps"
    ]  # shared metrics only
    md = " ".join(KP.section(mixed, configs, measurements).split())
    assert (
        "- ub 512 vs ub 128: ubatch (-ub) 512 vs 128. From the first to the second, the table says prefill t/s "
        "per request -20.0%, decode t/s per request +10.0%; measured here, with one build on one machine: "
        "prefill t/s per request inconclusive (other processes competed: rerun on a quiet machine), decode t/s per "
        "request inconclusive (other processes competed: rerun on a quiet machine)." in md
    )
    assert (
        "⚠ Repeat these before trusting them: the range is wider than 10% of the median for ub 512, decode (13%); "
        "np 4, 4 users, aggregate (12%). Other processes used up to 1.2 CPU cores during 2 of the 6 measurements"
    ) in md


def test_a_claims_workload_is_never_the_objective_unless_named(tmp_path):
    """A claims row at 100K tokens became every configuration's objective (the longest workload), so the user's own
    runs were judged at a depth they never asked about, and the report recommended nothing (issue #26)."""

    def long_rows(c):
        c["workload"] = {"prompt_tokens": 100_000, "gen_tokens": 16}

    raw = {
        "models": {"m": {"source": "file:/x.gguf"}},
        "configurations": [{"grid": {"ubatch": [128, 512]}}, {"settings": {"parallel": 4, "ctx": 131072}}],
        "workloads": [{"name": "short", "prompt_tokens": 128, "gen_tokens": 16}],
        "claims": [str(write_claims(tmp_path, long_rows))],
    }
    cfg = C.validate(raw, SCHEMA)
    assert any(w["prompt_tokens"] == 100_000 for w in cfg["workloads"])  # the rows' workload still runs
    assert C.objective_workload(cfg) == "short"
    named = C.validate({**raw, "objective": {"workload": K.workload_name(cfg["workloads"][-1])}}, SCHEMA)
    assert C.objective_workload(named) == K.workload_name(cfg["workloads"][-1])


def test_markdown_escaping_filter():
    from crashline.report.templates import md

    assert md("a|b `c` *d* _e_ <script>&") == "a\\|b \\`c\\` \\*d\\* \\_e\\_ &lt;script&gt;&amp;"
    assert md("[x](javascript:y)\nz") == "\\[x\\](javascript:y) z"


def test_a_claims_file_may_name_its_own_template(tmp_path, real_tables):
    def own(c):
        c["template"] = "ours.md.j2"

    path = write_claims(tmp_path, own)
    (tmp_path / "ours.md.j2").write_text(
        "{{ heading }} Our numbers\n\n{% for row in rows %}* {{ row.label | md }}: "
        "{{ row.cells.prefill_tps.claimed }} claimed, {{ row.cells.prefill_tps.measured | md }}\n{% endfor %}"
    )
    claim = K.load_claims([path], run_config())[0]
    configs, measurements = tables_for(claim, real_tables, STATS)
    md = KP.section(claim, configs, measurements)
    assert md.startswith(
        KP.START_MARKER + "\n### Our numbers\n\n* ub 512: 1,000.0 claimed, 600.0 \\[580.0–640.0\\] n=3"
    )
    assert "Generated by crashline" in md and md.rstrip().endswith(KP.END_MARKER)  # the markers and footer stay

    (tmp_path / "ours.md.j2").unlink()
    with pytest.raises(K.ClaimsError, match="key template = 'ours.md.j2': no file"):
        K.load_claims([path], run_config())


@pytest.mark.parametrize(
    "text, expected",
    [
        ('{% include "/etc/passwd" %}', "reads no other file (/etc/passwd)"),  # no file outside the template
        ("{{ title.__class__.__mro__ }}", "__class__"),  # no Python internals
        ("{{ rows[0].no_such_key }}", "no_such_key"),  # a misspelt name is an error, never an empty cell
        ("{% for r in rows %}", "line 1"),
    ],
)
def test_a_users_template_runs_in_a_sandbox(tmp_path, real_tables, text, expected):
    from crashline.report.templates import TemplateError

    def own(c):
        c["template"] = "hostile.md.j2"

    path = write_claims(tmp_path, own)
    (tmp_path / "hostile.md.j2").write_text(text)
    claim = K.load_claims([path], run_config())[0]
    configs, measurements = tables_for(claim, real_tables, STATS)
    with pytest.raises(TemplateError, match=re.escape(expected)):
        KP.section(claim, configs, measurements)


def test_a_long_inconclusive_difference_wraps_under_its_number_in_the_html_table(mixed, real_tables):
    """The default run's report on a busy machine: "inconclusive: other processes used 0.9 of 2 cores …" beside a
    measured number in a right-aligned cell that never wraps made the correction table 2,313 px wide in Chromium
    (test_workflow_e2e); the difference goes under the number, small, where it wraps between words."""
    configs, measurements = tables_for(mixed, real_tables, STATS)
    measurements.loc[measurements["config_id"] == mixed["rows"][1]["id"], "cpu_other_cores"] = 1.2
    html = KP.section(mixed, configs, measurements, fmt="html")
    cells = [c for c in re.findall(r"<td class=\"num\">(.*?)</td>", html) if "<span>inconclusive:</span>" in c]
    assert cells
    for cell in cells:
        assert re.fullmatch(r"[^<]+,<br><small>(<span>[^<]+</span> )+<span>[^<]+</span></small>", cell), cell
    md = KP.section(mixed, configs, measurements)
    assert "n=3 ⚠, inconclusive: other processes used 1.2 of " in md  # upstream's Markdown: one line, as before


def test_rows_whose_notes_say_they_failed_are_checked_for_survival_with_the_margin(tmp_path, real_tables):
    # the notes column of a hand-made table, as import reads it: "crawled, then OOM" asks for a survival check
    from crashline.config import claims_import as CI

    (tmp_path / "README.md").write_text(
        "## Speed\n\n| -ub | PP512 (t/s) | TG128 (t/s) | Notes |\n|---|---|---|---|\n"
        "| 512 | 100.5 | 10.2 | picked |\n| 2048 | 150.0 | 3.1 | crawled, then OOM |\n"
    )
    CI.import_claims(str(tmp_path / "README.md"), tmp_path / "theirs.yaml", model="m")
    imported = K.load_claims([tmp_path / "theirs.yaml"], run_config())[0]
    assert [(r["label"], r["says_failed"]) for r in imported["rows"] if r["says_failed"]] == [
        ("-ub 2048, pp512", True),
        ("-ub 2048, tg128", True),
    ]

    def noted(raw):
        raw["rows"][0]["note"] = "crawled at 2 t/s"
        raw["rows"][1]["note"] = "crashed (out of memory) with 2 slots"
        raw["rows"][2]["note"] = "the one we picked"

    claim = K.load_claims([write_claims(tmp_path, noted)], run_config())[0]
    assert claim["margin_mib"] == 1024 and [r["says_failed"] for r in claim["rows"]] == [True, True, False]

    def checked(headroom: float, host: float | None = None) -> dict:
        configs, measurements = tables_for(claim, real_tables, STATS, failed={1: ("oom", "load")})
        configs["headroom_mib"], configs["host_headroom_mib"] = headroom, host
        return {s["label"]: s for s in KC.survival(claim, configs, measurements)}, configs, measurements

    roomy, configs, measurements = checked(1524.0)
    assert set(roomy) == {"ub 512", "ub 128"}  # "the one we picked" asks for nothing
    assert roomy["ub 512"]["survived"] is True
    assert (
        roomy["ub 512"]["text"]
        == "survived at the claimed settings with the 1,024 MiB margin (1,524 MiB VRAM headroom)"
    )
    assert roomy["ub 128"]["survived"] is False
    assert roomy["ub 128"]["text"] == "did not survive at the claimed settings: oom at load: out of memory"
    tight = checked(100.0)[0]["ub 512"]
    assert tight["survived"] is False and "100 MiB VRAM headroom, less than the 1,024 MiB margin" in tight["text"]
    host = checked(float("nan"), 300.0)[0]["ub 512"]  # no GPU: the host budget's headroom, checked the same way
    assert host["survived"] is False and "300 MiB host memory headroom" in host["text"]
    unmeasured = checked(float("nan"), float("nan"))[0]["ub 512"]
    assert unmeasured["survived"] is None and "no memory budget was measured" in unmeasured["text"]
    measurements.loc[measurements["config_id"] == claim["rows"][0]["id"], "workload_outcome"] = "server_crashed"
    own = {s["label"]: s for s in KC.survival(claim, configs, measurements)}["ub 512"]
    assert own["survived"] is False and own["text"].startswith("survived the config's workloads, but not its own")
    # in the section sent upstream and in the report's part
    md = " ".join(KP.section(claim, configs, measurements).split())
    assert "**Rows the table says crawled or crashed, re-measured for survival.**" in md
    assert (
        "- ub 128 (the table notes: crashed (out of memory) with 2 slots): did not survive at the claimed settings: "
        "oom at load: out of memory." in md
    )
    assert "the one we picked):" not in md
    from crashline.report import html

    report = html.block(KP.build(claim, configs, measurements))
    assert "did not survive at the claimed settings: oom at load: out of memory." in report
