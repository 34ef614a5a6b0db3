"""Needle recall, the job: does a configuration really read the context it claims?

The server of one configuration is started exactly as the measurement starts it (same emulated
card, same lock), every needle trial is sent to it, and the record says per trial what was asked
and answered. The prompt is built from token ids, tokenized by the server itself, to exactly the
intended length; the server's ``prompt_n`` must equal it. A prompt that is refused, truncated or
shifted is a failure of the configuration, never a pass. Greedy, prompt cache off.

Prompt styles: ``continuation`` (base models; the prompt ends with the needle's lead-in, and the
model continues with the value) and ``chat`` (the model's own chat template, applied by the server
through ``/apply-template``; the assistant's turn is started with the same lead-in).

Random-weight synthetic models cannot recall anything: their record says "not applicable" and no
server is started. What the prompts are made of: ``config.needle`` (the wording) and ``jobs.haystack`` (the prose).
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import requests

from ..core import progress
from ..engine import logparse
from ..core import records
from ..core.atomic import open_output
from .measure import require_unchanged, server_command
from .haystack import NeedleClient
from .serve import RecordHead, ServerJob, outcome_text, server_failure
from ..config.needle import (
    NOT_APPLICABLE_REASON,
    baseline_failed,
    fitted,
    wording,
)
from ..core.paths import RecordFolder, SearchFolder
from ..engine.server import ServerProcess
from ..core.supervision import exit_with_workflow
from ..models.synthetic import random_weights
from ..core.records import utc_now
from .contract import Item, JobInputs, Objective, Recall, ServerLimits
from .trials import planned_trials, run_trials, completed, grid, verdict

# --------------------------------------------------------------------------- the job


@dataclass(frozen=True)
class NeedleSpec:
    """What a recall check reads: the configuration and ``recall``; ``twin``: the configuration whose recall stands
    for this one's, if any."""

    model: str
    item: Item
    recall: Recall
    twin: str | None = None
    job: ClassVar[str] = "needle"
    KEYS: ClassVar[tuple[str, ...]] = ("model", "item", "config")

    @property
    def id(self) -> str:
        return self.item.id

    @property
    def draft_model(self) -> str | None:
        return self.item.settings.get("draft_model")

    def to_dict(self) -> dict:
        twin = {"twin": self.twin} if self.twin is not None else {}
        return {
            "model": self.model,
            "item": self.item.as_dict(self.model),
            "config": self.recall.as_dict(self.model),
            **twin,
        }

    @classmethod
    def from_dict(cls, raw: dict) -> NeedleSpec:
        return cls(raw["model"], Item.of(raw["item"]), Recall.of(raw["config"]), raw.get("twin"))

    def run(self, inputs: JobInputs, outputs: dict) -> str:
        """Check recall (or copy the twin's, from ``inputs.twin_record``); ``outputs``: record, server_log."""
        record_path, log_path = Path(outputs["record"]), Path(outputs["server_log"])
        if self.twin:
            rec = copy_twin(self.item, self.twin, Path(inputs.twin_record), record_path, log_path)
            return f"{self.model} {self.id}: recall {rec['recall']}, as {self.twin}'s"
        rec = run_needle(self, inputs, record_path, log_path)
        return f"{self.model} {self.id}: recall {rec['recall']}"


@dataclass(frozen=True)
class SearchNeedleSpec:
    """What a search's recall check reads: the group's id, the objective its candidates are ordered by, the margin,
    and what a recall check reads."""

    model: str
    group_id: str
    objective: Objective
    margin_mib: int
    recall: Recall
    draft_model: str | None = None  # the draft the search's candidates load beside the model, if any
    job: ClassVar[str] = "search_needle"
    KEYS: ClassVar[tuple[str, ...]] = ("model", "group", "objective", "margin_mib", "config")

    @property
    def id(self) -> str:
        return self.group_id

    def to_dict(self) -> dict:
        return {
            "model": self.model,
            "group": {"id": self.group_id, **({"draft_model": self.draft_model} if self.draft_model else {})},
            "objective": self.objective.as_dict(),
            "margin_mib": self.margin_mib,
            "config": self.recall.as_dict(self.model),
        }

    @classmethod
    def from_dict(cls, raw: dict) -> SearchNeedleSpec:
        group = raw["group"]
        return cls(
            raw["model"],
            group["id"],
            Objective(**raw["objective"]),
            raw["margin_mib"],
            Recall.of(raw["config"]),
            group.get("draft_model"),
        )

    def run(self, inputs: JobInputs, outputs: dict) -> str:
        """Check recall of the search's candidates in order; ``outputs``: summary (the recall's), search (its
        summary's path)."""
        rec = run_search_needle(self, inputs, Path(outputs["search"]), Path(outputs["summary"]))
        tested = ", ".join(rec["records"]) or "none"
        return f"{self.model} search {self.id}: recall checked for {tested}; recalled: {rec['recalled']}"


@dataclass
class _Run:
    """How far one server run got: the trials so far, the failure (None: none yet)."""

    slot_ctx: int | None
    failure: dict | None = None
    trials: list[dict] = field(default_factory=list)


def run_needle(
    spec: NeedleSpec, inputs: JobInputs, record_path: Path, log_path: Path, rng: random.Random | None = None
) -> dict:
    """Start the server for one configuration, run every needle trial, stop it, write the record; a --fit on aimed
    at the margin at the target its measurement settled on (``inputs.measured``: its measure record,
    ``as_measured``)."""
    with progress.job(f"needle {spec.model} {spec.item.id}"):
        if inputs.measured:
            spec = dataclasses.replace(spec, item=as_measured(spec.item, Path(inputs.measured)))
        record = _run_needle(spec, inputs, record_path, log_path, rng)
        if record["applicable"]:
            failed = f", required lengths failed: {record['failed_required']}" if record["failed_required"] else ""
            server = "" if record["outcome"] == "ok" else f"; the server {outcome_text(record)}"
            progress.say(f"needle recall {record['recall']}{failed}{server}")
        return record


def as_measured(item: Item, measured: Path) -> Item:
    """A --fit on aimed at the margin, checked at the --fit-target its measurement settled on (``measured``, its
    measure record: jobs.measure.measure_aimed raises the target where a start's peak fell short), so that its recall
    is of the placement its speed and headroom are; the target asked where the record is not of this
    configuration (it was measured under another id, or not yet)."""
    record = records.load(measured, "measure") if measured.exists() else {}
    if record.get("config_id") != item.id or not record.get("fit_aim"):
        return item
    target = record["settings"]["fit_target"]
    if target != item.settings["fit_target"]:
        progress.say(f"checked at --fit-target {target}, where its measurement left the margin ({measured})")
    return dataclasses.replace(item, settings={**item.settings, "fit_target": target})


def copy_twin(item: Item, twin: str, twin_path: Path, record_path: Path, log_path: Path) -> dict:
    """The recall of configuration ``twin`` (the same llama-server arguments: ``config.plan.needle_twin``; its record
    at ``twin_path``) as this configuration's, under this configuration's id and settings. No server starts; the
    log says whose recall it is."""
    record = {**records.load(twin_path, "needle"), "config_id": item.id, "settings": item.settings}
    record.update(given=item.given, recall_of=twin)
    _note(
        log_path,
        f"crashline: no llama-server started: configuration {twin} runs the same llama-server arguments, so its "
        f"recall stands for this one's (its {RecordFolder.NEEDLE_SERVER_LOG})\n",
    )
    records.write(record_path, "needle", record)
    progress.say(f"needle recall of {item.id} is {twin}'s (the same llama-server arguments): {record['recall']}")
    return record


def _run_needle(spec: NeedleSpec, inputs: JobInputs, record_path: Path, log_path: Path, rng) -> dict:
    """The job of ``run_needle`` (which names its progress lines and says the verdict)."""
    item, recall, fetch_record = spec.item, spec.recall, inputs.fetch_record
    resolved = item.settings
    run = _Run(slot_ctx=resolved["ctx"] // max(1, resolved["parallel"]) if resolved.get("ctx") else None)
    ns = fitted(recall.needle.as_dict(), run.slot_ctx)
    style = recall.source.prompt_style
    head = RecordHead.of(spec.model, item, inputs)
    record = _record(head, spec, ns)
    if random_weights(recall.source.source, fetch_record["files"][0]["path"]):
        progress.say(f"needle recall not applicable, no llama-server started: {NOT_APPLICABLE_REASON}")
        return _not_applicable(record, head, run.slot_ctx, spec.model, record_path, log_path)
    progress.say(
        f"needle recall: {len(planned_trials(ns))} trials (lengths {ns['lengths']} x depths {ns['depths']} x "
        f"{ns['trials']}), {ns['kind']} values, {style} prompts"
    )
    require_unchanged(spec.model, fetch_record)
    command, _ = server_command(inputs.provenance, fetch_record["files"][0]["path"], item, inputs.draft_path)
    server = ServerProcess(command, log_path, host_ram_mib=recall.budget.host_ram_mib)
    rng = rng or random.SystemRandom()
    job = ServerJob(
        holder=f"needle {spec.model} {item.id}",
        server=server,
        limits=recall.server,
        budget=recall.budget,
        record=record,
        what=" for needle recall",
    )
    exit_with_workflow()
    job.run(lambda job: _trials(job, recall.server, ns, style, rng, run), log_path)
    run.failure = job.failure
    _finish(record, head, server, run, ns, log_path)
    return records.write(record_path, "needle", record)


def _record(head: RecordHead, spec: NeedleSpec, ns: dict) -> dict:
    """The needle record as its job begins: the head, and what the check asks."""
    return {
        "kind": "needle",
        **head.opening(),
        "given": spec.item.given,
        **head.where(),
        "prompt_style": spec.recall.source.prompt_style,
        "needle": ns,
        "wording": dataclasses.asdict(wording(ns["kind"])),
        "budget": spec.recall.budget.as_dict(),
        "requests": {"cache_prompt": False, "temperature": 0.0, "top_k": 1, "prompt": "token ids"},
        "started_at": utc_now(),
    }


def _not_applicable(
    record: dict, head: RecordHead, slot_ctx, model_name: str, record_path: Path, log_path: Path
) -> dict:
    ended = {"outcome": "not_applicable", "failure": None, "phase": None, "message": NOT_APPLICABLE_REASON}
    record.update(
        applicable=False,
        **head.ended(ended).ending(),
        command=None,
        returncode=None,
        slot_ctx=slot_ctx,
        trials=[],
        grid=[],
        recall="not_applicable",
        failed_required=[],
        finished_at=utc_now(),
    )
    _note(log_path, f"crashline: no llama-server started for {model_name}: {NOT_APPLICABLE_REASON}\n")
    return records.write(record_path, "needle", record)


def _trials(job: ServerJob, limits: ServerLimits, ns: dict, style: str, rng, run: _Run) -> None:
    """The trials on the ready server; a request that timed out or lost the server is the job's failure."""
    server = job.server
    client = NeedleClient.of(server, limits.request_timeout_s)
    run.slot_ctx = client.slot_context() or run.slot_ctx
    job.phase = "needle"
    try:
        run_trials(client, style, ns, run.slot_ctx, rng, run.trials)
    except requests.Timeout:
        job.failure = server_failure(server, "needle", timed_out=True)
    except requests.ConnectionError as exc:
        if server.alive():
            job.failure = {"outcome": "error", "failure": "request", "phase": "needle", "message": str(exc)[:300]}
        else:
            job.failure = server_failure(server, "needle")


def _finish(record: dict, head: RecordHead, server: ServerProcess, run: _Run, ns: dict, log_path: Path) -> None:
    """The record's outcome, from the failure seen or else the server's log, and the verdict on the trials."""
    if not Path(log_path).exists():
        _note(log_path, f"crashline: llama-server did not start ({run.failure and run.failure.get('message')})\n")
    log = server.log_text()
    placement = logparse.parse_log(log)
    failure = run.failure or logparse.classify(log, server.returncode, phase_hint="stop")
    trials = run.trials if failure["outcome"] == "ok" else completed(run.trials, ns, run.slot_ctx, failure)
    recall, failed_required = verdict(trials, ns, applicable=True)
    record.update(
        applicable=True,
        returncode=server.returncode,
        slot_ctx=run.slot_ctx,
        placement=placement,
        **head.ended(failure).ending(),
        log_tail=placement.get("tail") if failure["outcome"] != "ok" else None,
        trials=trials,
        grid=grid(trials, ns),
        recall=recall,
        failed_required=failed_required,
        finished_at=utc_now(),
    )


def _note(log_path: Path, text: str) -> None:
    """The server log is a job output: say in it why there is no server output."""
    Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    with open_output(log_path) as f:  # never through a link planted at the log's name
        f.write(text)


# --- a search's recall check ---------------------------------------------------------------------------------


def search_candidates(summary_path: Path, objective: Objective, margin_mib: int) -> list[Item]:
    """The configurations a search measured that may be recommended (every workload survived with the margin), as
    needle items, the search's winner first, then by the objective's median at its workload, fastest first."""
    summary = records.load(summary_path, "search")
    metric, workload = objective.metric, objective.workload
    candidates = []
    for rel in summary["records"]:
        if "/" in rel:  # a finalist's later start: the same configuration
            continue
        rec = records.load(SearchFolder.of(summary_path).probe(rel).measure, "measure")
        headroom = (rec.get("memory") or {}).get("headroom_mib")
        if rec["outcome"] != "ok" or (headroom is not None and headroom < margin_mib):
            continue
        runs = {w["name"]: w for w in rec.get("workloads") or []}
        median = ((runs.get(workload) or {}).get(metric) or {}).get("median")
        first = (rec["settings"].get("n_cpu_moe"), rec["settings"].get("override_tensor")) == (
            summary.get("recommended_n_cpu_moe"),
            summary.get("recommended_override_tensor"),
        )
        item = Item(rec["config_id"], rec["settings"], rec.get("given") or {})
        candidates.append((not first, -(median or 0.0), item))
    return [item for *_, item in sorted(candidates, key=lambda c: (c[0], c[1]))]


def run_search_needle(spec: SearchNeedleSpec, inputs: JobInputs, summary_path: Path, out_path: Path) -> dict:
    """Recall for a search's winner before it is recommended: the candidates in order (the winner, then the next
    fastest), one needle job each, until one recalls at every required length; a winner that fails is replaced
    by the next. A model whose recall does not apply stops at the first, and so does one that fails the baseline
    (no needle recalled even at the shortest length: ``uninformative`` says so)."""
    tested, passed, uninformative = [], None, None
    for item in search_candidates(summary_path, spec.objective, spec.margin_mib):
        folder = SearchFolder.of(out_path).candidate(item.id)
        record = run_needle(
            NeedleSpec(spec.model, item, spec.recall),
            inputs.records(),
            folder.needle,
            folder.needle_server_log,
        )
        tested.append(item.id)
        if not record["applicable"]:
            break
        if record["outcome"] == "ok" and not record["failed_required"]:
            passed = item.id
            break
        trials = [(t.get("length_target"), t.get("passed")) for t in record.get("trials") or []]
        if record["outcome"] == "ok" and (shortest := baseline_failed(trials)) is not None:
            # the candidates differ in placement alone: the next would fail as this one did
            uninformative = f"{item.id} recalled no needle even at {shortest:,} tokens, the shortest length"
            progress.say(f"needle: {uninformative}; recall cannot rank this search's configurations")
            break
        progress.say(f"needle: {item.id} failed recall; the next fastest of the search is checked")
    summary = {
        "model": spec.model,
        "search": str(summary_path),
        "records": tested,
        "recalled": passed,
        "uninformative": uninformative,
    }
    return records.write(out_path, "search_needle", summary)
