# The config (the --configfile alone, else the demo), validated; the output layout and input functions.
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(workflow.basedir) / "src"))

from crashline.config import plan as crashline_config  # noqa: E402
from crashline.jobs import spec as crashline_jobs  # noqa: E402
from crashline.core import settings as crashline_settings  # noqa: E402
from crashline.tables import recommend as crashline_recommend  # noqa: E402
from crashline.core.atomic import write_json  # noqa: E402
from crashline.core.paths import (
    Layout,
    merged_records as crashline_merged_records,
    recheck_tables as crashline_recheck_tables,
)  # noqa: E402
from crashline.core.paths import table_files as crashline_table_files  # noqa: E402

from snakemake.utils import update_config  # noqa: E402

# --configfile FILE runs exactly FILE (plus any --config KEY=VALUE); without it, the demo config.
if not workflow.config_settings.configfiles:
    CONFIG_FILE = crashline_config.DEFAULT_CONFIG
    try:
        demo = crashline_config.read_yaml(Path(CONFIG_FILE), "configuration file")
    except crashline_config.ConfigError as exc:
        raise WorkflowError(str(exc)) from None
    update_config(demo, config)
    config.clear()
    config.update(demo)
else:
    CONFIG_FILE = ", ".join(map(str, workflow.config_settings.configfiles))
    try:  # Snakemake's own reading keeps the last of a key written twice: refuse that first
        for path in workflow.config_settings.configfiles:
            crashline_config.read_yaml(Path(path), "configuration file")
    except crashline_config.ConfigError as exc:
        raise WorkflowError(str(exc)) from None
try:
    CFG = crashline_config.validate(config, crashline_config.load_schema())
except crashline_config.ConfigError as exc:
    raise WorkflowError(str(exc)) from None

LAYOUT = Layout(CFG["results_dir"])
RESULTS = CFG["results_dir"]
CONFIGURATIONS = crashline_config.expand(CFG)
CONFIG_BY_KEY = {(c["model"], c["id"]): c for c in CONFIGURATIONS}

# The validated, merged config the jobs read (written only when it changes).
EFFECTIVE_CONFIG = Path(RESULTS) / ".crashline" / "config.json"
if not EFFECTIVE_CONFIG.exists() or json.loads(
    EFFECTIVE_CONFIG.read_text()
) != json.loads(json.dumps(CFG)):
    write_json(EFFECTIVE_CONFIG, CFG)

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


def job_spec(job):
    """The rule's params: everything the job reads besides its input files (crashline.jobs.spec); a change
    reruns it, and the job reads exactly this."""

    def spec(wildcards):
        job_id = wildcards.gid if job in ("search", "search_needle") else wildcards.cid
        return crashline_jobs.as_param(
            crashline_jobs.spec(job, CFG, wildcards.model, job_id)
        )

    return spec


SEARCHES = crashline_config.expand_searches(CFG)
SEARCH_BY_KEY = {(g["model"], g["id"]): g for g in SEARCHES}


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
    """Every configuration's record, every search's summary (which stands for its probes), and the records of
    other machines' runs (merge_results)."""
    return (
        [LAYOUT.record(c["model"], c["id"]) for c in CONFIGURATIONS]
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
