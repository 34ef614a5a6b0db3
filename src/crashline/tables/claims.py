"""Published speed tables against the measurements: each claimed number beside the measured one,
and the rows of one table that measured different things.

:func:`correction_table` sets each claimed number beside the measured one (median [min–max] n, the
difference in %), and :func:`comparability` names the speed-relevant settings in which rows of the
one published table differ. ``report.correction`` writes both as a section.
"""

from __future__ import annotations

import itertools
from typing import Any

import pandas as pd

from ..core import settings as settings_mod
from ..config.claims import SPEED_SETTINGS, WORKLOAD_KEYS
from ..core.thresholds import inconclusive, missing, shared, too_wide
from .recommend import TIGHT, below_margin, failure_reason

# What each claimed number is compared with: per request, or all requests together.
METRICS = {
    "prefill_tps": "prefill t/s per request",
    "decode_tps": "decode t/s per request",
    "aggregate_tps": "aggregate generated t/s, all requests",
}
_WORKLOAD_TITLES = {
    "prompt_tokens": "prompt tokens",
    "gen_tokens": "generated tokens",
    "concurrency": "requests at once",
}
_UNSET = {"threads": "llama.cpp's choice", "threads_batch": "as threads", "kv_unified": "llama.cpp's choice"}


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


def _difference_text(d: dict) -> str:
    name = d["setting"]
    return f"{setting_title(name)} {_show_known(name, d['a'], d['a_how'])} vs {_show_known(name, d['b'], d['b_how'])}"


def comparability(rows: list[dict]) -> list[dict]:
    """Pairs of rows of one published table that differ in speed-relevant settings.

    ``rows``: a claim's rows (or ``config.claims.claim_configurations`` items of one claim). Stated and
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
        if diffs:
            flags.append(
                {
                    "a": a["label"],
                    "b": b["label"],
                    "settings": [d["setting"] for d in diffs],
                    "differences": diffs,
                    "text": "; ".join(_difference_text(d) for d in diffs),
                }
            )
    return flags


def unverifiable(rows: list[dict]) -> list[dict]:
    """Settings some rows leave out: they may differ between the source's rows, and nothing here
    can tell. Each: {"setting", "title", "rows" (labels that leave it out), "all", "assumed_values"}."""
    rows = [_as_row(r) for r in rows]
    out = []
    for name in ("build", *SPEED_SETTINGS):
        silent = [r for r in rows if (r.get("build") is None if name == "build" else name in r["assumed"])]
        if not silent:
            continue
        values = sorted({"not stated" if name == "build" else show(name, r["resolved"][name]) for r in silent})
        out.append(
            {
                "setting": name,
                "title": setting_title(name),
                "rows": [r["label"] for r in silent],
                "all": len(silent) == len(rows),
                "assumed_values": values,
            }
        )
    return out


# The settings a published table mixes most often (#42): each row names those it states differently from another row
# and those it never states, so no two rows are set side by side over a setting the table left out without saying so.
MIXED_SETTINGS = (
    "ubatch",
    "parallel",
    "build",
    "threads",
    "depth",
    "cache_type_k",
    "cache_type_v",
    "n_cpu_moe",
    "n_gpu_layers",
    "fit",
    "load_mode",
)
_MIXED_TITLES = {"build": "build", "depth": "depth (tokens before decoding)", "parallel": "slots (-np)"}


def mixed_title(name: str) -> str:
    return _MIXED_TITLES.get(name) or setting_title(name)


def _stated(row: dict, name: str) -> tuple[bool, Any]:
    """Whether the table states ``name`` for the row, and the value it states. Depth is the context a decode speed
    was measured after (the prompt; 0 after a one-token prompt), stated by the row's test; a row that claims no
    decode speed has none (prefill starts from an empty context)."""
    if name == "build":
        return row.get("build") is not None, row.get("build")
    if name == "depth":
        decodes = any(m in row.get("claimed", {}) for m in ("decode_tps", "aggregate_tps"))
        prompt = row["workload"]["prompt_tokens"]
        return decodes, (prompt if prompt > 1 else 0) if decodes else None
    return name in row["stated"], row["resolved"][name]


def mixed_settings(rows: list[dict]) -> list[dict]:
    """Per published row, what it mixes with the table's other rows: {"label", "differs": [{"setting", "title",
    "value", "others": {label: value}}] (stated here and stated otherwise by another row), "unstated": [setting
    names] (never stated for this row: the other rows may differ in it unseen), "text"}, over ``MIXED_SETTINGS``."""
    rows = [_as_row(r) for r in rows]
    known = {r["label"]: {n: _stated(r, n) for n in MIXED_SETTINGS if n != "depth" or _stated(r, n)[0]} for r in rows}
    out = []
    for r in rows:
        mine, differs, unstated = known[r["label"]], [], []
        for name, (said, value) in mine.items():
            if not said:
                unstated.append(name)
                continue
            others = {
                o["label"]: show(name, known[o["label"]][name][1])
                for o in rows
                if name in known[o["label"]] and known[o["label"]][name][0] and known[o["label"]][name][1] != value
            }
            if others:
                differs.append(
                    {"setting": name, "title": mixed_title(name), "value": show(name, value), "others": others}
                )
        out.append(
            {"label": r["label"], "differs": differs, "unstated": unstated, "text": _mixed_text(differs, unstated)}
        )
    return out


def _mixed_text(differs: list[dict], unstated: list[str]) -> str:
    parts = []
    for d in differs:
        values = list(dict.fromkeys(d["others"].values()))
        where = next(iter(d["others"])) if len(d["others"]) == 1 else f"{len(d['others'])} other rows"
        parts.append(f"{d['title']} {d['value']} here, {' / '.join(values)} in {where}")
    if unstated:
        parts.append("not stated: " + ", ".join(map(mixed_title, unstated)))
    return "; ".join(parts) or "states every one of the settings tables mix, as the other rows do"


def _as_row(item: dict) -> dict:
    """A claim row, from either a loaded claim's row or a ``claim_configurations`` item."""
    if "stated" in item:
        return item
    return {
        "label": item["label"],
        "stated": {k: v for k, v in item["settings"].items() if k not in item["assumed"]},
        "assumed": item["assumed"],
        "resolved": item["resolved"],
        "workload": item["workload"],
        "build": item.get("build"),
        "unknown": item.get("unknown", []),
    }


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


def _fmt(value: float) -> str:
    return f"{value:,.1f}"


def _config_row(configs: pd.DataFrame, model: str, cid: str):
    """The configs row of a configuration, or None."""
    if configs.empty:
        return None
    c = configs[(configs["model"] == model) & (configs["config_id"] == cid)]
    return c.iloc[0] if len(c) else None


def _measured_row(row: dict, model: str, configs: pd.DataFrame, measurements: pd.DataFrame):
    """The measurement of a claim row: (workload row or None, why there is none)."""
    w = row["workload"]
    if not measurements.empty:
        m = measurements[
            (measurements["model"] == model)
            & (measurements["config_id"] == row["id"])
            & (measurements["prompt_tokens"] == w["prompt_tokens"])
            & (measurements["gen_tokens"] == w["gen_tokens"])
            & (measurements["concurrency"] == w["concurrency"])
        ]
        if len(m):
            ok = m[m["workload_outcome"] == "ok"]
            hit = (ok if len(ok) else m).iloc[0]
            if hit["workload_outcome"] != "ok":
                return hit, f"{hit['workload_outcome']}: {hit['workload_message'] or 'no message'}"
            return hit, None
    cfg = _config_row(configs, model, row["id"])
    if cfg is None:
        return None, f"not measured: no record of configuration {row['id']} (run the workflow)"
    if cfg["outcome"] != "ok":
        where = f" at {cfg['phase']}" if cfg["phase"] else ""
        return None, f"{cfg['outcome']}{where}: {cfg['message'] or 'no message'}"
    return None, (
        f"not measured: configuration {row['id']} has no workload of {w['prompt_tokens']} prompt / "
        f"{w['gen_tokens']} generated tokens at {w['concurrency']} request(s) at once"
    )


def _warnings(hit, med: float, lo: float, hi: float) -> dict[str, float]:
    """Why a measured number should be repeated before it is trusted (or sent upstream):
    {"spread_pct": range over median, in %} and / or {"other_cores": CPU cores others used}."""
    out = {}
    spread = (hi - lo) / med * 100 if med else None
    if too_wide(spread):
        out["spread_pct"] = spread
    other = hit.get("cpu_other_cores")
    if shared(other):
        out["other_cores"] = float(other)
    return out


def warning_notes(table: list[dict]) -> dict:
    """The warnings of a correction table, summarised: which numbers spread too wide, how many
    were measured while others used the machine, and how busy it was."""
    spread = [
        f"{t['label']}, {t['metric'].split('_')[0]} ({t['warnings']['spread_pct']:.0f}%)"
        for t in table
        if "spread_pct" in t["warnings"]
    ]
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
            if a is not None and b is not None:
                changes.append(_change(metric, title, a, b))
        out.append({**f, "changes": changes})
    return out


def _change(metric: str, title: str, a: dict, b: dict) -> dict:
    change = {
        "metric": metric,
        "title": title,
        "claimed_pct": (b["claimed"] / a["claimed"] - 1) * 100,
        "measured_pct": None,
        "overlap": None,
    }
    if "other_cores" in a["warnings"] or "other_cores" in b["warnings"]:
        change["inconclusive"] = True  # other processes competed on a side: no change is drawn (#41)
    elif a["median"] and b["median"]:
        change["measured_pct"] = (b["median"] / a["median"] - 1) * 100
        change["overlap"] = bool(a["min"] <= b["max"] and b["min"] <= a["max"])
    return change


def workload_text(w: dict) -> str:
    text = f"pp{w['prompt_tokens']} tg{w['gen_tokens']}"
    return text + (f", {w['concurrency']} requests at once" if w["concurrency"] != 1 else "")


def _entry(claim: dict, row: dict, metric: str, problem: str | None, not_comparable: list[str]) -> dict:
    """A claimed number with what is known of its row, before anything measured is set beside it."""
    claimed = float(row["claimed"][metric])
    return {
        "claim": claim["name"],
        "label": row["label"],
        "row": row["index"],
        "metric": metric,
        "metric_title": METRICS[metric],
        "claimed": claimed,
        "claimed_text": _fmt(claimed),
        "median": None,
        "min": None,
        "max": None,
        "n": None,
        "measured_text": problem or "–",
        "diff_pct": None,
        "diff_text": "–",
        "within_range": None,
        "status": "ok" if problem is None else "missing",
        "problem": problem,
        "config_id": row["id"],
        "settings": settings_mod.label(row["resolved"]),
        "stated": {k: show(k, v) for k, v in row["stated"].items()},
        "assumed": [f"{k}={show(k, row['resolved'][k])}" for k in row["assumed"]],
        "build_claimed": row["build"] or "not stated",
        "workload": dict(row["workload"]),
        "workload_text": workload_text(row["workload"]),
        "not_comparable_with": not_comparable,
        "build": None,
        "host": None,
        "warnings": {},
    }


def _where(entry: dict, env) -> None:
    """The build and the machine of the measurement (or of the configuration's failed run)."""
    sha = env.get("server_sha256") or ""
    version = env.get("server_version")
    entry["build"] = f"{version} (sha256 {sha[:12]}…)" if sha else str(version)
    entry["host"] = f"{env.get('cpu_model')}; {env.get('gpu')}"


def _measured(entry: dict, hit) -> None:
    """The measured number beside the claimed one: median [min–max] n, the difference, the warnings."""
    metric, claimed = entry["metric"], entry["claimed"]
    med = hit.get(f"{metric}_median")
    if missing(med):
        entry.update(status="missing", problem="the measurement has no value for this metric", measured_text="–")
        return
    lo, hi, n = hit[f"{metric}_min"], hit[f"{metric}_max"], int(hit[f"{metric}_n"])
    pct = (med - claimed) / claimed * 100
    within = bool(lo <= claimed <= hi)
    warnings = _warnings(hit, float(med), float(lo), float(hi))
    doubt = inconclusive([hit])  # other processes competed: no difference to send upstream (#41)
    entry.update(
        median=float(med),
        min=float(lo),
        max=float(hi),
        n=n,
        diff_pct=None if doubt else pct,
        within_range=within,
        warnings=warnings,
        measured_text=f"{_fmt(med)} [{_fmt(lo)}–{_fmt(hi)}] n={n}" + (" ⚠" if warnings else ""),
        diff_text=doubt or f"{pct:+.1f}%" + (" (within range)" if within else ""),
    )


def _headroom(cfg) -> list[str]:
    """The headroom a configuration left to each budget it measured: "N MiB VRAM headroom"."""
    return [
        f"{cfg[column]:,.0f} MiB {what} headroom"
        for column, what in TIGHT
        if cfg.get(column) is not None and not pd.isna(cfg[column])
    ]


def survival(claim: dict, configs: pd.DataFrame, measurements: pd.DataFrame) -> list[dict]:
    """The rows whose own notes say they crawled, crashed or failed (``config.claims.says_failed``), re-measured for
    survival with the run's margin as the recommendation checks it (``tables.recommend.below_margin``): their
    configuration ran every workload of the config and the row's own. Each: {"label", "note", "survived" (True,
    False, None when not measured yet), "text"}."""
    out = []
    margin = claim["margin_mib"]
    for row in (r for r in claim["rows"] if r["says_failed"]):
        cfg = _config_row(configs, claim["model"], row["id"])
        hit, problem = _measured_row(row, claim["model"], configs, measurements)
        if cfg is None:
            survived, text = None, f"not measured yet: no record of configuration {row['id']} (run the workflow)"
        elif cfg["outcome"] != "ok":
            survived = False
            text = "did not survive at the claimed settings: " + failure_reason(
                cfg["outcome"], cfg["phase"], cfg["message"]
            )
        elif hit is not None and hit["workload_outcome"] != "ok":
            survived, text = False, f"survived the config's workloads, but not its own: {problem}"
        elif below_margin(cfg, margin):
            survived = False
            text = f"survived, but with {' and '.join(below_margin(cfg, margin))}, less than the {margin:,} MiB margin"
        elif not _headroom(cfg):
            survived = None  # no budget to leave a margin to: this run cannot say
            text = f"survived at the claimed settings; no memory budget was measured against the {margin:,} MiB margin"
        else:
            survived = True
            text = f"survived at the claimed settings with the {margin:,} MiB margin ({' and '.join(_headroom(cfg))})"
        out.append({"label": row["label"], "note": row["note"], "survived": survived, "text": text})
    return out


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
            env = hit if hit is not None else _config_row(configs, claim["model"], row["id"])
            for metric in (m for m in METRICS if m in row["claimed"]):
                entry = _entry(claim, row, metric, problem, flags[row["label"]])
                if env is not None:
                    _where(entry, env)
                if hit is not None and problem is None:
                    _measured(entry, hit)
                out.append(entry)
    return out
