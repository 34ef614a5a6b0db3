"""A table as three files side by side: Parquet (typed, nested values native), CSV (nested values as JSON
text, missing values empty) and JSON (a list of one object per row), for readers without Arrow: a
spreadsheet, ``jq``, a notebook. Each file is written atomically."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from ..core.atomic import atomic_path
from ..core.paths import table_files


def _plain(value):
    """A value JSON can hold: NaN (a float column's missing value) as None, nested values recursively."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _cell(value) -> str:
    if value is None:
        return ""
    return json.dumps(value, ensure_ascii=False) if isinstance(value, list | dict) else str(value)


def write(table: pa.Table, parquet_path: Path | str) -> None:
    parquet, csv_path, json_path = table_files(parquet_path)
    rows = [_plain(r) for r in table.to_pylist()]
    with atomic_path(parquet) as tmp:
        pq.write_table(table, tmp)
    with atomic_path(csv_path) as tmp, open(tmp, "w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(table.column_names)
        writer.writerows([_cell(r[c]) for c in table.column_names] for r in rows)
    with atomic_path(json_path) as tmp:
        tmp.write_text(json.dumps(rows, indent=1, ensure_ascii=False, allow_nan=False) + "\n")


def keys_of(parquet_path: Path | str) -> set[tuple[str, str]]:
    """The (model, config_id) pairs a table holds, read from those two columns alone."""
    t = pq.read_table(parquet_path, columns=["model", "config_id"])
    return set(zip(t.column("model").to_pylist(), t.column("config_id").to_pylist()))


def _column(values: list, kind: pa.DataType | None) -> pa.Array:
    """One column of a table. A scalar is cast safely (2.5 is no int64); lists and structs are built as
    their type; a column the registry does not name (a setting since removed) keeps its values' type."""
    if kind is None:
        return pa.array(values)
    if pa.types.is_nested(kind):
        return pa.array(values, type=kind)
    return pa.array(values).cast(kind)


def typed_table(rows: list[dict], types: dict[str, pa.DataType]) -> pa.Table:
    """The rows as a table of the registry's columns and types (every column, with no rows too)."""
    names = list(types) + [k for k in dict.fromkeys(k for row in rows for k in row) if k not in types]
    return pa.table({name: _column([row.get(name) for row in rows], types.get(name)) for name in names})
