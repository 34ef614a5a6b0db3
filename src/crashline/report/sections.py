"""The report's sections, laid out once from what ``crashline.report`` worked out: the failures at the
top, the environment, per model the recommendation, why the others lost, the results, llama.cpp's own
choice, the planner, the crash line, what limits decode, cold versus warm and the failures; then
the needle recall grid and the corrections of published tables."""

from __future__ import annotations

from ..core.progress import duration
from ..core.thresholds import CONTENTION_CORES, HIGH_SPREAD_PCT, missing
from . import needle
from .doc import Abbr, Box, Bullets, Cell, Code, CodeBlock, Details, Document, Mark, Para, Ref, Section, Strong, Table
from .doc import joined, plural
from .compact import constant_columns

TITLE = "crashline report"


def _or_blank(value) -> str:
    return "" if missing(value) else value


def _or_dash(value) -> str:
    return "–" if missing(value) else value


def document(ctx: dict, needle_grid: list[dict], corrections: Section | None) -> Document:
    """The whole report."""
    blocks = [
        *top(ctx["nothing_survived"]),
        *recheck(ctx.get("recheck")),
        *(Para([Strong(f"{model}: "), why, "."], "warn") for model, why in ctx["recall_uninformative"].items()),
        *intro(ctx),
        *summary(ctx.get("summary")),
        environment(ctx),
        *(model_section(m, ctx) for m in ctx["per_model"]),
        needle.section(needle_grid),
        corrections,
    ]
    return Document(TITLE, [b for b in blocks if b is not None])


# -- before the environment ----------------------------------------------------------------------


def top(lost: dict) -> list:
    """When nothing survived: the common cause (with the binary's provenance), and per model how each
    configuration failed."""
    blocks = []
    if lost["common"]:
        blocks += [
            Para(Strong(lost["common"]), "fail"),
            Para("The llama-server:"),
            Bullets([[f["label"], ": ", Code(f["value"])] for f in lost["server"]]),
        ]
        if lost["check"]:
            blocks += [Para("Its check:"), CodeBlock(lost["check"])]
    for m in lost["models"]:
        blocks.append(Para(Strong(m["title"] + "."), "fail"))
        if m["failures"]:
            blocks.append(Bullets([_failed(f) for f in m["failures"]]))
    return blocks


def summary(blocks: list[dict] | None) -> list:
    """The answers first: per model every configuration at the workload that decides, best first, ★ the
    recommendation (``build.summary``); the sections below say why."""
    out = []
    for b in blocks or []:
        table = [
            [
                Cell([f"{'★ ' if r['winner'] else ''}", Code(r["config_id"])], "winner" if r["winner"] else None),
                Code(r["differs"]),
                Cell(r["outcome"], None if r["outcome"] == "ok" else "fail"),
                r["prefill"],
                r["decode"],
                r["e2e"],
                r["peak"],
            ]
            for r in b["rows"]
        ]
        header = [
            "config",
            "settings that differ",
            "outcome",
            "prefill t/s",
            "decode t/s",
            "end to end t/s",
            b["memory"],
        ]
        out += [Para(Strong(b["title"] + ":")), Table(header, table, numeric=frozenset({3, 4, 5, 6}))]
    return out


def recheck(found: dict | None) -> list:
    """The earlier run set beside this one (``recheck.against``): the headline first (which configurations the new
    build broke or slowed), then per configuration then and now."""
    if not found or not found["rows"]:
        return []
    rows = found["rows"]
    regressed = any(r["verdict"] in ("fails now", "slower") for r in rows)

    def first(value) -> str:
        return "no answer" if value is None else f"{value:.2f} s"

    def speed(value) -> str:
        return "–" if value is None else f"{value:,.1f}"

    def change(value) -> str:
        return "–" if value is None else f"{value:+,.0f}"

    table = [
        [
            Code(r["config_id"]),
            Code(r["server_args"] or ""),
            r["failed_then"] or "survived",
            Cell(r["failed_now"] or "survived", "fail" if r["failed_now"] else None),
            f"{first(r['first_request_s_then'])} → {first(r['first_request_s_now'])}",
            f"{speed(r['median_then'])} → {speed(r['median_now'])}",
            "–" if r["ratio"] is None else f"{r['ratio']:.2f}x",
            change(r["peak_gpu_mib_change"]),
            change(r["peak_rss_mib_change"]),
            Cell(r["verdict"], "fail" if r["verdict"] in ("fails now", "slower") else None),
        ]
        for r in rows
    ]
    metric, workload = rows[0]["metric"], rows[0]["workload"]
    header = [
        "config",
        "llama-server settings",
        "earlier run",
        "this run",
        "first request after /health",
        f"{metric} at {workload}, then → now",
        "now / then",
        "peak VRAM MiB change",
        "peak RSS MiB change",
        "verdict",
    ]
    lead = [
        Strong("Recheck"),
        " against ",
        Code(found["against"]),
        ": each configuration measured in both runs, the earlier build's figures beside this one's (tied: their "
        "ranges overlap, as the recommendation judges noise; cannot tell: a side measured it once).",
    ]
    return [Para(Strong(found["headline"]), "fail" if regressed else "ok"), Para(lead), Table(header, table)]


def _failed(f: dict) -> list:
    return [Code(f["server_args"]), " ", Ref(f["config_id"]), " — ", f["reason"]]


def intro(ctx: dict) -> list[Para]:
    models = len(ctx["models"])
    made = (
        f"Generated {ctx['generated']} from {plural(ctx['n_configs'], 'configuration')} of {plural(models, 'model')}. "
        f"Every speed is the median of the repetitions with its range and count (⚠: the range is wider than "
        f"{HIGH_SPREAD_PCT:.0f}% of the median; repeat before trusting it); every row carries the llama-server "
        "arguments it was measured with."
    )
    speeds = (
        "Speeds per request come from the server's own timings of each request; with several requests at once, the "
        'aggregate is every generated token over the wall-clock time of the whole batch. "CPU cores" is what the '
        f"server / every other process used during the workload (⚠: others used more than {CONTENTION_CORES} cores, "
        "so the machine was shared and the speeds are not the configuration's alone)."
    )
    return [Para(made), Para(speeds)]


# -- environment ---------------------------------------------------------------------------------


def _server_line(server: dict) -> list:
    sha = server.get("sha256") or ""
    line = [
        Strong("llama-server"),
        f": {server.get('version')} ({server.get('backend')}; {server.get('obtained')}; sha256 ",
        Code(sha[:16] + "…"),
        ")",
    ]
    if server.get("build_flags"):
        line += ["; build flags ", Code(" ".join(server["build_flags"]))]
    return line


def cost_text(c: dict | None) -> str | None:
    """The cost in one sentence, as the report's environment section and ``tune`` say it."""
    if not c:
        return None
    text = (
        f"{c['server_starts']:,} llama-server starts ({c['measurements']:,} measurements"
        + (f", {c['calibrations']:,} search calibrations" if c.get("calibrations") else "")
        + (f", {c['restarts']:,} further starts (finalists again, restart cases)" if c["restarts"] else "")
        + (f", {c['recall_starts']:,} recall checks" if c["recall_starts"] else "")
        + f"); measurements {duration(c['measure_s'])}, of which {duration(c['serving_s'])} starting servers and "
        + (
            f"serving requests (job time / that: {c['overhead_ratio']:.2f}; the rest is crashline's setup, lock waits, "
            "stopping, telemetry and analysis)"
            if c["overhead_ratio"] is not None
            else "serving requests (no server served one)"
        )
    )
    if c.get("grid_starts"):
        text += (
            f"; the searches took {c['search_starts']:,} of the starts, where every value of their ranges, started "
            f"as often as a finalist, would take {c['grid_starts']:,}"
        )
    if c["recall_s"]:
        text += f"; recall checks {duration(c['recall_s'])}"
    if c["gpu_s"]:
        text += f"; a GPU held by measurements {duration(c['gpu_s'])}"
    if c["build_s"]:
        text += f"; the llama-server build took {duration(c['build_s'])}, once per machine ({c['built']})"
    return text


def environment(ctx: dict) -> Section:
    budget = ctx["budget"]
    vram = f"{budget['vram_budget_mib']} MiB (emulated)" if budget.get("vram_budget_mib") else None
    requests = [
        Strong("Requests"),
        ": prompt cache off (",
        Code("cache_prompt: false"),
        "), greedy, ",
        Code("ignore_eos"),
        "; prompts are public-domain prose sized to exact token counts with the server's ",
        Code("/tokenize"),
        "; models read into the page cache before measuring, except configurations with ",
        Code("page_cache: cold"),
        f" (resident at server start: {ctx['residency']})",
    ]
    items = [
        *(
            [
                Strong("Host"),
                f": {e['hosts'] + ', ' if e.get('hosts') else ''}{e['cpu_model']}; ",
                Strong("GPU"),
                f": {e['gpu']}",
            ]
            for e in ctx["environments"]
        ),
        _server_line(ctx["server"]),
        [
            Strong("VRAM budget"),
            f": {vram or 'none (the whole card, or no GPU)'}; margin {budget['margin_mib']} MiB",
        ],
        requests,
        *([[Strong("What this answer cost"), ": ", said]] if (said := cost_text(ctx.get("cost"))) else []),
    ]
    return Section(
        "Environment", [Bullets(items), _workloads(ctx["workloads"]), _models(ctx["models"])], anchor="environment"
    )


def _workloads(workloads: list[dict]) -> Table:
    rows = [[w["workload"], w["prompt_tokens"], w["gen_tokens"], w["repetitions"]] for w in workloads]
    return Table(["workload", "prompt tokens", "generated tokens", "repetitions"], rows, frozenset({1, 2, 3}))


def _models(models: list[dict]) -> Table:
    rows = [
        [
            m["model"],
            Code(m["model_source"]),
            Abbr(Code(_or_dash(m["model_sha256"])[:16] + "…"), _or_dash(m["model_sha256"])),
            _or_dash(m["architecture"]),
            _or_dash(m["quantisation"]),
            m["size"],
        ]
        for m in models
    ]
    return Table(["model", "source", "sha256", "architecture", "quantisation", "size"], rows, frozenset({5}))


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
    answer = Para([Strong(["Use ", Code(r["use"])])], "answer")
    said = [
        f"{r['metric_label'].capitalize()} {r['winner_speed']:.1f} t/s, the best by "
        f"{r.get('objective_text') or r['workload']} among the configurations that survived every workload "
        "with the margin",
        f"; {r['memory']}." if r.get("memory") else ".",
        *([f" {whole}"] if (whole := request_text(r.get("winner_measured") or {})) else []),
    ]
    blocks = [answer, Para(said), CodeBlock(r["command"], copy=True), Para(["Configuration id ", Code(r["winner"])])]
    if r.get("tie"):
        blocks.insert(
            2,
            Para(
                [
                    "Tied: ",
                    r["tie"],
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


def _settings_cell(row: dict) -> list:
    settings = [Code(row["differs"])] if row["differs"] else ["(only the common settings)"]
    if row.get("used"):
        settings += [" ", Mark("warn", f"⚠ llama.cpp used {row['used']}")]
    return settings


def compacted(header: list[str], rows: list[list], keep: frozenset[int], numeric: frozenset[int], marks=None) -> list:
    """A table without its columns that are blank in every row, and those equal in every row said once above it."""
    shown, once = constant_columns(header, rows, keep)
    table = Table(
        [header[i] for i in shown],
        [[r[i] for i in shown] for r in rows],
        frozenset(j for j, i in enumerate(shown) if i in numeric),
        marks,
    )
    if not once:
        return [table]
    said = joined([[f"{name} ", Strong(value)] for name, value in once], "; ")
    return [Para(["Same in every row that has a value: ", *said]), table]


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
    "peak RSS MiB",
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
        out.append([[Code(row["config_id"]), " ★" if row["recommended"] else ""], _settings_cell(row), *cells])
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
            _settings_cell(t),
            t["workload"],
            t["concurrency"],
            _or_dash(t["parallel"]),
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
                        f" at the objective workload, with {f['recommended']['headroom']} MiB of headroom against "
                        f"its {f['fit']['headroom']}"
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
    said += _fits_apart(m["fit"], metric)
    return [Para(lead), Table(header, rows, frozenset(range(3, 8)), marks), *said]


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
    blocks += [Para(t) for t in (s.get("climb"), s.get("finalists_text")) if t]
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
    ]
    header = ["config", "settings that differ", "verdict", "deciding suspects", "decode t/s", "bound t/s", "of bound"]
    table = [
        [Code(r["config_id"]), _settings_cell(r), r["verdict"], r["deciding"], r["decode"], r["bound"], r["ratio"]]
        for r in rows
    ]
    every = [[Code(r["config_id"]), *r["cells"]] for r in rows]
    suspects = compacted(["config", *ctx["suspect_columns"]], every, frozenset({0}), frozenset())
    blocks = [Para(lead), *compacted(header, table, frozenset({0, 1, 2}), frozenset({4, 5, 6}))]
    if len(suspects[-1].header) > 1:
        summary = "every suspect: measured value (share of its limit, per generated token): verdict"
        blocks.append(Details(summary, suspects))
    return blocks


def cold_warm(rows: list[dict]) -> list:
    if not rows:
        return []
    header = [
        "llama-server settings",
        "workload",
        "resident at load cold / warm %",
        "load s cold / warm",
        "prefill t/s cold",
        "prefill t/s warm",
        "decode t/s cold",
        "decode t/s warm",
    ]
    table = [
        [
            Code(r["server_args"]),
            r["workload"],
            f"{r['cold_resident']} / {r['warm_resident']}",
            f"{r['cold_load']} / {r['warm_load']}",
            r["cold_prefill"],
            r["warm_prefill"],
            r["cold_decode"],
            r["warm_decode"],
        ]
        for r in rows
    ]
    lead = Para([Strong("Cold versus warm page cache"), " (never mixed in one figure):"])
    return [lead, Table(header, table, frozenset({4, 5, 6, 7}))]


def conversations(rows: list[dict]) -> list:
    """Each configuration under each conversation workload: survived or where it failed, how far it grew, what the
    cache reused, memory growth per 1,000 tokens of history, and the restart case."""
    if not rows:
        return []
    header = [
        "config",
        "settings that differ",
        "conversation",
        "outcome",
        "turns done",
        "depth reached",
        "reused from the cache",
        "VRAM MiB per 1K tokens",
        "RSS MiB per 1K tokens",
        "RSS MiB per hour (soak)",
        "context checkpoints: made, most held, MiB each",
        "restart: TTFT s, prefill t/s",
    ]
    table = [
        [
            Code(r["config_id"]),
            _settings_cell(r),
            r["shape"],
            Cell(r["outcome_text"], None if r["survived"] else "fail"),
            r["turns"],
            r["depth"],
            r["reused"],
            r["gpu_per_1k"],
            r["rss_per_1k"],
            r["rss_per_hour"],
            r["checkpoints"],
            r["restart"],
        ]
        for r in rows
    ]
    lead = Para(
        [
            Strong("Conversations"),
            " (prompt cache on: each turn resends the whole history with new text, and the server evaluates what "
            "its slot does not hold; a configuration that fails one is not recommended):",
        ]
    )
    return [lead, *compacted(header, table, frozenset({0, 1, 3}), frozenset({4, 5, 6, 7, 8, 9}))]


def soaks(rows: list[dict]) -> list:
    """Each configuration's unique-prompt soak: what ran, the growth per request with its 95% interval, and when
    it reaches a limit at that rate."""
    if not rows:
        return []
    header = [
        "config",
        "settings that differ",
        "soak",
        "RSS MiB per request (95%)",
        "VRAM MiB per request (95%)",
        "prompt cache MiB per request (95%)",
        "what it means",
    ]
    table = [
        [
            Code(r["config_id"]),
            r["differs"],
            r["ran"],
            r["rss"],
            r["gpu"],
            r["cache"],
            Cell(r["said"], None if r["survived"] else "fail"),
        ]
        for r in rows
    ]
    lead = Para(
        [
            Strong("Soak of unique prompts"),
            " (different prompts one after another, the prompt cache on, as agents and chat clients send them; "
            "growth fitted by least squares, and projected to the host budget, else the machine's RAM, and to the "
            "VRAM limit; a configuration that would reach one sooner than soak.must_survive_h is not recommended):",
        ]
    )
    return [lead, Table(header, table)]


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
        [Code(f["config_id"]), _settings_cell(f), Cell(f["outcome"], "fail"), *(_or_blank(f[k]) for k in TEXTS)]
        for f in rows
    ]
    header = ["config", "settings that differ", "outcome", "failure", "phase", "message"]
    tails = [Details(f"log tail of {f['config_id']}", f["log_tail"]) for f in rows if _or_blank(f.get("log_tail"))]
    return [Para(Strong("Failures")), Table(header, table), *tails]
