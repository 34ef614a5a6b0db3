# Fetch and verify each model, inspect it, and read it into the page cache.


rule fetch_model:
    output:
        LAYOUT.fetch("{model}"),
    log:
        f"{RESULTS}/logs/fetch/{{model}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/fetch/{{model}}.tsv"
    conda:
        "../envs/crashline.yaml"
    params:
        spec=model_spec,
    script:
        "../scripts/job.py"


rule inspect_model:
    input:
        LAYOUT.fetch("{model}"),
    output:
        LAYOUT.manifest("{model}"),
    log:
        f"{RESULTS}/logs/inspect/{{model}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/inspect/{{model}}.tsv"
    conda:
        "../envs/crashline.yaml"
    script:
        "../scripts/job.py"


rule warmup:
    input:
        LAYOUT.fetch("{model}"),
    output:
        LAYOUT.warmup("{model}"),
    log:
        f"{RESULTS}/logs/warmup/{{model}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/warmup/{{model}}.tsv"
    conda:
        "../envs/crashline.yaml"
    script:
        "../scripts/job.py"
