"""A validated config expanded: every configuration and search with its id, the one twin whose recall stands for
another's, the objective the recommendation ranks by, and where the cache is."""

from __future__ import annotations

import copy
import itertools
import json
import os
from pathlib import Path

from . import claims
from ..core import settings as settings_mod
from .file import (
    ConfigError,
    short_repr,
)


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


def resolved_entries(config: dict):
    """(entry index, resolved settings) of every grid point of every entry, searches included."""
    for searches in (False, True):
        for i, _, given in _combinations(config, searches):
            if searches:
                given = {k: v for k, v in given.items() if k != "n_cpu_moe"}
            yield i, _resolve(i, given)


def from_claims(workload: dict) -> bool:
    """A workload a claims file added (named as config.claims.claim_workloads names them): it runs as published."""
    return workload["name"] == claims.workload_name(workload)


def expand_searches(config: dict) -> list[dict]:
    """Every (model, group) whose n_cpu_moe is searched; the group id hashes the other settings and the range,
    not ``climb`` and ``starts``, which the group carries (changing them reruns the search; it reuses its records).
    A group whose search has ``prune`` carries ``rivals``: the ids of its model's groups listed before it, whose
    summaries it reads (``jobs.search``: it stops where it is clearly slower than their best)."""
    out = {}
    for i, entry, given in _combinations(config, searches=True):
        given = {k: v for k, v in given.items() if k != "n_cpu_moe"}
        lo, hi = entry["search"]["n_cpu_moe"]
        how = {k: entry["search"][k] for k in ("climb", "starts", "prune", "partial") if k in entry["search"]}
        if "starts" in entry:
            raise ConfigError(
                f"config key configurations.{i}.starts = {entry['starts']!r}: an entry with a search starts its "
                "finalists search.starts times, not the entry's; move it to search.starts"
            )
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
                    f"settings for model {model!r}, with another climb, starts, prune or partial; keep one of them"
                )
    groups = list(out.values())
    for k, group in enumerate(groups):  # a pruned search runs after its model's searches listed before it
        if group.pop("prune", False):
            group["rivals"] = [g["id"] for g in groups[:k] if g["model"] == group["model"]]
    return groups


def expand(config: dict) -> list[dict]:
    """Every (model, configuration) the config asks for, resolved, with ids; duplicates once.

    Each item: {"model", "id", "settings" (resolved), "given" (what the config wrote)}, and "starts" where its
    entry asks for more than one server start (the most any entry listing it asks for; not in the id: the same
    server). A configuration with ``fit: on`` gets ``fit_target`` (budget.margin_mib) and ``fit_ctx`` (its ctx) in
    its settings unless it sets them (settings.aim_fit); they are not in "given", so a build without those flags
    leaves them out.
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
            item = seen.setdefault((model, cid), {"model": model, "id": cid, "settings": resolved, "given": given})
            if entry.get("starts", 1) > item.get("starts", 1):
                item["starts"] = entry["starts"]
    for item in claims.claim_configurations(claims.load_claims(config.get("claims") or [], config)):
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


def recall_as_measured(config: dict, model: str, cid: str) -> bool:
    """Whether ``cid``'s recall check runs at the settings its measurement settled on, read from its measure record:
    a --fit on aimed at the margin, whose --fit-target the measurement raises where a start's peak fell short
    (jobs.measure.measure_aimed). Its needle job waits for that record."""
    item = find(config, model, cid)
    return settings_mod.fit_aimed(item["settings"], item["given"])


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
    found = {resolved["parallel"] or 1 for _, resolved in resolved_entries(config)}
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
    own = [w for w in workloads if not from_claims(w)] or workloads
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


def kv_label(settings: dict) -> str | None:
    """A configuration's KV cache types as one label ("q8_0"; K then V where they differ: "q8_0-q4_0"), None for
    f16 K and V, the reference the others are measured against (``jobs.kvquality``)."""
    k, v = (settings.get(f"cache_type_{x}") or "f16" for x in "kv")
    if k == v == "f16":
        return None
    return k if k == v else f"{k}-{v}"


def kv_labels(config: dict) -> dict[str, list[str]]:
    """Per model, the quantised KV cache types its configurations and searches use, in the config's order: each
    gets its KL divergence against f16 measured (``kv_quality``)."""
    out: dict[str, list[str]] = {}
    every = [(i["model"], i["settings"]) for i in expand(config)]
    every += [(g["model"], settings_mod.resolve(g["given"])) for g in expand_searches(config)]
    for model, settings in every:
        label = kv_label(settings)
        if label and label not in out.setdefault(model, []):
            out[model].append(label)
    return {model: labels for model, labels in out.items() if labels}


def kv_quality_job(config: dict) -> dict:
    """What a kv_quality job reads of the config besides its model and KV type: the context of both passes (the
    objective workload's prompt, at most kv_quality.max_ctx)."""
    prompt = next(w for w in config["workloads"] if w["name"] == objective_workload(config))["prompt_tokens"]
    return {"prompt_tokens": prompt, "max_ctx": config["kv_quality"]["max_ctx"]}
