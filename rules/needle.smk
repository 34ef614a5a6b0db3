# One needle-recall job per model x configuration: the model, served with exactly that
# configuration, must recall a random value buried at every length and depth of `needle:`.
# Random-weight synthetic models get a "not applicable" record without a server.


def needle_params(wildcards):
    """Everything a needle job depends on besides its inputs; a change reruns it."""
    return json.dumps(
        {
            "settings": json.loads(canonical(configuration(wildcards)["settings"])),
            "needle": CFG.get("needle"),
            "prompt_style": CFG["models"][wildcards.model].get("prompt_style"),
            "server": {
                k: CFG["server"][k] for k in ("startup_timeout_s", "request_timeout_s")
            },
        },
        sort_keys=True,
    )


def all_needle_records(wildcards):
    return [LAYOUT.needle_record(c["model"], c["id"]) for c in CONFIGURATIONS]


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
        depends_on=needle_params,
    shell:
        "{CRASHLINE} needle --config {EFFECTIVE_CONFIG} --model {wildcards.model} --id {wildcards.cid}"
        " --out {output.record} --log {output.server_log} > {log} 2>&1"


rule needle_table:
    input:
        all_needle_records,
    output:
        LAYOUT.needle_table(),
    log:
        f"{RESULTS}/logs/needle_table.log",
    conda:
        "../envs/crashline.yaml"
    shell:
        "{CRASHLINE} needle-table --out {output} {input} > {log} 2>&1"
