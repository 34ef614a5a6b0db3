"""Where each job's output lives under the results folder; the Snakefile and the CLI share it."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar


class Layout:
    def __init__(self, results_dir: str | Path):
        self.root = Path(results_dir)

    def fetch(self, model: str) -> Path:
        return self.root / "models" / model / "fetch.json"

    def manifest(self, model: str) -> Path:
        return self.root / "models" / model / "manifest.json"

    def warmup(self, model: str) -> Path:
        return self.root / "models" / model / "warmup.json"

    def provenance(self) -> Path:
        return self.root / "server" / "provenance.json"

    def record_folder(self, model: str, cid: str) -> RecordFolder:
        """The folder of configuration ``cid``'s own records: its measurement and its recall check."""
        return RecordFolder(self.root / "records" / model / cid)

    def record(self, model: str, cid: str) -> Path:
        return self.record_folder(model, cid).measure

    def later_record(self, model: str, cid: str, k: int | str) -> Path:
        """The record of server start ``k`` (2, 3, ...) of configuration ``cid`` (an entry's ``starts``)."""
        return self.record_folder(model, cid).later_start(k).measure

    def start_records(self, model: str, cid: str, starts: int) -> list[Path]:
        """The records of every server start of configuration ``cid``, the first's first."""
        return [self.record(model, cid), *(self.later_record(model, cid, k) for k in range(2, starts + 1))]

    def server_log(self, model: str, cid: str) -> Path:
        return self.record_folder(model, cid).server_log

    def telemetry(self, model: str, cid: str) -> Path:
        return self.record_folder(model, cid).telemetry

    def needle_record(self, model: str, cid: str) -> Path:
        return self.record_folder(model, cid).needle

    def needle_server_log(self, model: str, cid: str) -> Path:
        return self.record_folder(model, cid).needle_server_log

    def needle_table(self) -> Path:
        return self.root / "tables" / "needle.parquet"

    def run_plan(self) -> Path:
        """The server jobs of the run that started last, as it started (engine/eta.py)."""
        return self.root / "logs" / "run-plan.json"

    def search_folder(self, model: str, gid: str) -> SearchFolder:
        """The folder of search ``gid`` of ``model``: its summary, its probes and its recall check."""
        return SearchFolder(self.root / "search" / model / gid)

    def search(self, model: str, gid: str) -> Path:
        return self.search_folder(model, gid).summary()

    def search_recall(self, model: str, gid: str) -> Path:
        """A search's recall check: which candidates were tested (their needle records in ``needle/ID/``)."""
        return self.search_folder(model, gid).recall()

    def measure_records(self, model: str, cid: str) -> list[Path]:
        """Every record of configuration ``cid``: its own measurement, then each search probe's first start."""
        own = self.record(model, cid)
        return ([own] if own.exists() else []) + self._probe_files(model, cid, RecordFolder.MEASURE)

    def probe_telemetry(self, model: str, cid: str) -> list[Path]:
        """The time series of configuration ``cid`` wherever a search of ``model`` measured it as a probe."""
        return self._probe_files(model, cid, RecordFolder.TELEMETRY)

    def _probe_files(self, model: str, cid: str, name: str) -> list[Path]:
        """The file ``name`` of configuration ``cid``'s first start in every search of ``model`` that probed it."""
        return sorted((self.root / "search" / model).glob(f"*/{PROBES}/{cid}/{name}"))

    def configs_table(self) -> Path:
        return self.root / "tables" / "configs.parquet"

    def measurements_table(self) -> Path:
        return self.root / "tables" / "measurements.parquet"

    def searches_table(self) -> Path:
        return self.root / "tables" / "searches.parquet"

    def conversations_table(self) -> Path:
        return self.root / "tables" / "conversations.parquet"

    def validity(self) -> Path:
        return self.root / "validity" / "llama-bench.json"

    def kv_quality(self, model: str, kv: str) -> Path:
        """One quantised KV type's KL divergence against f16 (``jobs.kvquality``)."""
        return self.root / "kv_quality" / model / f"{kv}.json"

    def kv_quality_table(self) -> Path:
        return self.root / "tables" / "kv_quality.parquet"

    def recommendation(self) -> Path:
        """Each model's answer, machine-readable: what the report's headline says and ``tune`` prints."""
        return self.root / "recommendation.json"

    def summary_md(self) -> Path:
        """The short table of the answer (llama-bench's ``-o md`` kind), which ``report`` and ``tune`` print."""
        return self.root / "summary.md"

    def report_md(self) -> Path:
        return self.root / "report.md"

    def report_html(self) -> Path:
        return self.root / "report.html"

    def figures(self) -> Path:
        """The report's figures as SVG files, which report.md links as ``figures/NAME.svg``."""
        return self.root / "figures"


PROBES = "records"
LATER_START = "start-{}"  # the folder of a configuration's server start k > 1, beside its first start's record


@dataclass(frozen=True)
class RecordFolder:
    """The folder of one server start's records, the one owner of the names of the files in it: a configuration's
    own (``records/MODEL/ID/``, ``Layout.record_folder``), a search probe's (``SearchFolder.probe``), a later start's
    (``later_start``) and a recall candidate's (``SearchFolder.candidate``). A measurement writes its record, server
    log and telemetry there; a recall check its needle record and needle server log."""

    folder: Path

    MEASURE: ClassVar[str] = "measure.json"
    SERVER_LOG: ClassVar[str] = "server.log"
    TELEMETRY: ClassVar[str] = "telemetry.parquet"
    NEEDLE: ClassVar[str] = "needle.json"
    NEEDLE_SERVER_LOG: ClassVar[str] = "needle-server.log"

    @classmethod
    def of(cls, record_path: str | Path) -> RecordFolder:
        """The record folder of a file in it (a record a job was told to write, wherever that is)."""
        return cls(Path(record_path).parent)

    @property
    def measure(self) -> Path:
        return self.folder / self.MEASURE

    @property
    def server_log(self) -> Path:
        return self.folder / self.SERVER_LOG

    @property
    def telemetry(self) -> Path:
        return self.folder / self.TELEMETRY

    @property
    def needle(self) -> Path:
        return self.folder / self.NEEDLE

    @property
    def needle_server_log(self) -> Path:
        return self.folder / self.NEEDLE_SERVER_LOG

    def later_start(self, k: int | str) -> RecordFolder:
        """Server start ``k`` (2, 3, ...) of this folder's configuration: ``start-K/`` in it (a search's finalists;
        an entry's ``starts``)."""
        return RecordFolder(self.folder / LATER_START.format(k))

    def fit_attempt(self, target: int) -> RecordFolder:
        """Where an aimed ``--fit on`` start at ``--fit-target`` ``target`` that left less than the margin is kept:
        ``fit-target-T/`` in this folder."""
        return RecordFolder(self.folder / f"fit-target-{target}")


def first_start_of(record: str | Path) -> Path | None:
    """The record of the first server start of the configuration whose later start ``record`` is (``start-K/``
    beside it: ``RecordFolder.later_start``), None for a record that is no later start."""
    folder = Path(record).parent
    if re.fullmatch(LATER_START.format(r"[1-9][0-9]*"), folder.name):
        return RecordFolder(folder.parent).measure
    return None


def measure_records_under(folder: Path) -> list[Path]:
    """Every measure record anywhere under ``folder`` (a search's probes: first starts, later starts, kept aimed
    starts), in a stable order; none where it does not exist."""
    return sorted(folder.rglob(RecordFolder.MEASURE)) if folder.is_dir() else []


class SearchFolder:
    """One search's folder (``search/MODEL/GID/``, ``Layout.search``'s parent), the one owner of what is in it: its
    summary, its probes' records (``records/ID/`` for a first start, ``records/ID/start-K/`` for a later one), its
    recall check and the needle records of the candidates it tested, and the probes an earlier search left there
    (set aside in ``superseded/``)."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)

    @classmethod
    def of(cls, path: str | Path) -> SearchFolder:
        """The search folder of a file in it: its search.json or recall.json."""
        return cls(Path(path).parent)

    SUMMARY: ClassVar[str] = "search.json"
    RECALL: ClassVar[str] = "recall.json"

    def summary(self) -> Path:
        return self.folder / self.SUMMARY

    def recall(self) -> Path:
        return self.folder / self.RECALL

    def probes(self) -> Path:
        return self.folder / PROBES

    def probe(self, record_id: str) -> RecordFolder:
        """The folder of one probe's server start (``ID`` or ``ID/start-K``): its record, log and telemetry."""
        return RecordFolder(self.probes() / record_id)

    def probe_records(self) -> list[Path]:
        """Every probe record in the folder, this search's and any an earlier search left, later starts included."""
        return measure_records_under(self.probes())

    def candidate(self, config_id: str) -> RecordFolder:
        """The folder of one recall candidate: its needle record and needle server log."""
        return RecordFolder(self.folder / "needle" / config_id)

    def superseded(self, record_id: str = "") -> Path:
        return self.folder / "superseded" / record_id


TABLE_SUFFIXES = (".parquet", ".csv", ".json")


def table_files(parquet_path: Path | str) -> list[Path]:
    """The files of a table whose Parquet file is ``parquet_path``: Parquet, CSV, JSON (``tables.files`` writes
    them)."""
    path = Path(parquet_path)
    return [path.with_suffix(s) for s in TABLE_SUFFIXES]


def merged_records(folders: list[str], models, kind: str) -> list[Path]:
    """The ``kind`` records ("measure" or "needle") of ``models`` in other runs' results folders (merge_results),
    in a stable order; a measurement's later starts (``start-K/``) with them, to be pooled with their first."""
    name = {"measure": RecordFolder.MEASURE, "needle": RecordFolder.NEEDLE}[kind]
    where = [f"*/{name}", *([f"*/{LATER_START.format('*')}/{name}"] if kind == "measure" else [])]
    return [
        path
        for folder in folders
        for model in models
        for pattern in where
        for path in sorted((Path(folder) / "records" / model).glob(pattern))
    ]


def recheck_tables(config: dict) -> list[Path]:
    """The tables of the earlier run a run is set beside (``recheck.against``), which its report reads; none without."""
    against = config["recheck"].get("against")
    return [Layout(against).configs_table(), Layout(against).measurements_table()] if against else []
