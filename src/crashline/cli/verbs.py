"""What each verb of ``python -m crashline`` does: read its inputs, call the stage, write or print the result.
The parser that names them and the one way errors are printed are ``cli.main``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ..config import plan
from ..core import settings as settings_mod
from ..core.atomic import read_json, write_json
from ..core.owned import own_folder, own_results
from ..core.paths import Layout, RecordFolder, SearchFolder, merged_records
from ..core.records import needle_records_from, records_from


def _load(args) -> tuple[dict, Layout]:
    """The config and its results layout, once the results folder is found to be the user's own (core.owned): made
    where missing, except by ``plan``, which writes nothing."""
    cfg = plan.load(args.config)
    own_results(cfg["results_dir"], "results_dir", create=args.verb != "plan")
    return cfg, Layout(cfg["results_dir"])


def cmd_plan(args) -> int:
    cfg, layout = _load(args)
    if args.json:
        print(json.dumps(plan.expand(cfg), indent=2))
        return 0
    print("\n".join(plan.plan_lines(cfg)))
    sys.stdout.flush()
    print(f"records under {layout.root}/records/MODEL/ID/", file=sys.stderr)
    return 0


def cmd_fetch(args) -> int:
    from ..models import sources

    cfg, layout = _load(args)
    if args.model not in cfg["models"]:
        raise plan.ConfigError(f"no model {args.model!r} in the config; models are {', '.join(cfg['models'])}")
    model = cfg["models"][args.model]
    cache = own_folder(plan.cache_dir(cfg), "cache_dir")  # models and llama-server: nobody else's to swap
    record = sources.fetch(
        model["source"],
        cache / "models" / args.model,
        sha256=model.get("sha256"),
        synthetic=model.get("synthetic"),
        cache_dir=cache,
    )
    write_json(args.out or layout.fetch(args.model), record)
    print(record["files"][0]["path"])
    return 0


def cmd_inspect(args) -> int:
    from ..models.manifest import inspect_gguf

    path = Path(args.path) if args.path else Path(read_json(args.fetch_record)["files"][0]["path"])
    manifest = inspect_gguf(path)
    if args.out:
        write_json(args.out, manifest)
    else:
        print(json.dumps(manifest, indent=2))
    return 0


def cmd_warmup(args) -> int:
    from ..models import pagecache

    record = read_json(args.fetch_record)
    result = {"files": [pagecache.warm(f["path"]) for f in record["files"]]}
    write_json(args.out, result)
    return 0


def cmd_provision(args) -> int:
    from ..engine import provision

    cfg, layout = _load(args)
    from ..core.host import measured_memory_bandwidth

    cache = own_folder(plan.cache_dir(cfg), "cache_dir")
    info = provision.provide(cfg["server"], cache, log=sys.stderr)
    plan.check_flags(cfg, provision.supported_flags(info), info["version"])
    # once per machine, kept in the cache folder; not in every job (1.5 s each)
    info["host_memory_bandwidth"] = measured_memory_bandwidth(cache)
    write_json(args.out or layout.provenance(), info)
    print(info["binary"])
    return 0


def server_job(args) -> int:
    """measure, needle and search: the spec given (the workflow's params) or built from the config,
    the input records and outputs at the paths given or the layout's; the spec runs the job."""
    import dataclasses

    from ..jobs import spec

    cfg, layout = _load(args)
    job = args.verb.replace("-", "_")
    if args.spec:
        job_spec = spec.from_json(args.spec)
        if job_spec.job != job:
            raise plan.ConfigError(f"{args.verb} --spec: the spec is of a {job_spec.job} job; give one of {job}")
        model, job_id = job_spec.model, job_spec.id
    elif args.model and args.id:
        model, job_id = args.model, args.id
        start = {"start": args.start} if getattr(args, "start", None) else {}  # measure's later start, by hand
        job_spec = spec.spec(job, cfg, model, job_id, **start)
    else:
        raise plan.ConfigError(f"{args.verb} needs --model and --id (see `plan`), or --spec")
    draft = job_spec.draft_model
    inputs = spec.inputs(
        Path(args.fetch or layout.fetch(model)),
        Path(args.manifest or layout.manifest(model)),
        Path(args.server or layout.provenance()),
        Path(args.draft or layout.fetch(draft)) if draft else None,
    )
    if job == "search":
        outputs = {"summary": args.out or layout.search(model, job_id)}
        rivals = list(job_spec.group.rivals or ())
        found = spec.rivals(args.rival or [layout.search(model, gid) for gid in rivals], rivals)
        inputs = dataclasses.replace(inputs, rivals=found)
    elif job == "search_needle":
        outputs = {
            "summary": args.out or layout.search_recall(model, job_id),
            "search": args.search or layout.search(model, job_id),
        }
    elif job == "needle":
        outputs = {
            "record": args.out or layout.needle_record(model, job_id),
            "server_log": args.log or layout.needle_server_log(model, job_id),
        }
        if job_spec.twin:
            inputs = dataclasses.replace(inputs, twin_record=layout.needle_record(model, job_spec.twin))
        if settings_mod.fit_aimed(job_spec.item.settings, job_spec.item.given):  # checked as it was measured
            inputs = dataclasses.replace(inputs, measured=Path(args.measured or layout.record(model, job_id)))
    else:
        start = job_spec.start
        record = Path(
            args.out or (layout.record(model, job_id) if start == 1 else layout.later_record(model, job_id, start))
        )
        outputs = {
            "record": record,
            "server_log": args.log or RecordFolder.of(record).server_log,
            "telemetry": args.telemetry or RecordFolder.of(record).telemetry,
        }
    print(job_spec.run(inputs, outputs))
    return 0


def cmd_needle_table(args) -> int:
    from ..tables.needle import write_table

    cfg, layout = _load(args)
    given = args.records or [layout.needle_record(i["model"], i["id"]) for i in plan.expand(cfg)]
    given = given if args.records else [*given, *merged_records(cfg["merge_results"], cfg["models"], "needle")]
    write_table(needle_records_from(given), Path(args.out or layout.needle_table()))
    return 0


def cmd_aggregate(args) -> int:
    from ..tables.aggregate import write

    cfg, layout = _load(args)
    outputs = [p for i in plan.expand(cfg) for p in layout.start_records(i["model"], i["id"], i.get("starts", 1))]
    outputs += [layout.search(g["model"], g["id"]) for g in plan.expand_searches(cfg)]
    outputs += merged_records(cfg["merge_results"], cfg["models"], "measure")
    given = [Path(p) for p in (args.records or outputs)]
    write(
        records_from(given),
        Path(args.configs or layout.configs_table()),
        Path(args.measurements or layout.measurements_table()),
        [p for p in given if p.name == SearchFolder.SUMMARY],
        Path(args.searches or layout.searches_table()),
        Path(args.conversations or layout.conversations_table()),
    )
    return 0


def cmd_report(args) -> int:
    from ..report.build import render

    cfg, layout = _load(args)
    md = Path(args.md or layout.report_md())
    render(
        Path(args.configs or layout.configs_table()),
        Path(args.measurements or layout.measurements_table()),
        Path(args.server or layout.provenance()),
        cfg,
        md,
        Path(args.html or layout.report_html()),
        Path(args.searches or layout.searches_table()),
        Path(args.needle or layout.needle_table()),
        conversations_path=Path(args.conversations or layout.conversations_table()),
        validity_path=Path(args.validity or layout.validity()),
        kv_quality_path=Path(args.kv_quality or layout.kv_quality_table()),
        recommendation_path=Path(args.recommendation or layout.recommendation()),
        summary_path=Path(args.summary or layout.summary_md()),
    )
    print(Path(args.summary or layout.summary_md()).read_text(), end="")
    print(md)
    return 0


def cmd_validity(args) -> int:
    from ..crosscheck import validity
    from ..core.atomic import read_json

    cfg, layout = _load(args)
    tables = {
        "configs": Path(args.configs or layout.configs_table()),
        "measurements": Path(args.measurements or layout.measurements_table()),
        "needle": Path(args.needle or layout.needle_table()),
    }
    tables["needle"] = tables["needle"] if tables["needle"].exists() else None
    models = {m: read_json(layout.fetch(m))["files"][0]["path"] for m in cfg["models"] if layout.fetch(m).exists()}
    server = read_json(Path(args.server or layout.provenance()))
    validity.job(cfg, tables, server, models, Path(args.out or layout.validity()))
    return 0


def cmd_kv_quality(args) -> int:
    from ..jobs import kvquality

    cfg, layout = _load(args)
    kvs, job = plan.kv_labels(cfg).get(args.model, []), plan.kv_quality_job(cfg)
    if args.kv not in kvs:
        raise plan.ConfigError(
            f"kv-quality --kv {args.kv}: no configuration of model {args.model} uses it; give one of {kvs}"
        )
    fetched = read_json(Path(args.fetch or layout.fetch(args.model)))
    server = read_json(Path(args.server or layout.provenance()))
    model = {"name": args.model, "source": fetched["source"], "path": fetched["files"][0]["path"]}
    ctx, why = kvquality.context(job["prompt_tokens"], job["max_ctx"])
    out = Path(args.out or layout.kv_quality(args.model, args.kv))
    kvquality.run(server.get("perplexity_binary"), model, args.kv, ctx, why, out, log=sys.stdout)
    return 0


def cmd_kv_quality_table(args) -> int:
    from ..tables.kvquality import write_table

    cfg, layout = _load(args)
    given = args.records or [layout.kv_quality(m, kv) for m, kvs in plan.kv_labels(cfg).items() for kv in kvs]
    write_table([Path(p) for p in given], Path(args.out or layout.kv_quality_table()))
    return 0


def cmd_suggest(args) -> int:
    from .suggest import from_cli

    print(
        from_cli(args.model, args.vram, args.ctx, args.ubatch, args.cache_type, args.np, args.margin, args.calibration)
    )
    return 0


def cmd_tune(args) -> int:
    from .tune import TuneStopped, tune

    try:
        lines = tune(
            args.model,
            args.ctx,
            args.prompt,
            args.vram,
            args.margin,
            args.gpu,
            args.out,
            args.ubatch,
            args.cache_type,
            args.threads,
            args.gen,
            args.time,
            args.draft,
            args.spec,
            args.max_kld,
        )
    except TuneStopped as exc:
        print(exc, file=sys.stderr)
        return exc.exit_code
    print("\n".join(lines))
    return lines.status  # NOTHING_SURVIVED where a model has no recommendation (exits)


def cmd_recheck(args) -> int:
    from .recheck import recheck
    from .tune import TuneStopped

    try:
        lines = recheck(args.results, args.binary, args.out)
    except TuneStopped as exc:
        print(exc, file=sys.stderr)
        return exc.exit_code
    print("\n".join(lines))
    return lines.status  # REGRESSED where a configuration fails now or is slower (exits)


def cmd_context(args) -> int:
    from .context import context_of

    lines = context_of(args.results, args.out, args.step, args.host_ram, args.margin, args.finalists)
    print("\n".join(lines))
    return lines.status


def cmd_compare(args) -> int:
    from ..report.compare import compare, short
    from .exits import of_compare

    page, rows = compare(args.results, Path(args.out))
    print(short(rows))
    print(f"written: {page}, {page.with_suffix('.html')}, {page.with_suffix('.json')}")
    return of_compare(rows)  # REGRESSED where a run is slower than the first or lost its answer (exits)


def cmd_publish(args) -> int:
    """Every claim's publication; what was pushed on stdout and, under Snakemake, on the console. A pull request
    that failed after its push is an error (status 2), after every claim was published."""
    from ..core import progress
    from ..publish import PublishError, incomplete, run, said

    cfg, layout = _load(args)
    if args.dry_run:
        cfg = {**cfg, "publish": {**(cfg.get("publish") or {}), "dry_run": True}}
    records = run(
        cfg,
        Path(args.configs or layout.configs_table()),
        Path(args.measurements or layout.measurements_table()),
        layout.root / "publish",
        only=args.claim,
        out_dir=args.out_dir,
    )
    for r in records:
        print(said(r), flush=True)
        if not r["dry_run"]:
            progress.say(said(r), log=False)  # the console under Snakemake (stdout is the job's log there)
    failed = [why for why in map(incomplete, records) if why]
    if failed:
        raise PublishError(failed[0] + (f" (and {len(failed) - 1} more claim(s))" if len(failed) > 1 else ""))
    return 0


def cmd_claims_import(args) -> int:
    """The claims file written, and each line of the table that was not read, on stdout."""
    from ..config.claims_import import import_claims

    imported = import_claims(args.source, args.out, args.model, args.table)
    print(f"written: {args.out}: {len(imported.rows)} row(s) from {imported.tables} speed table(s)")
    for line in imported.lines:
        print(f"  not read: {line}")
    if not args.model:
        print(f"  name the model in {args.out} (model: NAME of your config's models) before running it")
    return 0


def cmd_reanalyse(args) -> int:
    from ..jobs.measure import reanalyse, telemetry_file

    record = Path(args.record)
    rec = reanalyse(record, telemetry_file(record, args.telemetry), read_json(args.manifest))
    for w in rec["workloads"]:
        print(f"{w['name']}: {(w.get('bottleneck') or {}).get('verdict')}")
    return 0


def cmd_parse_log(args) -> int:
    from ..engine import logparse

    print(json.dumps(logparse.summarize(args.log), indent=2))
    return 0
