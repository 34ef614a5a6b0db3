"""Load and validate the workflow configuration; expand it into configurations with ids."""

from __future__ import annotations

import copy
import itertools
import os
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from . import settings as settings_mod

SCHEMA_NAME = "schema.yaml"
DEFAULT_CONFIG = "config/config.yaml"  # the demo run, relative to the working directory
DATA = Path(__file__).parent / "data"


class ConfigError(ValueError):
    """The configuration is invalid; the message names the key and the bad value."""


def load_schema(name: str = SCHEMA_NAME) -> dict:
    """A schema shipped inside the package (so a wheel has it too)."""
    return yaml.safe_load((DATA / name).read_text())


def _fill_defaults(schema: dict, instance: Any) -> Any:
    """Fill ``default`` values from the schema into ``instance`` (objects and array items)."""
    if isinstance(instance, dict):
        for key, sub in schema.get("properties", {}).items():
            if key not in instance and "default" in sub:
                instance[key] = copy.deepcopy(sub["default"])
            if key in instance:
                instance[key] = _fill_defaults(sub, instance[key])
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for key in instance:
                if key not in schema.get("properties", {}):
                    instance[key] = _fill_defaults(extra, instance[key])
    elif isinstance(instance, list) and isinstance(schema.get("items"), dict):
        return [_fill_defaults(schema["items"], item) for item in instance]
    return instance


def _key_path(error: jsonschema.ValidationError) -> str:
    parts = [str(p) for p in error.absolute_path]
    return ".".join(parts) if parts else "(top level)"


def schema_errors(instance, schema: dict, prefix: str) -> list[str]:
    """One line per schema violation, naming the key and the bad value."""
    validator = jsonschema.Draft202012Validator(schema)
    lines = []
    for e in sorted(validator.iter_errors(instance), key=lambda e: list(e.absolute_path)):
        if e.validator == "additionalProperties":
            lines.append(f"{prefix} {_key_path(e)}: {e.message}")
        else:
            lines.append(f"{prefix} {_key_path(e)} = {e.instance!r}: {e.message}")
    return lines


def validate(config: dict, schema: dict) -> dict:
    """Validate against the schema, fill defaults, then check cross references."""
    lines = schema_errors(config, schema, "config key")
    if lines:
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(lines))
    config = _fill_defaults(schema, copy.deepcopy(config))
    config = _add_claim_workloads(config)
    _check_references(config)
    return config


def _add_claim_workloads(config: dict) -> dict:
    """Workloads the claims files need that the config lacks (none where the sweep's match them)."""
    from . import claims as claims_mod

    claims = claims_mod.load_claims(config.get("claims") or [], config)
    config["workloads"] = config["workloads"] + claims_mod.claim_workloads(claims, config["workloads"])
    return config


def _check_references(config: dict) -> None:
    models = set(config["models"])
    for i, entry in enumerate(config["configurations"]):
        for name in entry.get("models", []):
            if name not in models:
                raise ConfigError(
                    f"config key configurations.{i}.models: unknown model {name!r}; "
                    f"models are {', '.join(sorted(models))}"
                )
    names = [w["name"] for w in config["workloads"]]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigError(f"config key workloads: duplicate workload name(s) {', '.join(dupes)}")
    objective = config["objective"].get("workload")
    if objective is not None and objective not in names:
        raise ConfigError(f"config key objective.workload = {objective!r}: no such workload; workloads are {', '.join(names)}")
    for name, model in config["models"].items():
        if "synthetic" in model and not model["source"].startswith("synthetic:"):
            raise ConfigError(f"config key models.{name}.synthetic: only synthetic: sources take a shape")
    if "needle" in config:
        from .needle import needle_settings

        try:
            needle_settings(config)  # fractions in (0, 1], token counts >= 64, required among the lengths
        except ValueError as exc:
            raise ConfigError(f"config key needle: {exc}") from None
    for cfg in expand(config):
        draft = cfg["settings"].get("draft_model")
        if draft is not None and draft not in models:
            raise ConfigError(f"setting draft_model = {draft!r} in a configuration of {cfg['model']}: no such model")


def read_yaml(path: Path, what: str, error: type[ConfigError] = ConfigError) -> Any:
    """A YAML file's content; a missing or malformed file raises ``error`` naming ``what`` and the path."""
    try:
        return yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise error(f"{what} not found: {path}") from None
    except yaml.YAMLError as exc:
        raise error(f"{what} {path} is not valid YAML: {exc}") from None


def load(path: str | os.PathLike) -> dict:
    path = Path(path)
    raw = read_yaml(path, "configuration file")
    if not isinstance(raw, dict):
        raise ConfigError(f"configuration file {path} must hold a mapping, got {type(raw).__name__}")
    return validate(raw, load_schema())


def cache_dir(config: dict) -> Path:
    configured = config.get("cache_dir") or os.environ.get("CRASHLINE_CACHE")
    return Path(configured or Path.home() / ".cache" / "crashline").expanduser()


def _combinations(config: dict, searches: bool):
    """(entry index, entry, given settings) for every grid point of the entries with or without a search."""
    base = config.get("defaults", {})
    for i, entry in enumerate(config["configurations"]):
        if bool(entry.get("search")) is not searches:
            continue
        grid = entry.get("grid", {})
        names = list(grid)
        for combo in itertools.product(*(grid[n] for n in names)):
            yield i, entry, {**base, **entry.get("settings", {}), **dict(zip(names, combo))}


def _resolve(i: int, given: dict) -> dict:
    try:
        return settings_mod.resolve(given)
    except settings_mod.SettingsError as exc:
        raise ConfigError(f"config key configurations.{i}: {exc}") from None


def expand_searches(config: dict) -> list[dict]:
    """Every (model, group) whose n_cpu_moe is searched; the group id hashes the other settings and the range."""
    out = {}
    for i, entry, given in _combinations(config, searches=True):
        given = {k: v for k, v in given.items() if k != "n_cpu_moe"}
        lo, hi = entry["search"]["n_cpu_moe"]
        if lo > hi:
            raise ConfigError(f"config key configurations.{i}.search.n_cpu_moe = {[lo, hi]!r}: low is above high")
        resolved = _resolve(i, given)
        for model in entry.get("models") or list(config["models"]):
            gid = settings_mod.config_id(model, {**resolved, "n_cpu_moe": None, "search": [lo, hi]})
            out.setdefault((model, gid), {"model": model, "id": gid, "given": given, "range": [lo, hi]})
    return list(out.values())


def expand(config: dict) -> list[dict]:
    """Every (model, configuration) the config asks for, resolved, with ids; duplicates once.

    Each item: {"model", "id", "settings" (resolved), "given" (what the config wrote)}.
    Entries with a ``search`` are not here: see expand_searches. The rows of the claims files
    come last, one configuration each: a row identical to a sweep configuration has its id, and
    is measured once, by the same job.
    """
    from . import claims as claims_mod

    seen: dict[tuple[str, str], dict] = {}
    for i, entry, given in _combinations(config, searches=False):
        resolved = _resolve(i, given)
        for model in entry.get("models") or list(config["models"]):
            cid = settings_mod.config_id(model, resolved)
            seen.setdefault((model, cid), {"model": model, "id": cid, "settings": resolved, "given": given})
    for item in claims_mod.claim_configurations(claims_mod.load_claims(config.get("claims") or [], config)):
        seen.setdefault((item["model"], item["id"]),
                        {"model": item["model"], "id": item["id"], "settings": item["resolved"], "given": item["settings"]})
    return list(seen.values())


def find_search(config: dict, model: str, gid: str) -> dict:
    for group in expand_searches(config):
        if group["model"] == model and group["id"] == gid:
            return group
    raise ConfigError(f"no search {gid!r} for model {model!r} in this config (run `python -m crashline plan`)")


def find(config: dict, model: str, cid: str) -> dict:
    for item in expand(config):
        if item["model"] == model and item["id"] == cid:
            return item
    raise ConfigError(f"no configuration {cid!r} for model {model!r} in this config (run `python -m crashline plan`)")


def objective_workload(config: dict) -> str:
    """The workload whose speed decides: the configured one, else the one with the longest prompt."""
    if config["objective"].get("workload"):
        return config["objective"]["workload"]
    return max(config["workloads"], key=lambda w: (w["prompt_tokens"], w["gen_tokens"]))["name"]


def plan_lines(config: dict) -> list[str]:
    """What a run measures: each configuration and search with its id and llama-server arguments."""
    items, searches = expand(config), expand_searches(config)
    lines = [f"{item['model']:<20} {item['id']}  {settings_mod.label(item['settings'])}" for item in items]
    for group in searches:
        lo, hi = group["range"]
        lines.append(f"{group['model']:<20} {group['id']}  search --n-cpu-moe {lo}..{hi} with {group['given']}")
    models = sorted({i["model"] for i in items} | {g["model"] for g in searches})
    lines.append(f"{len(models)} model(s) ({', '.join(models)}), {len(items)} configuration(s), "
                 f"{len(searches)} search(es), workloads {', '.join(w['name'] for w in config['workloads'])}")
    return lines


def check_flags(config: dict, supported: set[str] | None, build: str) -> None:
    """Every configuration's settings against the flags the server build knows (SettingsError if one lacks)."""
    for item in expand(config):
        settings_mod.for_binary(item["settings"], item["given"], supported, build)
    for group in expand_searches(config):
        given = {**group["given"], "n_cpu_moe": group["range"][1]}
        settings_mod.for_binary(settings_mod.resolve(given), given, supported, build)
