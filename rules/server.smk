# Provide llama-server: configured, $LLAMA_SERVER, PATH, or built from the pinned sdist.


rule provision_server:
    output:
        LAYOUT.provenance(),
    log:
        f"{RESULTS}/logs/provision_server.log",
    benchmark:
        f"{RESULTS}/benchmarks/provision_server.tsv"
    conda:
        "../envs/llama-cpp.yaml"
    params:
        server=json.dumps({k: CFG["server"][k] for k in ("binary", "backend")}),
    script:
        "../scripts/job.py"
