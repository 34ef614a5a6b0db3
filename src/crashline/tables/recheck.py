"""An earlier run against this one, configuration by configuration (``recheck.against``): usually the same
configurations on another llama-server build. Per configuration measured in both: did it survive then and now
(and where it failed), the first request after ``/health``, the objective's speed now over then (tied where the
recommendation would tie them, ``ties.same_speed``; "cannot tell" where a side measured it once), and the change
in peak VRAM and host memory. Pure: tables in, rows out."""

from __future__ import annotations

import pandas as pd

from ..core import columns as cols
from ..core.records import Outcome
from ..core.thresholds import inconclusive
from .ties import same_speed, spread_of


def build_of(row) -> str:
    sha = row.get("server_sha256")
    return f"{row.get('server_version') or 'unknown build'}" + (f" ({sha[:12]})" if isinstance(sha, str) else "")


def _failure(row) -> str | None:
    if row["outcome"] == Outcome.OK:
        return None
    return f"{row['outcome']}" + (f" at {row['phase']}" if isinstance(row.get("phase"), str) else "")


def number(value) -> float | None:
    return None if value is None or value != value else float(value)


def _difference(now, then) -> float | None:
    now, then = number(now), number(then)
    return None if now is None or then is None else round(now - then, 1)


def compare(
    before_configs: pd.DataFrame,
    before_measurements: pd.DataFrame,
    configs: pd.DataFrame,
    measurements: pd.DataFrame,
    metric: str,
    workload: str,
) -> list[dict]:
    """One row per configuration of this run that the earlier run measured too (same model and id), in this run's
    order; the objective's ``metric`` at ``workload`` decides slower, tied or faster."""
    rows = []
    then_by_key = {(r["model"], r["config_id"]): r for r in before_configs.to_dict("records")}
    speeds_then = {
        (r["model"], r["config_id"]): r
        for r in before_measurements[before_measurements["workload"] == workload].to_dict("records")
    }
    speeds_now = {
        (r["model"], r["config_id"]): r for r in measurements[measurements["workload"] == workload].to_dict("records")
    }
    median, count = cols.stat(metric, "median"), cols.stat(metric, "n")
    for now in configs.to_dict("records"):
        key = (now["model"], now["config_id"])
        then = then_by_key.get(key)
        if then is None:
            continue
        failed_then, failed_now, doubt = _failure(then), _failure(now), None
        a, b = speeds_then.get(key), speeds_now.get(key)
        ok_speeds = a is not None and b is not None and number(a.get(median)) and number(b.get(median))
        ratio = round(float(b[median]) / float(a[median]), 3) if ok_speeds else None
        if failed_now and failed_then:
            verdict = "fails in both"
        elif failed_now:
            verdict = "fails now"
        elif failed_then:
            verdict = "survives now"
        elif ratio is None:
            verdict = "tied"  # nothing to compare at the objective's workload
        elif min(number(a.get(count)) or 0, number(b.get(count)) or 0) < 2:
            verdict = "cannot tell"  # one request on a side: no range to judge the noise by
        elif doubt := inconclusive([a, b]):
            verdict = "inconclusive"  # other processes competed on one side: neither faster nor slower
        elif same_speed(spread_of(a, metric), spread_of(b, metric)):
            verdict = "tied"
        else:
            verdict = "slower" if ratio < 1 else "faster"
        rows.append(
            {
                "model": now["model"],
                "config_id": now["config_id"],
                "server_args": now.get("server_args"),
                "build_then": build_of(then),
                "build_now": build_of(now),
                # the very bits the earlier run used: a recheck then measures the machine and the noise, not a build
                "same_build": isinstance(then.get("server_sha256"), str)
                and then.get("server_sha256") == now.get("server_sha256"),
                "failed_then": failed_then,
                "failed_now": failed_now,
                "first_request_s_then": number(then.get("first_request_s")),
                "first_request_s_now": number(now.get("first_request_s")),
                "metric": metric,
                "workload": workload,
                "median_then": number(a.get(median)) if a is not None else None,
                "median_now": number(b.get(median)) if b is not None else None,
                "ratio": ratio,
                "peak_gpu_mib_change": _difference(now.get("peak_gpu_mib"), then.get("peak_gpu_mib")),
                "peak_rss_mib_change": _difference(now.get("peak_rss_mib"), then.get("peak_rss_mib")),
                "verdict": verdict,
                "inconclusive": doubt,  # why neither faster nor slower: others' processes, in words
            }
        )
    return rows


def regressed(rows: list[dict]) -> list[dict]:
    """The configurations that fail now or are slower beyond the noise (``recheck`` exits REGRESSED with any)."""
    return [r for r in rows if r["verdict"] in ("fails now", "slower")]


def headline(rows: list[dict]) -> str | None:
    """What the new build did, in one sentence: which configurations it broke or slowed, or that it kept them; on
    the very build the earlier run used (its sha256), it says so, as a change then is none of the build's."""
    if not rows:
        return None
    builds = sorted({r["build_now"] for r in rows})
    earlier = sorted({r["build_then"] for r in rows})
    broke = [r for r in rows if r["verdict"] == "fails now"]
    slowed = [r for r in rows if r["verdict"] == "slower"]
    same = all(r.get("same_build") for r in rows)
    if same:
        said = f"The same build as the earlier run ({', '.join(builds)}, the same sha256)"
    else:
        said = f"Against the earlier run ({', '.join(earlier)}), this build ({', '.join(builds)})"
    if broke or slowed:
        parts = [f"{r['model']} {r['config_id']} now fails ({r['failed_now']})" for r in broke]
        parts += [f"{r['model']} {r['config_id']} is slower ({r['ratio']:.2f}x the {r['metric']})" for r in slowed]
        unchanged = " (the build did not change: the machine, its load or the noise did)" if same else ""
        return f"{said} regressed: {'; '.join(parts)}{unchanged}."
    kept = sum(r["verdict"] in ("tied", "faster", "survives now", "cannot tell") for r in rows)
    once = sum(r["verdict"] == "cannot tell" for r in rows)
    untold = f"; {once} measured once on a side, so its speed is not compared (raise repetitions)" if once else ""
    busy = [r for r in rows if r["verdict"] == "inconclusive"]
    if busy:
        untold += f"; {len(busy)} {busy[0]['inconclusive']}"
    return (
        f"{said} kept all {kept} configuration(s) measured in both: none fails or is slower beyond the noise{untold}."
    )
