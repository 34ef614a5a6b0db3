"""Nothing stale: a record deleted by hand is measured again, where Snakemake alone would keep showing it (it
does not rerun a job whose input is gone while its outputs are up to date)."""

from __future__ import annotations

import json
import shutil

import pytest

from conftest import snakemake_in

pytestmark = pytest.mark.e2e


def test_a_deleted_record_is_measured_again(tmp_path, small_run):
    work = tmp_path / "run"
    shutil.copytree(small_run, work, symlinks=True)
    (record,) = (work / "results" / "records" / "tiny-moe").glob("*/measure.json")
    before = json.loads(record.read_text())["started_at"]
    record.unlink()
    dry = snakemake_in(work, "-n", "report")
    assert dry.returncode == 0 and "gone since" in dry.stderr and "the next run measures them again" in dry.stderr
    assert (work / "results" / "tables" / "configs.parquet").exists(), "a dry run changes nothing"
    done = snakemake_in(work, "report")
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert "measuring them again" in done.stderr
    assert json.loads(record.read_text())["started_at"] != before  # measured again, not restored
    answer = json.loads((work / "results" / "recommendation.json").read_text())
    assert answer[0]["winner"] == record.parent.name
    again = snakemake_in(work, "-n", "report")
    assert "Nothing to be done" in again.stdout + again.stderr and "gone since" not in again.stderr
