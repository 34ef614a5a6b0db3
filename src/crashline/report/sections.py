"""The report's sections, laid out once from what ``report.build`` worked out: the failures at the
top, the summary, the environment and what the answer cost, then one section per model
(``model_sections``), the needle recall grid and the corrections of published tables."""

from __future__ import annotations

from ..core.progress import duration
from ..core.thresholds import CONTENTION_CORES, HIGH_SPREAD_PCT
from . import kvquality, needle
from .doc import Abbr, Bullets, Cell, Code, CodeBlock, Document, Para, Ref, Section, Strong, Table
from .doc import code_spans, plural
from .model_sections import model_section, or_dash

TITLE = "crashline report"


def document(ctx: dict, needle_grid: list[dict], corrections: Section | None) -> Document:
    """The whole report."""
    blocks = [
        *top(ctx["nothing_survived"]),
        *recheck(ctx.get("recheck")),
        *(
            Para([Strong(f"{model}: "), *code_spans(why), "."], "warn")
            for model, why in ctx["recall_uninformative"].items()
        ),
        *intro(ctx),
        *summary(ctx.get("summary")),
        environment(ctx),
        *(model_section(m, ctx) for m in ctx["per_model"]),
        needle.section(needle_grid),
        kv_section(ctx.get("kv_quality")),
        corrections,
    ]
    return Document(TITLE, [b for b in blocks if b is not None])


# -- before the environment ----------------------------------------------------------------------


def kv_section(kv: dict | None) -> Section | None:
    """The KV cache quality section (report.kvquality), None without a quantised KV type measured."""
    if not kv:
        return None
    return kvquality.section(kv["models"], kv["max_kld"], kv["metric_label"], kv["workload"])


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
            Abbr(Code(or_dash(m["model_sha256"])[:16] + "…"), or_dash(m["model_sha256"])),
            or_dash(m["architecture"]),
            or_dash(m["quantisation"]),
            m["size"],
        ]
        for m in models
    ]
    return Table(["model", "source", "sha256", "architecture", "quantisation", "size"], rows, frozenset({5}))
