# One job per model x configuration: start llama-server, run every workload, write one record.


rule measure:
    input:
        unpack(measure_inputs),
    output:
        record=LAYOUT.record("{model}", "{cid}"),
        server_log=LAYOUT.server_log("{model}", "{cid}"),
        telemetry=LAYOUT.telemetry("{model}", "{cid}"),
    log:
        f"{RESULTS}/logs/measure/{{model}}/{{cid}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/measure/{{model}}/{{cid}}.tsv"
    conda:
        "../envs/crashline.yaml"
    resources:
        server=1,
    params:
        depends_on=measure_params,
    shell:
        "python -m crashline measure --model {wildcards.model:q} --id {wildcards.cid:q}"
        " --out {output.record:q} --log {output.server_log:q} --telemetry {output.telemetry:q} > {log:q} 2>&1"


rule search:
    input:
        fetch=LAYOUT.fetch("{model}"),
        manifest=LAYOUT.manifest("{model}"),
        warmup=LAYOUT.warmup("{model}"),
        server=LAYOUT.provenance(),
    output:
        LAYOUT.search("{model}", "{gid}"),
    log:
        f"{RESULTS}/logs/search/{{model}}/{{gid}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/search/{{model}}/{{gid}}.tsv"
    conda:
        "../envs/crashline.yaml"
    resources:
        server=1,
    params:
        depends_on=search_params,
    shell:
        "python -m crashline search --model {wildcards.model:q} --id {wildcards.gid:q} --out {output:q} > {log:q} 2>&1"
