"""The planner in the workflow: for one combination of the other settings, find the fastest
n_cpu_moe that survives every workload with headroom, with a few server starts instead of one per
value.

1. Calibrate: start the highest n_cpu_moe of the range that leaves an expert layer on the card
   (planner.calibration_value: the load most likely to fit whose compute buffer is the probes') and stop it
   once it is ready, without workloads (recorded under
   ``records/ID/calibration/``): its log gives the compute buffer at this ubatch; its peak VRAM at load
   less its buffers gives the rest (CUDA context, small buffers). Its workloads, among the slowest of the
   range, would decide nothing unless every lower value fails, and then the search measures it. Where it
   fails to load, the highest value (every expert on the CPU) is the calibration.
2. Predict every value's VRAM from the manifest (planner.predict) and start at the lowest value
   predicted to fit the budget.
3. Search: gallop from the prediction and bisect (planner.search_lowest), each probe a full
   measurement with every workload.
4. The lowest value whose headroom clears the margin, found the same way (headroom only grows with
   n_cpu_moe): from the value the planner predicts to clear it, corrected by what it missed at the
   boundary, instead of a start per value up from the boundary.
5. Climb (``climb`` values at most, planner.climb): speed is not monotonic in n_cpu_moe near the
   boundary, so measure the values above it while the objective's speed improves or stays within
   noise (the ranges of the requests overlap).
6. Finalists (planner.settle): the fastest value and those within noise of it (at least the
   runner-up) are started again, interleaved (A B A B ...), until each has ``starts`` server starts
   (the first included): decode with experts on the CPU varies between starts of one configuration
   more than within one. The winner has the highest median over every request of every start.

A group with ``prune`` (``rivals``: its model's searches listed before it, which run first) stops before step 5
when the lowest value with the margin is clearly slower than the best of the rivals' winners (``best_rival``: its
whole range of requests below theirs, every request of every start) and, for an objective of whole requests, at
every reply length from 1 to what the context leaves (``loses_at_every_reply``, by the medians of the first token
and the decode): the values above keep more experts on the CPU. tune searches its largest ubatch
first, so a smaller one that cannot win a long prompt at any reply length costs its boundary and margin only; one
that wins at some reply length climbs and starts its finalists as the answer's search does.

A group without ``climb`` (or with ``climb: 0``) stops at step 4: it recommends the lowest value
with the margin. Start k > 1 of a value is recorded under ``records/ID/start-K/`` beside the first
(``records/ID/``); ``records`` lists every record used (``ID`` and ``ID/start-K``), and
``finalists`` which records are starts of one configuration (``aggregate`` pools them into one row).

Values below the boundary that were never started are reported as skipped with the arithmetic
("predicted to need X MiB more than the budget"), never silently dropped.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from ..config.file import ConfigError
from ..engine import eta, planner
from ..core import progress, records
from ..core import settings as settings_mod
from .measure import MeasurePaths, MeasureSpec, job_key, measure
from ..core.locks import lease_for
from .serve import outcome_text
from .contract import Item, JobInputs, Measurement, Objective, SearchGroup
from ..core.paths import LATER_START, SearchFolder
from ..core.records import Outcome
from .search_rules import (
    best_rival,
    bound_text,
    calibration,
    cut_short_text,
    headroom_ok,
    longest_reply,
    margin_guess,
    request_of,
    speed_of,
    stat,
)


@dataclass(frozen=True)
class SearchSpec:
    """What a search reads: the group, and what each probe's server runs (``measurement``: the probes' job key does
    not hold the objective, so a new objective reruns the search, which reuses its records)."""

    model: str
    group: SearchGroup
    measurement: Measurement
    job: ClassVar[str] = "search"
    KEYS: ClassVar[tuple[str, ...]] = ("model", "group", "config")

    @property
    def id(self) -> str:
        return self.group.id

    @property
    def draft_model(self) -> str | None:
        """The draft model every probe loads beside the model, where the group holds one."""
        return self.group.given.get("draft_model")

    def to_dict(self) -> dict:
        return {"model": self.model, "group": self.group.as_dict(self.model), "config": self.measurement.as_dict()}

    @classmethod
    def from_dict(cls, raw: dict) -> SearchSpec:
        return cls(raw["model"], SearchGroup.of(raw["group"]), Measurement.of(raw["config"]))

    def run(self, inputs: JobInputs, outputs: dict) -> str:
        """Search, under one lease for every probe; ``outputs``: summary."""
        group = self.group
        highest = settings_mod.resolve(
            {**group.given, "n_cpu_moe": group.range[1]}
        )  # the most the search asks of the host
        with lease_for(f"search {self.model} {group.id}", highest, inputs.manifest.get("layers")):  # every probe's
            summary = run_search(self, inputs, Path(outputs["summary"]).parent)
        return (
            f"{self.model} search {self.id}: boundary n_cpu_moe {summary['boundary']}, use "
            f"{summary['recommended_n_cpu_moe']}, {summary['server_starts']} server starts"
        )


def run_search(spec: SearchSpec, inputs: JobInputs, out_dir: Path) -> dict:
    """Run the search for one group; records of every probe go under ``out_dir/records``. ``inputs.rivals``: the
    summaries of the searches a group with ``prune`` runs after (``best_rival``)."""
    with progress.job(f"search {spec.model} {spec.group.id}"):
        summary = _Search(spec, inputs, out_dir).run()
        lowest = summary["lowest_with_margin"]
        also = f" (the lowest with the margin: {lowest})" if lowest != summary["recommended_n_cpu_moe"] else ""
        progress.say(
            f"search done: boundary n_cpu_moe {summary['boundary']}, use {summary['recommended_n_cpu_moe']}{also}, "
            f"{summary['server_starts']} server starts"
        )
        return summary


def set_aside(out_dir: Path, listed: list[str]) -> list[str]:
    """Move the probe records of the search folder ``out_dir`` that this search does not list (measured by an
    earlier search under other workloads, another budget or another model file) to its ``superseded`` folder, each
    with its server log and telemetry: whoever reads or merges the folder finds only this search's records there,
    and nothing is deleted. Returns what was moved."""
    moved = []
    folder = SearchFolder(out_dir)
    root = folder.probes()
    for record in folder.probe_records():
        rel = record.parent.relative_to(root).as_posix()
        if rel in listed:
            continue
        dest = folder.superseded(rel)
        dest.mkdir(parents=True, exist_ok=True)
        for f in record.parent.iterdir():
            if f.is_file():
                f.replace(dest / f.name)
        moved.append(rel)
    if moved:
        progress.say(f"set aside {len(moved)} probe record(s) of an earlier search in {folder.superseded()}")
    return moved


class _Search:
    """One search's state: every value measured, with the records of each of its server starts."""

    def __init__(self, spec: SearchSpec, inputs: JobInputs, out_dir: Path):
        # a probe whose warm-up leaves less than the margin skips its timed repetitions (jobs/serving.py)
        group, manifest, model_name = spec.group, inputs.manifest, spec.model
        self.model_name, self.group = model_name, group
        self.measurement = dataclasses.replace(spec.measurement, timed_with_margin_mib=group.margin_mib)
        self.inputs, self.manifest, self.out_dir = inputs.records(), manifest, out_dir
        self.margin = group.margin_mib
        self.rivals = list(inputs.rivals)
        self.climb, self.starts = group.climb or 0, group.starts or 1
        lo, hi = group.range
        if lo > manifest["layers"]:
            raise ConfigError(
                f"search n_cpu_moe [{lo}, {hi}] of {model_name}: the model has {manifest['layers']} layers, so every "
                f"value from {manifest['layers']} up keeps all experts on the CPU; give a range within "
                f"0..{manifest['layers']}"
            )
        self.range = (lo, min(hi, manifest["layers"]))
        self.measured: dict[int, str] = {}  # n_cpu_moe -> the probe's configuration id
        self.starts_of: dict[int, list[dict]] = {}  # n_cpu_moe -> the record of each server start, the first first
        self.ids_of: dict[int, list[str]] = {}  # n_cpu_moe -> its records: "ID" (the first start), "ID/start-2", ...
        self.results: dict[int, bool] = {}  # n_cpu_moe -> survived every workload (its first start)
        self.calibration_record = ""  # "ID/calibration": the start that gave the compute buffer, no workloads
        self.took: list[float] = []  # seconds of each server start so far, for the time left
        # seconds of each that ran its timed requests: what an optional start (a climb's, a finalist's) takes, where
        # a calibration, a failed load or a probe under the margin ends in seconds (session 30's 100K run priced them
        # alike: 60 s a start against 100 s for a whole one, and ran over its --time)
        self.whole_took: list[float] = []
        self.stage, self.climbed, self.finalist_starts = "boundary", 0, 0  # where the search is, for the time left
        self.boundary = lo  # the lowest value that survived, once found
        self.limit: float | None = None  # the VRAM limit the search fits, once calibrated
        self.began = time.time()  # the run's time limit counts from here outside a workflow (eta.over_time)
        self.time_cut: list[str] = []  # what the run's time limit (--time) left out, in words

    # -- measuring ---------------------------------------------------------------------------------------------------

    def given(self, n: int | planner.Partial) -> dict:
        whole, override = planner.plain(n)
        return {**self.group.given, "n_cpu_moe": whole, **({"override_tensor": override} if override else {})}

    def probe(self, n: int, why: str) -> dict:
        """Measure n_cpu_moe ``n`` once (``why``: what the probe is for), saying how it went."""
        if n not in self.starts_of:
            lo, hi = self.range
            cid = self.measured[n] = settings_mod.config_id(self.model_name, settings_mod.resolve(self.given(n)))
            progress.say(f"probe {len(self.starts_of) + 1}: n_cpu_moe {n}, configuration {cid} ({why})")
            self.ids_of[n] = [cid]
            rec = self._measure(n, cid)
            self.starts_of[n] = [rec]
            self.results[n] = rec["outcome"] == Outcome.OK
            said = "ok" if self.results[n] else outcome_text(rec)
            progress.say(
                f"probe {len(self.starts_of)}: n_cpu_moe {n} {said}; {bound_text(self.results, lo, hi)}{self.left()}"
            )
        return self.starts_of[n][0]

    def again(self, n: int, k: int) -> planner.Speed | None:
        """Start ``k`` (2, 3, ...) of a finalist; its speed, None where it did not survive with the margin."""
        cid = self.measured[n]
        progress.say(f"start {k}/{self.starts} of n_cpu_moe {n} (configuration {cid}), interleaved with the finalists")
        self.ids_of[n].append(f"{cid}/{LATER_START.format(k)}")
        rec = self._measure(n, self.ids_of[n][-1])
        self.starts_of[n].append(rec)
        self.finalist_starts = max(0, self.finalist_starts - 1)
        speed = self.speed([rec])
        text = speed.text() if speed else f"{outcome_text(rec)}: out, every start must survive with the margin"
        progress.say(f"start {k}/{self.starts}: n_cpu_moe {n} {self.words()} {text}{self.left()}")
        return speed

    def calibrate(self, n: int) -> dict:
        """Start n_cpu_moe ``n`` and stop it once ready (no workloads): the compute buffer and the rest."""
        cid = self.measured.setdefault(n, settings_mod.config_id(self.model_name, settings_mod.resolve(self.given(n))))
        self.calibration_record = f"{cid}/calibration"
        progress.say(
            f"calibration: n_cpu_moe {n} (the most expert layers on the CPU with one on the card), configuration "
            f"{cid}, started and stopped once ready: its log gives the compute buffer, its load peak the rest"
        )
        rec = self._measure(n, self.calibration_record, load_only=True)
        if rec["outcome"] != Outcome.OK:  # it failed before any workload: that is n's probe too
            self.ids_of[n], self.starts_of[n], self.results[n] = [self.calibration_record], [rec], False
        return rec

    def roomy(self) -> dict[int, bool]:
        """Each value measured above the boundary: did it survive with the margin (what the margin's search has seen;
        the boundary's own headroom is its first probe)."""
        return {
            n: headroom_ok(recs[0], self.margin) for n, recs in self.starts_of.items() if n > self.boundary and recs
        }

    def left(self) -> str:
        """ "; about N more server starts, T left" by the usual course of a search from here: the boundary's bisection,
        the margin's above the boundary, the whole climb, two finalists' further starts (none where nothing is
        left)."""
        lo, hi = self.range
        climb = self.climb if self.climb else 0
        finals = planner.finalist_starts(climb, self.starts)
        left = {
            "boundary": planner.probes_left(self.results, lo, hi)
            + planner.course_after_boundary(climb, self.starts, bool(self.limit), self.group.partial),
            "margin": planner.probes_left(self.roomy(), self.boundary + 1, hi) + climb + finals,
            "climb": max(0, climb - self.climbed) + finals,
            "finalists": self.finalist_starts,
        }[self.stage]
        if not left or not self.took:
            return ""
        each = sum(self.took) / len(self.took)
        return f"; about {left} more server start(s), {progress.duration(left * each)} left"

    def out_of_time(self, what: str) -> str | None:
        """Why ``what`` (an optional server start) is left out by the run's time limit, said and kept, or None."""
        own = SearchFolder(self.out_dir).summary()
        text = eta.over_time(what, self.group.time_limit_s, self.whole_took or self.took, self.began, own)
        if text:
            self.time_cut.append(text)
            progress.say(text)
        return text

    def _measure(self, n: int, record_id: str, load_only: bool = False) -> dict:
        """One server start of n_cpu_moe ``n``, recorded under ``records/RECORD_ID/`` (reused when this search
        measured it before under the same job key: workloads, budget, limits, build)."""
        folder = SearchFolder(self.out_dir).probe(record_id)
        record_path = folder.measure
        earlier = records.load(record_path, "measure") if record_path.exists() else {}
        if (
            earlier.get("job_key") == job_key(self.measurement, self.inputs.provenance, self.inputs.fetch_record)
            and bool(earlier.get("load_only")) == load_only
        ):
            progress.say(f"n_cpu_moe {n}: measured by this search before ({record_id}), record reused")
            return earlier
        given, began = self.given(n), time.monotonic()
        probe = MeasureSpec(
            self.model_name, Item(self.measured[n], settings_mod.resolve(given), given), self.measurement
        )
        rec = measure(probe, self.inputs, MeasurePaths.of(folder), load_only=load_only)
        self.took.append(time.monotonic() - began)
        if not load_only and headroom_ok(rec, self.margin):
            self.whole_took.append(self.took[-1])
        return rec

    # -- speeds ------------------------------------------------------------------------------------------------------

    @property
    def objective(self) -> Objective:  # read only when the climb runs (the group has one then)
        return self.group.objective

    def speed(self, recs: list[dict]) -> planner.Speed | None:
        return speed_of(recs, self.objective, self.margin)

    def first(self, n: int) -> planner.Speed | None:
        """The speed of n's first start (measured now if it was not)."""
        self.probe(n, "climb")
        return self.speed(self.starts_of[n][:1])

    def pooled(self, n: int) -> planner.Speed | None:
        return self.speed(self.starts_of[n])

    def words(self) -> str:
        return f"{self.objective.metric.removesuffix('_tps')} t/s at {self.objective.workload}"

    # -- the search --------------------------------------------------------------------------------------------------

    def run(self) -> dict:
        lo, hi = self.range
        budget = self.measurement.budget.vram_budget_mib
        margin = self.margin
        clipped = f" (the model has {self.manifest['layers']} layers)" if hi < self.group.range[1] else ""
        goal = "fastest n_cpu_moe that survives with the margin" if self.climb else "lowest n_cpu_moe that survives"
        progress.say(f"search for the {goal}, in {lo}..{hi}{clipped}")
        calib = self.calibrate(at := planner.calibration_value(self.manifest, lo, hi))
        if calib["outcome"] != Outcome.OK and at < hi:  # one expert layer's load did not fit: that is its probe
            calib = self.calibrate(hi)
        resolved = settings_mod.resolve(self.given(hi))
        compute, rest = calibration(calib, resolved["ubatch"])
        # the prediction is of the whole model: against the budget on each of its GPUs together
        limit = (
            budget * settings_mod.gpu_count(resolved) if budget else (calib.get("memory") or {}).get("vram_limit_mib")
        )
        self.limit = limit
        predictions = {
            n: planner.predict(self.manifest, {**resolved, "n_cpu_moe": n}, compute, rest) for n in range(lo, hi + 1)
        }
        if limit:
            start = next((n for n in range(lo, hi + 1) if predictions[n]["total_mib"] <= limit), hi)
            progress.say(
                f"calibrated: compute buffer {compute(resolved['ubatch']):,.0f} MiB, rest {rest:,.0f} MiB; "
                f"lowest n_cpu_moe predicted to fit {limit:,.0f} MiB: {start}"
            )
        else:
            start = lo  # no GPU limit known (CPU only): every value fits in VRAM terms
            progress.say(f"no VRAM limit (no GPU, no budget): every n_cpu_moe fits; searching from {start}")
        survives = lambda n: self.probe(n, "search")["outcome"] == Outcome.OK  # noqa: E731
        boundary, probes = planner.search_lowest(survives, start, lo, hi)
        lowest = None
        if boundary is not None:  # the lowest value with the margin: the same search, from the predicted value

            def roomy(n: int) -> bool:
                return headroom_ok(self.probe(n, f"headroom: the margin is {margin:,} MiB"), margin)

            self.stage, self.boundary = "margin", boundary
            guess = margin_guess(self.starts_of[boundary][0], boundary, predictions, limit, margin, hi)
            lowest, _ = planner.search_lowest(roomy, guess, boundary, hi)
        fastest = self.fastest(lowest, hi) if lowest is not None and self.climb else {}
        won, won_override = planner.plain(fastest.get("winner", lowest))  # (None, None) without a winner
        values = []
        for n in range(lo, hi + 1):
            p = predictions[n]
            entry = {"n_cpu_moe": n, "predicted_mib": p["total_mib"]}
            if n in self.starts_of:
                entry["status"] = "measured"
            elif n in self.measured:
                entry["status"] = "calibration: started and stopped once ready, no workloads"
            elif boundary is not None and n < boundary and limit and p["total_mib"] > limit:
                entry["status"] = f"skipped: predicted to need {p['total_mib'] - limit:,.0f} MiB more than the budget"
            elif boundary is not None and n < boundary:
                entry["status"] = "skipped: below the measured boundary"
            else:
                entry["status"] = "not measured: above the boundary, fits by the same prediction"
            values.append(entry)
        all_ids = [r for ids in self.ids_of.values() for r in ids]
        summary = {
            "model": self.model_name,
            "group": self.group.id,
            "settings": {k: v for k, v in resolved.items() if k != "n_cpu_moe"},
            "range": [lo, hi],
            "limit_mib": limit,
            "margin_mib": margin,
            "compute_mib": compute.measured,
            "rest_mib": round(rest, 1),
            "predicted_lowest": start,
            "arithmetic": planner.arithmetic(predictions[start], limit, margin) if limit else None,
            "full_residency": planner.arithmetic(predictions[lo], limit, margin) if limit else None,
            "probes": [{"n_cpu_moe": n, "survived": ok} for n, ok in probes],
            "boundary": boundary,
            "lowest_with_margin": lowest,
            "objective": self.objective.as_dict() if self.climb else None,
            "climb": self.climb,
            "climbed": fastest.get("climbed", []),
            "climb_stop": fastest.get("climb_stop"),
            "rival": fastest.get("rival"),  # the best winner of the searches before it (prune), if any
            "cut_short": fastest.get("cut_short", False),
            "starts": self.starts if self.climb else 1,
            "finalists": fastest.get("finalists", []),
            "start_order": fastest.get("start_order", []),
            "runner_up": planner.plain(fastest.get("runner_up"))[0],
            "lead_won": fastest.get("won"),
            "lead_pairs": fastest.get("pairs"),
            "lead_held": fastest.get("lead_held"),
            "recommended_n_cpu_moe": won,
            "recommended_override_tensor": won_override,  # where the winner is a partial placement (step 4b)
            "partial": fastest.get("partial", []),
            "server_starts": sum(map(len, self.ids_of.values())) + (self.calibration_record not in all_ids),
            "records": sorted(all_ids),
            "calibration": self.calibration_record,
            # its clock, for the cost: a calibration that was also n's probe is in the configs table already
            "calibration_time_budget_s": None if self.calibration_record in all_ids else calib.get("time_budget_s"),
            "values": values,
            **({"time_limit_s": self.group.time_limit_s, "time_cut": self.time_cut} if self.group.time_limit_s else {}),
        }
        set_aside(self.out_dir, [*summary["records"], summary["calibration"]])
        return records.write(SearchFolder(self.out_dir).summary(), "search", summary)

    def request(self, n: int) -> planner.Request | None:
        return request_of(self.starts_of[n], self.objective, self.margin)

    def loses_at_every_reply(self, n: int, theirs: planner.Request | None) -> bool:
        """Whether n's first start loses to a rival's winner (``theirs``) at every reply length the objective is
        asked about (#40: a configuration 21% faster on decode was dropped at a 64-token reply); for an objective
        that does not depend on the reply, the objective alone decides. Without either request's figures: False."""
        recs = self.starts_of[n][:1]
        longest = longest_reply(self.objective, recs)
        if longest is None:
            return True
        ours = request_of(recs, self.objective, self.margin)
        return ours is not None and theirs is not None and planner.loses_at_every_reply(ours, theirs, longest)

    def cut_short(self, n: int, speed: planner.Speed, gid: str, rival_n: int, rival: planner.Speed) -> dict:
        """Where the lowest value with the margin is clearly slower than a rival search's winner (``prune``)."""
        text = cut_short_text(n, speed, gid, rival_n, rival, self.words())
        progress.say(text)
        return {"winner": n, "climbed": [], "climb_stop": text, "cut_short": True}

    def partial(self, lowest: int) -> list[dict]:
        """Step 4b: the boundary layer's experts in part on the card. Where n_cpu_moe ``lowest`` - 1 did not keep
        the margin, the layer between them may still bring part of its experts (up, or up and gate, as --fit on
        places a boundary layer) to the card: each placement predicted, from ``lowest``'s measured headroom less the
        tensors' bytes and the activations a split layer adds (``planner.split_layer_mib``), to keep the margin is
        probed, the larger move first, until one keeps it; it then competes
        with the climb's values for the finalists. None where the group overrides tensors itself, there is no VRAM
        limit, or the layer is not on the card, or the group did not ask for it (``partial``). Returns what was
        predicted and done, for the summary."""
        lo = self.range[0]
        headroom = (self.starts_of[lowest][0].get("memory") or {}).get("headroom_mib")
        layer = lowest - 1
        if (
            not self.group.partial
            or not self.limit
            or headroom is None
            or layer < lo
            or self.group.given.get("override_tensor")
            or layer not in planner.gpu_layers(self.manifest, self.group.given.get("n_gpu_layers"))
        ):
            return []
        done = []
        ubatch = self.starts_of[lowest][0]["settings"]["ubatch"]
        for value, moved, left in planner.partials(self.manifest, layer, headroom, ubatch):
            entry = {
                "n_cpu_moe": value.whole,
                "override_tensor": value.override,
                "moved_mib": moved,
                "predicted_headroom_mib": left,
            }
            done.append(entry)
            if left < self.margin:
                crossing = planner.split_layer_mib(self.manifest, ubatch, value.on_cpu)
                entry["status"] = (
                    f"skipped: predicted to leave {left:,.0f} MiB ({headroom:,.0f} at n_cpu_moe {lowest} less "
                    f"{moved:,.0f} of weights and {crossing:,.0f} of activations crossing to the CPU), "
                    f"under the {self.margin:,} MiB margin"
                )
                continue
            if why := self.out_of_time(f"the partial placement n_cpu_moe {value}"):
                entry["status"] = why
                break
            rec = self.probe(value, f"layer {layer} in part on the card: predicted to leave {left:,.0f} MiB")
            entry["config_id"] = self.measured[value]
            entry["headroom_mib"] = (rec.get("memory") or {}).get("headroom_mib")
            if headroom_ok(rec, self.margin):
                entry["status"] = "measured: kept the margin"
                break
            entry["status"] = f"measured: {outcome_text(rec) if rec['outcome'] != Outcome.OK else 'under the margin'}"
        return done

    def fastest(self, lowest: int, hi: int) -> dict:
        """Steps 5 and 6: the climb above the lowest value with the margin, then the finalists' interleaved starts."""
        most, starts = self.climb, self.starts
        self.stage = "climb"
        first = self.first(lowest)
        rival = best_rival(self.rivals, self.objective)
        raced = {"rival": {"search": rival[0], "n_cpu_moe": rival[1], **stat(rival[2])}} if rival else {}
        if first is not None and rival is not None and first.high < rival[2].low:
            if self.loses_at_every_reply(lowest, rival[3]):
                return {**self.cut_short(lowest, first, *rival[:3]), **raced}
            progress.say(
                f"n_cpu_moe {lowest}, the lowest with the margin, {self.words()} {first.text()}, lies below the "
                f"winner of search {rival[0]} ({rival[2].text()}) at the asked reply but not at every reply length: "
                "it climbs and its finalists start as the answer's do"
            )
        partial = self.partial(lowest)
        progress.say(
            f"climb from n_cpu_moe {lowest}, the lowest with the {self.margin:,} MiB margin: {self.words()} "
            f"{first.text() if first else 'n/a'}; up to {most} value(s) above it while faster or within noise"
        )

        def said(step: planner.Step, i: int) -> None:
            if step.speed is None:
                text = f"{outcome_text(self.starts_of[step.n_cpu_moe][0])}: not safe with the margin, stop"
            else:
                going = "stop" if step.verdict == "slower" else "go on"
                best = self.first(step.best)
                text = f"{step.speed.text()}, {step.verdict}; best so far {step.best} ({best.text()}): {going}"
            self.climbed = i
            progress.say(f"climb {i}/{most}: n_cpu_moe {step.n_cpu_moe} {text}{self.left()}")

        steps, stop = planner.climb(
            self.first,
            lowest,
            hi,
            most,
            said,
            lambda n: None if n in self.starts_of else self.out_of_time(f"the climb from n_cpu_moe {n} on"),
        )
        progress.say(f"climb done: {stop}")
        safe = {n: s for n in self.starts_of if (s := self.speed(self.starts_of[n][:1]))}  # in the order measured
        chosen = planner.finalists(safe)
        best, others = chosen[0], chosen[1:]
        if not others:
            who = f"{best}, the only value that survived with the margin"
        elif planner.within_noise(safe[others[0]], safe[best]):
            who = f"{best} (the fastest in one start), {', '.join(map(str, others))} (within noise of it)"
        else:
            who = f"{best} (the fastest in one start), {others[0]} (the runner-up, apart in one start)"
        round_ = " ".join(str(n) for n in safe if n in chosen)
        self.stage, self.finalist_starts = "finalists", len(chosen) * (starts - 1)
        progress.say(f"finalists: {who}; {starts} server starts each, interleaved: {', '.join([round_] * starts)}")
        result = planner.settle(
            self.again,
            self.pooled,
            safe,
            starts,
            left_out=lambda k: self.out_of_time(f"the finalists' start {k} of {starts} and any later one"),
        )
        joined = [n for n in result["finalists"] if n not in chosen]
        if joined:
            progress.say(f"joined the finalists: {', '.join(map(str, joined))} (faster in one start than the winner)")
        winner = result["winner"]
        if winner is not None:
            pooled = result["pooled"][winner]
            progress.say(
                f"winner: n_cpu_moe {winner}, {self.words()} {pooled.text()} over {len(result['per_start'][winner])} "
                "start(s) "
                f"({pooled.n} requests); {result['lead_held']}"
            )
        else:
            progress.say(f"no winner: {result['lead_held']}")
        if result["cut"]:  # ranked on the starts they have
            result["lead_held"] = f"{result['lead_held']}; {result['cut']}"
        return {
            **raced,
            "partial": partial,
            **{k: result[k] for k in ("winner", "runner_up", "won", "pairs", "lead_held")},
            "climbed": [{"n_cpu_moe": st.n_cpu_moe, **stat(st.speed), "verdict": st.verdict} for st in steps],
            "climb_stop": stop,
            "finalists": [
                {
                    **dict(zip(("n_cpu_moe", "override_tensor"), planner.plain(n), strict=True)),
                    "config_id": self.measured[n],
                    "starts": len(result["per_start"][n]),
                    "start_medians": [s.median if s else None for s in result["per_start"][n]],
                    **stat(result["pooled"][n]),
                    # its request's first token and decode, pooled: a later search's cut_short weighs every reply
                    "request": (req.as_dict() if (req := self.request(n)) else None),
                    "survived": all(s is not None for s in result["per_start"][n]),
                    "records": self.ids_of[n],
                }
                for n in result["finalists"]
            ],
            "start_order": [{"n_cpu_moe": planner.plain(n)[0], "start": k} for n, k in result["order"]],
        }
