"""Load the workflow configuration, validated (``validate``), and what a run of it holds; the config's names are
read from here (``expand``, ``file``, ``validate``)."""

from __future__ import annotations

import os
from pathlib import Path

from .file import (  # noqa: F401 - the config's own names: callers read them from here
    DATA,
    SCHEMA_NAME,
    ConfigError,
    check_setting,
    fill_defaults,
    load_schema,
    read_yaml,
    schema_errors,
    short_repr,
)
from .expand import (  # noqa: F401 - as above
    DEFAULT_METRIC,
    OBJECTIVE_LIMITS,
    OBJECTIVE_METRICS,
    cache_dir,
    expand,
    expand_searches,
    find,
    find_search,
    kv_label,
    kv_labels,
    kv_quality_job,
    needle_twin,
    objective_workload,
    recall_as_measured,
    resolve_objective,
)
from .validate import check_flags, validate  # noqa: F401 - as above
from ..core import settings as settings_mod


DEFAULT_CONFIG = "config/config.yaml"  # the demo run, relative to the working directory


def load(path: str | os.PathLike) -> dict:
    path = Path(path)
    raw = read_yaml(path, "configuration file")
    if not isinstance(raw, dict):
        raise ConfigError(
            f"configuration file {path} must hold a mapping of keys (models, configurations, "
            f"workloads, ...), got {type(raw).__name__}"
        )
    return validate(raw, load_schema())


def plan_lines(config: dict) -> list[str]:
    """What a run measures: each configuration and search with its id and llama-server arguments."""
    items, searches = expand(config), expand_searches(config)
    lines = [f"{item['model']:<20} {item['id']}  {settings_mod.label(item['settings'])}" for item in items]
    for group in searches:
        lo, hi = group["range"]
        lines.append(f"{group['model']:<20} {group['id']}  search --n-cpu-moe {lo}..{hi} with {group['given']}")
    models = sorted({i["model"] for i in items} | {g["model"] for g in searches})
    lines.append(
        f"{len(models)} model(s) ({', '.join(models)}), {len(items)} configuration(s), "
        f"{len(searches)} search(es), workloads {', '.join(w['name'] for w in config['workloads'])}"
    )
    return lines
