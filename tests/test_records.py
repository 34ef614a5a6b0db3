"""Typed records (crashline.core.records): every record has a kind and a version, load() refuses what it
cannot read and upgrades what it knows; and the Parquet tables keep lists and nested values native
(crashline.core.columns), equal to the JSON-text columns they are to replace."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from crashline.tables import aggregate
from crashline.engine import bottleneck
from crashline.core import records
from crashline.core import columns as cols
from crashline.core.atomic import read_json, write_json
from crashline.core.records import Outcome, RecordError

from conftest import FIXTURES

RECORDS = sorted(p for p in (FIXTURES / "h200-records").glob("*.json") if p.name != "provenance.json")
SEARCH = FIXTURES / "h200-search" / "search.json"
# Steady decode on a GPU with GPM: every suspect bottleneck.table knows, each with every field it gives.
DECODE = {
    "pcie_rx_kbs": 9_000_000,
    "pcie_tx_kbs": 100_000,
    "pcie_gen": 5,
    "pcie_width": 16,
    "gpm_dram_bw_pct": 40.0,
    "gpu_sm_pct": 97.0,
    "gpm_sm_pct": 20.0,
    "gpm_occupancy_pct": 12.0,
    "server_cpu_cores": 3.5,
    "majflt_per_s": 0.0,
    "disk_read_bytes_per_s": 0,
}


# -- load and write -------------------------------------------------------------------------------


def test_load_refuses_a_newer_version_naming_the_file_and_what_it_reads(tmp_path):
    path = tmp_path / "measure.json"
    write_json(path, {"kind": "measure", "schema_version": records.CURRENT["measure"] + 1, "outcome": "ok"})
    with pytest.raises(RecordError) as caught:
        records.load(path)
    message = str(caught.value)
    newer = records.CURRENT["measure"] + 1
    assert message.startswith(f"{path}: measure record version {newer} is newer than this code reads")
    assert f"measure 1–{records.CURRENT['measure']}" in message and "search 0–1" in message


def test_load_refuses_an_unknown_kind_and_a_kind_other_than_expected(tmp_path):
    path = tmp_path / "odd.json"
    write_json(path, {"kind": "telemetry", "schema_version": 1})
    reads = r"odd\.json: unknown record kind 'telemetry' \(this code reads kv_quality 1–1, "
    reads += rf"measure 1–{records.CURRENT['measure']}"
    with pytest.raises(RecordError, match=reads):
        records.load(path)
    with pytest.raises(RecordError, match=r"ncmoe25\.json: a 'measure' record where a 'search' record was expected"):
        records.load(FIXTURES / "h200-records" / "ncmoe25.json", "search")
    with pytest.raises(RecordError, match="names no kind"):  # a search without version is read only as a search
        records.load(SEARCH)
    (tmp_path / "broken.json").write_text('{"kind": "measure", ')
    with pytest.raises(RecordError, match=r"broken\.json: not a record: not JSON"):
        records.load(tmp_path / "broken.json")


def test_load_upgrades_a_version_1_measure_record():
    path = FIXTURES / "h200-records" / "ncmoe25.json"
    raw = read_json(path)
    assert (raw["kind"], raw["schema"]) == ("measure", 1) and "schema_version" not in raw  # written by crashline 1
    loaded = records.load(path, "measure")
    assert list(loaded)[:2] == ["kind", "schema_version"] and loaded["schema_version"] == records.CURRENT["measure"]
    assert "schema" not in loaded
    upgraded = ("schema_version", "workloads")
    assert {k: v for k, v in loaded.items() if k not in upgraded} == {
        k: v for k, v in raw.items() if k not in ("schema", "workloads")
    }
    # version 3: each workload's end-to-end speed from its requests (version 1 kept the server's times only)
    for before, after in zip(raw["workloads"], loaded["workloads"], strict=True):
        assert {k: v for k, v in after.items() if k not in ("e2e_tps", "warmup_runs")} == before
        assert after["warmup_runs"] == []
        seconds = [(r["prompt_ms"] + r["predicted_ms"]) / 1000 for r in before["runs"]]
        rates = [(r["prompt_n"] + r["predicted_n"]) / s for r, s in zip(before["runs"], seconds)]
        assert after["e2e_tps"]["n"] == len(rates) and after["e2e_tps"]["min"] == pytest.approx(min(rates))


def test_load_upgrades_a_search_without_version():
    raw = read_json(SEARCH)
    assert not {"kind", "schema", "schema_version", "records"} & set(raw)  # version 0
    loaded = records.load(SEARCH, "search")
    assert (loaded["kind"], loaded["schema_version"]) == ("search", records.CURRENT["search"])
    assert loaded["records"] == []  # a search from before it named its probes' records names none
    assert {k: loaded[k] for k in raw} == raw


def test_write_then_load_round_trip(tmp_path):
    path = tmp_path / "measure.json"
    record = {
        "config_id": "abc",
        "outcome": Outcome.CONTEXT_EXCEEDED,
        "workloads": [{"name": "short", "outcome": Outcome.OK}],
    }
    written = records.write(path, "measure", record)
    text = path.read_text()
    assert json.loads(text) == written and not list(tmp_path.glob(".*.part"))
    assert text.startswith(
        f'{{\n  "kind": "measure",\n  "schema_version": {records.CURRENT["measure"]},\n  "config_id": "abc",'
    )
    assert '"outcome": "context_exceeded"' in text  # the enum is its plain string in JSON
    loaded = records.load(path, "measure")
    assert (
        loaded
        == written
        == {
            "kind": "measure",
            "schema_version": records.CURRENT["measure"],
            "config_id": "abc",
            "outcome": "context_exceeded",
            "workloads": [{"name": "short", "outcome": "ok"}],
        }
    )
    assert records.load(path) == loaded  # the file names its own kind
    with pytest.raises(RecordError, match="cannot be written as a 'search' record"):
        records.write(tmp_path / "other.json", "search", loaded)
    with pytest.raises(RecordError, match="no record kind 'measurement'"):
        records.write(tmp_path / "other.json", "measurement", record)
    with pytest.raises(RecordError, match="measure record with 'schema', the version key of version 1"):
        records.write(tmp_path / "other.json", "measure", {**record, "schema": 1})


def test_outcome_is_its_string_and_names_every_outcome_of_the_records():
    assert Outcome.OK == "ok" and f"{Outcome.LOAD_FAILED}" == "load_failed" and Outcome.OOM in {"oom"}
    assert json.dumps({"outcome": Outcome.BUDGET_REFUSED}) == '{"outcome": "budget_refused"}'
    found = {read_json(p)["outcome"] for p in RECORDS + sorted((FIXTURES / "h200-records-11761").glob("*.json"))}
    assert found == {"ok", "load_failed", "oom"} and all(Outcome(o) == o for o in found)


# -- Parquet tables ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """The tables aggregate.write makes from the H200 records (one given bottleneck rows) and the search."""
    out = tmp_path_factory.mktemp("tables")
    rec = records.load(FIXTURES / "h200-records" / "ncmoe29.json", "measure")
    rec["workloads"][0]["bottleneck"] = bottleneck.table(DECODE, 70.0, 4, gpu=True)
    records.write(out / "suspects.json", "measure", rec)
    paths = {name: out / f"{name}.parquet" for name in ("configs", "measurements", "searches")}
    aggregate.write(
        [*RECORDS, out / "suspects.json"], paths["configs"], paths["measurements"], [SEARCH], paths["searches"]
    )
    empty = {name: out / f"empty-{name}.parquet" for name in paths}
    aggregate.write([], empty["configs"], empty["measurements"], [], empty["searches"])
    return (
        {name: pq.read_table(path) for name, path in paths.items()},
        {name: pq.read_table(path) for name, path in empty.items()},
        rec,
    )


EXPECTED = {"configs": cols.CONFIGS, "measurements": cols.MEASUREMENTS, "searches": cols.SEARCHES}


def test_tables_have_the_registry_s_columns_and_native_types_with_rows_or_without(written):
    tables, empty, _ = written
    for name, types in EXPECTED.items():
        assert tables[name].schema.names == empty[name].schema.names == list(types)
        for table in (tables[name], empty[name]):
            assert {f.name: f.type for f in table.schema} == types, name
    configs, searches = tables["configs"].schema, tables["searches"].schema
    assert configs.field("command_argv").type == pa.list_(pa.string())
    assert configs.field("buffers").type == pa.list_(
        pa.struct([("device", pa.string()), ("kind", pa.string()), ("mib", pa.float64())])
    )
    assert configs.field("s_n_cpu_moe").type == pa.int64() and configs.field("s_cont_batching").type == pa.bool_()
    assert tables["measurements"].schema.field("bottleneck_rows").type.value_type.field("suspect").type == pa.string()
    probe = pa.struct([("n_cpu_moe", pa.int64()), ("survived", pa.bool_())])
    assert searches.field("probe_rows").type == pa.list_(probe)
    assert searches.field("range_lo").type == pa.int64() and "s_n_cpu_moe" not in searches.names
    json_text = {"command", "buffers_mib", "bottleneck", "range", "probes", "values"}  # the columns they replace
    assert not json_text & (set(cols.CONFIGS) | set(cols.MEASUREMENTS) | set(cols.SEARCHES))
    for key, types in ((cols.CONFIGS_KEY, cols.CONFIGS), (cols.MEASUREMENTS_KEY, cols.MEASUREMENTS)):
        assert set(key) <= set(types)
    assert set(cols.SEARCHES_KEY) <= set(cols.SEARCHES)


def _not_settings(names) -> set[str]:
    return {n for n in names if not n.startswith(cols.SETTING_PREFIX)}


def test_the_row_builders_make_exactly_the_registry_s_columns():
    """Nothing aggregate writes is missing from the registry, nothing the registry names is left empty."""
    rec = records.load(FIXTURES / "h200-records" / "ncmoe29.json", "measure")
    assert _not_settings(aggregate._config_row(rec)) == _not_settings(cols.CONFIGS)
    assert set(aggregate._workload_columns(rec["workloads"][0], {})) == set(cols.WORKLOAD)
    added = ("fit_target", "fit_ctx", "cache_ram", "ctx_checkpoints", "checkpoint_min_step", "cache_reuse", "spec_type")
    added += ("split_mode", "tensor_split", "main_gpu", "gpus")
    newer = {
        cols.setting(name) for name in (*added, "cache_idle_slots", "swa_full")
    }  # settings newer than the fixtures
    assert set(aggregate._search_row(records.load(SEARCH, "search"))) | newer == set(cols.SEARCHES)
    assert set(cols.settings_columns()) == {cols.setting(name) for name in rec["settings"]} | {"s_page_cache"} | newer


def test_native_columns_equal_the_records(written):
    tables, _, with_suspects = written
    configs = tables["configs"].to_pylist()
    by_path = {records.load(p, "measure")["config_id"]: records.load(p, "measure") for p in RECORDS}
    for row in configs[: len(RECORDS)]:
        rec = by_path[row["config_id"]]
        assert row["command_argv"] == rec["command"]
        assert row["buffers"] == rec["placement"]["buffers"]
        assert {f"{b['device']}:{b['kind']}": b["mib"] for b in row["buffers"]} == rec["placement"]["buffers_mib"]
    rows = [r for r in tables["measurements"].to_pylist() if r["bottleneck_rows"]]
    expected = with_suspects["workloads"][0]["bottleneck"]["rows"]
    assert len(rows) == 1 and len(expected) == 7
    assert rows[0]["bottleneck_rows"] == [
        {**dict.fromkeys(cols.BOTTLENECK_ROWS.value_type.names), **r} for r in expected
    ]  # every field kept (absent ones are null)
    (search,) = tables["searches"].to_pylist()
    summary = read_json(SEARCH)
    assert search["probe_rows"] == summary["probes"]
    assert search["value_rows"] == summary["values"]
    assert [search["range_lo"], search["range_hi"]] == summary["range"] == [0, 48]
    assert {k: search[cols.setting(k)] for k in summary["settings"] if k != "extra_args"} == {
        k: v for k, v in summary["settings"].items() if k != "extra_args"
    }
    assert search["s_extra_args"] == "" and summary["settings"]["extra_args"] == []
