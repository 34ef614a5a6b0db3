"""A config checked whole before anything runs: the schema, then every rule the schema cannot say (each error
names the key, the value and the fix), and its settings against the flags of the server build."""

from __future__ import annotations

import copy
import os
from pathlib import Path

from .claims import claim_workloads, load_claims
from ..core import settings as settings_mod
from ..core.paths import Layout
from .file import (
    ConfigError,
    check_setting,
    fill_defaults,
    schema_errors,
    short_repr,
)
from .needle import DEFAULTS as NEEDLE_DEFAULTS
from .needle import needle_settings
from .source import SourceError, parse_source
from .shape import resolve_shape
from .expand import (
    from_claims,
    resolved_entries,
    cache_dir,
    expand,
    expand_searches,
    resolve_objective,
)


def validate(config: dict, schema: dict) -> dict:
    """Validate against the schema, fill defaults, check each key, then the keys against each other. Every problem
    of the schema and of each key on its own is said at once, each once; the keys against each other are checked
    once each key is right on its own (their errors would repeat the ones before)."""
    lines = schema_errors(config, schema, "config key")
    try:
        filled = fill_defaults(schema, copy.deepcopy(config))
    except (TypeError, AttributeError, KeyError):  # a mistyped block the schema has named
        filled = None
    if filled is not None:
        for check in (_check_models, _check_settings, _check_places):
            lines += [line for line in _problems(check, filled, schema_failed=bool(lines)) if line not in lines]
    if len(lines) == 1:
        raise ConfigError(lines[0])  # one problem, one line
    if lines:
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(lines))
    config = _add_claim_workloads(filled)
    _check_references(config)
    return config


def _problems(check, config: dict, schema_failed: bool) -> list[str]:
    """What one check of each key on its own finds: every line it yields, or the one it raised. Where the schema
    already failed, a check that trips over the mistyped value it named adds nothing."""
    found = []
    try:
        for line in check(config):
            found.append(line)
    except ConfigError as exc:
        found.append(str(exc))
    except (TypeError, AttributeError, KeyError, ValueError):
        if not schema_failed:
            raise
    return found


def _add_claim_workloads(config: dict) -> dict:
    """Workloads the claims files need that the config lacks (none where the sweep's match them)."""
    claims = load_claims(config.get("claims") or [], config)
    config["workloads"] = config["workloads"] + claim_workloads(claims, config["workloads"])
    return config


# -- each key on its own -------------------------------------------------------------------------


def _check_models(config: dict):
    """Every source parses (config.source.parse_source) and every synthetic shape resolves: a line per problem."""
    for name, model in config["models"].items():
        source = model["source"]
        try:
            kind = parse_source(source)["kind"]
        except SourceError as exc:
            why = str(exc).removeprefix(f"model source {source!r}: ")
            yield f"config key models.{name}.source = {source!r}: {why}"
            continue
        if "synthetic" in model:
            try:
                _check_shape(f"models.{name}", kind, model["synthetic"], parse_source(source).get("name"))
            except ConfigError as exc:
                yield str(exc)


def _check_shape(where: str, kind: str, shape: dict, preset: str | None) -> None:
    if kind != "synthetic":
        raise ConfigError(
            f"config key {where}.synthetic: only synthetic: sources take a shape; "
            f"remove it or make {where}.source synthetic:NAME"
        )
    options = dict(shape)
    seed = options.pop("seed", 0)  # as sources.fetch: the seed is not part of the shape
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ConfigError(f"config key {where}.synthetic.seed = {seed!r}: expected a non-negative integer")
    try:
        resolve_shape(options, preset)
    except ValueError as exc:
        key = getattr(exc, "key", None)
        if key is None:
            raise ConfigError(f"config key {where}.synthetic: {exc}") from None
        value = short_repr(options.get(key))
        raise ConfigError(f"config key {where}.synthetic.{key} = {value}: {exc.reason}") from None


def _written_settings(config: dict):
    """(key path, setting name, value) of every server setting the config writes."""
    for name, value in config.get("defaults", {}).items():
        yield f"defaults.{name}", name, value
    for i, entry in enumerate(config["configurations"]):
        for name, value in entry.get("settings", {}).items():
            yield f"configurations.{i}.settings.{name}", name, value
        for name, values in entry.get("grid", {}).items():
            if name not in settings_mod.SETTINGS:
                yield f"configurations.{i}.grid.{name}", name, values
                continue  # an unknown setting is said once, not once per value
            for j, value in enumerate(values):
                yield f"configurations.{i}.grid.{name}.{j}", name, value


def _check_settings(config: dict):
    """Every setting where it is written (defaults, configurations.N.settings, configurations.N.grid) and every model
    a configuration names: a line per problem."""
    for key, name, value in _written_settings(config):
        try:
            check_setting(key, name, value, config["models"])
        except settings_mod.SettingsError as exc:
            yield f"config key {exc}"
    known = config["models"]
    for i, entry in enumerate(config["configurations"]):
        for name in entry.get("models", []):
            if name not in known:
                yield (
                    f"config key configurations.{i}.models: unknown model {name!r}; "
                    f"{settings_mod.did_you_mean(name, sorted(known), 'models')}"
                )


PSEUDO_FILESYSTEMS = ("/proc", "/sys", "/dev")


def _unwritable(path: Path) -> str | None:
    """Why files cannot be written under ``path`` (created if need be), or None."""
    path = path.resolve()
    for root in map(Path, PSEUDO_FILESYSTEMS):
        if path == root or root in path.parents:
            return f"{path} is under {root}, a kernel file system, not a place for files"
    existing = path
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is a file, not a folder"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{existing} is not writable by this user" + ("" if existing == path else f", so {path} cannot be made")
    return None


def _server_binary_problem(value: str) -> str | None:
    """A server.binary that is certainly wrong (a missing one is provision's to report: it may be made later)."""
    path = Path(value).expanduser()
    if path.is_dir():
        return "it is a directory; give the llama-server executable itself (e.g. .../build/bin/llama-server)"
    if path.is_file() and not os.access(path, os.X_OK):
        mode = path.stat().st_mode & 0o777
        return f"it is not executable (mode {mode:o}); chmod +x it or give the llama-server executable"
    return None


def _places(config: dict) -> dict:
    """results_dir and cache_dir with ``~`` expanded, as a shell would (a folder named ``~`` is never meant); an
    empty results_dir, or one that is the cache or inside it (or holds it), is refused: results would spill into
    the folder the command runs in, or mix with models and builds that outlive any run."""
    results = config["results_dir"]
    if not results.strip():
        raise ConfigError("config key results_dir = '': empty; give a folder for records and reports (default results)")
    config["results_dir"] = os.path.expanduser(results)
    if config.get("cache_dir"):
        config["cache_dir"] = os.path.expanduser(config["cache_dir"])
    mine, cache = Path(config["results_dir"]).resolve(), cache_dir(config).resolve()
    if mine == cache or cache in mine.parents or mine in cache.parents:
        raise ConfigError(
            f"config key results_dir = {results!r} is {'the cache' if mine == cache else 'nested with the cache'} "
            f"({cache}); keep them apart: deleting results must not delete models and builds"
        )
    return config


def _check_places(config: dict):
    """results_dir (``~`` expanded, apart from the cache) can be written; merge_results and recheck.against are other
    runs' results; server.binary is not a directory or a file that cannot run: a line per problem.

    Spaces and shell characters in paths are fine: paths never pass through a shell unquoted."""
    _places(config)  # raises: every other place is judged against results_dir
    why = _unwritable(Path(config["results_dir"]))
    if why:
        yield (
            f"config key results_dir = {config['results_dir']!r}: cannot write there: {why}; "
            "choose a folder this user can write"
        )
    merged = [Path(f).resolve() for f in config.get("merge_results") or []]
    for i, folder in enumerate(config.get("merge_results") or []):
        if merged.index(merged[i]) != i:
            yield f"config key merge_results.{i} = {folder!r} is listed twice; keep one"
        elif not (Path(folder) / "records").is_dir():
            yield (
                f"config key merge_results.{i} = {folder!r}: no crashline results there (no records/ folder); "
                "give the results folder of another run, as its results_dir"
            )
        elif Path(folder).resolve() == Path(config["results_dir"]).resolve():
            yield f"config key merge_results.{i} = {folder!r} is this run's own results_dir"
    against = config.get("recheck", {}).get("against")
    if against is not None:
        tables = Layout(against)
        if not (tables.configs_table().is_file() and tables.measurements_table().is_file()):
            yield (
                f"config key recheck.against = {against!r}: no crashline tables there ({tables.measurements_table()} "
                "is missing); give the results folder of an earlier run whose report was made"
            )
        elif Path(against).resolve() == Path(config["results_dir"]).resolve():
            yield f"config key recheck.against = {against!r} is this run's own results_dir; give another"
    binary = config["server"].get("binary")
    why = _server_binary_problem(binary) if binary else None
    if why:
        yield f"config key server.binary = {binary!r}: {why}"


# -- the keys against each other -----------------------------------------------------------------


def _check_references(config: dict) -> None:
    """Workload and conversation names, the objective, every combination of settings, search ranges,
    concurrency, needle lengths."""
    names = [w["name"] for w in config["workloads"]]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigError(
            f"config key workloads: duplicate workload name(s) {', '.join(dupes)}; each workload needs its own name"
        )
    talks = [c["name"] for c in config["conversations"]]
    clash = sorted({n for n in talks if talks.count(n) > 1 or n in names})
    if clash:
        raise ConfigError(
            f"config key conversations: name(s) {', '.join(clash)} used twice among workloads and conversations; "
            "each needs its own name (it names its phases in records and reports)"
        )
    objective = config["objective"].get("workload")
    if objective is not None and objective not in names:
        raise ConfigError(
            f"config key objective.workload = {objective!r}: no such workload; "
            f"{settings_mod.did_you_mean(objective, names, 'workloads')}"
        )
    entries = list(resolved_entries(config))  # every combination resolves (ubatch <= batch, fit alone)
    expand_searches(config)  # every search range is LOW <= HIGH
    _check_concurrency(config["workloads"], entries)
    _check_scopes(config)
    resolve_objective(config)  # its load, limits and workload fit together and the configurations
    _check_needle(config)


def _check_scopes(config: dict) -> None:
    """A workload's ``configs`` name configurations of the plan: an id that none has would leave it unmeasured."""
    scoped = [(j, w) for j, w in enumerate(config["workloads"]) if "configs" in w]
    if not scoped:
        return
    known = {item["id"] for item in expand(config)}
    for j, w in scoped:
        for k, cid in enumerate(w["configs"]):
            if cid not in known:
                raise ConfigError(
                    f"config key workloads.{j}.configs.{k} = {cid!r}: no configuration has that id, so workload "
                    f"{w['name']!r} would run nowhere; `python -m crashline plan` lists the ids"
                )


def _check_concurrency(workloads: list[dict], entries: list[tuple[int, dict]]) -> None:
    """A workload sends no more requests at once than every configuration has slots."""
    for j, w in enumerate(workloads):
        n = w.get("concurrency", 1)
        if w.get("decode_from") == "resent" and n != 1:
            raise ConfigError(
                f"config key workloads.{j}.decode_from = 'resent': workload {w['name']!r} sends {n} request(s) at "
                "once, and a re-sent prompt is one request's; write `concurrency: 1` or `decode_from: fresh`"
            )
        if n == "slots" or from_claims(w):
            continue
        for i, resolved in entries:
            slots = resolved["parallel"] or 1
            if n > slots:
                raise ConfigError(
                    f"config key workloads.{j}.concurrency = {n}: workload {w['name']!r} sends {n} requests at once, "
                    f"but configurations.{i} has parallel = {slots} slot(s), so {n - slots} would wait in the queue; "
                    f"write `concurrency: slots` (one request per slot) or raise parallel to {n}"
                )


def _check_needle(config: dict) -> None:
    """needle_settings accepts the block; a token length given (not crashline's default) fits some configuration.

    A length that one configuration's context per slot cannot hold is that configuration's measured failure,
    as a workload longer than its context is; one that no configuration can hold is a mistake."""
    try:
        ns = needle_settings(config)  # fractions in (0, 1], token counts >= 64, required among the lengths
    except ValueError as exc:
        raise ConfigError(f"config key needle: {exc}") from None
    if ns["lengths"] == NEEDLE_DEFAULTS["lengths"]:
        return
    slots = [
        (s["ctx"] // (s["parallel"] or 1), s["ctx"], s["parallel"])
        for s in (item["settings"] for item in expand(config))
        if s["ctx"]
    ]
    if not slots:
        return
    largest, ctx, parallel = max(slots)
    room = largest - ns["gen_tokens"]
    for k, spec in enumerate(ns["lengths"]):
        if not isinstance(spec, float) and spec >= room:  # a float is a fraction of the context
            raise ConfigError(
                f"config key needle.lengths.{k} = {spec}: a prompt of {spec} tokens and the {ns['gen_tokens']}-token "
                f"answer fit no configuration; the largest context per slot is {largest} tokens (ctx {ctx}, "
                f"parallel {parallel}); give fewer than {room} tokens or a fraction of the context such as 0.9"
            )


def check_flags(config: dict, supported: set[str] | None, build: str) -> None:
    """Every configuration's settings against the flags the server build knows (SettingsError if one lacks)."""
    for item in expand(config):
        settings_mod.for_binary(item["settings"], item["given"], supported, build)
    for group in expand_searches(config):
        given = {**group["given"], "n_cpu_moe": group["range"][1]}
        settings_mod.for_binary(settings_mod.resolve(given), given, supported, build)
