# One needle-recall job per model x configuration: the model, served with exactly that
# configuration, must recall a random value buried at every length and depth of `needle:`.
# Random-weight synthetic models get a "not applicable" record without a server.


rule needle:
    input:
        unpack(measure_inputs),
    output:
        record=LAYOUT.needle_record("{model}", "{cid}"),
        server_log=LAYOUT.needle_server_log("{model}", "{cid}"),
    log:
        f"{RESULTS}/logs/needle/{{model}}/{{cid}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/needle/{{model}}/{{cid}}.tsv"
    conda:
        "../envs/crashline.yaml"
    resources:
        server=1,
    params:
        spec=job_spec("needle"),
    script:
        "../scripts/job.py"


rule needle_table:
    input:
        all_needle_records,
    output:
        crashline_table_files(LAYOUT.needle_table()),
    log:
        f"{RESULTS}/logs/needle_table.log",
    conda:
        "../envs/crashline.yaml"
    script:
        "../scripts/job.py"
