# One needle-recall job per model x configuration: the model, served with exactly that
# configuration, must recall a random value buried at every length and depth of `needle:`.
# Random-weight synthetic models get a "not applicable" record without a server.


rule needle:
    input:
        unpack(needle_inputs),
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
        gpu=gpus_of("needle"),
    params:
        spec=job_spec("needle"),
    script:
        "../scripts/job.py"


# A search's winner is checked the same way before it is recommended; one that fails is replaced by the
# next fastest of the search, checked in the same job.
rule search_needle:
    input:
        unpack(lambda w: draft_input(SEARCH_BY_KEY[(w.model, w.gid)])),
        fetch=LAYOUT.fetch("{model}"),
        manifest=LAYOUT.manifest("{model}"),
        warmup=LAYOUT.warmup("{model}"),
        server=LAYOUT.provenance(),
        search=LAYOUT.search("{model}", "{gid}"),
    output:
        summary=LAYOUT.search_recall("{model}", "{gid}"),
    log:
        f"{RESULTS}/logs/search_needle/{{model}}/{{gid}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/search_needle/{{model}}/{{gid}}.tsv"
    conda:
        "../envs/crashline.yaml"
    resources:
        gpu=gpus_of("search_needle"),
    params:
        spec=job_spec("search_needle"),
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
