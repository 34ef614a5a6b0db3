# crashline: the fastest llama.cpp server configuration that survives your real workload.
# `snakemake --cores 1 report` runs everything; see README.md.


configfile: "config/config.yaml"


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
