"""A published speed table, read out of a Markdown file (a README, a model card) into a claims file.

:func:`read_tables` finds the tables of a Markdown text, with what stands above each (its headings, the last code
block of flags in its section) and the ``build: 1a2b3c4 (6050)`` line llama-bench prints below it. :func:`claims`
turns the speed tables among them into a claims file's content (``config.claims`` loads it): every setting a row
states (from its columns, the headings, the flag block), the workload each test name means (``pp512`` a prompt of
512 tokens, ``tg128`` 128 generated, ``@ d8192`` after 8,192 tokens), each claimed number with its ± spread, and the
speed settings the table leaves out, listed as unknown. A column is known by what its cells hold as much as by its
name, so a table headed in another language (``| 测试 | Baseline | FA |`` over ``pp512 | 1135 t/s | 5722 t/s``) is
read as one headed in English. What it cannot read it says, one line each (``Imported.lines``):
it never guesses a number. Nothing read here reaches llama-server except as a crashline setting, checked as a config's
is: a flag that is no setting is named and left out, never passed through.

:func:`fetch` reads an ``https://`` (or ``http://``) address or ``hf:OWNER/REPO`` (the model card, README.md).
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests
import yaml

from ..core import serverflags
from ..core.atomic import atomic_path
from ..core.errors import CrashlineError
from ..core.mdtext import FENCE, HEADING
from ..core.owned import own_folder
from ..core import settings as settings_mod
from .claims import SPEED_SETTINGS

MAX_BYTES = 4 << 20  # a README larger than this is no README
HF_ENDPOINT = "https://huggingface.co"

# -- Markdown -----------------------------------------------------------------------------------------------------

_DELIMITER = re.compile(r"^\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$")
_BUILD = re.compile(r"^\s*build:\s*(\S+)\s*\((\d+)\)\s*$")


@dataclass
class Table:
    """A Markdown table: where it starts (``line``, 1-based), its header and rows ((line, cells)), the headings above
    it (outermost first), the flag block of its section and the llama-bench ``build:`` line below it."""

    line: int
    header: list[str]
    rows: list[tuple[int, list[str]]]
    headings: list[str] = field(default_factory=list)
    code: str | None = None
    build: str | None = None


def _cells(line: str) -> list[str]:
    text = line.strip()
    text = text[1:] if text.startswith("|") else text
    text = text[:-1] if text.endswith("|") and not text.endswith("\\|") else text
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", text)]


def read_tables(text: str) -> list[Table]:
    """Every table of ``text`` outside code blocks, with its context (see :class:`Table`)."""
    lines = text.splitlines()
    tables: list[Table] = []
    headings: list[tuple[int, str]] = []  # (level, text) of the sections the line is in
    codes: list[tuple[int, str]] = []  # (level of the section it is in, text) of code blocks seen
    i = 0
    while i < len(lines):
        line = lines[i]
        if FENCE.match(line):
            fence = FENCE.match(line).group(1)
            end = next((j for j in range(i + 1, len(lines)) if lines[j].strip().startswith(fence)), len(lines))
            codes.append((headings[-1][0] if headings else 0, "\n".join(lines[i + 1 : end])))
            i = end + 1
            continue
        heading = HEADING.match(line)
        if heading:
            level = len(heading.group(1))
            headings = [h for h in headings if h[0] < level] + [(level, heading.group(2))]
            codes = [c for c in codes if c[0] < level]
            i += 1
            continue
        if line.lstrip().startswith("|") and i + 1 < len(lines) and _DELIMITER.match(lines[i + 1]):
            table = Table(i + 1, _cells(line), [], [h[1] for h in headings], codes[-1][1] if codes else None)
            i += 2
            while i < len(lines) and lines[i].lstrip().startswith("|"):
                table.rows.append((i + 1, _cells(lines[i])))
                i += 1
            after = next((j for j in range(i, len(lines)) if lines[j].strip()), None)
            if after is not None and _BUILD.match(lines[after]):
                table.build = "{} ({})".format(*_BUILD.match(lines[after]).groups())
            tables.append(table)
            continue
        i += 1
    return tables


# -- what a cell says -----------------------------------------------------------------------------------------------

# Column names (llama-bench's own, and those hand-made tables use) of crashline settings; a flag as a column name is
# read through core.serverflags.
COLUMNS = {
    "ngl": "n_gpu_layers",
    "n_gpu_layers": "n_gpu_layers",
    "n_cpu_moe": "n_cpu_moe",
    "ncmoe": "n_cpu_moe",
    "n-cpu-moe": "n_cpu_moe",
    "n_ubatch": "ubatch",
    "ubatch": "ubatch",
    "n_batch": "batch",
    "batch": "batch",
    "type_k": "cache_type_k",
    "type_v": "cache_type_v",
    "fa": "flash_attn",
    "flash_attn": "flash_attn",
    "threads": "threads",
    "n_threads": "threads",
    "ctx": "ctx",
    "n_ctx": "ctx",
    "context": "ctx",
    "context size": "ctx",
    "slots": "parallel",
    "parallel": "parallel",
    "np": "parallel",
    "sm": "split_mode",
    "split_mode": "split_mode",
}
BOTH_KV = ("kv", "kv cache", "kv type", "cache type")  # one column of the K and V cache type
NOTES = ("notes", "note", "comment", "comments", "remarks", "status")
BUILDS = ("build", "commit", "version")
TEST_COLUMN = "test"

_TEST = re.compile(r"\b(pp|tg)\s*(\d+)(?:\s*@\s*d(\d+))?\b", re.IGNORECASE)
_TPS = re.compile(r"t/s|tok/s|tokens?/s|tokens? per second|\btps\b", re.IGNORECASE)
_PREFILL = re.compile(r"\b(pp|prefill|prompt|pp\d+|s_pp)\b", re.IGNORECASE)
_DECODE = re.compile(r"\b(tg|decode|gen|generation|tg\d+|s_tg)\b", re.IGNORECASE)
_NUMBER = re.compile(r"^(\d{1,3}(?:,\d{3})+\.\d+|\d+(?:\.\d+)?)(?:\s*±\s*(\d+(?:\.\d+)?))?\s*(.*)$")
_CTX = re.compile(r"\b(?:ctx|context)\s*[=:]?\s*(\d+[kK]?)\b|\b(\d+[kK]?)\s*(?:ctx|context)\b", re.IGNORECASE)
_KV = re.compile(
    r"\b(f32|f16|bf16|q8_0|q4_0|q4_1|q5_0|q5_1|iq4_nl)\s+KV\b|\bKV(?:\s*cache)?\s*[=:]?\s*(f32|f16|bf16|q8_0|q4_0|q4_1"
    r"|q5_0|q5_1|iq4_nl)\b",
    re.IGNORECASE,
)


_TEST_CELL = re.compile(r"(pp|tg)\s*\d+(\s*@\s*d\d+)?", re.IGNORECASE)  # a cell that is a test name and nothing else
_RATIO_CELL = re.compile(r"\d+(\.\d+)?\s*[x×]", re.IGNORECASE)  # a speed-up: 5.2x


def plain(cell: str) -> str:
    """A cell without emphasis and code marks: ``**30**`` is 30."""
    return re.sub(r"[*`]|__", "", cell).strip()


def _column_setting(name: str) -> str | None:
    key = plain(name).lower()
    if key in COLUMNS:
        return COLUMNS[key]
    return serverflags.setting_of(key) if key.startswith("-") else None


def _setting_value(name: str, text: str) -> Any:
    """A stated value as the setting takes it, or SettingsError. ``32K`` of a context is 32,768 tokens; a flash
    attention of 1 / 0 (llama-bench's) is on / off."""
    text = plain(text)
    kind = settings_mod.SETTINGS[name].kind
    if name == "ctx" and re.fullmatch(r"\d+[kK]", text):
        value: Any = int(text[:-1]) * 1024
    elif kind == "int" and re.fullmatch(r"-?\d+", text):
        value = int(text)
    elif name == "flash_attn" and text in ("1", "0"):
        value = "on" if text == "1" else "off"
    else:
        value = text
    return settings_mod.check_value(name, value)


@dataclass
class Metric:
    """What a speed column measures: ``kind`` pp (prefill) or tg (decode), tokens and depth where its name says."""

    kind: str
    tokens: int | None = None
    depth: int = 0


def test_of(text: str) -> Metric | None:
    """``pp512`` / ``tg 128`` / ``pp4096 @ d8192``: the test a llama-bench name means."""
    found = _TEST.search(plain(text))
    if not found:
        return None
    return Metric(found.group(1).lower(), int(found.group(2)), int(found.group(3) or 0))


def _speed_column(name: str) -> Metric | str | None:
    """A column of speeds: its Metric, "ambiguous" where it does not say prefill or decode, None for no speed."""
    test = test_of(name)
    if test is not None:
        return test
    if not _TPS.search(name):
        return None
    prefill, decode = _PREFILL.search(name), _DECODE.search(name)
    if bool(prefill) == bool(decode):
        return "ambiguous"
    return Metric("pp" if prefill else "tg")


def number(cell: str) -> tuple[float, float | None, str] | str:
    """(value, ± spread or None, text after it) of a claimed speed, or why it is no number. ``1,234.5`` is read;
    ``4,479`` (a thousands or a decimal comma?) and ``~150`` (about) are not."""
    text = plain(cell)
    if not text or text in ("-", "–", "—"):
        return "empty"
    if text[0] in "~≈<>":
        return f"{cell!r} is not a measured number"
    found = _NUMBER.match(text)
    if not found or re.search(r"\d", found.group(3)) or float(found.group(1).replace(",", "")) <= 0:
        return f"{cell!r} is no number of tokens/s"
    spread = float(found.group(2)) if found.group(2) else None
    return float(found.group(1).replace(",", "")), spread, found.group(3).strip()


# -- settings above a table -----------------------------------------------------------------------------------------


def flag_settings(code: str) -> tuple[dict, dict, list[str]]:
    """The crashline settings a block of command lines states, the llama-bench workload it gives (``-p``, ``-n``,
    ``-d``: {"prompt", "gen", "depth"}) and what it could not take (lines). Several values of one flag
    (``-ub 256,512``) state none; a flag that is no setting is named and left out."""
    stated, workload, lines, ignored = {}, {}, [], []
    bench = "llama-bench" in code
    for raw in code.replace("\\\n", " ").splitlines():
        try:
            tokens = shlex.split(raw, comments=True)
        except ValueError:
            tokens = raw.split()
        i = 0
        while i < len(tokens):
            flag = serverflags.normalise(tokens[i])
            i += 1
            if not flag.startswith("-"):
                continue
            value = tokens[i] if i < len(tokens) and not re.fullmatch(r"-[A-Za-z-].*", tokens[i]) else None
            if bench and flag in ("-p", "--n-prompt", "-n", "--n-gen", "-d", "--n-depth"):
                i += value is not None
                key = {"p": "prompt", "n": "gen", "d": "depth"}[flag.lstrip("-")[0]]
                if value is not None and value.isdigit():
                    workload[key] = int(value)
                else:
                    lines.append(f"{flag} {value}: several values; the rows say which")
                continue
            name = serverflags.setting_of(flag)
            if name is None:
                ignored.append(flag)
                continue
            setting = settings_mod.SETTINGS[name]
            if setting.kind == "bool":
                stated[name] = not flag.lstrip("-").startswith("no")
                continue
            if name == "flash_attn" and value not in ("on", "off", "auto", "1", "0"):
                stated[name] = "on"  # a bare -fa, as older builds took it
                continue
            i += value is not None
            if value is None or "," in value:
                lines.append(f"{flag} {value or ''}: {'several values' if value else 'no value'}; not stated".strip())
                continue
            try:
                stated[name] = _setting_value(name, value)
            except settings_mod.SettingsError as exc:
                lines.append(f"{flag} {value}: {exc}; not stated")
    if ignored:
        lines.append(f"flags that are no crashline setting, left out: {' '.join(sorted(set(ignored)))}")
    return stated, workload, lines


def heading_settings(headings: list[str]) -> dict:
    """The context and KV cache type the headings above a table state (``ctx=32768``, ``q8_0 KV cache``)."""
    stated = {}
    for text in headings:
        ctx = _CTX.search(text)
        if ctx:
            value = ctx.group(1) or ctx.group(2)
            stated["ctx"] = _setting_value("ctx", value)
        kv = _KV.search(text)
        if kv:
            kind = (kv.group(1) or kv.group(2)).lower()
            stated["cache_type_k"] = stated["cache_type_v"] = kind
    return stated


def heading_flags(title: str) -> tuple[dict, list[str]]:
    """The settings the flags in the title of a table's own section state (``优化 2: 启用 Flash Attention (运行参数
    -fa 1)``: ``-fa 1``), read as a flag block's are, and what could not be taken. Only the section's own title: a
    document's title spans tables of other setups."""
    found = re.findall(
        r"(?<![\w-])(--?[A-Za-z][\w-]*)(?:[ =]([\w.:-]+))?", re.sub(r"[()（）\[\]【】,，;；]", " ", title)
    )
    if not found:
        return {}, []
    stated, _, lines = flag_settings(" ".join(" ".join(p for p in pair if p) for pair in found))
    return stated, lines


def _said(stated: dict) -> str:
    return ", ".join(f"{name} {value}" for name, value in stated.items())


# -- a table into claims rows --------------------------------------------------------------------------------------


@dataclass
class Speed:
    """One claimed number of a table: its row's line, the row's cells by column, the test and the value."""

    line: int
    cells: dict
    column: str
    metric: Metric
    value: float
    spread: float | None
    remark: str


@dataclass
class Imported:
    """What import read: ``rows`` (claims rows), ``lines`` (what it could not read or skipped, one each), ``models``
    (the model column's values) and ``tables`` (how many speed tables it read)."""

    rows: list[dict] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    models: set = field(default_factory=set)
    tables: int = 0


def _column_cells(table: Table, j: int) -> list[str]:
    return [plain(cells[j]) for _, cells in table.rows if len(cells) == len(table.header) and plain(cells[j])]


def _cells_are(table: Table, j: int, kind: str) -> bool:
    """Whether every filled cell of column ``j`` (one at least) is a test name (``pp512``), a number of tokens/s with
    its unit (``1135 t/s``) or a ratio (``5.2x``): what the column holds, whatever language its name is in."""
    cells = _column_cells(table, j)
    if kind == "test":
        return bool(cells) and all(_TEST_CELL.fullmatch(c) for c in cells)
    if kind == "ratio":
        return bool(cells) and all(_RATIO_CELL.fullmatch(c) for c in cells)
    read = [number(c) for c in cells]
    return bool(cells) and all(not isinstance(r, str) and _TPS.fullmatch(r[2]) for r in read)


def _columns(table: Table, out: Imported) -> dict | None:
    """Each column's role: ("setting", name), ("kv",), ("speed", Metric or None: by the test column), ("test",),
    ("note",), ("build",), ("ratio",), ("other",); None for a table with no speed it can claim (said in
    ``out.lines``). A column named in no words import knows is known by its cells: test names, tokens/s with their
    unit, ratios."""
    roles, unclear = {}, []
    for j, name in enumerate(table.header):
        key = plain(name).lower()
        speed = _speed_column(name)
        if key == TEST_COLUMN or (speed is None and _cells_are(table, j, "test")):
            roles[j] = ("test",)
        elif key in ("t/s", "tok/s", "tokens/s") or (speed is None and _cells_are(table, j, "tokens/s")):
            roles[j] = ("speed", None)
        elif isinstance(speed, Metric):
            roles[j] = ("speed", speed)
        elif speed == "ambiguous":
            roles[j] = ("other",)
            unclear.append(name)
        elif key in NOTES:
            roles[j] = ("note",)
        elif key in BUILDS:
            roles[j] = ("build",)
        elif key in BOTH_KV:
            roles[j] = ("kv",)
        elif _cells_are(table, j, "ratio"):
            roles[j] = ("ratio",)
            out.lines.append(f"table at line {table.line}: column {name!r} holds ratios, not speeds; not claimed")
        else:
            roles[j] = ("setting", _column_setting(name)) if _column_setting(name) else ("other",)
    where = f"table at line {table.line}"
    out.lines += [f"{where}: column {n!r} does not say prefill or decode; its numbers are not claimed" for n in unclear]
    speeds = [r for r in roles.values() if r[0] == "speed"]
    if speeds and not (any(r[1] is None for r in speeds) and ("test",) not in roles.values()):
        return roles
    if not unclear:
        out.lines.append(f"{where}: no column of prefill or decode speed; not a speed table, skipped")
    return None


def _speeds(table: Table, roles: dict, out: Imported) -> list[Speed]:
    speeds = []
    where = "line {}: column {!r} = {!r}"
    for line, cells in table.rows:
        if len(cells) != len(table.header):
            out.lines.append(
                f"line {line}: {len(cells)} cells under a header of {len(table.header)}; the row is not read"
            )
            continue
        by_name = dict(zip(table.header, cells))
        test = next((test_of(cells[j]) for j, r in roles.items() if r[0] == "test"), None)
        for j, role in roles.items():
            if role[0] != "speed":
                continue
            metric = role[1] or test
            if metric is None:
                out.lines.append(where.format(line, table.header[j], cells[j]) + ": no test name it belongs to")
                continue
            read = number(cells[j])
            if isinstance(read, str):
                if read != "empty":
                    out.lines.append(where.format(line, table.header[j], cells[j]) + f": {read}; not claimed")
                continue
            value, spread, remark = read
            remark = "" if _TPS.fullmatch(remark) else remark  # 1135 t/s: the unit, no remark
            speeds.append(Speed(line, by_name, table.header[j], metric, value, spread, remark))
    return speeds


def _row_settings(speed: Speed, roles: dict, header: list[str], out: Imported, say: bool) -> dict:
    """The settings a row's own cells state; what is no value of its setting is said (once a row: ``say``)."""
    stated = {}
    for j, role in roles.items():
        cell = plain(speed.cells[header[j]])
        if role[0] not in ("setting", "kv") or not cell:
            continue
        names = ("cache_type_k", "cache_type_v") if role[0] == "kv" else (role[1],)
        for name in names:
            try:
                stated[name] = _setting_value(name, cell)
            except settings_mod.SettingsError as exc:
                if say:
                    out.lines.append(f"line {speed.line}: column {header[j]!r} = {cell!r}: {exc}; not stated")
    return stated


def _workload(speed: Speed) -> tuple[dict | None, str | None]:
    """The one request a test means, or why there is none. ``ppP``: a prompt of P tokens (and 1 generated);
    ``tgN``: N generated after a prompt of one token, or of d with ``@ dD`` (the reply after d tokens in the
    cache). A prompt after tokens in the cache cannot be sent as one request; a test without its length has none."""
    metric = speed.metric
    tokens = metric.tokens
    if metric.kind == "pp" and metric.depth:
        return None, (
            "a prompt processed after tokens already in the cache: crashline sends every prompt whole, with the "
            "prompt cache off, so it cannot measure this"
        )
    if tokens is None:
        return None, "no prompt or generated length stated"
    if metric.kind == "pp":
        return {"prompt_tokens": tokens, "gen_tokens": 1}, None
    return {"prompt_tokens": metric.depth or 1, "gen_tokens": tokens}, None


def _test_name(s: Speed) -> str:
    name = f"{s.metric.kind}{s.metric.tokens or ''}"
    return name + (f" @ d{s.metric.depth}" if s.metric.depth else "")


def _compared(speeds: list[Speed]) -> list[str]:
    """The speed columns that give one row the same test (``| pp512 | 1135 t/s | 5722 t/s |`` under ``Baseline`` and
    ``FA``): setups the table sets side by side, in the order of the header."""
    seen: dict[tuple[int, str], list[str]] = {}
    for s in speeds:
        seen.setdefault((s.line, _test_name(s)), []).append(s.column)
    return list(dict.fromkeys(c for columns in seen.values() if len(columns) > 1 for c in columns))


def _labels(speeds: list[Speed], roles: dict, header: list[str]) -> list[str]:
    """Each claimed number's label: the cells that differ between the table's rows, the column where several give a
    row the same test, then its test; unique (a row's line is added where two would read the same)."""
    names = [header[j] for j, r in roles.items() if r[0] not in ("speed", "test", "note", "ratio")]
    varying = [n for n in names if len({plain(s.cells[n]) for s in speeds}) > 1]
    compared = _compared(speeds)
    labels = [
        ", ".join(
            [f"{plain(n)} {plain(s.cells[n])}" for n in varying if plain(s.cells[n])]
            + ([plain(s.column)] if s.column in compared else [])
            + [_test_name(s)]
        )
        for s in speeds
    ]
    return [f"{label} (line {s.line})" if labels.count(label) > 1 else label for label, s in zip(labels, speeds)]


def _cells_of(speed: Speed, roles: dict, header: list[str], role: str) -> list[str]:
    return [plain(speed.cells[header[j]]) for j, r in roles.items() if r[0] == role if plain(speed.cells[header[j]])]


def read_table(table: Table, out: Imported) -> None:
    """The claims rows of one table, appended to ``out`` (with what it could not read): one per claimed number."""
    roles = _columns(table, out)
    if roles is None:
        return
    out.tables += 1
    above, table_workload, flag_lines = flag_settings(table.code) if table.code else ({}, {}, [])
    out.lines += [f"table at line {table.line}, flag block above it: {x}" for x in flag_lines]
    titled, title_lines = heading_flags(table.headings[-1]) if table.headings else ({}, [])
    out.lines += [f"table at line {table.line}, its heading: {x}" for x in title_lines]
    above = {**above, **titled, **heading_settings(table.headings)}
    speeds = _speeds(table, roles, out)
    compared = _compared(speeds)
    if compared and above:
        out.lines.append(
            f"table at line {table.line}: its columns {', '.join(map(repr, compared))} set setups side by side that it "
            f"does not state apart; what is stated above it ({_said(above)}) is given to none of them"
        )
        above = {}
    for s in speeds:  # a column without its length (Decode t/s) takes the llama-bench command's -p / -n
        if s.metric.tokens is None:
            s.metric = Metric(s.metric.kind, table_workload.get("prompt" if s.metric.kind == "pp" else "gen"))
    for j, r in roles.items():
        if plain(table.header[j]).lower() == "model":
            out.models |= {plain(s.cells[table.header[j]]) for s in speeds}
    read_lines = set()
    for speed, label in zip(speeds, _labels(speeds, roles, table.header)):
        workload, why = _workload(speed)
        if workload is None:
            out.lines.append(f"line {speed.line} ({label}): {why}; not imported")
            continue
        row_settings = _row_settings(speed, roles, table.header, out, speed.line not in read_lines)
        read_lines.add(speed.line)
        stated = {**above, **row_settings}
        build = next(iter(_cells_of(speed, roles, table.header, "build")), None) or table.build
        key = "prefill_tps" if speed.metric.kind == "pp" else "decode_tps"
        row = {"label": label, "claimed": {key: speed.value}}
        if speed.spread is not None:
            row["claimed_spread"] = {key: speed.spread}
        row["stated"] = stated
        row["unknown"] = [n for n in SPEED_SETTINGS if n not in stated] + ([] if build else ["build"])
        if build:
            row["build"] = build
        row["workload"] = workload
        note = "; ".join(_cells_of(speed, roles, table.header, "note") + ([speed.remark] if speed.remark else []))
        if note:
            row["note"] = note
        out.rows.append(row)


def read_markdown(text: str, only: int | None = None) -> Imported:
    """The claims rows of every speed table of ``text`` (or of its ``only``-th table, from 1)."""
    out = Imported()
    tables = read_tables(text)
    if only is not None:
        if not 1 <= only <= len(tables):
            raise ImportRefused(f"--table {only}: the file has {len(tables)} table(s)")
        tables = [tables[only - 1]]
    sections = []  # (first row, last row + 1, what names the table) of each table read
    for table in tables:
        first = len(out.rows)
        read_table(table, out)
        sections.append((first, len(out.rows), table.headings[-1] if table.headings else f"table at line {table.line}"))
    labels = [r["label"] for r in out.rows]
    for first, end, name in sections:  # a label two tables give (Baseline, pp512) is led by its table's heading
        for row in out.rows[first:end]:
            if labels.count(row["label"]) > 1:
                row["label"] = f"{name}: {row['label']}"
    if not out.tables:
        out.lines.append("no speed table found (a table with a column of prefill or decode tokens/s)")
    if len(out.models) > 1:
        out.lines.append(
            f"the rows name {len(out.models)} models ({', '.join(sorted(out.models))}); a claims file measures one: "
            "keep the rows of yours"
        )
    return out


# -- the source -----------------------------------------------------------------------------------------------------


class ImportRefused(CrashlineError, ValueError):
    """An import that would overwrite its input or finds nothing to claim; the message says which."""


class SourceUnreadable(CrashlineError, ValueError):
    """A README that cannot be read; the message says which address and why."""


def source_url(source: str) -> tuple[str, str | None]:
    """The address to read for ``source`` (``https://...``, ``http://...``, ``hf:OWNER/REPO``) and the Hugging Face
    repository it names (or None). ``hf:`` reads the model card from $HF_ENDPOINT, as the hub code does."""
    if source.startswith("hf:"):
        repo = source[3:].strip("/")
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*", repo):
            raise SourceUnreadable(f"{source!r}: hf: takes OWNER/REPO (the model card's repository)")
        endpoint = (os.environ.get("HF_ENDPOINT") or HF_ENDPOINT).rstrip("/")
        return f"{endpoint}/{repo}/raw/main/README.md", repo
    if source.startswith(("https://", "http://")):
        return source, None
    raise SourceUnreadable(f"{source!r}: not an https://, http:// or hf: address")


def is_address(source: str) -> bool:
    return source.startswith(("https://", "http://", "hf:"))


def fetch(source: str) -> str:
    """The text at ``source`` (see :func:`source_url`): UTF-8, at most MAX_BYTES."""
    url, _ = source_url(source)
    try:
        with requests.get(url, stream=True, timeout=(15, 60)) as response:
            if response.status_code != 200:
                raise SourceUnreadable(f"{source}: {url} answered HTTP {response.status_code} {response.reason}")
            body = b""
            for chunk in response.iter_content(65536):
                body += chunk
                if len(body) > MAX_BYTES:
                    raise SourceUnreadable(f"{source}: {url} is larger than {MAX_BYTES >> 20} MiB; no README is")
    except requests.RequestException as exc:
        raise SourceUnreadable(f"{source}: cannot read {url}: {exc}") from None
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SourceUnreadable(f"{source}: {url} is not UTF-8 text ({exc})") from None


def claims_file(imported: Imported, source: dict, model: str | None) -> dict:
    """The claims file's content: ``source`` (url, local_copy, file, hf_repo), the model (None leaves the key for
    the user to fill: the loader names it then) and the rows."""
    out: dict[str, Any] = {
        "title": f"Speed table of {source['url'] if is_address(source['url']) else source['file']}",
        "note": "Imported by `crashline claims import`; what it could not read is listed in the comments above.",
        "source": source,
    }
    if model:
        out["model"] = model
    out["rows"] = imported.rows
    return out


def _write_text(path: Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def yaml_text(content: dict, lines: list[str], source: str) -> str:
    """The claims file as YAML, led by comments: where it came from and what import could not read."""
    head = [f"# Imported by `crashline claims import {source}`: every row as the table states it.", "#"]
    if "model" not in content:
        head.append("# Name the model first: `model: NAME`, a model of your workflow config (its `models:`).")
    if lines:
        head.append("# Not read (one line each; nothing here was guessed):")
        head += [f"#   {line}" for line in lines]
    return (
        "\n".join(head)
        + "\n"
        + yaml.safe_dump(content, sort_keys=False, allow_unicode=True, width=120, default_flow_style=None)
    )


def import_claims(source: str, out: str | os.PathLike, model: str | None = None, only: int | None = None) -> Imported:
    """Read the speed tables of ``source`` (a Markdown file, or an address :func:`fetch` reads) and write a claims
    file at ``out``, atomically, in a folder of the user's own (core.owned). The README is kept beside it
    (``NAME.source.md``, the claims file's ``local_copy``, which publish patches), unless it is a local file in that
    folder already. Refused: an ``out`` (or its copy) that is the input, a source without a row to claim."""
    out = Path(out)
    folder = own_folder(out.parent if str(out.parent) else ".", "--out")
    out = folder / out.name
    copy = out.with_name(f"{out.stem}.source.md")
    if is_address(source):
        text = fetch(source)
        _, repo = source_url(source)
        meta = {
            "url": f"{HF_ENDPOINT}/{repo}" if repo else source,
            "file": "README.md" if repo else (source.rstrip("/").rsplit("/", 1)[-1] or "README.md"),
            "local_copy": copy.name,
            "hf_repo": repo,
        }
    else:
        path = Path(source).resolve()
        if path in (out.resolve(), copy.resolve()):
            raise ImportRefused(f"--out {out}: would overwrite the input {source}; give another --out")
        text = path.read_text(encoding="utf-8")
        inside = path.is_relative_to(folder)  # publish reads the local copy only inside the claims file's folder
        meta = {"url": source, "file": path.name, "local_copy": os.path.relpath(path, folder) if inside else copy.name}
        copy = None if inside else copy
    imported = read_markdown(text, only)
    if not imported.rows:
        raise ImportRefused(f"{source}: no row to claim; " + "; ".join(imported.lines))
    if copy is not None:
        _write_text(copy, text)
    _write_text(out, yaml_text(claims_file(imported, meta, model), imported.lines, source))
    return imported
