"""Saying things once: the llama-server settings every row shares, apart from the ones that differ;
table columns that hold one value in every row, stated above the table; runs of equal neighbours
as ranges; a long command wrapped at its flags; a table without its blank columns and with its constant ones said
once above it."""

from __future__ import annotations

import re
import shlex

from .doc import Cell, Code, Mark, Para, Strong, Table, joined

_FLAG = re.compile(r"^--?[A-Za-z]")
BLANK = "–"
NOTE = " · "  # settings.label: what follows is a measurement setting, not a server argument


def setting_units(args: str) -> list[str]:
    """llama-server arguments as settings: each flag with the values after it ("-ub 2048", "-cb");
    a leading word (the binary) is a unit of its own, and so is a measurement setting that is not a flag,
    which ``settings.label`` appends after " · " ("· cold page cache")."""
    args, *notes = (args or "").split(NOTE)
    units = [shlex.join(u) for u in _grouped(shlex.split(args))]
    return units + [f"{NOTE.strip()} {note.strip()}" for note in notes]


def flag_groups(text: str) -> list[str]:
    """Text as it stands, split between flags: each flag with the words after it, joined by single spaces (no
    shell parsing: any text, quotes and all, of a table cell)."""
    return [" ".join(u) for u in _grouped(text.split())]


def _grouped(tokens: list[str]) -> list[list[str]]:
    """Tokens in units: a flag and the values after it; a leading value is a unit of its own."""
    units: list[list[str]] = []
    for token in tokens:
        if _FLAG.match(token) or not units:
            units.append([token])
        else:
            units[-1].append(token)
    return units


def split_common(args_list: list[str]) -> tuple[str, list[str]]:
    """The settings every one of ``args_list`` holds, and per entry the rest, each as one string."""
    per = [setting_units(a) for a in args_list]
    common = [u for u in per[0] if all(u in p for p in per[1:])] if per else []
    return " ".join(common), [" ".join(u for u in p if u not in common) for p in per]


def _flag(unit: str) -> str:
    return unit.split(" ", 1)[0]


def distinguishing(args: str, all_args: list[str]) -> str:
    """The settings of ``args`` that set it apart among ``all_args``: a flag given a value that others give
    differently, or a flag most of them leave out. "-ngl 999" passed by every configuration but a
    ``--fit on`` one does not set a winner apart; "--n-cpu-moe 31" among 25, 29, 31 does."""
    per = [setting_units(a) for a in all_args]
    out = []
    for unit in setting_units(args):
        given = [u for units in per for u in units if _flag(u) == _flag(unit)]
        if len(set(given)) > 1 or len(given) * 2 < len(per):
            out.append(unit)
    return " ".join(out)


def wrapped(command: str, width: int = 88) -> str:
    """A command on several lines (a shell continues them), broken between settings."""
    lines: list[str] = []
    for unit in setting_units(command):
        if lines and len(lines[-1]) + 1 + len(unit) <= width:
            lines[-1] += " " + unit
        else:
            lines.append(unit)
    return " \\\n  ".join(lines)


def _content(cell):
    return cell.content if isinstance(cell, Cell) else cell


def constant_columns(header: list[str], rows: list[list], keep: frozenset[int]) -> tuple[list[int], list[tuple]]:
    """Which columns to show, and (name, value) of the others: a column outside ``keep`` that is blank in every
    row is left out; one that holds the same value in every row that has one (two rows at least) is said once."""
    if len(rows) < 2:
        return list(range(len(header))), []
    shown, once = [], []
    for i, name in enumerate(header):
        values = [v for v in (_content(r[i]) for r in rows) if v not in (BLANK, "", None)]
        if i in keep or (values and (len(values) < 2 or any(v != values[0] for v in values))):
            shown.append(i)
        elif values:
            once.append((name, values[0]))
    return shown, once


def runs(items: list, key) -> list[tuple[int, int, object]]:
    """(first index, last index, key) of each run of neighbours with the same ``key(item)``; a key of None
    is never joined to a neighbour."""
    out: list[tuple[int, int, object]] = []
    for i, item in enumerate(items):
        k = key(item)
        if out and k is not None and out[-1][2] == k:
            out[-1] = (out[-1][0], i, k)
        else:
            out.append((i, i, k))
    return out


def settings_cell(row: dict) -> list:
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
