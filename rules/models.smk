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
    shell:
        "python -m crashline fetch --model {wildcards.model:q} --out {output:q} > {log:q} 2>&1"


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
    shell:
        "python -m crashline inspect --fetch-record {input:q} --out {output:q} > {log:q} 2>&1"


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
    shell:
        "python -m crashline warmup --fetch-record {input:q} --out {output:q} > {log:q} 2>&1"
