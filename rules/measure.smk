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
        "python -m crashline measure --model {wildcards.model} --id {wildcards.cid}"
        " --out {output.record} --log {output.server_log} --telemetry {output.telemetry} > {log} 2>&1"
