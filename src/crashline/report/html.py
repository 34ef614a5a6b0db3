"""The HTML printer of ``report.doc``: every text escaped, marks as classes."""

from __future__ import annotations

import re

from .compact import flag_groups
from .doc import (
    Abbr,
    Box,
    Cell,
    Code,
    CodeBlock,
    Details,
    Document,
    Figure,
    Link,
    Mark,
    Para,
    Ref,
    Section,
    Stat,
    Strong,
    Table,
)

STYLE = """\
body { font-family: system-ui, sans-serif; margin: 2rem auto; max-width: 1400px; padding: 0 1rem; color: #1a1a1a; }
table { border-collapse: collapse; margin: 0.8rem 0 1.5rem; font-size: 0.8rem; }
th, td { border: 1px solid #ccc; padding: 0.25rem 0.4rem; text-align: left; vertical-align: top; }
th { background: #f0f0f0; }
td code, td code.flags span, td small span { white-space: nowrap; }
td code.flags { white-space: normal; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td.num small { white-space: normal; }
code, pre { font-family: ui-monospace, monospace; font-size: 0.85rem; }
pre { background: #f6f6f6; padding: 0.6rem; white-space: pre-wrap; overflow-wrap: anywhere; }
.fail { color: #b00020; font-weight: 600; }
.warn { color: #8a5a00; font-weight: 600; }
.rec { background: #f3f7fb; }
.winner { border-left: 4px solid #5b7a99; padding-left: 0.8rem; }
.answer { font-size: 1.25rem; }
.command { position: relative; }
.command button { position: absolute; top: 0.3rem; right: 0.3rem; font-size: 0.8rem; }
div.table { overflow-x: auto; }
figure { margin: 1rem 0 2rem; max-width: 900px; }
figure svg { width: 100%; height: auto; }
figcaption { font-size: 0.9rem; color: #444; }"""
# Copies a command block's text; clipboard access needs a secure context, so a file:// page may fall
# back to selecting the text for the reader to copy.
SCRIPT = """\
function copyCommand(button) {
  const pre = button.parentElement.querySelector("pre");
  const selectIt = () => {
    const r = document.createRange(); r.selectNodeContents(pre);
    const s = window.getSelection(); s.removeAllRanges(); s.addRange(r);
    button.textContent = "selected: press Ctrl+C";
  };
  if (navigator.clipboard && window.isSecureContext) {
    navigator.clipboard.writeText(pre.textContent).then(() => { button.textContent = "copied"; }, selectIt);
  } else { selectIt(); }
}"""

_ESCAPES = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&#34;", "'": "&#39;"})


def escape(text) -> str:
    return str(text).translate(_ESCAPES)


def _attrs(**values) -> str:
    return "".join(f' {k}="{escape(v)}"' for k, v in values.items() if v)


LONG_GROUP = 24  # characters of a flag and its value past which the value may break at its dots


def _cell_code(text: str) -> str:
    """Code in a table cell: a command line breaks between flags, never inside a flag and its values; other
    code does not break (the text copied is the same)."""
    groups = flag_groups(text)
    if len(groups) < 2 or " ".join(groups) != text:  # one group, or spacing a join would change
        return f"<code>{escape(text)}</code>"
    return '<code class="flags">' + " ".join(f"<span>{_breakable(g)}</span>" for g in groups) + "</code>"


def _breakable(group: str) -> str:
    """A flag and its value, escaped; a long value (an -ot regex) may break after each dot or underscore (<wbr>: the
    text copied is the same), so that one placement does not widen a table past the window."""
    text = escape(group)
    return re.sub(r"([._])", r"\1<wbr>", text) if len(group) > LONG_GROUP else text


def inline(content, in_cell: bool = False) -> str:
    """Inline content as HTML (IN_CELL: inside a table cell, where command lines may wrap between flags)."""
    if isinstance(content, list):
        return "".join(inline(c, in_cell) for c in content)
    if isinstance(content, Code):
        return _cell_code(content.text) if in_cell else f"<code>{escape(content.text)}</code>"
    if isinstance(content, Strong):
        return f"<b>{inline(content.content, in_cell)}</b>"
    if isinstance(content, Mark):
        return f'<span class="{escape(content.kind)}">{inline(content.content, in_cell)}</span>'
    if isinstance(content, Link):
        return f'<a href="{escape(content.url)}">{escape(content.text)}</a>'
    if isinstance(content, Ref):
        return f"<small>({escape(content.text)})</small>"
    if isinstance(content, Stat):
        words = " ".join(f"<span>{escape(w)}</span>" for w in str(content.spread).split(" "))
        return f"{escape(content.median)}<br><small>{words}</small>"
    if isinstance(content, Abbr):
        return f"<span{_attrs(title=content.full)}>{inline(content.content, in_cell)}</span>"
    return escape(content)


def _cell(cell, numeric: bool) -> str:
    mark = cell.mark if isinstance(cell, Cell) else None
    content = cell.content if isinstance(cell, Cell) else cell
    classes = " ".join(c for c in ("num" if numeric else None, mark) if c)
    return f"<td{_attrs(**{'class': classes})}>{inline(content, in_cell=True)}</td>"


def _table(table: Table) -> str:
    lines = ["<table>", "<tr>" + "".join(f"<th>{escape(h)}</th>" for h in table.header) + "</tr>"]
    marks = table.marks or [None] * len(table.rows)
    for cells, mark in zip(table.rows, marks, strict=True):
        tds = "".join(_cell(c, i in table.numeric) for i, c in enumerate(cells))
        lines.append(f"<tr{_attrs(**{'class': mark})}>{tds}</tr>")
    return "\n".join(['<div class="table">', *lines, "</table>", "</div>"])


def _section(section: Section) -> str:
    level = min(6, section.level)
    heading = f"<h{level}>{inline(section.title)}</h{level}>"
    opening = f"<section{_attrs(**{'class': section.kind, 'id': section.anchor})}>"
    return "\n".join([opening, heading, *(block(b) for b in section.blocks), "</section>"])


def block(b) -> str:
    """One block (or a list of blocks) as HTML."""
    if isinstance(b, list):
        return "\n".join(block(x) for x in b)
    if isinstance(b, Para):
        return f"<p{_attrs(**{'class': b.mark})}>{inline(b.content)}</p>"
    if isinstance(b, Table):
        return _table(b)
    if isinstance(b, CodeBlock):
        pre = f"<pre>{escape(b.text)}</pre>"
        if b.copy:
            return f'<div class="command"><button type="button" onclick="copyCommand(this)">copy</button>{pre}</div>'
        return pre
    if isinstance(b, Details):
        inside = f"<pre>{escape(b.content)}</pre>" if isinstance(b.content, str) else block(b.content)
        return f"<details><summary>{escape(b.summary)}</summary>\n{inside}\n</details>"
    if isinstance(b, Figure):
        series = "|".join(b.series)
        # The drawing carries its title; the figure is named by it for readers that do not see it.
        attrs = _attrs(**{"data-file": b.file, "data-series": series, "aria-label": b.title})
        return f"<figure{attrs}>\n{b.svg}\n</figure>"
    if isinstance(b, Box):
        return "\n".join([f'<div class="{escape(b.mark)}">', block(b.blocks), "</div>"])
    if isinstance(b, Section):
        return _section(b)
    return "<ul>\n" + "\n".join(f"<li>{inline(item)}</li>" for item in b.items) + "\n</ul>"  # Bullets


def page(doc: Document) -> str:
    """A whole HTML page: the title, the style, the blocks."""
    title = escape(doc.title)
    head = f'<!doctype html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n<title>{title}</title>\n'
    head += f"<style>\n{STYLE}\n</style>\n<script>\n{SCRIPT}\n</script>\n</head>\n"
    return f"{head}<body>\n<h1>{title}</h1>\n{block(doc.blocks)}\n</body>\n</html>\n"
