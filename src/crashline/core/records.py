"""Typed records: the outcomes a job can end with, and one way to write and read each kind of record.

Every record written through ``write`` starts with ``{"kind": KIND, "schema_version": N}``. ``load``
reads it back through the same table of versions: a record of an unknown kind, or of a version newer
than this code reads, is refused with a ``RecordError`` that names the file; an older version is
upgraded step by step (``UPGRADES``), so that the code after ``load`` only ever sees the current one.

Versions (bump one, and add its upgrade, whenever a field is renamed, removed or given a new meaning):

- measure 1: ``"schema": 1`` (the version under its first name). 2: ``schema_version``. 3: each workload has
  ``e2e_tps`` (end to end per request, from its runs' requests) and ``warmup_runs`` (untimed runs at its depth;
  none before version 3).
- needle 1: as measure 1. 2: ``schema_version``.
- search_needle 1: a search's recall check (``jobs.needle.run_search_needle``): which candidates it tested,
  in order, and the first that recalled (``records``: their needle.json folders, relative to its own).
- search 0: no version, no kind, and maybe no ``records``. 1: ``kind``, ``schema_version`` and
  ``records`` (the probes' configuration ids), always present.

``records_from`` and ``needle_records_from`` list the records a search's summary or recall check stands for.
"""

from __future__ import annotations

import datetime as dt
import enum
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .atomic import read_json, write_json
from .stats import end_to_end_tps, stats
from .errors import CrashlineError
from .paths import SearchFolder


class Outcome(enum.StrEnum):
    """How a job, a workload or a server check ended. A str enum: ``Outcome.OK == "ok"``, JSON and
    Parquet keep the plain string, and f-strings print the value (a ``(str, Enum)`` would print
    ``Outcome.OK``)."""

    OK = "ok"
    LOAD_FAILED = "load_failed"  # the server never listened (a model, argument or memory problem at load)
    OOM = "oom"  # out of memory after load
    OOM_HOST = "oom_host"  # the kernel's OOM killer ended the server at the host-memory budget (budget.host_ram_mib)
    CRASHED = "crashed"  # the server died after load
    TIMEOUT = "timeout"  # no answer (or no readiness) in time
    CONTEXT_EXCEEDED = "context_exceeded"  # the server refused a prompt longer than its context
    TRUNCATED = "truncated"  # a request came back with fewer tokens than asked for
    REQUEST_FAILED = "request_failed"  # the server refused a request and lived on
    BUDGET_REFUSED = "budget_refused"  # the VRAM budget could not be emulated: no server started
    ERROR = "error"  # a fault of crashline itself
    NOT_APPLICABLE = "not_applicable"  # needle recall on a model that cannot recall anything


KIND_KEY = "kind"
VERSION_KEY = "schema_version"
LEGACY_VERSION_KEY = "schema"  # measure and needle version 1 named their version so

CURRENT = {"measure": 3, "needle": 2, "search": 1, "search_needle": 1, "kv_quality": 1}


class RecordError(CrashlineError, ValueError):
    """A record this code cannot read: not a record, of an unknown kind, or of a newer version."""


def _schema_renamed(record: dict) -> dict:
    """Version 1 to 2: the version moves from ``schema`` to ``schema_version`` (stamped by ``load``)."""
    record.pop(LEGACY_VERSION_KEY, None)
    return record


def _end_to_end(record: dict) -> dict:
    """Version 2 to 3: each workload's end-to-end speed per request, from the requests its runs recorded; no
    warm-up runs (version 2 had one short request per server start only)."""
    for w in record.get("workloads") or []:
        w.setdefault("warmup_runs", [])
        if "e2e_tps" not in w:
            # a run of version 1 is the request itself
            reqs = [r for run in w.get("runs") or [] for r in run.get("requests", [run])]
            ok = w.get("outcome") == Outcome.OK
            w["e2e_tps"] = stats([e for r in reqs if (e := end_to_end_tps(r))]) if ok else None
    return record


def _search_defaults(record: dict) -> dict:
    """Version 0 to 1: a search from before ``records`` names none of its probes' records."""
    record.setdefault("records", [])
    return record


# (kind, version) -> the function that turns that version into the next one.
UPGRADES: dict[tuple[str, int], Callable[[dict], dict]] = {
    ("measure", 1): _schema_renamed,
    ("measure", 2): _end_to_end,
    ("needle", 1): _schema_renamed,
    ("search", 0): _search_defaults,
}


def utc_now() -> str:
    """Now, as every record stamps its times (UTC, to the second)."""
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def supported() -> str:
    """The kinds and versions ``load`` reads, in words: "measure 1–3, needle 1–2, search 0–1, search_needle 1–1"."""
    return ", ".join(f"{kind} {oldest(kind)}–{CURRENT[kind]}" for kind in sorted(CURRENT))


def oldest(kind: str) -> int:
    """The oldest version of ``kind`` that upgrades, one step after another, to the current one."""
    version = CURRENT[kind]
    while (kind, version - 1) in UPGRADES:
        version -= 1
    return version


def stamp(kind: str, record: dict) -> dict:
    """The record with its kind and the current version first."""
    if kind not in CURRENT:
        raise RecordError(f"no record kind {kind!r} (kinds: {', '.join(sorted(CURRENT))})")
    if record.get(KIND_KEY, kind) != kind:
        raise RecordError(f"a {record[KIND_KEY]!r} record cannot be written as a {kind!r} record")
    if LEGACY_VERSION_KEY in record:
        raise RecordError(
            f"a {kind} record with {LEGACY_VERSION_KEY!r}, the version key of version 1, beside the current "
            f"version {CURRENT[kind]}: leave it out (the stamp is {VERSION_KEY!r})"
        )
    return {
        KIND_KEY: kind,
        VERSION_KEY: CURRENT[kind],
        **{k: v for k, v in record.items() if k not in (KIND_KEY, VERSION_KEY)},
    }


def write(path: str | os.PathLike, kind: str, record: dict) -> dict:
    """Write ``record`` as a ``kind`` record of the current version, atomically; returns what was written."""
    stamped = stamp(kind, record)
    write_json(path, stamped)
    return stamped


def _read(path: Path) -> dict:
    try:
        record = read_json(path)
    except json.JSONDecodeError as exc:
        raise RecordError(f"{path}: not a record: not JSON ({exc})") from exc
    except UnicodeDecodeError:
        raise RecordError(f"{path}: not a record: not text (a binary file, a GGUF model say)") from None
    if not isinstance(record, dict):
        raise RecordError(f"{path}: not a record: JSON {type(record).__name__}, not an object")
    return record


def _kind_of(path: Path, record: dict, expected: str | None) -> str:
    """The record's own kind; a record without one (search version 0) is taken to be the expected kind."""
    kind = record.get(KIND_KEY, expected)
    if kind is None:
        raise RecordError(f"{path}: the record names no kind, and none was expected (this code reads {supported()})")
    if expected is not None and kind != expected:
        raise RecordError(f"{path}: a {kind!r} record where a {expected!r} record was expected")
    if kind not in CURRENT:
        raise RecordError(f"{path}: unknown record kind {kind!r} (this code reads {supported()})")
    return kind


def _version_of(path: Path, record: dict, kind: str) -> int:
    version = record.get(VERSION_KEY, record.get(LEGACY_VERSION_KEY, 0))
    if not isinstance(version, int) or isinstance(version, bool) or version < 0:
        raise RecordError(f"{path}: {kind} record with version {version!r}, not a version number")
    if version > CURRENT[kind]:
        raise RecordError(
            f"{path}: {kind} record version {version} is newer than this code reads "
            f"({supported()}): read it with the crashline that wrote it, or a newer one"
        )
    if version < oldest(kind):
        raise RecordError(
            f"{path}: {kind} record version {version} is older than any this code upgrades "
            f"({supported()}): measure it again"
        )
    return version


def upgrade(kind: str, version: int, record: dict) -> dict:
    """``record``, a ``kind`` record of ``version``, as the current version (stamped)."""
    for step in range(version, CURRENT[kind]):
        record = UPGRADES[(kind, step)](record)
    return stamp(kind, record)


def load(path: str | os.PathLike, kind: str | None = None) -> dict[str, Any]:
    """Read a record, checking its kind (``kind``, when given, is the one expected) and version, and
    upgrading an older version to the current one. Refuses with a ``RecordError`` naming the file."""
    path = Path(path)
    record = _read(path)
    found = _kind_of(path, record, kind)
    return upgrade(found, _version_of(path, record, found), record)


def records_from(paths: list[Path]) -> list[Path]:
    """Measure record paths as they are; a search's summary stands for the records of its own probes (not for
    older records left in its folder by a search under other workloads or another budget)."""
    out = []
    for p in map(Path, paths):
        if p.name == SearchFolder.SUMMARY:
            out += [SearchFolder.of(p).probe(cid).measure for cid in load(p, "search")["records"]]
        else:
            out.append(p)
    return out


def needle_records_from(paths: list[Path]) -> list[Path]:
    """Needle record paths as they are; a search's recall check stands for the needle records of the candidates
    it tested."""
    out = []
    for p in map(Path, paths):
        if p.name == SearchFolder.RECALL:
            tested = load(p, "search_needle")["records"]
            out += [SearchFolder.of(p).candidate(cid).needle for cid in tested]
        else:
            out.append(p)
    return out
