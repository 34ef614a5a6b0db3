"""What a server job reads, in typed parts: the configuration (``Item``) or the search group (``SearchGroup``) with
its objective, what a measurement's server runs (``Measurement``: server limits, workloads, conversations, soak,
repetitions, budget, telemetry), what a recall check reads (``Recall``: the model's entry, server limits, budget,
needle grid), and the input records (``JobInputs``). Each job's spec (``jobs.measure.MeasureSpec``,
``jobs.needle.NeedleSpec`` and ``SearchNeedleSpec``, ``jobs.search.SearchSpec``) is made of them; ``jobs.spec`` builds
them from the validated config. ``as_dict`` gives each as the config wrote it (the rule's params, a record's
``job_config``); workloads and conversations stay the mappings the config wrote (the engine reads them by name).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path


def _keys_sorted(fields: dict) -> dict:
    """A part as the job has always read it from the rule's params (JSON with its keys sorted): a record's job config
    keeps its bytes."""
    return dict(sorted(fields.items()))


def _json_list(values) -> list:
    return [dict(v) if isinstance(v, dict) else v for v in values]


@dataclass(frozen=True)
class ServerLimits:
    """How long a server may take to start, to answer one request, and to stop (seconds)."""

    startup_timeout_s: float
    request_timeout_s: float
    stop_timeout_s: float

    def as_dict(self) -> dict:
        return _keys_sorted(dataclasses.asdict(self))


@dataclass(frozen=True)
class Budget:
    """The card a server emulates (``vram_budget_mib``, None: the whole card) and the host memory it may use (None:
    no cgroup). Not the margin: it only decides what may be recommended, so its edit re-measures nothing."""

    vram_budget_mib: int | None = None
    host_ram_mib: int | None = None

    def as_dict(self) -> dict:
        return _keys_sorted(dataclasses.asdict(self))


@dataclass(frozen=True)
class Soak:
    """The unique-prompt soak as a server runs it (``jobs.soak``); must_survive_h only decides what is recommended."""

    requests: int
    duration_s: float
    prompt_tokens: int
    gen_tokens: int
    at_once: int

    def as_dict(self) -> dict:
        return _keys_sorted(dataclasses.asdict(self))


@dataclass(frozen=True)
class Telemetry:
    interval_s: float

    def as_dict(self) -> dict:
        return _keys_sorted(dataclasses.asdict(self))


@dataclass(frozen=True)
class Measurement:
    """What a measurement's server runs besides its settings: the job config a record keeps (``as_dict``) and its
    job key hashes. No conversations (empty) and no soak (None) have no key: records measured before they existed
    stay current. ``timed_with_margin_mib``: a search's probes skip the timed repetitions of a workload whose
    warm-up left less than the margin (``jobs.serving``)."""

    server: ServerLimits
    workloads: tuple[dict, ...]
    repetitions: int
    warmup_requests: int
    budget: Budget
    telemetry: Telemetry
    conversations: tuple[dict, ...] = ()
    soak: Soak | None = None
    timed_with_margin_mib: int | None = None

    def as_dict(self) -> dict:
        read = {
            "server": self.server.as_dict(),
            "workloads": _json_list(self.workloads),
            **({"conversations": _json_list(self.conversations)} if self.conversations else {}),
            **({"soak": self.soak.as_dict()} if self.soak is not None else {}),
            "repetitions": self.repetitions,
            "warmup_requests": self.warmup_requests,
            "budget": self.budget.as_dict(),
            "telemetry": self.telemetry.as_dict(),
        }
        margin = self.timed_with_margin_mib
        return {**_keys_sorted(read), **({"timed_with_margin_mib": margin} if margin is not None else {})}

    @classmethod
    def of(cls, raw: dict) -> Measurement:
        return cls(
            server=ServerLimits(**raw["server"]),
            workloads=tuple(raw["workloads"]),
            repetitions=raw["repetitions"],
            warmup_requests=raw["warmup_requests"],
            budget=Budget(**raw["budget"]),
            telemetry=Telemetry(**raw["telemetry"]),
            conversations=tuple(raw.get("conversations") or ()),
            soak=Soak(**raw["soak"]) if "soak" in raw else None,
            timed_with_margin_mib=raw.get("timed_with_margin_mib"),
        )


@dataclass(frozen=True)
class ModelSource:
    """A model's entry in the config as a recall check reads it: its source (a ``synthetic:`` model recalls
    nothing), its prompt style, and what else the entry says of the file (a change reruns the check)."""

    source: str
    prompt_style: str = "continuation"
    sha256: str | list[str] | None = None
    synthetic: dict | None = None

    def as_dict(self) -> dict:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


@dataclass(frozen=True)
class NeedleGrid:
    """The needle block with crashline's defaults filled in (``config.needle.needle_settings``)."""

    lengths: tuple
    depths: tuple
    trials: int
    required: tuple
    kind: str
    gen_tokens: int

    def as_dict(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}

    @classmethod
    def of(cls, raw: dict) -> NeedleGrid:
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()})


@dataclass(frozen=True)
class Recall:
    """What a recall check reads besides its configuration: the model's entry, server limits, the budget it is
    checked under, the needle grid."""

    source: ModelSource
    server: ServerLimits
    budget: Budget
    needle: NeedleGrid

    def as_dict(self, model: str) -> dict:
        return {
            "models": {model: self.source.as_dict()},
            "server": self.server.as_dict(),
            "budget": self.budget.as_dict(),
            "needle": self.needle.as_dict(),
        }

    @classmethod
    def of(cls, raw: dict) -> Recall:
        ((_, source),) = raw["models"].items()
        return cls(
            ModelSource(**source), ServerLimits(**raw["server"]), Budget(**raw["budget"]), NeedleGrid.of(raw["needle"])
        )


@dataclass(frozen=True)
class Objective:
    """What a search's climb and finalists are ranked by: the metric at the workload, and the limits per request a
    configuration's medians must meet (``search_rules.LIMITS``)."""

    metric: str
    workload: str
    concurrency: int | None = None
    min_decode_tps: float | None = None
    max_ttft_s: float | None = None

    def as_dict(self) -> dict:
        return _keys_sorted(dataclasses.asdict(self))


@dataclass(frozen=True)
class Item:
    """One configuration: its id, its resolved settings, what the config wrote (``given``), how many server starts
    its entry asks for, and the run's time limit where it asks for more than one."""

    id: str
    settings: dict
    given: dict
    starts: int = 1
    time_limit_s: int | None = None  # the run's time for its starts after the first (config key time_limit_s)

    def as_dict(self, model: str) -> dict:
        starts = {"starts": self.starts} if self.starts != 1 else {}
        limit = {"time_limit_s": self.time_limit_s} if self.time_limit_s else {}
        return {"model": model, "id": self.id, "settings": self.settings, "given": self.given, **starts, **limit}

    @classmethod
    def of(cls, raw: dict) -> Item:
        return cls(raw["id"], raw["settings"], raw["given"], raw.get("starts", 1), raw.get("time_limit_s"))


@dataclass(frozen=True)
class SearchGroup:
    """One search: the settings it holds (``given``), the n_cpu_moe range, the margin, and as the config wrote them
    (None: not written) the climb, the finalists' starts and the rivals of a pruned search; the objective wherever
    it climbs."""

    id: str
    given: dict
    range: tuple[int, int]
    margin_mib: int
    climb: int | None = None
    starts: int | None = None
    rivals: tuple[str, ...] | None = None
    objective: Objective | None = None
    time_limit_s: int | None = None  # the run's time for the optional starts (config key time_limit_s)
    partial: bool = False  # also start the boundary layer with part of its experts on the card (jobs.search)

    def __post_init__(self):
        if self.climb and self.objective is None:
            raise ValueError(f"search {self.id} climbs {self.climb} value(s): it needs the objective it ranks by")

    def as_dict(self, model: str) -> dict:
        written = {k: getattr(self, k) for k in ("climb", "starts", "time_limit_s") if getattr(self, k) is not None}
        return {
            "model": model,
            "id": self.id,
            "given": self.given,
            "range": list(self.range),
            **written,
            **({"rivals": list(self.rivals)} if self.rivals is not None else {}),
            "margin_mib": self.margin_mib,
            **({"objective": self.objective.as_dict()} if self.objective is not None else {}),
            **({"partial": True} if self.partial else {}),
        }

    @classmethod
    def of(cls, raw: dict) -> SearchGroup:
        return cls(
            raw["id"],
            raw["given"],
            tuple(raw["range"]),
            raw["margin_mib"],
            raw.get("climb"),
            raw.get("starts"),
            tuple(raw["rivals"]) if "rivals" in raw else None,
            Objective(**raw["objective"]) if "objective" in raw else None,
            raw.get("time_limit_s"),
            bool(raw.get("partial")),
        )


@dataclass(frozen=True)
class JobInputs:
    """The input records a server job reads (``inputs``), and where a job has them: the needle record of the
    configuration whose recall it copies, the measure record whose --fit-target it is checked at, the summaries of a
    pruned search's rivals."""

    fetch_record: dict
    manifest: dict
    provenance: dict
    draft_path: str | None = None
    twin_record: Path | None = None
    measured: Path | None = None
    rivals: tuple[dict, ...] = ()

    def records(self) -> JobInputs:
        """The model's and the server's records and the draft model's file alone: what a search's probes and recall
        checks read."""
        return JobInputs(self.fetch_record, self.manifest, self.provenance, self.draft_path)
