# Records into Parquet tables; tables into the Markdown and HTML reports.


rule aggregate:
    input:
        all_records,
    output:
        configs=LAYOUT.configs_table(),
        measurements=LAYOUT.measurements_table(),
        searches=LAYOUT.searches_table(),
    log:
        f"{RESULTS}/logs/aggregate.log",
    conda:
        "../envs/crashline.yaml"
    shell:
        "python -m crashline aggregate --configs {output.configs:q}"
        " --measurements {output.measurements:q} --searches {output.searches:q} {input:q} > {log:q} 2>&1"


rule report:
    input:
        configs=LAYOUT.configs_table(),
        measurements=LAYOUT.measurements_table(),
        searches=LAYOUT.searches_table(),
        needle=LAYOUT.needle_table(),
        server=LAYOUT.provenance(),
        claims=CFG["claims"],
    output:
        md=LAYOUT.report_md(),
        html=LAYOUT.report_html(),
    log:
        f"{RESULTS}/logs/report.log",
    conda:
        "../envs/crashline.yaml"
    params:
        objective=json.dumps(CFG["objective"], sort_keys=True),
    shell:
        "python -m crashline report > {log:q} 2>&1"
