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
        gpu=gpus_of("measure"),
    params:
        spec=job_spec("measure"),
    script:
        "../scripts/job.py"


rule search:
    input:
        unpack(search_inputs),
    output:
        summary=LAYOUT.search("{model}", "{gid}"),
    log:
        f"{RESULTS}/logs/search/{{model}}/{{gid}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/search/{{model}}/{{gid}}.tsv"
    conda:
        "../envs/crashline.yaml"
    resources:
        gpu=gpus_of("search"),
    params:
        spec=job_spec("search"),
    script:
        "../scripts/job.py"
