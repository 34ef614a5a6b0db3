"""The Markdown printer of ``report.doc``, and how Markdown text is read (its headings).

Marks are left out (Markdown has no colour). Text in a table cell has its pipes escaped and its
line breaks joined, so a message cannot split a row; code spans get as many backticks as they need.
"""

from __future__ import annotations

import html
import re

from ..core.mdtext import FENCE, HEADING
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

# Where a correction section starts and ends in an upstream Markdown file (HTML comments: invisible there).
CORRECTION_START = "<!-- crashline:correction:start -->"
CORRECTION_END = "<!-- crashline:correction:end -->"
_TICKS = re.compile(r"`+")


def inline(content, cell: bool = False) -> str:
    """Inline content as Markdown (``cell``: inside a table cell)."""
    if isinstance(content, list):
        return "".join(inline(c, cell) for c in content)
    if isinstance(content, Code):
        return _code(content.text, cell)
    if isinstance(content, Strong):  # spaces at either end go outside the stars, or Markdown shows the stars
        inner = inline(content.content, cell)
        text = inner.strip()
        if not text:
            return inner
        return f"{inner[: len(inner) - len(inner.lstrip())]}**{text}**{inner[len(inner.rstrip()) :]}"
    if isinstance(content, (Mark, Abbr)):
        return inline(content.content, cell)
    if isinstance(content, Link):
        return f"[{_text(content.text, cell)}]({content.url})"
    if isinstance(content, Ref):
        return f"({_code(content.text, cell)})"
    if isinstance(content, Stat):
        return f"{_text(content.median, cell)} {_text(content.spread, cell)}"
    return _text(content, cell)


def _text(text, cell: bool) -> str:
    text = str(text).replace("\r", "").replace("\n", " ")
    return text.replace("|", "\\|") if cell else text


def _code(text, cell: bool) -> str:
    text = _text(text, cell)
    ticks = max((len(t) for t in _TICKS.findall(text)), default=0)
    if not ticks:
        return f"`{text}`"
    fence = "`" * (ticks + 1)
    return f"{fence} {text} {fence}"


def _fenced(text: str) -> str:
    ticks = max((len(t) for t in _TICKS.findall(text)), default=0)
    fence = "`" * max(3, ticks + 1)
    return f"{fence}\n{text.rstrip(chr(10))}\n{fence}"


def _table(table: Table) -> str:
    def row(cells) -> str:
        return "| " + " | ".join(cells) + " |"

    align = ["---:" if i in table.numeric else "---" for i in range(len(table.header))]
    lines = [row([_text(h, True) for h in table.header]), row(align)]
    for cells in table.rows:
        lines.append(row([inline(c.content if isinstance(c, Cell) else c, cell=True) for c in cells]))
    return "\n".join(lines)


def _details(b: Details) -> str:
    summary = html.escape(b.summary, quote=False)
    inside = _fenced(b.content) if isinstance(b.content, str) else block(b.content)
    return f"<details><summary>{summary}</summary>\n\n{inside}\n\n</details>"


def _section(section: Section) -> str:
    heading = "#" * min(6, section.level) + " " + inline(section.title)
    return "\n\n".join([heading, *(block(b) for b in section.blocks)])


def block(b) -> str:
    """One block (or a list of blocks) as Markdown, without a trailing newline."""
    if isinstance(b, list):
        return "\n\n".join(block(x) for x in b)
    if isinstance(b, Para):
        return inline(b.content)
    if isinstance(b, Table):
        return _table(b)
    if isinstance(b, CodeBlock):
        return _fenced(b.text)
    if isinstance(b, Details):
        return _details(b)
    if isinstance(b, Box):
        return block(b.blocks)
    if isinstance(b, Figure):
        alt = _text(b.title, False).replace("[", "\\[").replace("]", "\\]")
        return f"![{alt}]({b.file})"
    if isinstance(b, Section):
        return _section(b)
    return "\n".join("- " + inline(item) for item in b.items)  # Bullets


def page(doc: Document) -> str:
    """A whole document: its title as the level-1 heading, then its blocks."""
    return f"# {doc.title}\n\n{block(doc.blocks)}\n"


# -- reading Markdown ----------------------------------------------------------------------------


def headings(text: str) -> list[tuple[int, int, str]]:
    """(line index, level, title) of every ATX heading outside code fences."""
    out, fenced = [], False
    for i, line in enumerate(text.splitlines()):
        if FENCE.match(line):
            fenced = not fenced
            continue
        m = None if fenced else HEADING.match(line)
        if m:
            out.append((i, len(m.group(1)), m.group(2)))
    return out


def anchor_level(text: str, anchor: str | None) -> int | None:
    """The level of the heading ``anchor`` in ``text`` (None without an anchor or if it is absent)."""
    if not anchor:
        return None
    for _, level, title in headings(text):
        if title.strip().lower() == anchor.strip().lower():
            return level
    return None
