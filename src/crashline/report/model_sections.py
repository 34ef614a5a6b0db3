"""One model's section of the report, laid out from what ``report.build`` worked out for it: the
recommendation and why the others lost, the results, llama.cpp's own choice (``--fit on``), the planner and its
what-if, the crash line, what limits decode, cold versus warm, conversations, soaks, the llama-bench cross-check
and the failures."""

from __future__ import annotations

from ..core.thresholds import CONTENTION_CORES, missing
from .doc import Box, Bullets, Cell, Code, CodeBlock, Details, Mark, Para, Ref, Section, Strong, Table
from .doc import code_spans, plural
from .compact import compacted, settings_cell
from .serving_sections import cold_warm, conversations, soaks


def standing(tie: str | None) -> str:
    """Where the recommendation stands, as the report and ``tune`` both say it: tied (``tie``: why the tie went
    its way, ``recommend``) or not."""
    return "tied for the fastest" if tie else "the fastest"


def or_blank(value) -> str:
    return "" if missing(value) else value


def or_dash(value) -> str:
    return "–" if missing(value) else value


# -- per model -----------------------------------------------------------------------------------


def model_section(m: dict, ctx: dict) -> Section:
    blocks = [
        *(recommendation(r) for r in m["recommendations"]),
        *m.get("figures", []),
        *common_settings(m["common_args"]),
        results(m["rows"]),
        *tradeoff(m["tradeoff"]),
        *fit(m),
        *(b for s in m["searches"] for b in planner(s)),
        *crash_line(m["crash_lines"]),
        *limits(m["limits"], ctx),
        *cold_warm(m["cold_warm"]),
        *conversations(m["conversations"]),
        *soaks(m.get("soaks") or []),
        *validity(m.get("validity")),
        *failures(m["failures"]),
    ]
    return Section(m["title"], blocks, anchor=m["anchor"])


def recommendation(r: dict):
    """The answer first (the settings that set the winner apart), its speed and memory, the whole command to
    copy, its id; then why each other configuration lost."""
    if not r["winner"]:
        why = r.get("no_winner") or "no configuration survived every workload"
        return Para([Strong(f"No recommendation: {why}"), "."], "fail")
    rivals = [x for use in r.get("or_use") or [] for x in (" or ", Code(use))]  # inconclusive against it
    answer = Para([Strong(["Use ", Code(r["use"]), *rivals])], "answer")
    said = [
        f"{r['metric_label'].capitalize()} {r['winner_speed']:.1f} t/s, {standing(r.get('tie'))} by "
        f"{r.get('objective_text') or r['workload']} among the configurations that survived every workload "
        "with the margin",
        f"; {r['memory']}." if r.get("memory") else ".",
        *([f" {whole}"] if (whole := request_text(r.get("winner_measured") or {})) else []),
    ]
    blocks = [answer, Para(said), CodeBlock(r["command"], copy=True), Para(["Configuration id ", Code(r["winner"])])]
    if r.get("inconclusive"):
        blocks.insert(1, Para([Strong(r["inconclusive"][0].upper() + r["inconclusive"][1:]), "."], "fail"))
    if r.get("reply_length"):
        blocks.insert(2, Para(code_spans(r["reply_length"]["text"] + ".")))
    if r.get("tie"):
        blocks.insert(
            2,
            Para(
                [
                    *code_spans(r["tie"][0].upper() + r["tie"][1:]),
                    ". Two configurations are tied when neither range lies above the other (the medians of their "
                    "server starts where the fastest had several: then only those started as often count).",
                ]
            ),
        )
    if r["others"]:
        blocks += [
            Para("Why the others lost (each named by how its settings differ from the recommendation):"),
            Bullets([_lost(o) for o in r["others"]]),
        ]
    return Box(blocks, "winner")


def request_text(measured: dict) -> str | None:
    """What one request at the objective's workload was like: prefill, the first token, decode (medians)."""
    parts = [
        f"prefill {v:,.1f} t/s" if (v := measured.get("prefill_tps_median")) else None,
        f"first token after {v:.2f} s" if (v := measured.get("ttft_s_median")) is not None else None,
        f"decode {v:,.1f} t/s" if (v := measured.get("decode_tps_median")) else None,
    ]
    parts = [p for p in parts if p]
    return f"Per request: {', '.join(parts)}." if parts else None


def _lost(o: dict) -> list:
    return [
        Code(o["label"]),
        " ",
        Ref(o["config_id"]),
        " — ",
        Mark("fail", o["reason"]) if o["failed"] and not o.get("risky") else o["reason"],
    ]


def common_settings(common: str) -> list:
    if not common:
        return []
    return [Para([Strong("Settings of every configuration below"), ": ", Code(common)])]


RESULT_HEADER = [
    "config",
    "settings that differ",
    "workload",
    "outcome",
    "requests at once",
    "slots",
    "prefill t/s per request",
    "decode t/s per request",
    "draft tokens accepted",
    "aggregate generated t/s (all requests, end to end)",
    "time to first token s",
    "CPU cores server / others",
    "peak RSS MiB (workload)",
    "peak VRAM MiB (load)",
    "peak VRAM MiB (workload)",
    "load s",
]
RESULT_KEYS = (
    "workload",
    None,
    "concurrency",
    "slots",
    "prefill",
    "decode",
    "draft",
    "aggregate",
    "ttft",
    "cpu",
    "rss",
    "load_vram",
    "vram",
    "load_s",
)


def results(rows: list[dict]) -> list:
    """One row per configuration x workload."""
    out = []
    for row in rows:
        outcome = Cell(row["outcome"], None if row["outcome"] == "ok" else "fail")
        cells = [row[k] if k else outcome for k in RESULT_KEYS]
        out.append([[Code(row["config_id"]), " ★" if row["recommended"] else ""], settings_cell(row), *cells])
    marks = ["rec" if row["recommended"] else None for row in rows]
    return compacted(RESULT_HEADER, out, frozenset({0, 1, 2, 3, 7}), frozenset({4, *range(6, 16)}), marks)


def tradeoff(rows: list[dict]) -> list:
    """Per request against aggregate for the workloads that ran several requests at once: what each slot count
    gives one user and all of them; ★ the recommendation, ◆ the best trade-offs (nothing beats them on both)."""
    if not rows:
        return []
    lead = [
        Strong("Per request against all requests together"),
        " (medians; ◆ no other eligible configuration is faster on both; ★ recommended; "
        "✗ not eligible: it failed the margin, recall or a workload):",
    ]
    header = ["config", "settings that differ", "workload", "requests at once", "-np", "decode t/s per request"]
    header += ["aggregate t/s (end to end)", "time to first token s", ""]
    table = [
        [
            Code(t["config_id"]),
            settings_cell(t),
            t["workload"],
            t["concurrency"],
            or_dash(t["parallel"]),
            _num(t["decode_tps_median"], 1),
            _num(t["aggregate_tps_median"], 1),
            _num(t["ttft_s_median"], 3),
            ("★" if t["winner"] else "") + ("◆" if t["frontier"] else "") + ("" if t["eligible"] else "✗"),
        ]
        for t in rows
    ]
    return [Para(lead), Table(header, table, frozenset({3, 4, 5, 6, 7}))]


def _num(value, digits: int) -> str:
    return "–" if missing(value) else f"{value:,.{digits}f}"


def fit(m: dict) -> list:
    """llama.cpp's own placement (--fit on) beside the recommendation: each fit run (named by what sets it apart
    from the others), crashline's pick once per machine, the ratio to each, and the fit runs against each other."""
    if not m["fit"]:
        return []
    metric = m["recommendations"][0]["metric_label"] if m["recommendations"] else "decode"
    lead = [Strong("llama.cpp's own choice"), " (", Code("--fit on"), ", same context and ubatch) beside the "]
    lead.append(f"recommendation ({metric} t/s at the objective workload):")
    rows, marks, shown = [], [], set()
    for f in m["fit"]:
        rows.append(_placement(Code(f["label"]), f["fit"]))
        marks.append(None)
    for f in m["fit"]:
        if f["recommended"] and f["recommended"]["config_id"] not in shown:
            shown.add(f["recommended"]["config_id"])
            rows.append(_placement("crashline", f["recommended"]))
            marks.append("rec")
    header = [
        "placement",
        "config",
        "outcome",
        "t/s",
        "CUDA0 weights MiB",
        "peak VRAM MiB",
        "% of limit",
        "headroom MiB",
    ]
    said = []
    for f in m["fit"]:
        if f["is_fit"]:
            said.append(Para([Code(f["label"]), " is the recommendation: llama.cpp's own placement was the fastest."]))
        elif f["ratio"] is not None:
            said.append(
                Para(
                    [
                        "crashline's recommendation runs at ",
                        Strong(f"{f['ratio']:.2f}×"),
                        f" the {metric} t/s of ",
                        Code(f["label"]),
                        f" at the objective workload{fit_starts(f)}, with {f['recommended']['headroom']} MiB of "
                        f"headroom against its {f['fit']['headroom']}"
                        + (
                            f", under the {f['under_margin']:,} MiB margin, so it could not be the recommendation."
                            if f["under_margin"]
                            else "."
                        ),
                    ]
                )
            )
        elif f["recommended"]:
            outcome = f["fit"]["outcome"]
            said.append(Para([Code(f["label"]), f" did not survive ({outcome}): the recommendation stands."]))
    said += [
        Para(
            [
                Code(f["label"]),
                " was aimed at the margin, its ",
                Code("--fit-target"),
                f" raised after each start that left less than the margin: {f['aimed']}.",
            ]
        )
        for f in m["fit"]
        if f["aimed"]
    ]
    said += _fits_apart(m["fit"], metric)
    return [Para(lead), Table(header, rows, frozenset(range(3, 8)), marks), *said]


def fit_starts(f: dict) -> str:
    """How a fit run stands against the recommendation by the spread between starts: tied, or measured in one
    start (which cannot tie a configuration started several times); nothing where it is apart, or under the margin
    (out whatever its starts)."""
    if f.get("under_margin"):
        return ""
    if f.get("tied"):
        return f" (tied: its {f['starts']} server starts and the recommendation's cannot be told apart)"
    return " (in one server start)" if f.get("starts", 1) < 2 else ""


def _fits_apart(fits: list[dict], metric: str) -> list:
    """Where several fit runs survived, each against the fastest of them: what the settings that set them apart
    (the host prompt cache, a KV cache type) cost with llama.cpp's own placement."""
    timed = [f for f in fits if f["speed"]]
    if len(timed) < 2:
        return []
    best = max(timed, key=lambda f: f["speed"])
    text = [f"Between llama.cpp's own placements, {metric} t/s at the objective workload: ", Code(best["label"])]
    text.append(f" {best['speed']:,.1f}")
    for f in timed:
        if f is not best:
            text += ["; ", Code(f["label"]), f" {f['speed']:,.1f} ({f['speed'] / best['speed']:.2f}×)"]
    return [Para([*text, "."])]


def _placement(name, p: dict) -> list:
    return [
        name,
        Code(p["config_id"]),
        p["outcome"],
        p["speed"],
        p["gpu_weights"],
        p["peak"],
        p["peak_pct"],
        p["headroom"],
    ]


def planner(s: dict) -> list:
    """A search: the arithmetic, every value as runs of equal status, the per-value table folded away."""
    text = [Strong("Planner"), " (", Code("--n-cpu-moe"), f" searched in {s['range']} for the settings above"]
    text.append(f"): {plural(s['server_starts'], 'server start')}. ")
    if s.get("full_residency"):
        text.append(
            f"Everything on the GPU: {s['full_residency']}. "
            f"Predicted lowest that fits: n_cpu_moe {s['predicted_lowest']} ({s['arithmetic']}). "
        )
    order = ", ".join(str(p["n_cpu_moe"]) for p in s["probes"])
    boundary = s["boundary"] if s["boundary"] is not None else "none in the range"
    use = s["recommended_n_cpu_moe"] if s["recommended_n_cpu_moe"] is not None else "– (none)"
    text.append(
        f"Probed in this order: {order}. Boundary: {boundary}; with the {s['margin_mib']} MiB margin, "
        f"use n_cpu_moe {use}."
    )
    rows = [[v["n_cpu_moe"], f"{v['predicted_mib']:,.0f}", v["status"]] for v in s["value_rows"]]
    table = Table(["n_cpu_moe", "predicted MiB", "status"], rows, frozenset({0, 1}))
    blocks = [Para(text), Bullets(s["ranges"])]
    blocks += [Para(t) for t in (s.get("partial_text"), s.get("climb"), s.get("finalists_text")) if t]
    blocks.append(Details(f"every value of {s['range']}", [table]))
    return blocks + what_if(s.get("what_if"))


def what_if(w: dict | None) -> list:
    """The predicted lowest safe n_cpu_moe on other cards and at other contexts, from this search's calibration."""
    if not w:
        return []
    ctxs = w["ctxs"]
    by = {(r["card"], r["ctx"]): r for r in w["rows"]}
    rows = []
    for card in w["cards"]:
        cells = []
        for ctx in ctxs:
            r = by.get((card["card"], ctx))
            cells.append("–" if r is None else (f"{r['n_cpu_moe']}" if r["n_cpu_moe"] is not None else r["status"]))
        rows.append([f"{card['card']} ({card['vram_mib']:,} MiB)", *cells])
    lead = [
        Strong("What if"),
        f" (a prediction from this search's calibration, not measured; -ub {w['ubatches'][0]}, "
        f"{w['margin_mib']:,} MiB margin): the lowest ",
        Code("--n-cpu-moe"),
        " predicted to fit each card and context.",
    ]
    header = ["card", *(f"ctx {c:,}" for c in ctxs)]
    return [Para(lead), Table(header, rows, frozenset(range(1, len(header)))), Bullets(w["assumptions"])]


def crash_line(lines: list[dict]) -> list:
    if not lines:
        return []
    lead = [Strong("Crash line"), " (lowest ", Code("--n-cpu-moe"), " per combination of the other settings):"]
    return [Para(lead), Bullets([Mark("risky", e["sentence"]) if e["risky"] else e["sentence"] for e in lines])]


def limits(rows: list[dict], ctx: dict) -> list:
    """The verdict first with the suspects that decide it; every suspect's measurement folded away."""
    if not rows:
        return []
    lead = [
        Strong("What limits decode"),
        " at workload ",
        Code(ctx["objective_workload"]),
        ", measured during steady decode (after the first tokens). The bound is the decode speed if each device "
        "only had to stream the bytes it reads per token (the weights the server's log shows it holding, the "
        "active experts, the KV cache at this depth) at its memory bandwidth, one device after the other.",
        *([" ", ctx["bandwidth"]] if ctx.get("bandwidth") else []),
    ]
    header = ["config", "settings that differ", "verdict", "deciding suspects", "decode t/s", "bound t/s", "of bound"]
    table = [
        [Code(r["config_id"]), settings_cell(r), r["verdict"], r["deciding"], r["decode"], r["bound"], r["ratio"]]
        for r in rows
    ]
    every = [[Code(r["config_id"]), *r["cells"]] for r in rows]
    suspects = compacted(["config", *ctx["suspect_columns"]], every, frozenset({0}), frozenset())
    blocks = [Para(lead), *compacted(header, table, frozenset({0, 1, 2}), frozenset({4, 5, 6}))]
    if len(suspects[-1].header) > 1:
        summary = "every suspect: measured value (share of its limit, per generated token): verdict"
        blocks.append(Details(summary, suspects))
    return blocks


def validity(v: dict | None) -> list:
    """llama-bench beside crashline: per workload the two speeds and their ratio, ⚠ past the tolerance."""
    if not v or not (v["rows"] or v["message"]):
        return []
    lead = Para(
        [
            Strong("Cross-check with llama-bench"),
            f" (crashline's median / llama-bench's mean, t/s, and their ratio; ⚠ further than "
            f"{v['tolerance']:.0%} from 1). llama-bench times the engine alone: no HTTP, no sampling, a context "
            "of exactly its test's tokens. crashline reports the server's own timings of each request, what a "
            "client of llama-server gets; where they differ on a quiet machine, that gap is the server's. Where other "
            f"processes used more than {CONTENTION_CORES} cores beside either side (the cores they used are in the "
            "last column), the row says which side was disturbed and concludes nothing.",
        ]
    )
    if v["message"]:
        return [lead, Para(v["message"], "warn")]
    header = ["config", "llama-server settings", "workload", "prefill", "decode", "not in llama-bench", "others' cores"]
    table = []
    for r in v["rows"]:
        if "error" in r:
            table.append([Code(r["config_id"]), Code(r["server_args"]), Cell(r["error"], "fail"), "", "", "", ""])
            continue
        cells = [
            Cell(text + (" ⚠" if flagged else ""), "warn" if flagged else None) for text, flagged in r["cells"].values()
        ]
        others, busy = r.get("others", ("–", False))
        row = [Code(r["config_id"]), Code(r["server_args"]), r["workload"], *cells, r["left_out"]]
        table.append([*row, Cell(others, "warn" if busy else None)])
    commands = "\n".join(dict.fromkeys(r["command"] for r in v["rows"] if "command" in r))
    shown = compacted(header, table, frozenset({2, 3, 4, 6}), frozenset({3, 4}))
    return [lead, *shown, Details("llama-bench commands (decode tests)", commands)]


TEXTS = ("failure", "phase", "message")


def failures(rows: list[dict]) -> list:
    """Each failure: outcome, kind, phase, message; its log tail folded away below the table."""
    if not rows:
        return []
    table = [
        [Code(f["config_id"]), settings_cell(f), Cell(f["outcome"], "fail"), *(or_blank(f[k]) for k in TEXTS)]
        for f in rows
    ]
    header = ["config", "settings that differ", "outcome", "failure", "phase", "message"]
    tails = [Details(f"log tail of {f['config_id']}", f["log_tail"]) for f in rows if or_blank(f.get("log_tail"))]
    return [Para(Strong("Failures")), Table(header, table), *tails]
