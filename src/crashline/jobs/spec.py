"""One contract per server job (measure, needle, search, search_needle): a spec built once from the config.

The spec holds everything the job reads besides its input files, and nothing else: a frozen dataclass per job
(``measure.MeasureSpec``, ``needle.NeedleSpec``, ``needle.SearchNeedleSpec``, ``search.SearchSpec``, each beside its
job) made of typed parts (``jobs.contract``), whose ``run`` runs the job. The builders below (``spec`` and the four
``*_spec``) are the only place that reads the validated config for a job. The workflow passes the spec as the
rule's ``params`` (``to_json``: Snakemake reruns the job exactly when it changes) and the job reads it back
(``from_json``) instead of the config; ``python -m crashline VERB`` builds the same spec from the config file. Both
call the spec's ``run`` with the input records and explicit paths: the two entry points cannot drift apart.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from ..config import plan
from ..config.file import ConfigError
from ..core.atomic import read_json
from .contract import (
    Budget,
    Item,
    JobInputs,
    Measurement,
    ModelSource,
    NeedleGrid,
    Objective,
    Recall,
    SearchGroup,
    ServerLimits,
    Soak,
    Telemetry,
)
from .measure import MeasureSpec
from .needle import NeedleSpec, SearchNeedleSpec
from .search import SearchSpec


JobSpec = MeasureSpec | NeedleSpec | SearchSpec | SearchNeedleSpec
KINDS: dict[str, type] = {k.job: k for k in (MeasureSpec, NeedleSpec, SearchSpec, SearchNeedleSpec)}


def to_json(job_spec: JobSpec) -> str:
    """The spec as the rule's params value: canonical JSON (the job's name beside its fields, an absent twin left
    out), so equal specs are equal strings and a spec written before the classes reads the same."""
    return json.dumps({"job": job_spec.job, **job_spec.to_dict()}, sort_keys=True, separators=(",", ":"))


def from_json(text: str) -> JobSpec:
    """A spec back from ``to_json``'s text (``--spec``); ConfigError naming what is wrong with it."""

    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--spec: not JSON ({exc}); give the text the workflow passes (`crashline plan`)") from None
    kind = KINDS.get(raw.pop("job", None)) if isinstance(raw, dict) else None
    if kind is None:
        raise ConfigError(f"--spec: no job of {', '.join(KINDS)} named in it; give the text the workflow passes")
    optional = {NeedleSpec: {"twin"}, MeasureSpec: {"start"}}.get(kind, set())
    unknown, lacking = sorted(set(raw) - set(kind.KEYS) - optional), sorted(set(kind.KEYS) - set(raw))
    if unknown or lacking:
        said = "; ".join([*(f"unknown key {k!r}" for k in unknown), *(f"no {k!r}" for k in lacking)])
        raise ConfigError(f"--spec of a {kind.job} job: {said}; give the text the workflow passes")
    try:
        return kind.from_dict(raw)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ConfigError(
            f"--spec of a {kind.job} job: {type(exc).__name__}: {exc}; give the text the workflow passes"
        ) from None


def _server(config: dict) -> ServerLimits:
    server = config["server"]
    return ServerLimits(server["startup_timeout_s"], server["request_timeout_s"], server["stop_timeout_s"])


def _budget(config: dict) -> Budget:
    """The budget a server runs under: the card it emulates, not the margin."""
    budget = config["budget"]
    return Budget(budget["vram_budget_mib"], budget["host_ram_mib"])


def _soak(config: dict) -> Soak | None:
    """The soak as a server runs it, None without one (no requests)."""
    soak = config["soak"]
    if not soak["requests"]:
        return None
    return Soak(soak["requests"], soak["duration_s"], soak["prompt_tokens"], soak["gen_tokens"], soak["at_once"])


def _recall(config: dict, model: str) -> Recall:
    """What a recall check reads of the config: the model's entry, server limits, the budget, the needle grid."""
    from ..config.needle import needle_settings

    return Recall(
        ModelSource(**config["models"][model]), _server(config), _budget(config), NeedleGrid.of(needle_settings(config))
    )


def measure_spec(config: dict, model: str, cid: str, start: int = 1) -> MeasureSpec:
    """What a measurement reads: the configuration, the workloads and how they are run, and which of the
    configuration's server starts it is."""
    item = plan.find(config, model, cid)
    starts = item.get("starts", 1)
    if not 1 <= start <= starts:
        raise ConfigError(
            f"measure --start {start}: configuration {cid} of {model} has {starts} server start(s) (its entry's key "
            f"starts); give a start from 2 to {starts}, or raise the entry's starts to {max(start, 2)}"
        )
    if config.get("time_limit_s") and starts > 1:  # its later starts are optional
        item = {**item, "time_limit_s": config["time_limit_s"]}
    return MeasureSpec(model, Item.of(item), measurement_of(config, cid), start)


def search_spec(config: dict, model: str, gid: str) -> SearchSpec:
    """What a search reads: the group (settings, range, climb and starts, the margin, and the objective its climb
    and finalists are ranked by) and what each probe's server runs."""
    group = plan.find_search(config, model, gid)
    group = {**group, "margin_mib": config["budget"]["margin_mib"]}
    if group.get("climb"):
        group["objective"] = search_objective(config).as_dict()
    if config.get("time_limit_s"):
        group["time_limit_s"] = config["time_limit_s"]
    return SearchSpec(model, SearchGroup.of(group), measurement_of(config))


def search_objective(config: dict) -> Objective:
    """The objective block with its workload resolved (the metric, the workload, and the per-request limits, which
    the search's ranking honours)."""
    block = config["objective"]
    metric = block.get("metric") or plan.DEFAULT_METRIC
    return Objective(**{**block, "metric": metric, "workload": plan.objective_workload(config)})


def needle_spec(config: dict, model: str, cid: str) -> NeedleSpec:
    """What a recall check reads: the configuration (one check, however often it is measured), what a recall check
    reads of the config, and the configuration whose recall stands for it (the same llama-server arguments), if
    any."""
    item = dataclasses.replace(Item.of(plan.find(config, model, cid)), starts=1)
    return NeedleSpec(model, item, _recall(config, model), plan.needle_twin(config, model, cid))


def search_needle_spec(config: dict, model: str, gid: str) -> SearchNeedleSpec:
    """What a search's recall check reads: the group's id, the objective its candidates are ordered by, the margin,
    and what a recall check reads of the config."""
    draft = plan.find_search(config, model, gid)["given"].get("draft_model")
    return SearchNeedleSpec(
        model, gid, search_objective(config), config["budget"]["margin_mib"], _recall(config, model), draft
    )


def workloads_of(config: dict, cid: str | None) -> tuple[dict, ...]:
    """The workloads configuration ``cid`` runs (a search's probes: None): those without ``configs`` and those whose
    ``configs`` name it (a claims file's, for its rows' configurations), as the server runs them (without the key)."""
    return tuple(
        {k: v for k, v in w.items() if k != "configs"}
        for w in config["workloads"]
        if "configs" not in w or cid in w["configs"]
    )


def measurement_of(config: dict, cid: str | None = None) -> Measurement:
    return Measurement(
        server=_server(config),
        workloads=workloads_of(config, cid),
        repetitions=config["repetitions"],
        warmup_requests=config["warmup_requests"],
        budget=_budget(config),
        telemetry=Telemetry(config["telemetry"]["interval_s"]),
        conversations=tuple(config["conversations"]),
        soak=_soak(config),
    )


SPECS = {"measure": measure_spec, "search": search_spec, "needle": needle_spec, "search_needle": search_needle_spec}


def spec(job: str, config: dict, model: str, job_id: str, start: int = 1) -> JobSpec:
    """A job's spec; ``start``: which server start of a configuration a measure job is (1 for every other job)."""
    return SPECS[job](config, model, job_id, start) if start != 1 else SPECS[job](config, model, job_id)


def inputs(fetch: Path, manifest: Path, provenance: Path, draft_fetch: Path | None = None) -> JobInputs:
    """The input records a server job reads, from their paths."""
    return JobInputs(
        read_json(fetch),
        read_json(manifest),
        read_json(provenance),
        read_json(draft_fetch)["files"][0]["path"] if draft_fetch else None,
    )


def rivals(paths: list, gids: list[str]) -> tuple[dict, ...]:
    """The summaries of a pruned search's rivals (``config.expand.expand_searches``), from their paths. ConfigError
    where one was not run: the rival searches run first (the workflow orders them so)."""
    from ..config.file import ConfigError
    from ..core import records

    if len(paths) != len(gids):
        raise ConfigError(f"search rivals: {len(paths)} search.json given for the {len(gids)} rival(s) {gids}")
    missing = [str(p) for p in paths if not Path(p).is_file()]
    if missing:
        raise ConfigError(
            f"search rivals: no summary at {', '.join(missing)}: a search with prune runs after its model's searches "
            "listed before it; run them first (the workflow does), or drop prune"
        )
    return tuple(records.load(Path(p), "search") for p in paths)
