# Records into Parquet tables; tables into the Markdown and HTML reports.


rule aggregate:
    input:
        all_records,
    output:
        configs=LAYOUT.configs_table(),
        measurements=LAYOUT.measurements_table(),
    log:
        f"{RESULTS}/logs/aggregate.log",
    conda:
        "../envs/crashline.yaml"
    shell:
        "{CRASHLINE} aggregate --config {EFFECTIVE_CONFIG} --configs {output.configs}"
        " --measurements {output.measurements} {input} > {log} 2>&1"


rule report:
    input:
        configs=LAYOUT.configs_table(),
        measurements=LAYOUT.measurements_table(),
        server=LAYOUT.provenance(),
    output:
        md=LAYOUT.report_md(),
        html=LAYOUT.report_html(),
    params:
        objective=json.dumps(CFG["objective"], sort_keys=True),
    log:
        f"{RESULTS}/logs/report.log",
    conda:
        "../envs/crashline.yaml"
    shell:
        "{CRASHLINE} report --config {EFFECTIVE_CONFIG} > {log} 2>&1"
