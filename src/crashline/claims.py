"""Speed tables that others published, row by row, re-measured under the settings each row states.

A claims file (``config/claims/*.yaml``, validated against the package's ``data/claims.schema.yaml``) names
the source (URL, revision, the upstream file and a local copy of it), the model, the workload the
table measured, and its rows: the numbers claimed, the settings stated, the settings left out.

Each row becomes a configuration of the workflow: the run's defaults, then the claims file's
``defaults``, then what the row states. Settings the source does not state are *assumed* and
marked so. Its id is the same hash as a sweep configuration's, so a row that matches a sweep
point is measured once, by the same job. Each row also needs a workload of its prompt length,
generated tokens and concurrency; :func:`claim_workloads` adds the ones the config lacks.

After the measurement, :func:`correction_table` sets each claimed number beside the measured one
(median [min–max] n, the difference in %), and :func:`comparability` names the speed-relevant
settings in which rows of the one published table differ. :func:`section` renders both as a
Markdown (or HTML) section between markers, ready to go back upstream (see ``publish``).
"""

from __future__ import annotations

import copy
import itertools
import os
from pathlib import Path
from typing import Any

import jinja2
import pandas as pd

from . import settings as settings_mod
from .config import ConfigError, check_setting, load_schema, read_yaml, schema_errors
from .publish import END_MARKER, START_MARKER, anchor_level

SCHEMA_NAME = "claims.schema.yaml"

# Settings that change speed: rows differing in one of these measured different things.
SPEED_SETTINGS = (
    "ubatch", "batch", "parallel", "ctx", "cache_type_k", "cache_type_v", "flash_attn", "threads",
    "threads_batch", "n_gpu_layers", "n_cpu_moe", "override_tensor", "kv_unified", "cont_batching",
    "draft_model", "draft_max", "draft_min", "draft_n_gpu_layers", "page_cache",
)
WORKLOAD_KEYS = ("prompt_tokens", "gen_tokens", "concurrency")
# What each claimed number is compared with: per request, or all requests together.
METRICS = {
    "prefill_tps": "prefill t/s per request",
    "decode_tps": "decode t/s per request",
    "aggregate_tps": "aggregate generated t/s, all requests",
}
# As in the report: a range wider than this share of the median, or other processes busier than
# this many cores during the workload, and the number is not to be trusted (nor sent) as it is.
HIGH_SPREAD_PCT = 10.0
CONTENTION_CORES = 0.3
_WORKLOAD_TITLES = {"prompt_tokens": "prompt tokens", "gen_tokens": "generated tokens", "concurrency": "requests at once"}
_UNSET = {"threads": "llama.cpp's choice", "threads_batch": "as threads", "kv_unified": "llama.cpp's choice"}


class ClaimsError(ConfigError):
    """A claims file is invalid; the message names the file, the key and the bad value."""


def _validate(raw: Any, path: Path, schema: dict) -> None:
    if not isinstance(raw, dict):
        raise ClaimsError(f"claims file {path} must hold a mapping of keys (source, model, rows, ...), "
                          f"got {type(raw).__name__}")
    lines = schema_errors(raw, schema, "key")
    if len(lines) == 1:
        raise ClaimsError(f"claims file {path}: {lines[0]}")
    if lines:
        raise ClaimsError(f"invalid claims file {path}:\n  " + "\n  ".join(lines))


def _check_settings(values: dict, where: str, path: Path, models) -> None:
    """Every name must be a crashline setting, every value of its kind, a draft_model one of ``models``."""
    for name, value in values.items():
        try:
            check_setting(f"{where}.{name}", name, value, models)
        except settings_mod.SettingsError as exc:
            raise ClaimsError(f"claims file {path}: key {exc}") from None


def _load_one(path: Path, config: dict, schema: dict) -> dict:
    raw = read_yaml(path, "claims file", ClaimsError)
    _validate(raw, path, schema)
    claim = copy.deepcopy(raw)
    models = config.get("models", {})
    if claim["model"] not in models:
        raise ClaimsError(
            f"claims file {path}: key model = {claim['model']!r}: no such model in the config; "
            f"models are {', '.join(sorted(models))}"
        )
    source = {"revision": None, "file": "README.md", "anchor": None, "hardware": None, "git": None,
              "hf_repo": None, **claim["source"]}
    local = (path.parent / source["local_copy"]).resolve()
    if not local.is_file():
        raise ClaimsError(f"claims file {path}: key source.local_copy = {source['local_copy']!r}: no file {local} "
                          "(local_copy is relative to the claims file's folder)")
    source["local_copy_path"] = str(local)
    claim_defaults = claim.get("defaults") or {}
    _check_settings(claim_defaults, "defaults", path, models)
    run_defaults = config.get("defaults") or {}
    rows = []
    labels = [row["label"] for row in claim["rows"]]
    for j, row in enumerate(claim["rows"]):
        where = f"rows.{j}"
        if labels.index(row["label"]) != j:
            raise ClaimsError(f"claims file {path}: key {where}.label = {row['label']!r}: rows.{labels.index(row['label'])} "
                              "has the same label; labels name the rows in the correction")
        workload = row.get("workload") or claim.get("workload")
        if workload is None:
            raise ClaimsError(f"claims file {path}: key {where}.workload: no workload; give one for the row or the file")
        workload = {"concurrency": 1, **workload}
        stated = row.get("stated") or {}
        _check_settings(stated, f"{where}.stated", path, models)
        unknown = list(row.get("unknown") or [])
        for name in unknown:
            if name != "build" and name not in settings_mod.SETTINGS:
                hint = settings_mod.did_you_mean(name, ["build", *settings_mod.SETTINGS], "known settings")
                raise ClaimsError(f"claims file {path}: key {where}.unknown = {name!r}: unknown setting; {hint}")
        both = sorted(set(unknown) & set(stated))
        if both:
            raise ClaimsError(f"claims file {path}: key {where}.unknown = {both!r}: also stated in {where}.stated")
        build = row.get("build") or claim.get("build")
        if "build" in unknown and build is not None:
            raise ClaimsError(f"claims file {path}: key {where}.unknown = 'build': but build {build!r} is stated")
        given = {**run_defaults, **claim_defaults, **stated}
        try:
            resolved = settings_mod.resolve(given)
        except settings_mod.SettingsError as exc:
            raise ClaimsError(f"claims file {path}: key {where}: {exc}") from None
        # Assumed: what the source leaves out and a default fills (declared here or by the run).
        assumed = sorted((set(unknown) | set(claim_defaults) | set(run_defaults)) - set(stated) - {"build"})
        rows.append({
            "index": j,
            "label": row["label"],
            "claimed": dict(row["claimed"]),
            "stated": stated,
            "unknown": unknown,
            "build": build,
            "workload": workload,
            "given": given,
            "resolved": resolved,
            "id": settings_mod.config_id(claim["model"], resolved),
            "assumed": assumed,
        })
    return {
        "name": path.stem,
        "path": str(path),
        "title": claim.get("title") or f"Speed table of {source['file']} ({source['url']})",
        "note": claim.get("note"),
        "source": source,
        "model": claim["model"],
        "build": claim.get("build"),
        "defaults": claim_defaults,
        "rows": rows,
    }


def load_claims(paths: list[str | os.PathLike], config: dict, base_dir: str | os.PathLike | None = None) -> list[dict]:
    """Load and validate claims files against the config's models and the settings vocabulary.

    Relative paths are read from ``base_dir`` (default: the working directory, the workflow's
    folder when Snakemake runs). Each claim is named after its file's stem."""
    schema = load_schema(SCHEMA_NAME)
    out, names = [], {}
    for i, p in enumerate(paths or []):
        path = Path(p)
        if base_dir is not None and not path.is_absolute():
            path = Path(base_dir) / path
        if not path.exists():
            where = "" if Path(p).is_absolute() else f" (read from {Path(base_dir or '.').absolute()})"
            raise ClaimsError(f"config key claims.{i} = {str(p)!r}: claims file not found: {path}{where}")
        claim = _load_one(path, config, schema)
        if claim["name"] in names:
            raise ClaimsError(f"claims files {names[claim['name']]} and {path} share the name {claim['name']!r}")
        names[claim["name"]] = path
        out.append(claim)
    return out


def claim_configurations(claims: list[dict]) -> list[dict]:
    """One configuration per claim row: {"model", "id", "settings" (given: the run's and the claim's
    defaults, then what the source states), "resolved", "assumed", "claim", "row", "label", "workload"}.

    ``config.expand`` adds these to the sweep; an identical sweep configuration has the same id."""
    return [
        {"model": c["model"], "id": r["id"], "settings": dict(r["given"]), "resolved": r["resolved"],
         "assumed": list(r["assumed"]), "claim": c["name"], "row": r["index"], "label": r["label"],
         "workload": dict(r["workload"])}
        for c in claims for r in c["rows"]
    ]


def _requests_at_once(workload: dict, resolved: dict) -> int:
    """How many requests a config workload sends for these settings (``slots``: its parallel)."""
    from .workloads import concurrency

    return concurrency(workload, resolved)


def workload_name(workload: dict) -> str:
    name = f"claim-pp{workload['prompt_tokens']}-tg{workload['gen_tokens']}"
    return name + (f"-c{workload['concurrency']}" if workload.get("concurrency", 1) != 1 else "")


def claim_workloads(claims: list[dict], workloads: list[dict]) -> list[dict]:
    """The workloads to append to the config so that every claim row is measured as published.

    A row is covered by an existing workload of the same prompt and generated tokens that sends
    as many requests at once for the row's configuration (``concurrency: slots`` included), so a
    claim that matches the sweep's workloads adds nothing. Calling again with the result appended
    adds nothing: the expansion is idempotent."""
    have = list(workloads)
    added = []
    names = {w["name"]: w for w in have}
    for c in claims:
        for r in c["rows"]:
            w = r["workload"]
            if any(x["prompt_tokens"] == w["prompt_tokens"] and x["gen_tokens"] == w["gen_tokens"]
                   and _requests_at_once(x, r["resolved"]) == w["concurrency"] for x in have):
                continue
            new = {"name": workload_name(w), **{k: w[k] for k in WORKLOAD_KEYS}}
            if new["name"] in names:
                raise ClaimsError(
                    f"claims file {c['path']}: key rows.{r['index']}.workload: the workload name {new['name']!r} "
                    "is taken by a different workload in the config; rename that workload"
                )
            names[new["name"]] = new
            have.append(new)
            added.append(new)
    return added


# -- comparability -------------------------------------------------------------------------------


def show(name: str, value: Any) -> str:
    """A setting's value as a reader of the table would write it."""
    if value is None:
        return _UNSET.get(name, "not set")
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, (list, tuple)):
        return " ".join(map(str, value)) or "none"
    return str(value)


def setting_title(name: str) -> str:
    if name in _WORKLOAD_TITLES:
        return _WORKLOAD_TITLES[name]
    setting = settings_mod.SETTINGS.get(name)
    if setting is not None and setting.flag:
        return f"{name} ({setting.flag})"
    return name


def _values(row: dict) -> dict[str, tuple[Any, str]]:
    """Each speed-relevant property of a row: (value, how it is known: stated / assumed / default)."""
    out = {}
    for name in SPEED_SETTINGS:
        how = "stated" if name in row["stated"] else "assumed" if name in row["assumed"] else "default"
        out[name] = (row["resolved"][name], how)
    out["build"] = (row.get("build"), "stated" if row.get("build") else "unknown")
    for key in WORKLOAD_KEYS:
        out[key] = (row["workload"][key], "stated")
    return out


def _show_known(name: str, value: Any, how: str) -> str:
    if name == "build" and value is None:
        return "not stated"
    text = show(name, value)
    return f"{text} (assumed)" if how == "assumed" else text


def comparability(rows: list[dict]) -> list[dict]:
    """Pairs of rows of one published table that differ in speed-relevant settings.

    ``rows``: a claim's rows (or :func:`claim_configurations` items of one claim). Stated and
    assumed values both count: a row that states ``ctx 8192`` beside one whose context was
    assumed to be 4096 is flagged, with the assumption named. The workload counts too (prompt,
    generated tokens, requests at once), and so does the build. Each flag: {"a", "b" (labels),
    "settings" (names), "differences": [{"setting", "a", "b", "a_how", "b_how"}], "text"}."""
    rows = [_as_row(r) for r in rows]
    flags = []
    for a, b in itertools.combinations(rows, 2):
        va, vb = _values(a), _values(b)
        diffs = [
            {"setting": name, "a": va[name][0], "b": vb[name][0], "a_how": va[name][1], "b_how": vb[name][1]}
            for name in va
            if va[name][0] != vb[name][0]
        ]
        if not diffs:
            continue
        text = "; ".join(
            f"{setting_title(d['setting'])} {_show_known(d['setting'], d['a'], d['a_how'])} vs "
            f"{_show_known(d['setting'], d['b'], d['b_how'])}"
            for d in diffs
        )
        flags.append({"a": a["label"], "b": b["label"], "settings": [d["setting"] for d in diffs],
                      "differences": diffs, "text": text})
    return flags


def unverifiable(rows: list[dict]) -> list[dict]:
    """Settings some rows leave out: they may differ between the source's rows, and nothing here
    can tell. Each: {"setting", "rows" (labels that leave it out), "assumed_values"}."""
    rows = [_as_row(r) for r in rows]
    out = []
    for name in ("build", *SPEED_SETTINGS):
        silent = [r for r in rows if (r.get("build") is None if name == "build" else name in r["assumed"])]
        if not silent:
            continue
        values = sorted({"not stated" if name == "build" else show(name, r["resolved"][name]) for r in silent})
        out.append({"setting": name, "title": setting_title(name), "rows": [r["label"] for r in silent],
                    "all": len(silent) == len(rows), "assumed_values": values})
    return out


def _as_row(item: dict) -> dict:
    """A claim row, from either a loaded claim's row or a :func:`claim_configurations` item."""
    if "stated" in item:
        return item
    return {"label": item["label"], "stated": {k: v for k, v in item["settings"].items() if k not in item["assumed"]},
            "assumed": item["assumed"], "resolved": item["resolved"], "workload": item["workload"],
            "build": item.get("build"), "unknown": item.get("unknown", [])}


def row_flags(rows: list[dict], flags: list[dict] | None = None) -> dict[str, list[str]]:
    """Per row label: "OTHER (setting, setting)" for every row it can't be compared with."""
    flags = comparability(rows) if flags is None else flags
    out: dict[str, list[str]] = {_as_row(r)["label"]: [] for r in rows}
    for f in flags:
        names = ", ".join(_WORKLOAD_TITLES.get(n, n) for n in f["settings"])
        out[f["a"]].append(f"{f['b']} ({names})")
        out[f["b"]].append(f"{f['a']} ({names})")
    return out


# -- correction table ----------------------------------------------------------------------------


def _missing(value) -> bool:
    try:
        return value is None or bool(pd.isna(value))
    except (TypeError, ValueError):
        return False


def _fmt(value: float) -> str:
    return f"{value:,.1f}"


def _measured_row(row: dict, model: str, configs: pd.DataFrame, measurements: pd.DataFrame):
    """The measurement of a claim row: (workload row or None, why there is none)."""
    w = row["workload"]
    if not measurements.empty:
        m = measurements[
            (measurements["model"] == model) & (measurements["config_id"] == row["id"])
            & (measurements["prompt_tokens"] == w["prompt_tokens"]) & (measurements["gen_tokens"] == w["gen_tokens"])
            & (measurements["concurrency"] == w["concurrency"])
        ]
        if len(m):
            ok = m[m["workload_outcome"] == "ok"]
            hit = (ok if len(ok) else m).iloc[0]
            if hit["workload_outcome"] != "ok":
                return hit, f"{hit['workload_outcome']}: {hit['workload_message'] or 'no message'}"
            return hit, None
    c = configs[(configs["model"] == model) & (configs["config_id"] == row["id"])] if not configs.empty else configs
    if len(c):
        cfg = c.iloc[0]
        if cfg["outcome"] != "ok":
            where = f" at {cfg['phase']}" if cfg["phase"] else ""
            return None, f"{cfg['outcome']}{where}: {cfg['message'] or 'no message'}"
        return None, (f"not measured: configuration {row['id']} has no workload of {w['prompt_tokens']} prompt / "
                      f"{w['gen_tokens']} generated tokens at {w['concurrency']} request(s) at once")
    return None, f"not measured: no record of configuration {row['id']} (run the workflow)"


def _warnings(hit, med: float, lo: float, hi: float) -> dict[str, float]:
    """Why a measured number should be repeated before it is trusted (or sent upstream):
    {"spread_pct": range over median, in %} and / or {"other_cores": CPU cores others used}."""
    out = {}
    spread = (hi - lo) / med * 100 if med else None
    if spread is not None and spread > HIGH_SPREAD_PCT:
        out["spread_pct"] = spread
    other = hit.get("cpu_other_cores")
    if not _missing(other) and other > CONTENTION_CORES:
        out["other_cores"] = float(other)
    return out


def warning_notes(table: list[dict]) -> dict:
    """The warnings of a correction table, summarised for the section."""
    spread = [f"{t['label']}, {t['metric'].split('_')[0]} ({t['warnings']['spread_pct']:.0f}%)"
              for t in table if "spread_pct" in t["warnings"]]
    busy = [t["warnings"]["other_cores"] for t in table if "other_cores" in t["warnings"]]
    measured = sum(1 for t in table if t["median"] is not None)
    return {"spread": spread, "busy": len(busy), "busy_max": max(busy) if busy else None, "measured": measured}


def pair_changes(table: list[dict], flags: list[dict]) -> list[dict]:
    """For each pair of rows that can't be compared: per metric both claim, the change from the
    first row to the second as published and as measured here (one build, one machine), and
    whether the measured ranges overlap (then the measured change is not a real one yet)."""
    by = {(t["label"], t["metric"]): t for t in table}
    out = []
    for f in flags:
        changes = []
        for metric, title in METRICS.items():
            a, b = by.get((f["a"], metric)), by.get((f["b"], metric))
            if a is None or b is None:
                continue
            change = {"metric": metric, "title": title, "claimed_pct": (b["claimed"] / a["claimed"] - 1) * 100,
                      "measured_pct": None, "overlap": None}
            if a["median"] and b["median"]:
                change["measured_pct"] = (b["median"] / a["median"] - 1) * 100
                change["overlap"] = bool(a["min"] <= b["max"] and b["min"] <= a["max"])
            changes.append(change)
        out.append({**f, "changes": changes})
    return out


def workload_text(w: dict) -> str:
    text = f"pp{w['prompt_tokens']} tg{w['gen_tokens']}"
    return text + (f", {w['concurrency']} requests at once" if w["concurrency"] != 1 else "")


def correction_table(claims: list[dict], configs: pd.DataFrame, measurements: pd.DataFrame) -> list[dict]:
    """Claimed versus measured, one entry per claim row and claimed number.

    Each claimed number is compared with the column that measures the same thing: prefill and
    decode per request, ``aggregate_tps`` (all requests together) with the aggregate, never with a
    per-request speed, at the row's prompt, generated tokens and requests at once."""
    out = []
    for claim in claims:
        flags = row_flags(claim["rows"])
        for row in claim["rows"]:
            hit, problem = _measured_row(row, claim["model"], configs, measurements)
            env = hit if hit is not None else None
            if env is None and not configs.empty:
                c = configs[(configs["model"] == claim["model"]) & (configs["config_id"] == row["id"])]
                env = c.iloc[0] if len(c) else None
            for metric, title in METRICS.items():
                if metric not in row["claimed"]:
                    continue
                claimed = float(row["claimed"][metric])
                entry = {
                    "claim": claim["name"], "label": row["label"], "row": row["index"], "metric": metric,
                    "metric_title": title, "claimed": claimed, "claimed_text": _fmt(claimed),
                    "median": None, "min": None, "max": None, "n": None, "measured_text": problem or "–",
                    "diff_pct": None, "diff_text": "–", "within_range": None, "status": "ok" if problem is None else "missing",
                    "problem": problem,
                    "config_id": row["id"], "settings": settings_mod.label(row["resolved"]),
                    "stated": {k: show(k, v) for k, v in row["stated"].items()},
                    "assumed": [f"{k}={show(k, row['resolved'][k])}" for k in row["assumed"]],
                    "build_claimed": row["build"] or "not stated",
                    "workload": dict(row["workload"]), "workload_text": workload_text(row["workload"]),
                    "not_comparable_with": flags[row["label"]],
                    "build": None, "host": None, "warnings": {},
                }
                if env is not None:
                    sha = env.get("server_sha256") or ""
                    entry["build"] = f"{env.get('server_version')} (sha256 {sha[:12]}…)" if sha else str(env.get("server_version"))
                    entry["host"] = f"{env.get('cpu_model')}; {env.get('gpu')}"
                if hit is not None and problem is None:
                    med = hit.get(f"{metric}_median")
                    if _missing(med):
                        entry.update(status="missing", problem="the measurement has no value for this metric",
                                     measured_text="–")
                    else:
                        lo, hi, n = hit[f"{metric}_min"], hit[f"{metric}_max"], int(hit[f"{metric}_n"])
                        pct = (med - claimed) / claimed * 100
                        within = bool(lo <= claimed <= hi)
                        warnings = _warnings(hit, float(med), float(lo), float(hi))
                        entry.update(median=float(med), min=float(lo), max=float(hi), n=n, diff_pct=pct,
                                     within_range=within, warnings=warnings,
                                     measured_text=f"{_fmt(med)} [{_fmt(lo)}–{_fmt(hi)}] n={n}"
                                                   + (" ⚠" if warnings else ""),
                                     diff_text=f"{pct:+.1f}%" + (" (within range)" if within else ""))
                out.append(entry)
    return out


# -- the section ---------------------------------------------------------------------------------


def _env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("crashline", "templates"),
        # "x.html.j2" ends in ".j2": name the double extension, or nothing is escaped
        autoescape=jinja2.select_autoescape(["html", "html.j2"]),
        keep_trailing_newline=True,
    )
    env.filters["md"] = lambda s: str(s).replace("|", "\\|").replace("\n", " ")
    return env


def section_context(claim: dict, configs: pd.DataFrame, measurements: pd.DataFrame) -> dict:
    """Everything the correction templates show for one claim."""
    table = correction_table([claim], configs, measurements)
    flags = comparability(claim["rows"])
    rows = []
    for r in claim["rows"]:
        entries = [t for t in table if t["row"] == r["index"]]
        rows.append({"label": r["label"], "entries": entries, "first": entries[0] if entries else None})
    measured = [t for t in table if t["build"]]
    builds = sorted({t["build"] for t in measured})
    hosts = sorted({t["host"] for t in measured})
    reps = sorted({t["n"] for t in table if t["n"]})
    if not configs.empty and "repetitions" in configs:
        ids = {r["id"] for r in claim["rows"]}
        reps = sorted({int(x) for x in configs[configs["config_id"].isin(ids)]["repetitions"].dropna()}) or reps
    from . import __version__

    # One level below the heading the section goes under (a level-2 section at the end of a file).
    level = anchor_level(Path(claim["source"]["local_copy_path"]).read_text(), claim["source"].get("anchor")) or 1

    return {
        "claim": claim,
        "title": claim["title"],
        "source": claim["source"],
        "model": claim["model"],
        "table": table,
        "rows": rows,
        "flags": pair_changes(table, flags),
        "unverifiable": unverifiable(claim["rows"]),
        "any_warning": any(t["warnings"] for t in table),
        "notes": warning_notes(table),
        "high_spread_pct": HIGH_SPREAD_PCT,
        "contention_cores": CONTENTION_CORES,
        "builds": builds,
        "hosts": hosts,
        "repetitions": reps,
        "workloads": sorted({t["workload_text"] for t in table}),
        "any_aggregate": any(t["metric"] == "aggregate_tps" for t in table),
        "any_concurrent": any(r["workload"]["concurrency"] > 1 for r in claim["rows"]),
        "crashline_version": __version__,
        "start_marker": START_MARKER,
        "end_marker": END_MARKER,
        "heading": "#" * min(6, level + 1),
    }


def section(claim: dict, configs: pd.DataFrame, measurements: pd.DataFrame, fmt: str = "md") -> str:
    """The correction section for one claim: Markdown between markers (``fmt="md"``), ready to
    paste upstream, or an HTML fragment for the report (``fmt="html"``, with that Markdown)."""
    if fmt not in ("md", "html"):
        raise ValueError(f"fmt must be 'md' or 'html', not {fmt!r}")
    ctx = section_context(claim, configs, measurements)
    markdown = _env().get_template("correction.md.j2").render(**ctx).strip("\n") + "\n"
    if fmt == "md":
        return markdown
    return _env().get_template("correction.html.j2").render(**ctx, markdown=markdown).strip("\n") + "\n"


def report_sections(config: dict, configs: pd.DataFrame, measurements: pd.DataFrame) -> list[dict]:
    """For the report: per claims file of the config, {"name", "title", "md", "html"}."""
    out = []
    for claim in load_claims(config.get("claims") or [], config):
        out.append({"name": claim["name"], "title": claim["title"],
                    "md": section(claim, configs, measurements, "md"),
                    "html": section(claim, configs, measurements, "html")})
    return out
