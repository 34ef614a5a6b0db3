"""One contract per server job (measure, needle, search): a spec built once from the config.

The spec holds everything the job reads besides its input files, and nothing else. The workflow
passes it as the rule's ``params`` (so Snakemake reruns the job exactly when it changes) and the
job reads it back instead of the config; ``python -m crashline VERB`` builds the same spec from
the config file. Both call ``run`` with the spec and explicit paths: the two entry points cannot
drift apart.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from ..config import plan
from ..core.atomic import read_json

SERVER_LIMITS = ("startup_timeout_s", "request_timeout_s", "stop_timeout_s")


@dataclass(frozen=True)
class MeasureSpec:
    """What a measurement reads: the configuration (``item``: id, resolved settings, what the config wrote) and how
    its server runs (``config``: server limits, workloads, conversations, soak, repetitions, budget, telemetry)."""

    model: str
    item: dict
    config: dict
    job: ClassVar[str] = "measure"

    @property
    def id(self) -> str:
        return self.item["id"]


@dataclass(frozen=True)
class NeedleSpec:
    """What a recall check reads: the configuration, the model's source and prompt style, server limits, the budget
    and the needle grid (``config``); ``twin``: the configuration whose recall stands for this one's, if any."""

    model: str
    item: dict
    config: dict
    twin: str | None = None
    job: ClassVar[str] = "needle"

    @property
    def id(self) -> str:
        return self.item["id"]


@dataclass(frozen=True)
class SearchSpec:
    """What a search reads: the group (settings, range, climb, starts, the objective, the margin, ``rivals`` with
    prune) and what each probe reads (``config``, as a measurement's)."""

    model: str
    group: dict
    config: dict
    job: ClassVar[str] = "search"

    @property
    def id(self) -> str:
        return self.group["id"]


@dataclass(frozen=True)
class SearchNeedleSpec:
    """What a search's recall check reads: the group's id, the objective its candidates are ordered by, the margin,
    and what a needle job reads (``config``)."""

    model: str
    group: dict
    objective: dict
    margin_mib: int
    config: dict
    job: ClassVar[str] = "search_needle"

    @property
    def id(self) -> str:
        return self.group["id"]


JobSpec = MeasureSpec | NeedleSpec | SearchSpec | SearchNeedleSpec
KINDS: dict[str, type] = {k.job: k for k in (MeasureSpec, NeedleSpec, SearchSpec, SearchNeedleSpec)}


def to_json(job_spec: JobSpec) -> str:
    """The spec as the rule's params value: canonical JSON (the job's name beside its fields, an absent twin left
    out), so equal specs are equal strings and a spec written before the classes reads the same."""
    fields = {k: v for k, v in dataclasses.asdict(job_spec).items() if v is not None}
    return json.dumps({"job": job_spec.job, **fields}, sort_keys=True, separators=(",", ":"))


def from_json(text: str) -> JobSpec:
    """A spec back from ``to_json``'s text (``--spec``); ConfigError naming what is wrong with it."""
    from ..config.file import ConfigError

    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--spec: not JSON ({exc}); give the text the workflow passes (`crashline plan`)") from None
    kind = KINDS.get(raw.pop("job", None)) if isinstance(raw, dict) else None
    if kind is None:
        raise ConfigError(f"--spec: no job of {', '.join(KINDS)} named in it; give the text the workflow passes")
    names = {f.name for f in dataclasses.fields(kind)}
    unknown, lacking = sorted(set(raw) - names), sorted(n for n in names - set(raw) if n != "twin")
    if unknown or lacking:
        said = "; ".join([*(f"unknown key {k!r}" for k in unknown), *(f"no {k!r}" for k in lacking)])
        raise ConfigError(f"--spec of a {kind.job} job: {said}; give the text the workflow passes")
    return kind(**raw)


def _server(config: dict) -> dict:
    return {k: config["server"][k] for k in SERVER_LIMITS}


def _budget(config: dict) -> dict:
    """The budget a server runs under: the card it emulates, not the margin. The margin only decides what may be
    recommended (and where a search stops), so its edit re-measures nothing."""
    return {k: v for k, v in config["budget"].items() if k != "margin_mib"}


def _soak(config: dict) -> dict:
    """The soak as a server runs it: must_survive_h only decides what is recommended, so its edit measures nothing."""
    return {k: v for k, v in config["soak"].items() if k != "must_survive_h"}


def measure_spec(config: dict, model: str, cid: str) -> MeasureSpec:
    """What a measurement reads: the configuration, the workloads and how they are run."""
    return MeasureSpec(model, plan.find(config, model, cid), _measurement_config(config, cid))


def search_spec(config: dict, model: str, gid: str) -> SearchSpec:
    """What a search reads: the group (settings, range, climb and starts, and the objective its climb and finalists
    are ranked by) and what each probe reads (``config``: the probes' job key does not hold the objective, so a
    new objective reruns the search, which reuses its records)."""
    group = {**plan.find_search(config, model, gid), "margin_mib": config["budget"]["margin_mib"]}
    if group.get("climb"):
        group = {**group, "objective": search_objective(config)}
    return SearchSpec(model, group, _measurement_config(config))


def search_objective(config: dict) -> dict:
    """The objective block with its workload resolved (the metric, the workload, and any other key of the block,
    such as per-request limits, which the search's ranking honours where it knows them)."""
    block = config["objective"]
    metric = block.get("metric") or plan.DEFAULT_METRIC
    return {**block, "metric": metric, "workload": plan.objective_workload(config)}


def needle_spec(config: dict, model: str, cid: str) -> NeedleSpec:
    """What a recall check reads: the configuration, the model's source and prompt style, the needle
    grid and the budget it is checked under; and the configuration whose recall stands for it, if any."""
    from ..config.needle import needle_settings

    item = plan.find(config, model, cid)
    return NeedleSpec(
        model,
        {k: v for k, v in item.items() if k != "starts"},  # one recall check, however often it is measured
        {
            "models": {model: config["models"][model]},
            "server": _server(config),
            "budget": _budget(config),
            "needle": needle_settings(config),
        },
        plan.needle_twin(config, model, cid),  # its recall is the twin's (the same llama-server arguments)
    )


def search_needle_spec(config: dict, model: str, gid: str) -> SearchNeedleSpec:
    """What a search's recall check reads: the group, the objective its candidates are ordered by, and what a
    needle job reads (the model's source and prompt style, server limits, the budget and margin, the grid)."""
    from ..config.needle import needle_settings

    return SearchNeedleSpec(
        model,
        {"id": gid},
        search_objective(config),
        config["budget"]["margin_mib"],
        {
            "models": {model: config["models"][model]},
            "server": _server(config),
            "budget": _budget(config),
            "needle": needle_settings(config),
        },
    )


def workloads_of(config: dict, cid: str | None) -> list[dict]:
    """The workloads configuration ``cid`` runs (a search's probes: None): those without ``configs`` and those whose
    ``configs`` name it (a claims file's, for its rows' configurations), as the server runs them (without the key)."""
    return [
        {k: v for k, v in w.items() if k != "configs"}
        for w in config["workloads"]
        if "configs" not in w or cid in w["configs"]
    ]


def _measurement_config(config: dict, cid: str | None = None) -> dict:
    """A config without conversations has no key for them: records measured before they existed stay current."""
    return {
        "server": _server(config),
        "workloads": workloads_of(config, cid),
        **({"conversations": config["conversations"]} if config["conversations"] else {}),
        **({"soak": _soak(config)} if config["soak"]["requests"] else {}),
        "repetitions": config["repetitions"],
        "warmup_requests": config["warmup_requests"],
        "budget": _budget(config),
        "telemetry": config["telemetry"],
    }


SPECS = {"measure": measure_spec, "search": search_spec, "needle": needle_spec, "search_needle": search_needle_spec}


def spec(job: str, config: dict, model: str, job_id: str) -> JobSpec:
    return SPECS[job](config, model, job_id)


def inputs(fetch: Path, manifest: Path, provenance: Path, draft_fetch: Path | None = None) -> dict:
    """The input records a server job reads, from their paths."""
    return {
        "fetch_record": read_json(fetch),
        "manifest": read_json(manifest),
        "provenance": read_json(provenance),
        "draft_path": read_json(draft_fetch)["files"][0]["path"] if draft_fetch else None,
    }


def rivals(paths: list, gids: list[str]) -> list[dict]:
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
    return [records.load(Path(p), "search") for p in paths]


def run(job_spec: JobSpec, inputs: dict, outputs: dict) -> str:
    """Run one job; returns the line it prints. ``outputs``: record, server_log, telemetry (measure);
    record, server_log (needle); summary (search)."""
    model = job_spec.model
    if isinstance(job_spec, MeasureSpec):
        from .measure import measure

        rec = measure(
            model_name=model,
            item=job_spec.item,
            config=job_spec.config,
            **inputs,
            record_path=Path(outputs["record"]),
            log_path=Path(outputs["server_log"]),
            telemetry_path=Path(outputs["telemetry"]),
        )
        return f"{model} {rec['config_id']}: {rec['outcome']}" + (
            f" ({rec['phase']}: {rec['message']})" if rec["message"] else ""
        )
    if isinstance(job_spec, NeedleSpec):
        from .needle import run_needle

        if job_spec.twin:
            from .needle import copy_twin

            rec = copy_twin(
                job_spec.item,
                job_spec.twin,
                Path(inputs["twin_record"]),
                Path(outputs["record"]),
                Path(outputs["server_log"]),
            )
            return f"{model} {job_spec.id}: recall {rec['recall']}, as {job_spec.twin}'s"
        rec = run_needle(
            model_name=model,
            item=job_spec.item,
            config=job_spec.config,
            **inputs,
            record_path=Path(outputs["record"]),
            log_path=Path(outputs["server_log"]),
        )
        return f"{model} {job_spec.id}: recall {rec['recall']}"
    rival_summaries = inputs.get("rivals") or []
    inputs = {k: v for k, v in inputs.items() if k not in ("draft_path", "rivals")}
    if isinstance(job_spec, SearchNeedleSpec):
        from .needle import run_search_needle

        rec = run_search_needle(
            model_name=model,
            summary_path=Path(outputs["search"]),
            objective=job_spec.objective,
            margin_mib=job_spec.margin_mib,
            config=job_spec.config,
            **inputs,
            out_path=Path(outputs["summary"]),
        )
        tested = ", ".join(rec["records"]) or "none"
        return f"{model} search {job_spec.id}: recall checked for {tested}; recalled: {rec['recalled']}"
    from ..core.locks import lease_for
    from .search import run_search
    from ..core.settings import resolve

    group = job_spec.group
    highest = resolve({**group["given"], "n_cpu_moe": group["range"][1]})  # the most the search asks of the host
    with lease_for(f"search {model} {group['id']}", highest, inputs["manifest"].get("layers")):  # every probe's
        summary = run_search(
            model_name=model,
            group=group,
            config=job_spec.config,
            **inputs,
            rivals=rival_summaries,
            out_dir=Path(outputs["summary"]).parent,
        )
    return (
        f"{model} search {job_spec.id}: boundary n_cpu_moe {summary['boundary']}, use "
        f"{summary['recommended_n_cpu_moe']}, {summary['server_starts']} server starts"
    )
