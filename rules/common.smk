# The config (the --configfile alone, else the demo), validated; the output layout and input functions.
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(workflow.basedir) / "src"))

from crashline.config import plan as crashline_plan  # noqa: E402
from crashline.jobs import spec as crashline_spec  # noqa: E402
from crashline.engine import eta as crashline_eta  # noqa: E402
from crashline.core import settings as crashline_settings  # noqa: E402
from crashline.tables import recommend as crashline_recommend  # noqa: E402
from crashline.core.atomic import write_json  # noqa: E402
from crashline.core.changes import what_changed  # noqa: E402
from crashline.core.owned import UnsafeFolderError, own_results  # noqa: E402
from crashline.core.paths import (
    Layout,
    merged_records as crashline_merged_records,
    recheck_tables as crashline_recheck_tables,
)  # noqa: E402
from crashline.core.paths import table_files as crashline_table_files  # noqa: E402
from crashline.report import not_made as crashline_not_made  # noqa: E402
from crashline.tables.files import keys_of as crashline_keys_of  # noqa: E402

from snakemake.utils import update_config  # noqa: E402

# --configfile FILE runs exactly FILE (plus any --config KEY=VALUE); without it, the demo config.
if not workflow.config_settings.configfiles:
    CONFIG_FILE = crashline_plan.DEFAULT_CONFIG
    try:
        demo = crashline_plan.read_yaml(Path(CONFIG_FILE), "configuration file")
    except crashline_plan.ConfigError as exc:
        raise WorkflowError(str(exc)) from None
    update_config(demo, config)
    config.clear()
    config.update(demo)
else:
    CONFIG_FILE = ", ".join(map(str, workflow.config_settings.configfiles))
    try:  # Snakemake's own reading keeps the last of a key written twice: refuse that first
        for path in workflow.config_settings.configfiles:
            crashline_plan.read_yaml(Path(path), "configuration file")
    except crashline_plan.ConfigError as exc:
        raise WorkflowError(str(exc)) from None
try:
    CFG = crashline_plan.validate(config, crashline_plan.load_schema())
except crashline_plan.ConfigError as exc:
    raise WorkflowError(str(exc)) from None

LAYOUT = Layout(CFG["results_dir"])
RESULTS = CFG["results_dir"]
# The results folder and its .crashline/ are the user's own, which nobody else can make a write land elsewhere
# through (crashline.core.owned): checked on every run, dry ones too, before anything is written there.
try:
    own_results(RESULTS, "results_dir")
except UnsafeFolderError as exc:
    raise WorkflowError(str(exc)) from None
except OSError as exc:
    raise WorkflowError(
        f"crashline cannot make results_dir {RESULTS}: {exc.strerror or exc}"
    ) from None


def report_not_made(layout, log_dir: Path) -> str | None:
    """Why `snakemake --report FILE` cannot pack the report (crashline.report.not_made: the last run's failed job,
    its error and its log; Snakemake itself names only the first file it misses): None when it can.
    """
    packed = [
        path
        for table in (
            layout.configs_table(),
            layout.measurements_table(),
            layout.searches_table(),
            layout.conversations_table(),
        )
        for path in crashline_table_files(table)[1:]
    ]
    return crashline_not_made.why_not_made(
        layout.report_md(), [layout.report_html(), *packed], log_dir
    )


def packing_report() -> bool:
    """Whether Snakemake was asked to pack the report (--report FILE): it runs no job and changes nothing."""
    return any(a == "--report" or a.startswith("--report=") for a in sys.argv)


if packing_report():
    why = report_not_made(LAYOUT, Path(".snakemake") / "log")
    if why:
        raise WorkflowError(why)
CONFIGURATIONS = crashline_plan.expand(CFG)
CONFIG_BY_KEY = {(c["model"], c["id"]): c for c in CONFIGURATIONS}

# The validated, merged config the jobs read (written only when it changes).
EFFECTIVE_CONFIG = Path(RESULTS) / ".crashline" / "config.json"
LAST_CONFIG = (
    json.loads(EFFECTIVE_CONFIG.read_text()) if EFFECTIVE_CONFIG.exists() else None
)
if LAST_CONFIG != json.loads(json.dumps(CFG)):
    if (
        LAST_CONFIG is not None
    ):  # what the jobs Snakemake reruns read differently, in a line each (dry runs too)
        print(
            "crashline: what changed in the config since the last run\n  "
            + "\n  ".join(
                what_changed(LAST_CONFIG, json.loads(json.dumps(CFG)), most=20)
            ),
            file=sys.stderr,
        )
    # a full disk, a folder this user cannot write: one line, not a traceback
    try:
        write_json(EFFECTIVE_CONFIG, CFG)
    except OSError as exc:
        said = exc.strerror or str(exc)
        where = "" if str(EFFECTIVE_CONFIG) in said else f" ({EFFECTIVE_CONFIG})"
        raise WorkflowError(
            f"crashline cannot write its config: {said}{where}"
        ) from None

# Jobs run `python -m crashline ...` and find the package, this interpreter (unless a conda env
# is active for the job) and the effective config through their environment.
os.environ.update(
    CRASHLINE_CONFIG=str(EFFECTIVE_CONFIG),
    PYTHONPATH=str(Path(workflow.basedir) / "src"),
    PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]),
)


wildcard_constraints:
    model="[A-Za-z0-9][A-Za-z0-9._-]*",
    cid="[0-9a-f]{10}",
    gid="[0-9a-f]{10}",
    k="[2-9]|[1-9][0-9]+",


def configuration(wildcards):
    return CONFIG_BY_KEY[(wildcards.model, wildcards.cid)]


def model_spec(wildcards):
    """What identifies a model's bytes: rerun fetch only when this changes."""
    model = CFG["models"][wildcards.model]
    return json.dumps(
        {k: model.get(k) for k in ("source", "sha256", "synthetic")}, sort_keys=True
    )


def measure_inputs(wildcards):
    item = configuration(wildcards)
    inputs = {
        "fetch": LAYOUT.fetch(wildcards.model),
        "manifest": LAYOUT.manifest(wildcards.model),
        "warmup": LAYOUT.warmup(wildcards.model),
        "server": LAYOUT.provenance(),
    }
    draft = item["settings"].get("draft_model")
    if draft:
        inputs["draft"] = LAYOUT.fetch(draft)
    return inputs


def later_start_inputs(wildcards):
    """Start k of a configuration: a measurement's inputs, its own earlier starts (read to know whether it is left
    out), and start k - 1 of every configuration of the model that asks for k starts: round k waits for round k - 1.
    """
    model, k = wildcards.model, int(wildcards.k)
    return {
        **measure_inputs(wildcards),
        "earlier": LAYOUT.start_records(model, wildcards.cid, k - 1),
        "round": [
            LAYOUT.start_records(model, c["id"], k - 1)[-1]
            for c in CONFIGURATIONS
            if c["model"] == model and c.get("starts", 1) >= k
        ],
    }


def needle_inputs(wildcards):
    """A needle job's inputs: a measurement's, the needle record of the configuration whose recall stands
    for this one's (the same llama-server arguments), which it copies, and for a --fit on aimed at the margin
    its measure record, whose --fit-target it is checked at."""
    model, cid = wildcards.model, wildcards.cid
    twin = crashline_plan.needle_twin(CFG, model, cid)
    return {
        **measure_inputs(wildcards),
        **({"twin": LAYOUT.needle_record(model, twin)} if twin else {}),
        **(
            {"measured": LAYOUT.record(model, cid)}
            if crashline_plan.recall_as_measured(CFG, model, cid)
            else {}
        ),
    }


def job_spec(job):
    """The rule's params: everything the job reads besides its input files (crashline.jobs.spec); a change
    reruns it, and the job reads exactly this."""

    def spec(wildcards):
        job_id = wildcards.gid if job in ("search", "search_needle") else wildcards.cid
        start = int(getattr(wildcards, "k", 1))  # measure_start's
        return crashline_spec.to_json(
            crashline_spec.spec(job, CFG, wildcards.model, job_id, start)
        )

    return spec


SEARCHES = crashline_plan.expand_searches(CFG)
SEARCH_BY_KEY = {(g["model"], g["id"]): g for g in SEARCHES}


def search_inputs(wildcards):
    """A search's inputs: a measurement's, and the summaries of its rivals (a search with `prune` runs after its
    model's searches listed before it and reads their winners)."""
    group = SEARCH_BY_KEY[(wildcards.model, wildcards.gid)]
    return {
        "fetch": LAYOUT.fetch(wildcards.model),
        "manifest": LAYOUT.manifest(wildcards.model),
        "warmup": LAYOUT.warmup(wildcards.model),
        "server": LAYOUT.provenance(),
        "rivals": [
            LAYOUT.search(wildcards.model, gid) for gid in group.get("rivals", [])
        ],
        **draft_input(group),
    }


def draft_input(group):
    """The draft model's fetch record, for a search whose probes load one beside the model."""
    draft = group["given"].get("draft_model")
    return {"draft": LAYOUT.fetch(draft)} if draft else {}


def gpus_of(job):
    """The rule's `gpu` resource: the GPUs its job holds (crashline.core.locks), 1 unless its settings ask for more.
    `--resources gpu=N` admits jobs holding N GPUs in all at once; a cluster profile asks the scheduler for them.
    """

    def gpus(wildcards):
        if job in ("search", "search_needle"):
            given = SEARCH_BY_KEY[(wildcards.model, wildcards.gid)]["given"]
            return crashline_settings.gpu_count(crashline_settings.resolve(given))
        return crashline_settings.gpu_count(configuration(wildcards)["settings"])

    return gpus


def all_records(wildcards):
    """Every configuration's records (one per server start), every search's summary (which stands for its probes), and the records of
    other machines' runs (merge_results)."""
    return (
        [
            path
            for c in CONFIGURATIONS
            for path in LAYOUT.start_records(c["model"], c["id"], c.get("starts", 1))
        ]
        + [LAYOUT.search(g["model"], g["id"]) for g in SEARCHES]
        + crashline_merged_records(CFG["merge_results"], CFG["models"], "measure")
    )


def all_needle_records(wildcards):
    """Every configuration's needle record, every search's recall check (standing for its candidates'), and the
    needle records of other machines' runs (merge_results)."""
    return (
        [LAYOUT.needle_record(c["model"], c["id"]) for c in CONFIGURATIONS]
        + [LAYOUT.search_recall(g["model"], g["id"]) for g in SEARCHES]
        + crashline_merged_records(CFG["merge_results"], CFG["models"], "needle")
    )


def dry_run() -> bool:
    """Whether Snakemake was asked for a dry run (-n, -np, --dry-run): the executor that knows is not yet made when
    this file is read."""
    return any(
        a in ("--dry-run", "--dryrun")
        or (a.startswith("-") and not a.startswith("--") and "n" in a[1:])
        for a in sys.argv[1:]
    )


def forget_tables_of_gone_records():
    """A record deleted by hand is measured again. Snakemake does not rerun a job whose input is gone while its
    outputs are up to date, so the table that still holds the configuration and the report's answer made from it
    are removed (both are made from the records alone) and rebuilt; a dry run only says so. A record not yet made
    is no record gone."""
    for record_of, table in (
        (LAYOUT.record, LAYOUT.configs_table()),
        (LAYOUT.needle_record, LAYOUT.needle_table()),
    ):
        if not Path(table).exists():
            continue
        held = crashline_keys_of(table)
        gone = [
            str(record_of(*key))
            for key in CONFIG_BY_KEY
            if key in held and not record_of(*key).exists()
        ]
        if not gone:
            continue
        said = f"{len(gone)} record(s) gone since {table} was made ({', '.join(gone[:3])}{', …' if len(gone) > 3 else ''})"
        # a dry run, and --report (which packs what is there), remove nothing
        if dry_run() or packing_report():
            print(
                f"crashline: {said}: the next run measures them again", file=sys.stderr
            )
            continue
        print(f"crashline: {said}: measuring them again", file=sys.stderr)
        for path in [*crashline_table_files(table), LAYOUT.recommendation()]:
            Path(path).unlink(missing_ok=True)


forget_tables_of_gone_records()
