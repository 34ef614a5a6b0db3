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
include: "rules/report.smk"
include: "rules/publish.smk"


rule all:
    default_target: True
    input:
        rules.report.output,


onstart:
    print(f"crashline: config {CONFIG_FILE}", file=sys.stderr)
    print("\n".join(crashline_config.plan_lines(CFG)), file=sys.stderr)
