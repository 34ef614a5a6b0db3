"""The longest context a finished run's answer survives (#43 item 3): the planner's prediction, then real server
starts that each send one prompt filling the context, bisected on a grid of ``step`` tokens.

The prediction: the first start, the answer at its own context filled under the same budget, calibrates the
planner, which adds what every more token takes: its KV cache (from the model's manifest) and its share of the
attention mask (``planner.mask_mib``). On a GPU the peak is ``planner.predict`` with the compute buffer and the rest
that start measured at load (``search_rules.calibration``), against the card (or its VRAM budget); without one, the
host peak of that start's memory cgroup plus the KV cache the planner counts in host memory (``planner.host_mib``),
against the host-memory budget (the one given, else the run's, else the machine's RAM), which each start runs under
(``engine/hostmem.py``). The longest context predicted to keep the margin, rounded down to the step, is the next
start; from there ``planner.search_lowest``, counted down from the top, gallops and bisects. A start survives when
it served its prompt (outcome ok) and its peak left at least the margin."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import psutil

from ..config import plan
from ..config.plan import ConfigError
from ..core import progress, records
from ..core import settings as S
from ..core.atomic import read_json, write_json
from ..core.paths import Layout, RecordFolder, SearchFolder
from ..core.records import Outcome
from ..core.units import MIB
from ..engine import planner
from . import spec as jobs
from .contract import Budget, Item
from .measure import MeasurePaths, job_key, measure
from .search_rules import calibration
from .serve import outcome_text

DEFAULT_STEP = 4096
REPLY_TOKENS = 16  # the reply each start asks for after its prompt
# Tokens of the context the prompt leaves besides the reply: a reply that reaches the context's last cell is one the
# server flags as truncated (gemma at -c 2048, a 2,032-token prompt and a 16-token reply).
SPARE_TOKENS = 16


def fill(ctx: int) -> dict:
    """The one workload of a start at ``ctx``: a prompt filling the context but for the reply and the spare."""
    return {"name": f"fill-{ctx}", "prompt_tokens": ctx - REPLY_TOKENS - SPARE_TOKENS, "gen_tokens": REPLY_TOKENS}


ROOM_WORDS = {"vram": "VRAM", "host": "host memory"}


@dataclasses.dataclass(frozen=True)
class Room:
    """What a start's peak is held against: the VRAM (``on`` "vram") or the host memory ("host"), its limit and the
    margin to keep."""

    on: str
    limit_mib: float
    margin_mib: int

    def headroom(self, rec: dict) -> float | None:
        """A start's headroom against this limit, from its record (None where it has none)."""
        memory = rec.get("memory") or {}
        return memory.get("headroom_mib" if self.on == "vram" else "host_headroom_mib")

    def survives(self, rec: dict) -> bool:
        headroom = self.headroom(rec)
        return rec["outcome"] == Outcome.OK and headroom is not None and headroom >= self.margin_mib


def peak_at(manifest: dict, settings: dict, rec: dict, on: str) -> Callable[[int], float]:
    """The planner's predicted peak (MiB) at context ``ctx``, calibrated by ``rec`` (a start at ``settings``): what
    it measured, plus the KV cache and the attention mask (``planner.mask_mib``) of the tokens beyond its context."""
    if on == "vram":
        compute, rest = calibration(rec, settings["ubatch"])

        def held(ctx: int) -> float:  # the KV cache of the offloaded layers at this context
            return planner.predict(manifest, {**settings, "ctx": ctx}, compute, rest)["total_mib"]

    else:
        memory = rec["memory"]
        measured = memory.get("host_peak_mib") or memory["peak_rss_mib"]

        def held(ctx: int) -> float:
            kv = planner.host_mib(manifest, {**settings, "ctx": ctx}, gpu=False)["kv_mib"]
            return measured + kv - planner.host_mib(manifest, settings, gpu=False)["kv_mib"]

    return lambda ctx: held(ctx) + planner.mask_mib({**settings, "ctx": ctx}) - planner.mask_mib(settings)


def predicted_ctx(peak: Callable[[int], float], room: Room, step: int, top: int) -> int | None:
    """The longest context on the grid of ``step`` up to ``top`` whose predicted peak keeps the margin (None: not
    even one step)."""
    return next(
        (k * step for k in range(top // step, 0, -1) if peak(k * step) + room.margin_mib <= room.limit_mib), None
    )


def longest(
    survives: Callable[[int], bool], predicted: int | None, step: int, top: int
) -> tuple[int | None, list[tuple[int, bool]]]:
    """The longest context on the grid of ``step`` up to ``top`` that survives (None: not even one step), survival
    falling as the context grows, and the contexts started in order: ``planner.search_lowest`` over the steps
    counted down from ``top``, starting at ``predicted`` (one step where nothing is predicted to fit)."""
    most = top // step
    found, probes = planner.search_lowest(
        lambda m: survives((most - m) * step), most - (predicted or step) // step, 0, most - 1
    )
    return (None if found is None else (most - found) * step), [((most - m) * step, ok) for m, ok in probes]


def predicted_text(predicted: int | None, peak: Callable[[int], float], room: Room) -> str:
    """The prediction in a progress line."""
    against = f"the {room.margin_mib:,} MiB margin under the {room.limit_mib:,.0f} MiB of {ROOM_WORDS[room.on]}"
    if predicted is None:
        return f"predicted: no context keeps {against}"
    return f"predicted: -c {predicted:,} peaks at {peak(predicted):,.0f} MiB, keeping {against}"


def _why_not(rec: dict, room: Room) -> str:
    """Why a start did not survive, in a few words."""
    if rec["outcome"] != Outcome.OK:
        return outcome_text(rec)
    return f"left {room.headroom(rec):,.0f} MiB, under the {room.margin_mib:,} MiB margin"


def line(found: dict) -> str:
    """The one line: "holds 12,288 tokens with 1,050 MiB to spare (predicted 12,288; -c 16,384 ran out of ...)"."""
    failed = [s for s in found["starts"] if not s["survived"]]
    above = min((s for s in failed if s["ctx"] > (found["longest_ctx"] or 0)), key=lambda s: s["ctx"], default=None)
    predicted = "nothing" if found["predicted_ctx"] is None else f"{found['predicted_ctx']:,}"
    said = [f"predicted {predicted}"]
    if above:
        said.append(f"-c {above['ctx']:,} {above['why']}")
    elif found["longest_ctx"] == found["top_ctx"]:
        said.append(f"the model's trained context, {found['top_ctx']:,}")
    where = f"{'finalist ' if found.get('role') == 'finalist' else ''}{found['model']} {found['config_id']}"
    if found.get("speed") is not None:
        where += f" ({found['speed_label']} {found['speed']:,.1f} t/s at {found['workload']})"
    if found["longest_ctx"] is None:
        return f"{where}: holds no context of {found['step']:,} tokens or more ({'; '.join(said)})"
    return (
        f"{where}: holds {found['longest_ctx']:,} tokens with {found['headroom_mib']:,.0f} MiB of "
        f"{ROOM_WORDS[found['on']]} to spare "
        f"({'; '.join(said)})"
    )


def _room(cfg: dict, rec: dict, host_ram_mib: int | None, margin_mib: int | None) -> tuple[Room, Budget]:
    """What the starts are held against and run under: the card (or the run's VRAM budget) where the answer ran on
    a GPU, else the host-memory budget given, the run's, or the machine's RAM; the margin given, else the run's."""
    budget = cfg["budget"]
    margin = budget["margin_mib"] if margin_mib is None else margin_mib
    limit = (rec.get("memory") or {}).get("vram_limit_mib")
    host = host_ram_mib or budget["host_ram_mib"]
    if limit is not None:
        return Room("vram", limit, margin), Budget(budget["vram_budget_mib"], host)
    host = host or round(psutil.virtual_memory().total / MIB)
    return Room("host", host, margin), Budget(budget["vram_budget_mib"], host)


class Starts:
    """The server starts at one configuration's settings with only the context changed, each one prompt filling
    it (``fill``), under the budget: each start's record under ``out``/records/MODEL/ID/ (one there already, of the
    same workload, budget, build and model file, is read again, not started: the same command again starts only
    what is missing) and its row."""

    def __init__(self, cfg: dict, layout: Layout, model: str, rec: dict, budget: Budget, room: Room, out: Path):
        self.model, self.settings, self.given, self.room, self.out = model, rec["settings"], rec["given"], room, out
        draft = self.settings.get("draft_model")
        self.inputs = jobs.inputs(
            layout.fetch(model), layout.manifest(model), layout.provenance(), layout.fetch(draft) if draft else None
        ).records()
        self.base = dataclasses.replace(
            jobs.measurement_of(cfg), repetitions=1, warmup_requests=0, conversations=(), soak=None, budget=budget
        )
        self.rows: list[dict] = []
        self.done: dict[int, dict] = {}

    def run(self, ctx: int, peak: Callable[[int], float] | None = None) -> dict:
        """The start at ``ctx`` (its record); its row says the peak ``peak`` predicted (None: the calibration)."""
        if ctx in self.done:  # the calibration's context, on the grid
            return self.done[ctx]
        resolved = {**self.settings, "ctx": ctx}
        start_id = S.config_id(self.model, resolved)
        folder = RecordFolder(self.out / "records" / self.model / start_id)
        measurement = dataclasses.replace(self.base, workloads=(fill(ctx),))
        key = job_key(measurement, self.inputs.provenance, self.inputs.fetch_record)
        done = records.load(folder.measure, "measure") if folder.measure.exists() else None
        if done is None or done.get("job_key") != key:  # none yet, or measured under another budget or build
            folder.folder.mkdir(parents=True, exist_ok=True)
            progress.say(f"-c {ctx:,}: one prompt of {fill(ctx)['prompt_tokens']:,} tokens ({start_id})")
            item = Item(start_id, resolved, {**self.given, "ctx": ctx})
            done = measure(jobs.MeasureSpec(self.model, item, measurement), self.inputs, MeasurePaths.of(folder))
        ok = self.room.survives(done)
        self.rows.append(
            {
                "ctx": ctx,
                "prompt_tokens": fill(ctx)["prompt_tokens"],
                "config_id": start_id,
                "calibration": peak is None,
                "outcome": done["outcome"],
                "headroom_mib": self.room.headroom(done),
                "predicted_peak_mib": None if peak is None else round(peak(ctx), 1),
                "survived": ok,
                "why": None if ok else _why_not(done, self.room),
                "record": str(folder.measure),
            }
        )
        self.done[ctx] = done
        return done


def answer_context(
    cfg: dict,
    layout: Layout,
    model: str,
    cid: str,
    out: Path,
    step: int,
    host_ram_mib: int | None = None,
    margin_mib: int | None = None,
    speed: dict | None = None,
) -> dict:
    """The longest context of configuration ``cid`` of ``model`` (a finished run's ``layout``), ``speed`` its speed
    as the run's answer gives it (``answer_speed``), said beside it. The first start is
    the answer at its own context, filled (``calibration``): it calibrates the planner under the same budget and
    workload as the starts after it (the run's record measured other workloads, and outside any memory cgroup); then
    the prediction, the starts from it, and the longest that survived."""
    found_records = layout.measure_records(model, cid)
    if not found_records:
        raise ConfigError(f"{layout.root}: configuration {model} {cid} has no measure record; give a finished run")
    rec = records.load(found_records[0], "measure")
    manifest = read_json(layout.manifest(model))
    room, budget = _room(cfg, rec, host_ram_mib, margin_mib)
    top = manifest["context_length"] // step * step
    if top < step:
        raise ConfigError(f"--step {step}: more than the model's trained context ({manifest['context_length']:,})")
    starts = Starts(cfg, layout, model, rec, budget, room, out)
    with progress.job(f"context {model} {cid}"):
        calibrated = starts.run(rec["settings"]["ctx"])
        peak = peak_at(manifest, rec["settings"], calibrated, room.on)
        predicted = predicted_ctx(peak, room, step, top)
        progress.say(predicted_text(predicted, peak, room))
        best, _ = longest(lambda ctx: room.survives(starts.run(ctx, peak)), predicted, step, top)
    at_best = next((s for s in starts.rows if s["ctx"] == best), None)
    found = {
        "model": model,
        "config_id": cid,
        **(speed or {}),
        "answer_ctx": rec["settings"]["ctx"],
        "on": room.on,
        "limit_mib": room.limit_mib,
        "margin_mib": room.margin_mib,
        "step": step,
        "top_ctx": top,
        "reply_tokens": REPLY_TOKENS,
        "spare_tokens": SPARE_TOKENS,
        "predicted_ctx": predicted,
        "starts": starts.rows,
        "longest_ctx": best,
        "headroom_mib": at_best["headroom_mib"] if at_best else None,
    }
    return {**found, "line": line(found)}


def answer_speed(answer: dict) -> dict:
    """An answer's speed from recommendation.json: its objective's label, median and workload."""
    return {"speed": answer.get("speed"), "speed_label": answer.get("metric_label"), "workload": answer.get("workload")}


def finalists(layout: Layout, answer: dict) -> list[str]:
    """The configurations an answer was chosen among (#43 item 3), in order, the answer left out: those the speeds
    could not tell from it (recommendation.json's ``tied_with``), then the finalists of the model's searches that
    survived every start (their first start's probe id, as search.json lists them)."""
    model, ids = answer["model"], list(answer.get("tied_with") or [])
    for summary in sorted((layout.root / "search" / model).glob(f"*/{SearchFolder.SUMMARY}")):
        for final in records.load(summary, "search").get("finalists") or []:
            if final.get("survived") and final.get("records"):
                ids.append(final["records"][0])
    return [cid for cid in dict.fromkeys(ids) if cid != answer["winner"]]


def finalist_speed(layout: Layout, answer: dict, cid: str) -> dict:
    """A finalist's speed by its answer's objective (the run's measurements table), beside its context."""
    import pandas as pd

    speed = None
    if layout.measurements_table().is_file():
        table = pd.read_parquet(layout.measurements_table())
        rows = table[
            (table["model"] == answer["model"])
            & (table["config_id"] == cid)
            & (table["workload"] == answer.get("workload"))
        ]
        column = f"{answer.get('metric')}_median"
        if len(rows) and column in rows and rows[column].notna().any():
            speed = float(rows[column].dropna().iloc[0])
    return {**answer_speed(answer), "speed": speed, "role": "finalist"}


def context(
    results: Path,
    out: Path,
    step: int | None = None,
    host_ram_mib: int | None = None,
    margin_mib: int | None = None,
    with_finalists: bool = False,
) -> list[dict]:
    """Every answer of the finished run at ``results`` (its results_dir), and with ``with_finalists`` the
    configurations it was chosen among (``finalists``): ``answer_context`` each, written to ``out``/context.json."""
    layout = Layout(Path(results))
    saved = layout.root / ".crashline" / "config.json"
    for path, what in ((saved, "its config"), (layout.recommendation(), "its recommendation")):
        if not path.is_file():
            raise ConfigError(
                f"{results}: not the results folder of a finished crashline run ({what}, {path}, is missing); "
                "give the results_dir of a run whose report was made"
            )
    step = DEFAULT_STEP if step is None else step
    if step < 1:
        raise ConfigError(f"--step {step}: give a positive number of tokens (default {DEFAULT_STEP})")
    cfg = plan.validate(read_json(saved), plan.load_schema())
    answers = [a for a in read_json(layout.recommendation()) if a.get("winner")]
    if not answers:
        raise ConfigError(f"{results}: the run recommended no configuration, so there is no answer to hold a context")
    asked = {}
    for a in answers:
        asked[(a["model"], a["winner"])] = {**answer_speed(a), "role": "answer"}
        for cid in finalists(layout, a) if with_finalists else []:
            asked.setdefault((a["model"], cid), finalist_speed(layout, a, cid))
    found = [
        answer_context(cfg, layout, model, cid, out, step, host_ram_mib, margin_mib, speed)
        for (model, cid), speed in asked.items()
    ]
    write_json(out / "context.json", found)
    return found
