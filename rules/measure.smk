# One job per model x configuration and server start: start llama-server, run every workload, write one record.


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
    priority: 1
    conda:
        "../envs/crashline.yaml"
    resources:
        gpu=gpus_of("measure"),
    params:
        spec=job_spec("measure"),
    script:
        "../scripts/job.py"


# Server start k > 1 of a configuration whose entry asks for starts: once every configuration of the model asking for
# k starts has made start k - 1 (A B, A B), so that drift between starts hits them alike.
rule measure_start:
    input:
        unpack(later_start_inputs),
    output:
        record=LAYOUT.later_record("{model}", "{cid}", "{k}"),
    log:
        f"{RESULTS}/logs/measure/{{model}}/{{cid}}-start-{{k}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/measure/{{model}}/{{cid}}-start-{{k}}.tsv"
    conda:
        "../envs/crashline.yaml"
    resources:
        gpu=gpus_of("measure"),
    params:
        spec=job_spec("measure"),
    script:
        "../scripts/job.py"


# a search finds the answer: under a time limit (tune --time) its optional starts come before those of fixed
# entries, and fixed entries' first starts before their later ones (eta.over_time sets aside what must still run)
rule search:
    input:
        unpack(search_inputs),
    output:
        summary=LAYOUT.search("{model}", "{gid}"),
    log:
        f"{RESULTS}/logs/search/{{model}}/{{gid}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/search/{{model}}/{{gid}}.tsv"
    priority: 2
    conda:
        "../envs/crashline.yaml"
    resources:
        gpu=gpus_of("search"),
    params:
        spec=job_spec("search"),
    script:
        "../scripts/job.py"
