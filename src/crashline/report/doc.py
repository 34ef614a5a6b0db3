"""The report as plain data: each section is built once from these types, and two printers
(``report.markdown``, ``report.html``) write it.

Inline content is a ``str``, one of the spans below, or a list of them. Blocks are ``Para``,
``Bullets``, ``Table``, ``CodeBlock``, ``Details``, ``Box`` and ``Section``; a ``Document`` is a
title and blocks. A mark ("ok", "fail", "warn", "risky", "rec", "winner") is data, not prose: the
HTML printer colours it, the Markdown printer leaves it out. What a reader must see in both
formats (✓ ✗ ⚠ ★, "risky:") is content.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Code:
    """Literal text: a command line, an id, a value."""

    text: str


@dataclass(frozen=True)
class Strong:
    content: Any  # Inline


@dataclass(frozen=True)
class Mark:
    """Content of a kind ("ok", "fail", "warn", "risky") that HTML colours."""

    kind: str
    content: Any  # Inline


@dataclass(frozen=True)
class Link:
    text: str
    url: str


@dataclass(frozen=True)
class Ref:
    """The id of what was just named, in parentheses: a configuration after its settings."""

    text: str


@dataclass(frozen=True)
class Abbr:
    """Shortened content; HTML shows the full text on hover."""

    content: Any  # Inline
    full: str


@dataclass(frozen=True)
class Stat:
    """A statistic: its median, then the range and count ("[939.2–980.7] n=3 ⚠"); HTML puts the range
    under the median, small, so a table of them stays narrow."""

    median: str
    spread: str


Inline = str | Code | Strong | Mark | Link | Ref | Abbr | Stat | list


@dataclass
class Para:
    content: Inline
    mark: str | None = None


@dataclass
class Bullets:
    items: list[Inline]


@dataclass
class Cell:
    """A table cell with a mark (a plain cell is just its content)."""

    content: Inline
    mark: str | None = None


@dataclass
class Table:
    """A header and rows of cells; ``numeric``: the columns aligned right; ``marks``: one per row (or None)."""

    header: list[str]
    rows: list[list[Inline | Cell]]
    numeric: frozenset[int] = frozenset()
    marks: list[str | None] | None = None


@dataclass
class CodeBlock:
    """Literal lines; ``copy``: HTML offers a button that copies them (a command to run)."""

    text: str
    copy: bool = False


@dataclass
class Details:
    """Content folded away under a summary: a long text (a log tail, the Markdown to send) or blocks
    (a table a reader rarely needs)."""

    summary: str
    content: str | list


@dataclass
class Figure:
    """A drawing: ``svg`` is embedded in HTML; Markdown links ``file`` (a path relative to the report)."""

    title: str
    svg: str
    file: str
    series: list[str] = field(default_factory=list)


@dataclass
class Box:
    """Blocks that belong together (the recommendation); HTML frames them."""

    blocks: list
    mark: str


@dataclass
class Section:
    """A heading of ``level`` and its blocks; ``anchor`` and ``kind`` name it in HTML."""

    title: Inline
    blocks: list
    level: int = 2
    anchor: str | None = None
    kind: str | None = None


@dataclass
class Document:
    title: str
    blocks: list = field(default_factory=list)


def joined(items: list[Inline], sep: Inline = ", ") -> list[Inline]:
    """``items`` with ``sep`` between them."""
    out: list[Inline] = []
    for i, item in enumerate(items):
        out += [sep, item] if i else [item]
    return out


def plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def code_spans(text: str) -> list:
    """A sentence written once for the tables, recommendation.json and tune's line (plain text, settings and ids in
    backticks) as inlines: the backticked parts as code, so that no printer shows a literal backtick."""
    return [Code(t) if i % 2 else t for i, t in enumerate(text.split("`")) if t]
