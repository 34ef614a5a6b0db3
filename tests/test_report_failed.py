"""A report whatever happened: no record at all, every configuration crashed the same way (a
llama-server that dies by SIGILL at warm-up, like a build for another CPU), or configurations that
failed in different ways. The records come from crashline's own measure job, run with fake
llama-servers that really die; no real server starts."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pandas as pd
import pytest
import yaml

from crashline.tables import aggregate, needle as needle_table
from crashline.cli import main as cli
from crashline.report import build as report
from crashline.config import plan as C
from crashline.core.atomic import write_json

from conftest import FIXTURES
from crashline.core.host import gpus
from helpers import SCHEMA, run as measure_one

WARMUP = "common_init_from_params: warming up the model with an empty run - please wait"
WORKLOADS = [{"name": "short", "prompt_tokens": 32, "gen_tokens": 4}]
SIGILL_C = f'#include <stdio.h>\nint main(void) {{ fputs("{WARMUP}\\n", stderr); __builtin_trap(); }}\n'


@pytest.fixture(scope="module")
def servers(tmp_path_factory) -> dict[str, str]:
    """Fake llama-servers that die at warm-up: by SIGILL (a C program that traps), and with exit status 1."""
    out = tmp_path_factory.mktemp("servers")
    (out / "sigill.c").write_text(SIGILL_C)
    subprocess.run(["cc", "-o", str(out / "sigill"), str(out / "sigill.c")], check=True)
    (out / "exit1").write_text(f"#!/bin/sh\necho '{WARMUP}' >&2\nexit 1\n")
    (out / "exit1").chmod(0o755)
    return {"sigill": str(out / "sigill"), "exit1": str(out / "exit1")}


def provenance(binary: str) -> dict:
    """What provision records for a given binary, with a check run that failed (its shape is provision's)."""
    return {
        "binary": binary,
        "obtained": "given (test)",
        "version": "fake 1",
        "backend": "cpu",
        "build_flags": ["-DGGML_NATIVE=ON"],
        "sha256": hashlib.sha256(Path(binary).read_bytes()).hexdigest(),
        "check": {"ok": False, "phase": "warmup", "signal": "SIGILL", "log_tail": f"{WARMUP}\nIllegal instruction"},
    }


def measured(tmp_path: Path, model: Path, runs: list[tuple[str, dict]]) -> list[Path]:
    """One record per (binary, settings), written by crashline's measure job."""
    paths = []
    for i, (binary, settings) in enumerate(runs):
        out = tmp_path / f"job{i}"
        out.mkdir()
        measure_one(out, model, provenance(binary), settings, WORKLOADS, reps=1)
        paths.append(out / "measure.json")
    return paths


def run_config(model: Path, **extra) -> dict:
    return C.validate(
        {
            "models": {"tiny": {"source": f"file:{model}"}},
            "defaults": {"threads": 2},
            "configurations": [{"settings": {}}],
            "workloads": WORKLOADS,
            "repetitions": 1,
            **extra,
        },
        SCHEMA,
    )


def report_of(tmp_path: Path, model: Path, records: list[Path], binary: str) -> dict:
    """Tables (every one, needle included) and both reports from the records, as the workflow writes them."""
    out = tmp_path / "results"
    paths = {name: out / f"{name}.parquet" for name in ("configs", "measurements", "searches", "needle")}
    aggregate.write(records, paths["configs"], paths["measurements"], [], paths["searches"])
    needle_table.write_table([], paths["needle"])
    write_json(out / "provenance.json", provenance(binary))
    report.render(
        paths["configs"],
        paths["measurements"],
        out / "provenance.json",
        run_config(model),
        out / "report.md",
        out / "report.html",
        paths["searches"],
        paths["needle"],
    )
    return {
        **{name: pd.read_parquet(path) for name, path in paths.items()},
        "md": (out / "report.md").read_text(),
        "html": (out / "report.html").read_text(),
    }


def top(result: dict) -> tuple[str, str]:
    """What the reports say before the environment, the recommendations and the results."""
    return result["md"].split("## Environment")[0], result["html"].split("<h2>Environment</h2>")[0]


@pytest.fixture(scope="module")
def crashed(tmp_path_factory, tiny_moe, servers) -> list[Path]:
    """Two configurations, both measured with a llama-server that dies by SIGILL at warm-up."""
    return measured(
        tmp_path_factory.mktemp("crashed"),
        tiny_moe,
        [(servers["sigill"], {"n_cpu_moe": 0}), (servers["sigill"], {"n_cpu_moe": 2})],
    )


def test_tables_keep_their_columns_with_no_rows(tmp_path, crashed):
    empty_configs, empty_measurements = aggregate.tables([])
    configs, measurements = aggregate.tables(crashed)
    assert len(configs) == 2 and measurements.empty  # nothing reached a workload
    assert list(empty_configs.columns) == list(configs.columns)
    assert list(empty_measurements.columns) == list(measurements.columns)
    assert {"model", "config_id", "outcome", "phase", "s_n_cpu_moe"} <= set(configs.columns)
    # every column of measurements written from real (older) records that ran workloads
    records = [p for p in (FIXTURES / "h200-records").glob("*.json") if p.name != "provenance.json"]
    assert set(aggregate.tables(records)[1].columns) <= set(measurements.columns)
    assert {"model", "server_starts", "probe_rows"} <= set(aggregate.search_table([]).columns)
    aggregate.write([], tmp_path / "c.parquet", tmp_path / "m.parquet", [], tmp_path / "s.parquet")
    assert list(pd.read_parquet(tmp_path / "m.parquet").columns) == list(empty_measurements.columns)


def test_no_record_at_all(tmp_path, tiny_moe, servers):
    result = report_of(tmp_path, tiny_moe, [], servers["sigill"])
    assert result["configs"].empty and "outcome" in result["configs"]
    assert result["measurements"].empty and "workload_outcome" in result["measurements"]
    md, html = top(result)
    assert "**No configuration of tiny survived: there is no record of any.**" in md
    assert "No configuration of tiny survived: there is no record of any." in html
    assert "failed the same way" not in result["md"] + result["html"]


def test_every_configuration_crashed_the_same_way(tmp_path, tiny_moe, servers, crashed):
    result = report_of(tmp_path, tiny_moe, crashed, servers["sigill"])
    configs = result["configs"]
    assert (configs["outcome"] == "crashed").all() and (configs["phase"] == "warmup").all()
    assert result["measurements"].empty and "decode_tps_median" in result["measurements"]
    md, html = top(result)
    common = (
        "Every configuration of every model failed the same way (crashed at warmup: killed by SIGILL). The cause "
        "is common to all of them: the llama-server binary or this machine, not the configurations."
    )
    assert f"**{common}**" in md and common in html
    prov = provenance(servers["sigill"])
    for text in (md, html):
        assert prov["binary"] in text and prov["sha256"] in text and "-DGGML_NATIVE=ON" in text
        assert "how obtained" in text and "given (test)" in text and "fake 1" in text
        assert "signal: SIGILL" in text and f"log_tail: {WARMUP}\n  Illegal instruction" in text
    assert "No configuration of tiny survived." in html and "**No configuration of tiny survived.**" in md
    sigill = "crashed at warmup: killed by SIGILL"
    for row in configs.itertuples():
        assert f"- `{row.server_args}` (`{row.config_id}`) — {sigill}" in md
        assert f"<code>{row.server_args}</code> <small>({row.config_id})</small> — {sigill}" in html
    # the headline names the reason (it said "no configuration survived every workload with the margin")
    assert f"**No recommendation: every configuration failed the same way ({sigill})**." in result["md"]
    assert "survives every workload from no tested value. Tested: 0, 2." in result["md"]  # the crash line


def test_one_crashed_configuration_says_nothing_of_the_binary(tmp_path, tiny_moe, servers, crashed):
    result = report_of(tmp_path, tiny_moe, crashed[:1], servers["sigill"])
    md, html = top(result)
    assert "crashed at warmup: killed by SIGILL" in md and "binary or this machine" not in md + html


def test_cli_aggregate_and_report_exit_0_when_everything_crashed(tmp_path, tiny_moe, servers, crashed):
    results = tmp_path / "results"
    config = tmp_path / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "results_dir": str(results),
                "models": {"tiny": {"source": f"file:{tiny_moe}"}},
                "configurations": [{"settings": {}}],
                "workloads": WORKLOADS,
            }
        )
    )
    write_json(results / "server" / "provenance.json", provenance(servers["sigill"]))
    assert cli.main(["aggregate", "--config", str(config), *map(str, crashed)]) == 0
    assert cli.main(["report", "--config", str(config)]) == 0
    assert "failed the same way (crashed at warmup: killed by SIGILL)" in (results / "report.md").read_text()


def test_configurations_that_failed_in_different_ways(tmp_path, tiny_moe, servers):
    records = measured(
        tmp_path, tiny_moe, [(servers["sigill"], {"n_cpu_moe": 0}), (servers["exit1"], {"n_cpu_moe": 2})]
    )
    result = report_of(tmp_path, tiny_moe, records, servers["sigill"])
    md, html = top(result)
    rows = list(result["configs"].itertuples())
    reasons = sorted(f"{row.outcome} at {row.phase}: {row.message}" for row in rows)
    assert reasons == ["crashed at warmup: killed by SIGILL", "load_failed at load: exit status 1 before listening"]
    assert "**No configuration of tiny survived.**" in md and "No configuration of tiny survived." in html
    for row in rows:
        assert f"- `{row.server_args}` (`{row.config_id}`) — {row.outcome} at {row.phase}: {row.message}" in md
        assert f"<small>({row.config_id})</small> — {row.outcome} at {row.phase}: {row.message}" in html
    for text in (result["md"], result["html"]):
        assert "failed the same way" not in text and "binary or this machine" not in text


@pytest.mark.skipif(gpus()["present"], reason="a VRAM budget is emulated on this machine's GPU")
def test_a_budget_this_machine_cannot_emulate_is_named_as_the_cause(tmp_path, tiny_moe, servers):
    """budget.vram_budget_mib without an NVIDIA GPU: every configuration is refused before its server starts, and
    the report blamed "the llama-server binary or this machine" (issue #26); the cause is the config's budget."""
    records = []
    for i, settings in enumerate([{"n_cpu_moe": 0}, {"n_cpu_moe": 2}]):
        out = tmp_path / f"job{i}"
        out.mkdir()
        measure_one(
            out, tiny_moe, provenance(servers["exit1"]), settings, WORKLOADS, reps=1, budget={"vram_budget_mib": 8192}
        )
        records.append(out / "measure.json")
    result = report_of(tmp_path, tiny_moe, records, servers["exit1"])
    assert set(result["configs"]["outcome"]) == {"budget_refused"}
    md, html = top(result)
    assert "The cause is the config's budget (budget.vram_budget_mib or budget.host_ram_mib)" in md
    assert "vram_budget_mib needs an NVIDIA GPU" in md and "binary or this machine" not in md + html
