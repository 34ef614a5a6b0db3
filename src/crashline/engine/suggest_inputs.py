"""What the prediction (``engine.suggest``) reads, checked before it runs: a size or a list of ubatch sizes as a
user types them, the default margin, a calibration from a search record, and a model's manifest from a GGUF or a
manifest.json. Every error is a ``SuggestError`` naming the value and what to give instead."""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.errors import CrashlineError


class SuggestError(CrashlineError, ValueError):
    """Input the prediction cannot use; the message names the value and what to give instead."""


# -- input --------------------------------------------------------------------------------------------------------

_SIZE = re.compile(r"(?P<number>\d+(?:\.\d*)?|\.\d+)\s*(?P<unit>[A-Za-z]*)")
_UNITS = {"": 1, "m": 1, "mb": 1, "mib": 1, "g": 1024, "gb": 1024, "gib": 1024}
_SIZE_HELP = "write e.g. 24GiB, 24GB, 24576MiB or 24576 (MiB); GB is read as on the box: 24GB = 24,576 MiB"


def parse_size_mib(value: Any, what: str = "size", minimum: int = 1) -> int:
    """MiB from ``24GiB``, ``24GB``, ``24G``, ``24576MiB``, ``24576MB`` or ``24576`` (a bare number is MiB).

    GB is read as GiB, because a card sold as 24 GB reports 24 GiB (24,564 to 24,576 MiB) in ``nvidia-smi``, and
    MB as MiB (what ``nvidia-smi`` prints). Fractions are rounded down to whole MiB. ``what`` names the value in
    errors (``--vram``); ``minimum`` is the least MiB accepted (0 for a margin)."""
    if isinstance(value, bool) or value is None:
        raise SuggestError(f"{what} {value!r} is not a size; {_SIZE_HELP}")
    text = str(value).strip()
    m = _SIZE.fullmatch(text)
    if m is None:
        why = "is negative" if text.startswith("-") else "is not a size"
        raise SuggestError(f"{what} {value!r} {why}; {_SIZE_HELP}")
    unit = m["unit"].lower()
    if unit not in _UNITS:
        raise SuggestError(f"{what} {value!r} has an unknown unit {m['unit']!r}; {_SIZE_HELP}")
    mib = math.floor(float(m["number"]) * _UNITS[unit])
    if mib < minimum:
        raise SuggestError(f"{what} {value!r} is {mib} MiB, less than {minimum} MiB; {_SIZE_HELP}")
    return mib


def parse_ubatches(value: Any, what: str = "--ubatch") -> tuple[int, ...]:
    """Ubatch sizes from ``"512,2048"``, ``512`` or ``[512, 2048]``: positive integers, sorted, without repeats."""
    items = value.split(",") if isinstance(value, str) else value if isinstance(value, Iterable) else [value]
    out = []
    for item in items:
        text = str(item).strip()
        if isinstance(item, bool) or not text.isdigit() or int(text) < 1:
            raise SuggestError(f"{what} {value!r}: {item!r} is not a positive integer; write e.g. 512,2048")
        out.append(int(text))
    if not out:
        raise SuggestError(f"{what} {value!r} names no ubatch; write e.g. 512,2048")
    return tuple(sorted(set(out)))


@functools.cache
def default_margin_mib() -> int:
    """crashline's default budget margin (``budget.margin_mib`` in schema.yaml)."""
    from ..config.file import load_schema

    return int(load_schema()["properties"]["budget"]["properties"]["margin_mib"]["default"])


@dataclass(frozen=True)
class Calibration:
    """What one real server start measured: the compute buffer per ubatch (MiB), the rest (MiB), the context it
    ran with (None: unknown, taken to be the one predicted) and where it came from."""

    compute_mib: dict[int, float]
    rest_mib: float
    ctx: int | None = None
    source: str = "a calibration"


def _maybe_json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) and value[:1] in "{[" else value


def calibration_from(source: Any) -> Calibration:
    """A calibration from a search.json path, a search record, a searches-table row (a dict or a pandas row that
    has ``compute_mib`` and ``rest_mib``), a ``Calibration``, or ``{"compute_mib": {ubatch: MiB}, "rest_mib": MiB,
    "ctx": ctx}``."""
    if isinstance(source, Calibration):
        return source
    label = None
    if isinstance(source, (str, Path)):
        from ..core import records

        path = Path(source)
        if not path.is_file():
            what = "a folder" if path.is_dir() else "no such file"
            raise SuggestError(f"calibration {str(path)!r}: {what} (give a search.json a search wrote)")
        try:
            source, label = records.load(path, "search"), str(path)
        except records.RecordError as exc:
            raise SuggestError(f"calibration {exc}; give the search.json a search wrote") from None
    elif hasattr(source, "to_dict") and not isinstance(source, Mapping):
        source = source.to_dict()  # a pandas row
    if not isinstance(source, Mapping):
        raise SuggestError(f"calibration {source!r} is neither a search.json path nor a search record")
    missing = [k for k in ("compute_mib", "rest_mib") if source.get(k) is None]
    if missing:
        raise SuggestError(
            f"calibration {label or source.get('model', 'record')!r} has no {' or '.join(missing)}: give the "
            "search.json of a search (the searches table does not keep the compute buffer and the rest)"
        )
    compute = _maybe_json(source["compute_mib"])
    if isinstance(compute, list):  # [{"ubatch": .., "mib": ..}], as a table might keep it
        compute = {row["ubatch"]: row["mib"] for row in compute}
    try:
        compute = {int(u): float(mib) for u, mib in dict(compute).items()}
        rest = float(source["rest_mib"])
    except (TypeError, ValueError) as e:
        raise SuggestError(f"calibration {label or 'record'!r}: unreadable compute_mib or rest_mib ({e})") from None
    if not compute:
        raise SuggestError(f"calibration {label or 'record'!r}: compute_mib measures no ubatch")
    settings = _maybe_json(source.get("settings")) or {}
    ctx = settings.get("ctx") if isinstance(settings, Mapping) else None
    ctx = ctx if ctx is not None else source.get("s_ctx", source.get("ctx"))
    if label is None:
        label = f"search {source['model']}/{source['group']}" if "model" in source and "group" in source else "record"
    return Calibration(compute, rest, int(ctx) if ctx is not None else None, label)


def load_model(model: Any) -> dict:
    """The manifest of ``model``: a manifest dict (``manifest.inspect_gguf``), a manifest.json crashline wrote,
    or a GGUF file (read in seconds: metadata and tensor infos only; the first shard of a split model)."""
    if isinstance(model, Mapping):
        manifest = dict(model)
    else:
        path = Path(model)
        if path.is_dir():
            raise SuggestError(
                f"model {str(path)!r}: a folder; give the GGUF file in it (the first shard of a split model) or a "
                "manifest.json"
            )
        if not path.is_file():
            raise SuggestError(f"model {str(path)!r}: no such file (give a GGUF file or a manifest.json)")
        if path.suffix == ".json":
            manifest = json.loads(path.read_text())
        else:
            from ..models.manifest import inspect_gguf

            manifest = inspect_gguf(path)
    needed = ("layers", "per_layer", "output_bytes", "n_head_kv", "head_dim", "n_embd", "n_head")
    lacking = [k for k in needed if manifest.get(k) in (None, [])]
    if lacking or not manifest["layers"]:
        name = manifest.get("path") or manifest.get("name") or "the model"
        raise SuggestError(
            f"{name}: the manifest lacks {', '.join(lacking) or 'layers'}, so its VRAM cannot be predicted "
            f"(architecture {manifest.get('architecture')!r})"
        )
    return manifest


def model_name(manifest: dict) -> str:
    path = manifest.get("path")
    return Path(path).stem if path else manifest.get("name") or "the model"
