"""Load and validate the workflow configuration; expand it into configurations with ids."""

from __future__ import annotations

import copy
import itertools
import json
import os
from pathlib import Path

from . import claims as claims_load
from ..core import settings as settings_mod
from ..core.paths import Layout
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
from .needle import DEFAULTS as NEEDLE_DEFAULTS
from .needle import needle_settings
from .source import SourceError, parse_source
from .shape import resolve_shape

DEFAULT_CONFIG = "config/config.yaml"  # the demo run, relative to the working directory


def validate(config: dict, schema: dict) -> dict:
    """Validate against the schema, fill defaults, check each key, then the keys against each other."""
    lines = schema_errors(config, schema, "config key")
    if len(lines) == 1:
        raise ConfigError(lines[0])  # one problem, one line
    if lines:
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(lines))
    config = fill_defaults(schema, copy.deepcopy(config))
    _check_models(config)
    _check_settings(config)
    config = _places(config)
    _check_places(config)
    config = _add_claim_workloads(config)
    _check_references(config)
    return config


def _add_claim_workloads(config: dict) -> dict:
    """Workloads the claims files need that the config lacks (none where the sweep's match them)."""
    claims = claims_load.load_claims(config.get("claims") or [], config)
    config["workloads"] = config["workloads"] + claims_load.claim_workloads(claims, config["workloads"])
    return config


# -- each key on its own -------------------------------------------------------------------------


def _check_models(config: dict) -> None:
    """Every source parses (source_spec.parse_source) and every synthetic shape resolves."""
    for name, model in config["models"].items():
        source = model["source"]
        try:
            kind = parse_source(source)["kind"]
        except SourceError as exc:
            why = str(exc).removeprefix(f"model source {source!r}: ")
            raise ConfigError(f"config key models.{name}.source = {source!r}: {why}") from None
        if "synthetic" in model:
            _check_shape(f"models.{name}", kind, model["synthetic"], parse_source(source).get("name"))


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
            for j, value in enumerate(values):
                yield f"configurations.{i}.grid.{name}.{j}", name, value


def _check_settings(config: dict) -> None:
    """Every setting where it is written: defaults, configurations.N.settings, configurations.N.grid."""
    try:
        for key, name, value in _written_settings(config):
            check_setting(key, name, value, config["models"])
    except settings_mod.SettingsError as exc:
        raise ConfigError(f"config key {exc}") from None
    known = config["models"]
    for i, entry in enumerate(config["configurations"]):
        for name in entry.get("models", []):
            if name not in known:
                raise ConfigError(
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


def _check_places(config: dict) -> None:
    """results_dir can be written; server.binary is not a directory or a file that cannot run.

    Spaces and shell characters in paths are fine: paths never pass through a shell unquoted."""
    why = _unwritable(Path(config["results_dir"]))
    if why:
        raise ConfigError(
            f"config key results_dir = {config['results_dir']!r}: cannot write there: {why}; "
            "choose a folder this user can write"
        )
    merged = [Path(f).resolve() for f in config.get("merge_results") or []]
    for i, folder in enumerate(config.get("merge_results") or []):
        if merged.index(merged[i]) != i:
            raise ConfigError(f"config key merge_results.{i} = {folder!r} is listed twice; keep one")
        if not (Path(folder) / "records").is_dir():
            raise ConfigError(
                f"config key merge_results.{i} = {folder!r}: no crashline results there (no records/ folder); "
                "give the results folder of another run, as its results_dir"
            )
        if Path(folder).resolve() == Path(config["results_dir"]).resolve():
            raise ConfigError(f"config key merge_results.{i} = {folder!r} is this run's own results_dir")
    against = config.get("recheck", {}).get("against")
    if against is not None:
        tables = Layout(against)
        if not (tables.configs_table().is_file() and tables.measurements_table().is_file()):
            raise ConfigError(
                f"config key recheck.against = {against!r}: no crashline tables there ({tables.measurements_table()} "
                "is missing); give the results folder of an earlier run whose report was made"
            )
        if Path(against).resolve() == Path(config["results_dir"]).resolve():
            raise ConfigError(f"config key recheck.against = {against!r} is this run's own results_dir; give another")
    binary = config["server"].get("binary")
    why = _server_binary_problem(binary) if binary else None
    if why:
        raise ConfigError(f"config key server.binary = {binary!r}: {why}")


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
    entries = list(_resolved_entries(config))  # every combination resolves (ubatch <= batch, fit alone)
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


def _resolved_entries(config: dict):
    """(entry index, resolved settings) of every grid point of every entry, searches included."""
    for searches in (False, True):
        for i, _, given in _combinations(config, searches):
            if searches:
                given = {k: v for k, v in given.items() if k != "n_cpu_moe"}
            yield i, _resolve(i, given)


def _from_claims(workload: dict) -> bool:
    """A workload a claims file added (named as claims_load.claim_workloads names them): it runs as published."""
    return workload["name"] == claims_load.workload_name(workload)


def _check_concurrency(workloads: list[dict], entries: list[tuple[int, dict]]) -> None:
    """A workload sends no more requests at once than every configuration has slots."""
    for j, w in enumerate(workloads):
        n = w.get("concurrency", 1)
        if n == "slots" or _from_claims(w):
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


def load(path: str | os.PathLike) -> dict:
    path = Path(path)
    raw = read_yaml(path, "configuration file")
    if not isinstance(raw, dict):
        raise ConfigError(
            f"configuration file {path} must hold a mapping of keys (models, configurations, "
            f"workloads, ...), got {type(raw).__name__}"
        )
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
    """Every (model, group) whose n_cpu_moe is searched; the group id hashes the other settings and the range,
    not ``climb`` and ``starts``, which the group carries (changing them reruns the search; it reuses its records)."""
    out = {}
    for i, entry, given in _combinations(config, searches=True):
        given = {k: v for k, v in given.items() if k != "n_cpu_moe"}
        lo, hi = entry["search"]["n_cpu_moe"]
        how = {k: entry["search"][k] for k in ("climb", "starts") if k in entry["search"]}
        if lo > hi:
            raise ConfigError(
                f"config key configurations.{i}.search.n_cpu_moe = {[lo, hi]!r}: the range is "
                f"[LOW, HIGH] and {lo} is above {hi}; write {[hi, lo]!r}"
            )
        resolved = _resolve(i, given)
        for model in entry.get("models") or list(config["models"]):
            gid = settings_mod.config_id(model, {**resolved, "n_cpu_moe": None}, f"search n_cpu_moe {lo}..{hi}")
            group = {"model": model, "id": gid, "given": given, "range": [lo, hi], **how}
            if out.setdefault((model, gid), group) != group:
                raise ConfigError(
                    f"config key configurations.{i}.search: an earlier entry searches the same range with the same "
                    f"settings for model {model!r}, with another climb or starts; keep one of them"
                )
    return list(out.values())


def expand(config: dict) -> list[dict]:
    """Every (model, configuration) the config asks for, resolved, with ids; duplicates once.

    Each item: {"model", "id", "settings" (resolved), "given" (what the config wrote)}. A configuration
    with ``fit: on`` gets ``fit_target`` (budget.margin_mib) and ``fit_ctx`` (its ctx) in its settings unless
    it sets them (settings.aim_fit); they are not in "given", so a build without those flags leaves them out.
    Entries with a ``search`` are not here: see expand_searches. The rows of the claims files
    come last, one configuration each: a row identical to a sweep configuration has its id, and
    is measured once, by the same job.
    """
    seen: dict[tuple[str, str], dict] = {}
    margin = config.get("budget", {}).get("margin_mib")
    for i, entry, given in _combinations(config, searches=False):
        resolved = settings_mod.aim_fit(_resolve(i, given), margin)  # fit on aims at the margin, at ctx
        for model in entry.get("models") or list(config["models"]):
            cid = settings_mod.config_id(model, resolved)
            seen.setdefault((model, cid), {"model": model, "id": cid, "settings": resolved, "given": given})
    for item in claims_load.claim_configurations(claims_load.load_claims(config.get("claims") or [], config)):
        entry = {"model": item["model"], "id": item["id"], "settings": item["resolved"], "given": item["settings"]}
        seen.setdefault((item["model"], item["id"]), entry)
    return list(seen.values())


_PLANS: dict[str, dict] = {}  # a config's canonical text -> its plan (``_plan``): a few configs per process at most


def _plan(config: dict) -> dict:
    """The config's configurations and searches by (model, id), and which configuration's recall stands for each
    (``needle_twin``), worked out once per config: every job's spec is looked up here, so building the specs of a
    401-configuration grid expands it once, not once per job."""
    key = json.dumps(config, sort_keys=True, default=str)
    plan = _PLANS.get(key)
    if plan is None:
        items = {(i["model"], i["id"]): i for i in expand(config)}
        first: dict[tuple, str] = {}
        twins = {}
        for (model, cid), item in items.items():
            served = (model, json.dumps(settings_mod.server_args(item["settings"])))
            twin = first.setdefault(served, cid)
            twins[(model, cid)] = None if twin == cid else twin
        searches = {(g["model"], g["id"]): g for g in expand_searches(config)}
        if len(_PLANS) >= 8:
            _PLANS.clear()
        plan = _PLANS[key] = {"items": items, "twins": twins, "searches": searches}
    return plan


def find_search(config: dict, model: str, gid: str) -> dict:
    group = _plan(config)["searches"].get((model, gid))
    if group is None:
        raise ConfigError(f"no search {gid!r} for model {model!r} in this config (run `python -m crashline plan`)")
    return copy.deepcopy(group)


def find(config: dict, model: str, cid: str) -> dict:
    item = _plan(config)["items"].get((model, cid))
    if item is None:
        raise ConfigError(
            f"no configuration {cid!r} for model {model!r} in this config (run `python -m crashline plan`)"
        )
    return copy.deepcopy(item)


def needle_twin(config: dict, model: str, cid: str) -> str | None:
    """The configuration whose recall stands for ``cid``'s: the first of the same model whose llama-server runs
    with the same arguments (they differ only in what crashline does around the server, such as the page cache
    before it starts, which cannot change what the model recalls); None where that is ``cid`` itself."""
    return _plan(config)["twins"][(model, cid)]


OBJECTIVE_METRICS = {
    "e2e_tps": "end-to-end t/s per request: its prompt and generated tokens over the whole time it took, as a user "
    "waits for it, so prefill and decode both count",
    "decode_tps": "decode t/s per request",
    "prefill_tps": "prefill t/s per request",
    "aggregate_tps": "generated t/s of all requests at once together",
}
OBJECTIVE_LIMITS = ("min_decode_tps", "max_ttft_s")  # limits per request, at the objective's load
DEFAULT_METRIC = "e2e_tps"  # the schema's default too (tests/test_config.py checks they agree)


def _parallels(config: dict) -> set[int]:
    """The slot counts (parallel) of every configuration: sweeps, searches and claims rows."""
    found = {resolved["parallel"] or 1 for _, resolved in _resolved_entries(config)}
    return found | {item["settings"]["parallel"] or 1 for item in expand(config)}


def _runs_at(workload: dict, n: int, parallels: set[int] | None) -> bool:
    """Whether some configuration runs ``workload`` with ``n`` requests at once (``parallels`` None: unknown, so a
    ``concurrency: slots`` workload may)."""
    sent = workload.get("concurrency", 1)
    return (parallels is None or n in parallels) if sent == "slots" else sent == n


def _longest(workloads: list[dict]) -> dict:
    """The longest workload of the config's own: a claims file's workload (its rows as published) is never the
    objective unless the user names it (a 100K-token row once made every configuration context_exceeded and the
    report recommend nothing)."""
    own = [w for w in workloads if not _from_claims(w)] or workloads
    return max(own, key=lambda w: (w["prompt_tokens"], w["gen_tokens"]))


def objective_workload(config: dict) -> str:
    """The workload whose speed decides: the configured one; else, with objective.concurrency N, the one with
    the longest prompt among those some configuration runs with N requests at once; else the longest prompt."""
    obj = config["objective"]
    if obj.get("workload"):
        return obj["workload"]
    n = obj.get("concurrency")
    if n is not None:
        parallels = _parallels(config) if "configurations" in config else None  # a bare {objective, workloads}
        candidates = [w for w in config["workloads"] if _runs_at(w, n, parallels)]
        if candidates:
            return _longest(candidates)["name"]
    return _longest(config["workloads"])["name"]


def resolve_objective(config: dict) -> dict:
    """The objective resolved: ``{metric, workload, concurrency, min_decode_tps, max_ttft_s}``, the keyword
    arguments of ``recommend.recommend``. ConfigError when its parts do not fit together.

    ``concurrency`` is the load the objective is measured under (requests at once). Unset, it is the
    workload's own concurrency when that is a number; for ``concurrency: slots`` it is 1 request at once,
    or the slot count every configuration shares. aggregate_tps and the per-request limits need it set."""
    obj = config["objective"]
    metric = obj.get("metric") or DEFAULT_METRIC
    if metric not in OBJECTIVE_METRICS:
        close = settings_mod.did_you_mean(metric, OBJECTIVE_METRICS, "")
        hint = (
            close
            if close.startswith("did you mean")
            else "expected one of " + ", ".join(f"{k} ({v})" for k, v in OBJECTIVE_METRICS.items())
        )
        raise ConfigError(f"config key objective.metric = {short_repr(metric)}: unknown metric; {hint}")
    n = obj.get("concurrency")
    if n is None:
        needs = [k for k in OBJECTIVE_LIMITS if obj.get(k) is not None] + (
            ["metric"] if metric == "aggregate_tps" else []
        )
        if needs:
            key = needs[0]
            what = "aggregate throughput" if key == "metric" else "a limit per request"
            raise ConfigError(
                f"config key objective.{key} = {short_repr(obj[key])}: {what} depends on how many requests run at "
                "once; set objective.concurrency to that number (e.g. concurrency: 4), with a workload that runs "
                "it (concurrency: 4, or concurrency: slots and a configuration with parallel: 4)"
            )
    parallels = _parallels(config)
    name = objective_workload(config)
    workload = next(w for w in config["workloads"] if w["name"] == name)
    sent = workload.get("concurrency", 1)
    given = "objective.workload" if obj.get("workload") else "the default objective workload (the longest prompt)"
    if n is not None and not _runs_at(workload, n, parallels):
        if obj.get("workload") is None:
            raise ConfigError(
                f"config key objective.concurrency = {n}: no workload runs {n} request(s) at once; add one with "
                f"concurrency: {n}, or concurrency: slots and a configuration with parallel: {n}"
            )
        runs = (
            f"sends one request per slot, and no configuration has parallel = {n} "
            f"(they have {', '.join(map(str, sorted(parallels)))})"
            if sent == "slots"
            else f"sends {sent} request(s) at once"
        )
        raise ConfigError(
            f"config key objective.concurrency = {n}: workload {name!r} {runs}; choose a workload that runs "
            f"{n} at once, or leave objective.workload unset to pick the longest that does"
        )
    if n is None and sent != "slots":
        n = sent
    elif n is None:
        n = next(iter(parallels)) if len(parallels) == 1 else 1
        if n not in parallels:
            raise ConfigError(
                f"config key objective.concurrency: {given} {name!r} sends one request per slot, so the "
                f"configurations run it at {', '.join(map(str, sorted(parallels)))} requests at once, and those "
                "are not ranked against each other; set objective.concurrency to one of them"
            )
    return {
        "metric": metric,
        "workload": name,
        "concurrency": n,
        "min_decode_tps": obj.get("min_decode_tps"),
        "max_ttft_s": obj.get("max_ttft_s"),
    }


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


def check_flags(config: dict, supported: set[str] | None, build: str) -> None:
    """Every configuration's settings against the flags the server build knows (SettingsError if one lacks)."""
    for item in expand(config):
        settings_mod.for_binary(item["settings"], item["given"], supported, build)
    for group in expand_searches(config):
        given = {**group["given"], "n_cpu_moe": group["range"][1]}
        settings_mod.for_binary(settings_mod.resolve(given), given, supported, build)
