# What a quantised KV cache costs in quality: one job per model x quantised KV type its configurations use,
# llama-perplexity's KL divergence of that type against f16 (crashline.jobs.kvquality); a random-weight synthetic
# model gets a record that says the figure is not informative, without a pass.

KV_LABELS = crashline_plan.kv_labels(CFG)


wildcard_constraints:
    kv="[a-z0-9_]+(-[a-z0-9_]+)?",


rule kv_quality:
    input:
        fetch=LAYOUT.fetch("{model}"),
        warmup=LAYOUT.warmup("{model}"),
        server=LAYOUT.provenance(),
    output:
        record=str(LAYOUT.kv_quality("{model}", "{kv}")),
    log:
        f"{RESULTS}/logs/kv_quality/{{model}}/{{kv}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/kv_quality/{{model}}/{{kv}}.tsv"
    conda:
        "../envs/crashline.yaml"
    resources:
        gpu=1,
    params:
        # what the job reads of the config besides the wildcards: the context of its passes
        job=json.dumps(crashline_plan.kv_quality_job(CFG), sort_keys=True),
    script:
        "../scripts/job.py"


rule kv_quality_table:
    input:
        [
            str(LAYOUT.kv_quality(model, kv))
            for model, kvs in KV_LABELS.items()
            for kv in kvs
        ],
    output:
        crashline_table_files(LAYOUT.kv_quality_table()),
    log:
        f"{RESULTS}/logs/kv_quality_table.log",
    conda:
        "../envs/crashline.yaml"
    script:
        "../scripts/job.py"
