"""The needle recall section: per model, per configuration, a grid of lengths x depths (from
``tables.needle.recall_grid``)."""

from __future__ import annotations

from ..config.needle import not_recalled
from .doc import Abbr, Cell, Code, Mark, Para, Section, Strong, Table

LEGEND = (
    "A configuration's long-context numbers count only if the model, served with exactly that configuration, "
    "recalled a random value buried in a prompt of that length. Each cell is one depth of the needle in a haystack "
    "of public-domain prose: ✓ the answer contained the value, ✗ it did not or the prompt was refused or cut (the "
    "reason is given). Lengths are prompt tokens as the server counted them ("
)
LEGEND_END = "); greedy, prompt cache off; ★ marks lengths that must pass for a configuration to be recommended."


def printable(answer) -> str:
    """An answer as text a page can show: line breaks as ⏎, other control characters as \\xNN (a model
    with random weights answers with any token)."""
    text = str(answer).replace("\r", "").replace("\n", "⏎")
    return "".join(ch if ch.isprintable() else f"\\x{ord(ch):02x}" for ch in text)


def short(answer, limit: int = 24) -> str | None:
    """An answer on one line, cut to ``limit`` characters."""
    if answer is None:
        return None
    text = printable(str(answer).strip())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def section(grid: list[dict]) -> Section | None:
    """The section (None without needle records)."""
    if not grid:
        return None
    models = [Section(m["name"], _model(m), level=3, anchor=f"needle-{m['name']}") for m in grid]
    return Section("Needle recall", [Para([LEGEND, Code("prompt_n"), LEGEND_END]), *models], anchor="needle")


def _model(m: dict) -> list:
    if not m["applicable"]:
        return [Para(f"Not applicable: {m['message']}.")]
    blocks = []
    for c in m["configs"]:
        blocks.append(Para(_headline(c)))
        if c["rows"]:
            blocks.append(_grid(c))
    return blocks


def _headline(c: dict) -> list:
    """The configuration, its verdict, the context it had, the prompt style, how its server ended."""
    recall = Mark("ok" if c["recall"] == "pass" else "fail", Strong(c["recall"].replace("_", " ")))
    out = [Strong(Code(c["config_id"])), " ", Code(c["server_args"]), " — recall ", recall]
    if c["failed_required"]:
        out += [", ", Mark("fail", f"failed at required length {', '.join(c['failed_required'])}: not recommended")]
    if c["slot_ctx"]:
        out.append(f"; {c['slot_ctx']} tokens per slot")
    out.append(f"; {c['prompt_style']} prompts")
    if c["outcome"] != "ok":
        out += ["; ", Mark("fail", f"server {c['outcome']}: {c['message']}")]
    return out


def _grid(c: dict) -> Table:
    header = ["length (prompt tokens)", *(f"depth {round(d * 100)}%" for d in c["depths"])]
    rows = [[_length(r), *(_cell(cell) for cell in r["cells"])] for r in c["rows"]]
    return Table(header, rows)


def _length(r: dict) -> str:
    text = r["length"]
    if r["length_target"] is not None and r["length"] != str(r["length_target"]):
        text += f" ({r['length_target']})"
    return text + (" ★" if r["required"] else "")


def _cell(cell: dict | None):
    if cell is None:
        return "–"
    of = f"{cell['n_passed']}/{cell['n']}"
    if cell["passed"]:
        return Cell(["✓ recalled ", Code(cell["value"]), f" {of}" if cell["n"] > 1 else ""], "ok")
    answer = short(cell["answer"])
    if answer is None or not cell["value"]:
        return Cell("✗ " + (cell["reason"] or "no answer"), "fail")
    out = ["✗ answered ", Abbr(Code(answer), printable(cell["answer"])), ", expected ", Code(cell["value"])]
    if cell["n"] > 1:
        out.append(f" ({of} passed)")
    if cell["reason"] and cell["reason"] != not_recalled(cell["value"]):
        out.append(f"; {cell['reason']}")
    return Cell(out, "fail")
