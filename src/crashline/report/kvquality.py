"""The KV cache quality section: per model, each KV type's speed, KL divergence against f16 and needle recall side
by side (from ``tables.kvquality.side_by_side``), and where a faster type's price is above kv_quality.max_kld."""

from __future__ import annotations

from .doc import Code, Mark, Para, Section, Strong, Table

LEGEND = (
    "What a quantised KV cache costs. For each quantised type a configuration used, llama.cpp's llama-perplexity "
    "(built beside llama-server from the same sources) runs the model over the shipped prose once with an f16 cache "
    "and once with that type, and compares each scored token's next-token distribution: the KL divergence from "
    "f16's (nats; 0 is identical) at its median and 99th percentile, and how often both put the same token on top. "
    "Speed is the fastest configuration of the type at the objective workload; recall counts its configurations "
    "that recalled every needle, of those checked (the needle section has the depths). The threshold is "
    "kv_quality.max_kld, "
)


def section(kv: dict[str, list[dict]], max_kld: float, metric_label: str, workload: str) -> Section | None:
    """The section (None where no model used a quantised KV type)."""
    models = [Section(model, _model(rows, metric_label), level=3, anchor=f"kv-{model}") for model, rows in kv.items()]
    if not models:
        return None
    legend = Para([LEGEND, Code(f"{max_kld:g}"), f" (median KL divergence); the workload is {workload}."])
    return Section("KV cache quality", [legend, *models], anchor="kv-quality")


def _model(rows: list[dict], metric_label: str) -> list:
    blocks = []
    quiet = next((r["message"] for r in rows[1:] if not r["informative"]), None)
    if quiet:
        blocks.append(Para(f"No KL divergence: {quiet}.", "warn"))
    used = next((r["ctx_reason"] for r in rows[1:] if r["ctx_reason"]), None)
    if used and not quiet:
        blocks.append(Para(f"Measured over a context of {used}; the second half of it is scored."))
    header = ["KV type", "fastest config", f"{metric_label} t/s", "KLD median", "KLD p99", "same top token", "recall"]
    table = [[Strong(r["kv"]), *_cells(r)] for r in rows]
    blocks.append(
        Table(header, table, numeric=frozenset({2, 3, 4, 5}), marks=["fail" if r["over"] else None for r in rows])
    )
    blocks += [
        Para(Mark("fail", r["over"] + ": the faster type changes the answers more than allowed"))
        for r in rows
        if r["over"]
    ]
    return blocks


def _cells(r: dict) -> list:
    speed = "–" if r["speed"] is None else f"{r['speed']:.1f}"
    config = Code(r["config_id"]) if r["config_id"] else "none survived" if r["tried"] else "not tried"
    if r["kv"] == "f16":
        quality = ["0 (reference)", "0 (reference)", "100% (reference)"]
    elif not r["informative"] or r["kld_median"] is None:
        quality = ["–", "–", "–"]
    else:
        quality = [f"{r['kld_median']:.4f}", f"{r['kld_p99']:.4f}", f"{r['same_top_pct']:.1f}%"]
    if not r["recall_checked"]:
        recall = "not checked"
    elif not r["recall_applicable"]:
        recall = "not applicable"
    else:
        recall = f"{r['recall_passed']}/{r['recall_checked']} recalled"
    return [config, speed, *quality, recall]


def answer_text(r: dict) -> str:
    """The answer's quantised KV type in one line, as ``tune`` prints it: its KL divergence against f16, its recall,
    and where its price is above kv_quality.max_kld."""
    if not r["informative"] or r["kld_median"] is None:
        return f"KV cache {r['kv']}: no KL divergence against f16 ({r['message']})"
    text = (
        f"KV cache {r['kv']}: KL divergence against f16 median {r['kld_median']:.4f}, 99th percentile "
        f"{r['kld_p99']:.4f}, same top token {r['same_top_pct']:.1f}% (over {r['ctx_reason']})"
    )
    return text + (f"; {r['over']}" if r.get("over") else "")
