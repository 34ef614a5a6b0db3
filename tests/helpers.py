"""Helpers the test modules share: a fetch record of a local file, one measurement through the measure job, the
workflow copied into a folder and run (or dry-run) there. Fixtures stay in conftest.py."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import psutil

from conftest import REPO
from crashline.config import plan as C
from crashline.config.plan import load_schema
from crashline.core.atomic import read_json
from crashline.core.paths import RecordFolder
from crashline.jobs import measure as M
from crashline.jobs import spec as S


SCHEMA = load_schema()


def by_hand(tmp_path: Path, provenance: dict, *args: str) -> dict:
    """``provenance`` with its llama-server started as ``llama-server ... ARGS``: a wrapper script, so that a fault
    test can make a real server do what no config may ask of it (extra_args passes only what core/serverflags.py
    allows)."""
    script = tmp_path / "llama-server-by-hand"
    quoted = " ".join(f"'{a}'" for a in args)
    script.write_text(f"#!/bin/sh\nexec '{provenance['binary']}' \"$@\" {quoted}\n")
    script.chmod(0o755)
    return {**provenance, "binary": str(script)}


def fetch_record(model_path) -> dict:
    """What `fetch` records for a local file: its size and hash (measure checks it is unchanged)."""
    path = Path(model_path)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    return {
        "source": f"file:{path}",
        "sha256": digest,
        "files": [{"name": path.name, "path": str(path), "bytes": path.stat().st_size, "sha256": digest}],
    }


def measure_one(folder: Path, model: str, fetch: dict, provenance: dict, config: dict, draft_path=None) -> dict:
    """The first configuration of ``config`` (a raw config; validated here) measured on ``model``: its record, as
    written to the record folder ``folder`` (the server's log and the telemetry beside it, as in a results folder)."""
    cfg = C.validate(config, SCHEMA)
    item = C.expand(cfg)[0]
    M.measure(
        S.measure_spec(cfg, item["model"], item["id"]),
        S.JobInputs(fetch, {}, provenance, draft_path),
        M.MeasurePaths.of(RecordFolder(folder)),
    )
    return read_json(RecordFolder(folder).measure)


def measure_gemma(folder: Path, gemma_fetch: dict, provenance: dict, config: dict, draft_path=None) -> dict:
    """The one configuration of ``config`` measured on the real gemma (``measure_one``)."""
    return measure_one(folder, "gemma", gemma_fetch, provenance, config, draft_path)


def run(
    tmp_path,
    model_path,
    provenance,
    settings,
    workloads,
    reps=2,
    request_timeout_s=300,
    fetch=None,
    budget=None,
    starts=1,
    time_limit_s=None,
):
    cfg = C.validate(
        {
            **({"time_limit_s": time_limit_s} if time_limit_s else {}),
            "models": {"tiny": {"source": f"file:{model_path}"}},
            "defaults": {"threads": 2},
            "configurations": [{"settings": settings, **({"starts": starts} if starts > 1 else {})}],
            "workloads": workloads,
            "repetitions": reps,
            "server": {"startup_timeout_s": 120, "request_timeout_s": request_timeout_s},
            **({"budget": budget} if budget else {}),
        },
        SCHEMA,
    )
    (item,) = C.expand(cfg)
    fetch = fetch or fetch_record(model_path)
    record_path = RecordFolder(tmp_path).measure
    rec = M.measure(
        S.measure_spec(cfg, "tiny", item["id"]),
        S.JobInputs(fetch, {}, provenance),
        M.MeasurePaths(record_path, RecordFolder(tmp_path).server_log),
    )
    for k in range(2, starts + 1):  # the later starts, each its own job in the workflow
        M.measure(
            S.measure_spec(cfg, "tiny", item["id"], start=k),
            S.JobInputs(fetch, {}, provenance),
            M.MeasurePaths.of(RecordFolder(tmp_path).later_start(k)),
        )
    written = read_json(record_path)
    assert (written["config_id"], written["outcome"], written["message"]) == (
        item["id"],
        rec["outcome"],
        rec["message"],
    )
    assert not list(tmp_path.glob(".*.part")), "no temporary file left behind"
    left = [
        p
        for p in psutil.Process().children(recursive=True)
        if p.name() == "llama-server" and p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    ]
    assert not left, "the server outlived the job"
    return rec


def copy_workflow(dest):
    """A copy of the workflow, so that results of the checkout do not matter."""
    for name in ("Snakefile", "rules", "scripts", "config", "profiles", "envs"):
        (shutil.copytree if (REPO / name).is_dir() else shutil.copy)(REPO / name, dest / name)


def dry_run(workdir, *args):
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "-n", "report", *args],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO / "src")},
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    return out


def snakemake(workdir, *args, check=True):
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "--cores", "1", *args],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    output = proc.stdout + proc.stderr
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed:\n{output[-6000:]}")
    return output


def recorded(search_dir: Path, rel: Path) -> dict:
    """A replayed search's record at ``rel``; a calibration the run did not make, its own: before session 33 a search
    calibrated with every expert on the CPU, a value above the one it asks now (its compute buffer the same at these
    runs' -c 32768, 16K; at 100K, 128 MiB smaller on two shapes: bench/results/lease-2026-12-08-s33/)."""
    if rel.parent.name == "calibration" and not (search_dir / rel).exists():
        (rel,) = [p.relative_to(search_dir) for p in search_dir.glob("records/*/calibration/measure.json")]
    return read_json(search_dir / rel)
