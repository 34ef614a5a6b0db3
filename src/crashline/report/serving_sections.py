"""How the servers held up beyond one request, in the report's model section: cold versus warm page cache,
conversations that grow turn by turn on one slot, and soaks of many different prompts."""

from __future__ import annotations

from .compact import compacted, settings_cell
from .doc import Cell, Code, Para, Strong, Table


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
        "compared",
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
            Cell(r["inconclusive"], "fail") if r.get("inconclusive") else "–",
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
            settings_cell(r),
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
