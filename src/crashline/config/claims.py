"""Speed tables that others published, read and checked: the claims files, their rows as
configurations, and the workloads those rows need. No measurement and no presentation here
(``tables.claims`` sets claimed beside measured; ``report.correction`` writes the section).

A claims file (``config/claims/*.yaml``, validated against the package's ``data/claims.schema.yaml``)
names the source (URL, revision, the upstream file and a local copy of it), the model, the workload
the table measured, and its rows: the numbers claimed, the settings stated, the settings left out.

Each row becomes a configuration of the workflow: the run's defaults, then the claims file's
``defaults``, then what the row states. Settings the source does not state are *assumed* and
marked so. Its id is the same hash as a sweep configuration's, so a row that matches a sweep
point is measured once, by the same job. Each row also needs a workload of its prompt length,
generated tokens and concurrency; :func:`claim_workloads` adds the ones the config lacks.
"""

from __future__ import annotations

import copy
import os
import re
from pathlib import Path
from typing import Any

from ..core import settings as settings_mod
from .file import ConfigError, check_setting, load_schema, read_yaml, schema_errors

SCHEMA_NAME = "claims.schema.yaml"
WORKLOAD_KEYS = ("prompt_tokens", "gen_tokens", "concurrency")
# Settings that change speed: rows differing in one of these measured different things, and a table that leaves one
# out leaves it unknown (config.claims_import).
SPEED_SETTINGS = (
    "ubatch",
    "batch",
    "parallel",
    "ctx",
    "cache_type_k",
    "cache_type_v",
    "flash_attn",
    "threads",
    "threads_batch",
    "n_gpu_layers",
    "n_cpu_moe",
    "override_tensor",
    "kv_unified",
    "cont_batching",
    "draft_model",
    "draft_max",
    "draft_min",
    "draft_n_gpu_layers",
    "page_cache",
    "fit",  # llama.cpp's own placement (-fit on) moves layers and context
    "load_mode",  # mmap or not (--no-mmap, -lm): the weights read from the page cache or held in memory
)
# A row whose own notes say it did not run well at its settings (it crawled, crashed, ran out of memory, failed) is
# re-measured for survival with the margin, not only for speed (tables.claims.survival).
FAILURE_WORDS = re.compile(r"\b(crawl|crash|oom|out of memory|fail|segfault|killed|abort|hang|hung|froze|freez)", re.I)
SOURCE_DEFAULTS = {
    "revision": None,
    "file": "README.md",
    "anchor": None,
    "hardware": None,
    "git": None,
    "hf_repo": None,
}


class ClaimsError(ConfigError):
    """A claims file is invalid; the message names the file, the key and the bad value."""


def _validate(raw: Any, path: Path, schema: dict) -> None:
    if not isinstance(raw, dict):
        raise ClaimsError(
            f"claims file {path} must hold a mapping of keys (source, model, rows, ...), got {type(raw).__name__}"
        )
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


def _source(claim: dict, path: Path) -> dict:
    """The source block with its defaults, and the local copy's resolved path (which must exist)."""
    source = {**SOURCE_DEFAULTS, **claim["source"]}
    local = (path.parent / source["local_copy"]).resolve()
    if not local.is_file():
        raise ClaimsError(
            f"claims file {path}: key source.local_copy = {source['local_copy']!r}: no file {local} "
            "(local_copy is relative to the claims file's folder)"
        )
    source["local_copy_path"] = str(local)
    return source


def _template(claim: dict, path: Path) -> str | None:
    """The resolved path of the claims file's own correction template (which must exist), or None."""
    if not claim.get("template"):
        return None
    template = (path.parent / claim["template"]).resolve()
    if not template.is_file():
        raise ClaimsError(
            f"claims file {path}: key template = {claim['template']!r}: no file {template} "
            "(template is relative to the claims file's folder)"
        )
    return str(template)


def _check_unknown(unknown: list, stated: dict, build, where: str, path: Path) -> None:
    """The settings a row leaves out: known names, none of them also stated."""
    for name in unknown:
        if name != "build" and name not in settings_mod.SETTINGS:
            hint = settings_mod.did_you_mean(name, ["build", *settings_mod.SETTINGS], "known settings")
            raise ClaimsError(f"claims file {path}: key {where}.unknown = {name!r}: unknown setting; {hint}")
    both = sorted(set(unknown) & set(stated))
    if both:
        raise ClaimsError(f"claims file {path}: key {where}.unknown = {both!r}: also stated in {where}.stated")
    if "build" in unknown and build is not None:
        raise ClaimsError(f"claims file {path}: key {where}.unknown = 'build': but build {build!r} is stated")


def _row(j: int, row: dict, claim: dict, path: Path, run_defaults: dict, models) -> dict:
    """One published row as a configuration: settings given, resolved, assumed; its workload and id."""
    where = f"rows.{j}"
    workload = row.get("workload") or claim.get("workload")
    if workload is None:
        raise ClaimsError(f"claims file {path}: key {where}.workload: no workload; give one for the row or the file")
    stated = row.get("stated") or {}
    _check_settings(stated, f"{where}.stated", path, models)
    unknown = list(row.get("unknown") or [])
    build = row.get("build") or claim.get("build")
    _check_unknown(unknown, stated, build, where, path)
    claim_defaults = claim.get("defaults") or {}
    given = {**run_defaults, **claim_defaults, **stated}
    try:
        resolved = settings_mod.resolve(given)
    except settings_mod.SettingsError as exc:
        raise ClaimsError(f"claims file {path}: key {where}: {exc}") from None
    # Assumed: what the source leaves out and a default fills (declared here or by the run).
    assumed = sorted((set(unknown) | set(claim_defaults) | set(run_defaults)) - set(stated) - {"build"})
    return {
        "index": j,
        "label": row["label"],
        "claimed": dict(row["claimed"]),
        "claimed_spread": dict(row.get("claimed_spread") or {}),
        "note": row.get("note"),
        "says_failed": says_failed(row.get("note")),
        "stated": stated,
        "unknown": unknown,
        "build": build,
        "workload": {"concurrency": 1, **workload},
        "given": given,
        "resolved": resolved,
        "id": settings_mod.config_id(claim["model"], resolved),
        "assumed": assumed,
    }


def says_failed(note: str | None) -> bool:
    """Whether a row's note says it crawled, crashed, ran out of memory or failed at its settings."""
    return bool(note and FAILURE_WORDS.search(note))


def _check_label(labels: list[str], j: int, path: Path) -> None:
    if labels.index(labels[j]) != j:
        raise ClaimsError(
            f"claims file {path}: key rows.{j}.label = {labels[j]!r}: rows.{labels.index(labels[j])} "
            "has the same label; labels name the rows in the correction"
        )


def _rows(claim: dict, path: Path, run_defaults: dict, models) -> list[dict]:
    labels = [row["label"] for row in claim["rows"]]
    out = []
    for j, row in enumerate(claim["rows"]):
        _check_label(labels, j, path)
        out.append(_row(j, row, claim, path, run_defaults, models))
    return out


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
    source = _source(claim, path)
    claim_defaults = claim.get("defaults") or {}
    _check_settings(claim_defaults, "defaults", path, models)
    return {
        "name": path.stem,
        "path": str(path),
        "title": claim.get("title") or f"Speed table of {source['file']} ({source['url']})",
        "note": claim.get("note"),
        "template": _template(claim, path),
        "source": source,
        "model": claim["model"],
        "build": claim.get("build"),
        "defaults": claim_defaults,
        # the run's margin: a row whose notes say it failed is checked for survival with it (tables.claims.survival)
        "margin_mib": config["budget"]["margin_mib"],
        "rows": _rows(claim, path, config.get("defaults") or {}, models),
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
        {
            "model": c["model"],
            "id": r["id"],
            "settings": dict(r["given"]),
            "resolved": r["resolved"],
            "assumed": list(r["assumed"]),
            "claim": c["name"],
            "row": r["index"],
            "label": r["label"],
            "workload": dict(r["workload"]),
        }
        for c in claims
        for r in c["rows"]
    ]


def workload_name(workload: dict) -> str:
    name = f"claim-pp{workload['prompt_tokens']}-tg{workload['gen_tokens']}"
    return name + (f"-c{workload['concurrency']}" if workload.get("concurrency", 1) != 1 else "")


def _covering(row: dict, workloads: list[dict]) -> dict | None:
    """A workload of the row's prompt and generated tokens that sends as many requests at once."""
    w = row["workload"]
    return next(
        (
            x
            for x in workloads
            if x["prompt_tokens"] == w["prompt_tokens"]
            and x["gen_tokens"] == w["gen_tokens"]
            and settings_mod.concurrency(x, row["resolved"]) == w["concurrency"]
        ),
        None,
    )


def _check_slots(row: dict, path: str) -> None:
    """A row's workload sends no more requests at once than its configuration has slots, as in the config."""
    sent, slots = row["workload"]["concurrency"], row["resolved"]["parallel"] or 1
    if sent != "slots" and sent > slots:
        raise ClaimsError(
            f"claims file {path}: key rows.{row['index']}.workload.concurrency = {sent}: the row sends {sent} "
            f"requests at once, but its configuration has parallel = {slots} slot(s), so {sent - slots} would wait "
            f"in the queue; state parallel: {sent} for the row (or in the file's defaults) if that is what was run"
        )


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
            _check_slots(r, c["path"])
            found = _covering(r, have)
            if found is not None:
                if "configs" in found and r["id"] not in found["configs"]:  # another row's: runs here too
                    found["configs"].append(r["id"])
                continue
            new = {
                "name": workload_name(r["workload"]),
                **{k: r["workload"][k] for k in WORKLOAD_KEYS},
                "configs": [r["id"]],  # the rows' configurations only: never everyone's workload
            }
            if new["name"] in names:
                raise ClaimsError(
                    f"claims file {c['path']}: key rows.{r['index']}.workload: the workload name {new['name']!r} "
                    "is taken by a different workload in the config; rename that workload"
                )
            names[new["name"]] = new
            have.append(new)
            added.append(new)
    return added
