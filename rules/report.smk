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
    script:
        "../scripts/job.py"


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
    script:
        "../scripts/job.py"
