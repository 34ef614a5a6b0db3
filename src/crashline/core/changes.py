"""What changed between two versions of a job's inputs, in words a user reads ("workloads.depth-2k.prompt_tokens
2048 → 1536"), where Snakemake's own rerun reason prints the whole spec as JSON."""

from __future__ import annotations

from typing import Any

MISSING = object()


def _flat(value: Any, path: str, out: dict[str, Any]) -> None:
    """Leaves by dotted path; a list of named entries (workloads, conversations) is keyed by each entry's name."""
    if isinstance(value, dict) and (value or not path):
        for k, v in value.items():
            _flat(v, f"{path}.{k}" if path else str(k), out)
    elif isinstance(value, list) and value and all(isinstance(v, dict) and "name" in v for v in value):
        for v in value:
            _flat({k: x for k, x in v.items() if k != "name"}, f"{path}.{v['name']}", out)
    else:
        out[path] = value


def _text(value: Any) -> str:
    return "(none)" if value is MISSING else repr(value) if isinstance(value, str) else str(value)


def what_changed(old: dict, new: dict, most: int = 6) -> list[str]:
    """Every leaf that differs, as "PATH OLD → NEW" ("(none)" where one side lacks it), at most ``most`` of them
    and then how many more."""
    a, b = {}, {}
    _flat(old, "", a)
    _flat(new, "", b)
    lines = [
        f"{key} {_text(a.get(key, MISSING))} → {_text(b.get(key, MISSING))}"
        for key in sorted(set(a) | set(b))
        if a.get(key, MISSING) != b.get(key, MISSING)
    ]
    return lines[:most] + ([f"and {len(lines) - most} more"] if len(lines) > most else [])
