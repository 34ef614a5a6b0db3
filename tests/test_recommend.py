"""Why the others lost: each configuration named by how its settings differ from the winner, on the real
H200 records (h200-records/: --n-cpu-moe 12..31 and one --fit on, whose -ngl and --n-cpu-moe are unset).

A setting a configuration leaves to llama.cpp is no argument: it is left out of the label, and what the
server's log says llama.cpp chose follows in brackets. No label may say "nan" (issue #14: the --fit on row
was named "-ngl nan --n-cpu-moe nan --fit on")."""

from __future__ import annotations

import pandas as pd
import pytest

from crashline import aggregate
from crashline.recommend import difference, recommend

from conftest import FIXTURES

RECORDS = sorted(p for p in (FIXTURES / "h200-records").glob("*.json") if p.name != "provenance.json")
FIT_LABEL = "--fit on (llama.cpp chose -ngl 49, 7,122 MiB of weights on CUDA0)"


@pytest.fixture(scope="module")
def tables(tmp_path_factory):
    """The configs and measurements tables as the report reads them: written to Parquet, read back."""
    out = tmp_path_factory.mktemp("tables")
    aggregate.write(RECORDS, out / "configs.parquet", out / "measurements.parquet")
    return pd.read_parquet(out / "configs.parquet"), pd.read_parquet(out / "measurements.parquet")


def row(configs: pd.DataFrame, **where) -> pd.Series:
    (index,) = [
        i for i, r in configs.iterrows() if all(pd.notna(r[f"s_{k}"]) and r[f"s_{k}"] == v for k, v in where.items())
    ]
    return configs.loc[index]


def test_the_fit_on_row_is_named_by_what_llama_cpp_chose(tables):
    configs, _ = tables
    fit, n31 = row(configs, fit="on"), row(configs, n_cpu_moe=31)
    assert pd.isna(fit["s_n_gpu_layers"]) and pd.isna(fit["s_n_cpu_moe"])  # NaN in the table
    assert difference(fit, n31) == FIT_LABEL
    # the other way round: the unset values of the winner are not shown, the row's own are
    assert difference(n31, fit) == "-ngl 999 --n-cpu-moe 31 --fit off"


@pytest.mark.parametrize("margin_mib", [0, 1024])  # the --fit on row wins at 0, is risky at 1024
def test_no_label_says_nan(tables, margin_mib):
    configs, measurements = tables
    (r,) = recommend(configs, measurements, "decode_tps", "depth-16k", margin_mib=margin_mib)
    labels = [o["label"] for o in r["others"]]
    assert len(labels) == len(configs) - 1
    assert not [label for label in labels if "nan" in label.lower() or "<na>" in label.lower()]
    fit_id = row(configs, fit="on")["config_id"]
    assert (r["winner"] == fit_id) == (margin_mib == 0)
    if r["winner"] != fit_id:
        assert next(o["label"] for o in r["others"] if o["config_id"] == fit_id) == FIT_LABEL


def test_nullable_columns_and_nothing_known_from_the_log(tables):
    """Tables read with nullable dtypes (pd.NA, not NaN) name the row the same way; a setting left unset
    whose choice the log does not show is left out, or said to be left to llama.cpp if nothing else differs."""
    configs, _ = tables
    nullable = configs.convert_dtypes()
    fit, n31 = row(nullable, fit="on"), row(nullable, n_cpu_moe=31)
    assert fit["s_n_cpu_moe"] is pd.NA and difference(fit, n31) == FIT_LABEL
    blind = fit.copy()
    blind["layers_offloaded"], blind["buffers"] = pd.NA, None
    assert difference(blind, n31) == "--fit on"
    winner = n31.copy()
    winner["s_threads"] = 16  # the winner set -t 16; n31 left it to llama.cpp, whose log says 16 threads
    assert n31["n_threads"] == 16 and difference(n31, winner) == "(llama.cpp chose -t 16)"
    assert difference(winner, n31) == "-t 16"
    unlogged = n31.copy()
    unlogged["n_threads"] = pd.NA
    assert difference(unlogged, winner) == "-t left to llama.cpp"
