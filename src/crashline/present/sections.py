"""The report's sections, laid out once from what ``crashline.report`` worked out: the failures at the
top, the environment, per model the recommendation, why the others lost, the results, llama.cpp's own
choice, the planner, the crash line, what limits decode, cold versus warm and the failures; then
the needle recall grid and the corrections of published tables."""

from __future__ import annotations

from ..thresholds import CONTENTION_CORES, HIGH_SPREAD_PCT, missing
from . import needle
from .doc import Abbr, Box, Bullets, Cell, Code, CodeBlock, Details, Document, Mark, Para, Ref, Section, Strong, Table
from .doc import plural

TITLE = "crashline report"


def _or_blank(value) -> str:
    return "" if missing(value) else value


def _or_dash(value) -> str:
    return "–" if missing(value) else value


def document(ctx: dict, needle_grid: list[dict], corrections: Section | None) -> Document:
    """The whole report."""
    blocks = [
        *top(ctx["nothing_survived"]),
        *intro(ctx),
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
        *([Strong("Host"), f": {e['cpu_model']}; ", Strong("GPU"), f": {e['gpu']}"] for e in ctx["environments"]),
        _server_line(ctx["server"]),
        [
            Strong("VRAM budget"),
            f": {vram or 'none (the whole card, or no GPU)'}; margin {budget['margin_mib']} MiB",
        ],
        requests,
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
        *(recommendation(r, ctx["objective_concurrency"]) for r in m["recommendations"]),
        results(m["rows"]),
        *fit(m),
        *(b for s in m["searches"] for b in planner(s)),
        *crash_line(m["crash_lines"]),
        *limits(m["limits"], ctx),
        *cold_warm(m["cold_warm"]),
        *failures(m["failures"]),
    ]
    return Section(m["name"], blocks, anchor=f"model-{m['name']}")


def recommendation(r: dict, concurrency: int):
    """The winner with the command that reproduces it and why each other configuration lost."""
    if not r["winner"]:
        return Para([Strong("No configuration survived every workload"), ", so there is no recommendation."], "fail")
    said = [
        Strong(["Recommended: ", Code(r["winner"])]),
        f" — {r['metric_label']} {r['winner_speed']:.1f} t/s per request at workload ",
        Code(r["workload"]),
        f" ({plural(concurrency, 'request')} at once), the fastest of the configurations that survived every workload.",
    ]
    blocks = [Para(said), CodeBlock(r["command"])]
    if r["others"]:
        blocks += [
            Para("Why the others lost (each named by how its settings differ from the recommendation):"),
            Bullets([_lost(o) for o in r["others"]]),
        ]
    return Box(blocks, "winner")


def _lost(o: dict) -> list:
    return [
        Code(o["label"]),
        " ",
        Ref(o["config_id"]),
        " — ",
        Mark("fail", o["reason"]) if o["failed"] else o["reason"],
    ]


RESULT_HEADER = [
    "config",
    "llama-server settings",
    "workload",
    "outcome",
    "requests at once",
    "slots",
    "prefill t/s per request",
    "decode t/s per request",
    "aggregate generated t/s",
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
    "aggregate",
    "ttft",
    "cpu",
    "rss",
    "load_vram",
    "vram",
    "load_s",
)


def results(rows: list[dict]) -> Table:
    """One row per configuration x workload."""
    out = []
    for row in rows:
        settings = [Code(row["server_args"])]
        if row["used"]:
            settings += [" ", Mark("warn", f"⚠ llama.cpp used {row['used']}")]
        outcome = Cell(row["outcome"], "ok" if row["outcome"] == "ok" else "fail")
        cells = [row[k] if k else outcome for k in RESULT_KEYS]
        out.append([[Code(row["config_id"]), " ★" if row["recommended"] else ""], settings, *cells])
    marks = ["rec" if row["recommended"] else None for row in rows]
    return Table(RESULT_HEADER, out, frozenset({4, *range(6, 15)}), marks)


def fit(m: dict) -> list:
    """llama.cpp's own placement (--fit on) beside the recommendation."""
    if not m["fit"]:
        return []
    metric = m["recommendations"][0]["metric_label"] if m["recommendations"] else "decode"
    lead = [Strong("llama.cpp's own choice"), " (", Code("--fit on"), ", same context and ubatch) beside the "]
    lead.append(f"recommendation ({metric} t/s at the objective workload):")
    rows, marks = [], []
    for f in m["fit"]:
        rows.append(_placement(Code("--fit on"), f["fit"]))
        marks.append(None)
        if f["recommended"]:
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
    return [Para(lead), Table(header, rows, frozenset(range(3, 8)), marks)]


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
    """A search: the arithmetic, the probes, the boundary, every value's status."""
    text = [Strong("Planner"), " (", Code("--n-cpu-moe"), f" searched in {s['range']} for ", Code(s["server_args"])]
    text.append(f"): {s['server_starts']} server starts. ")
    if s.get("full_residency"):
        text.append(
            f"Everything on the GPU: {s['full_residency']}. "
            f"Predicted lowest that fits: n_cpu_moe {s['predicted_lowest']} ({s['arithmetic']}). "
        )
    probes = ", ".join(f"{p['n_cpu_moe']} {'✓' if p['survived'] else '✗'}" for p in s["probes"])
    boundary = s["boundary"] if s["boundary"] is not None else "none in the range"
    use = s["recommended_n_cpu_moe"] if s["recommended_n_cpu_moe"] is not None else "– (none)"
    text.append(
        f"Probes in order: {probes}. Boundary: {boundary}; with the {s['margin_mib']} MiB margin, use n_cpu_moe {use}."
    )
    rows = [[v["n_cpu_moe"], f"{v['predicted_mib']:,.0f}", v["status"]] for v in s["value_rows"]]
    return [Para(text), Table(["n_cpu_moe", "predicted MiB", "status"], rows, frozenset({0, 1}))]


def crash_line(lines: list[dict]) -> list:
    if not lines:
        return []
    lead = [Strong("Crash line"), " (lowest ", Code("--n-cpu-moe"), " per combination of the other settings):"]
    return [Para(lead), Bullets([Mark("risky", e["sentence"]) if e["risky"] else e["sentence"] for e in lines])]


def limits(rows: list[dict], ctx: dict) -> list:
    """Each suspect measured during steady decode against its limit, the decode bound, the verdict."""
    if not rows:
        return []
    lead = [
        Strong("What limits decode"),
        " at workload ",
        Code(ctx["objective_workload"]),
        ", measured during steady decode (after the first tokens). Each suspect: measured value (share of its "
        "limit, per generated token): verdict. The bound is the decode speed if each device only had to stream "
        "the bytes it reads per token (weights it holds, active experts, KV at this depth) at its memory "
        "bandwidth, one device after the other.",
    ]
    header = [
        "config",
        "llama-server settings",
        "decode t/s",
        "bound t/s",
        "measured / bound",
        *ctx["suspect_columns"],
        "verdict",
    ]
    table = [
        [Code(r["config_id"]), Code(r["server_args"]), r["decode"], r["bound"], r["ratio"], *r["cells"], r["verdict"]]
        for r in rows
    ]
    return [Para(lead), Table(header, table, frozenset({2, 3, 4}))]


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


TEXTS = ("failure", "phase", "message")


def failures(rows: list[dict]) -> list:
    """Each failure: outcome, kind, phase, message; its log tail folded away below the table."""
    if not rows:
        return []
    table = [
        [Code(f["config_id"]), Code(f["server_args"]), Cell(f["outcome"], "fail"), *(_or_blank(f[k]) for k in TEXTS)]
        for f in rows
    ]
    header = ["config", "llama-server settings", "outcome", "failure", "phase", "message"]
    tails = [Details(f"log tail of {f['config_id']}", f["log_tail"]) for f in rows if _or_blank(f.get("log_tail"))]
    return [Para(Strong("Failures")), Table(header, table), *tails]
