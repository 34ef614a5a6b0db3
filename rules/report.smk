# Records into tables (Parquet, and CSV and JSON beside them); tables into the Markdown and HTML
# reports and their figures. report() flags what `snakemake --report` carries.


rule aggregate:
    input:
        all_records,
    output:
        configs=LAYOUT.configs_table(),
        measurements=LAYOUT.measurements_table(),
        searches=LAYOUT.searches_table(),
        conversations=LAYOUT.conversations_table(),
        readable=[
            report(path, category="Tables")
            for table in (
                LAYOUT.configs_table(),
                LAYOUT.measurements_table(),
                LAYOUT.searches_table(),
                LAYOUT.conversations_table(),
            )
            for path in crashline_table_files(table)[1:]
        ],
    log:
        f"{RESULTS}/logs/aggregate.log",
    conda:
        "../envs/crashline.yaml"
    script:
        "../scripts/job.py"


# llama-bench beside crashline for each model's recommended configuration (and those validity.configs names).
rule validity:
    input:
        configs=LAYOUT.configs_table(),
        measurements=LAYOUT.measurements_table(),
        needle=LAYOUT.needle_table(),
        server=LAYOUT.provenance(),
        fetch=[LAYOUT.fetch(model) for model in CFG["models"]],
    output:
        LAYOUT.validity(),
    log:
        f"{RESULTS}/logs/validity.log",
    conda:
        "../envs/crashline.yaml"
    resources:
        gpu=(
            max(crashline_settings.gpu_count(c["settings"]) for c in CONFIGURATIONS)
            if CONFIGURATIONS
            else 1
        ),
    params:
        # what the job reads besides its inputs: which configurations (the recommendation's objective and margin)
        # and how llama-bench runs them
        validity=json.dumps(
            {
                "validity": CFG["validity"],
                **crashline_recommend.decision_inputs(CFG),
                "request_timeout_s": CFG["server"]["request_timeout_s"],
            },
            sort_keys=True,
        ),
    script:
        "../scripts/job.py"


rule report:
    input:
        configs=LAYOUT.configs_table(),
        measurements=LAYOUT.measurements_table(),
        searches=LAYOUT.searches_table(),
        conversations=LAYOUT.conversations_table(),
        validity=LAYOUT.validity(),
        needle=LAYOUT.needle_table(),
        kv_quality=LAYOUT.kv_quality_table(),
        server=LAYOUT.provenance(),
        claims=CFG["claims"],
        # what-if predictions from each search's calibration read the model's manifest
        manifests=[LAYOUT.manifest(model) for model in CFG["models"]],
        # the earlier run this one is set beside (recheck.against): its tables
        recheck=crashline_recheck_tables(CFG),
    output:
        recommendation=LAYOUT.recommendation(),
        summary=LAYOUT.summary_md(),
        md=report(LAYOUT.report_md(), category="Report"),
        html=report(LAYOUT.report_html(), category="Report"),
        figures=report(
            directory(LAYOUT.figures()), patterns=["{name}.svg"], category="Figures"
        ),
    log:
        f"{RESULTS}/logs/report.log",
    conda:
        "../envs/crashline.yaml"
    params:
        # what the report decides with besides its inputs (one decision: recommend.decide)
        decision=json.dumps(crashline_recommend.decision_inputs(CFG), sort_keys=True),
        kv_quality=json.dumps(CFG["kv_quality"], sort_keys=True),
    script:
        "../scripts/job.py"
