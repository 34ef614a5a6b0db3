# crashline: the fastest llama.cpp server configuration that survives your real workload.
# `snakemake --cores 1 report` runs everything; see README.md.
# The config is the file given with --configfile alone; without one, the demo run
# config/config.yaml (see rules/common.smk). Snakemake's `configfile:` would merge the two.


envvars:
    "PATH",


include: "rules/common.smk"
include: "rules/models.smk"
include: "rules/server.smk"
include: "rules/measure.smk"
include: "rules/needle.smk"
include: "rules/kv_quality.smk"
include: "rules/report.smk"
include: "rules/publish.smk"


# With a cluster executor (profiles/slurm), these run on the machine that runs Snakemake: downloads, reading a
# GGUF's header, tables and reports. The jobs that start llama-server go to the cluster.
localrules:
    fetch_model,
    inspect_model,
    warmup,
    aggregate,
    needle_table,
    kv_quality_table,
    report,
    publish_claim,


rule all:
    default_target: True
    input:
        rules.report.output,


onstart:
    print(f"crashline: config {CONFIG_FILE}", file=sys.stderr)
    print("\n".join(crashline_plan.plan_lines(CFG)), file=sys.stderr)
    # the server jobs find the plan here and say what is left of the run as each begins
    os.environ[crashline_eta.PLAN_ENV] = str(LAYOUT.run_plan())
    planned = crashline_eta.write_plan(CFG, LAYOUT.run_plan())
    for said in (
        crashline_eta.text(*crashline_eta.left(planned)),
        crashline_eta.limit_text(CFG),
    ):
        if said:
            print(said, file=sys.stderr)


# The main command ends with the answer, the summary table and the report's path on the console, the lines `crashline
# tune` prints (one function: cli.tune.answer), whenever the run made or kept the report (a run `--until` an earlier
# step says nothing: its report could be of another config). tune prints them itself.
onsuccess:
    from crashline.cli.tune import answer
    from crashline.core.supervision import WORKFLOW_PID

    made = any(job.rule.name == "report" for job in workflow.dag.jobs)
    if made and os.environ.get(WORKFLOW_PID) != str(os.getpid()):
        print("\n".join(["", *answer(CFG)]))
