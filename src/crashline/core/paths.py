"""Where each job's output lives under the results folder; the Snakefile and the CLI share it."""

from __future__ import annotations

from pathlib import Path


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

    def record(self, model: str, cid: str) -> Path:
        return self.root / "records" / model / cid / "measure.json"

    def server_log(self, model: str, cid: str) -> Path:
        return self.root / "records" / model / cid / "server.log"

    def telemetry(self, model: str, cid: str) -> Path:
        return self.root / "records" / model / cid / "telemetry.parquet"

    def needle_record(self, model: str, cid: str) -> Path:
        return self.root / "records" / model / cid / "needle.json"

    def needle_server_log(self, model: str, cid: str) -> Path:
        return self.root / "records" / model / cid / "needle-server.log"

    def needle_table(self) -> Path:
        return self.root / "tables" / "needle.parquet"

    def run_plan(self) -> Path:
        """The server jobs of the run that started last, as it started (engine/eta.py)."""
        return self.root / "logs" / "run-plan.json"

    def search(self, model: str, gid: str) -> Path:
        return self.root / "search" / model / gid / "search.json"

    def search_recall(self, model: str, gid: str) -> Path:
        """A search's recall check: which candidates were tested (their needle.json in ``needle/ID/``)."""
        return SearchFolder(self.root / "search" / model / gid).recall()

    def measure_records(self, model: str, cid: str) -> list[Path]:
        """Every record of configuration ``cid``: its own measurement, then each search probe's first start."""
        own = self.record(model, cid)
        return ([own] if own.exists() else []) + sorted(
            (self.root / "search" / model).glob(f"*/{PROBES}/{cid}/measure.json")
        )

    def probe_telemetry(self, model: str, cid: str) -> list[Path]:
        """The time series of configuration ``cid`` wherever a search of ``model`` measured it as a probe."""
        return sorted((self.root / "search" / model).glob(f"*/{PROBES}/{cid}/telemetry.parquet"))

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


def later_start(record_path: str | Path, k: int) -> Path:
    """The folder of server start ``k`` (2, 3, ...) of the configuration whose first start is recorded at
    ``record_path``: ``start-K/`` beside it (a search's finalists; an entry's ``starts``)."""
    return Path(record_path).parent / LATER_START.format(k)


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

    def summary(self) -> Path:
        return self.folder / "search.json"

    def recall(self) -> Path:
        return self.folder / "recall.json"

    def probes(self) -> Path:
        return self.folder / PROBES

    def probe(self, record_id: str) -> Path:
        """The folder of one probe's server start: measure.json, server.log and telemetry.parquet."""
        return self.probes() / record_id

    def probe_record(self, record_id: str) -> Path:
        return self.probe(record_id) / "measure.json"

    def candidate(self, config_id: str) -> Path:
        """The folder of one recall candidate: needle.json and needle-server.log."""
        return self.folder / "needle" / config_id

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
    in a stable order."""
    return [
        path
        for folder in folders
        for model in models
        for path in sorted((Path(folder) / "records" / model).glob(f"*/{kind}.json"))
    ]


def recheck_tables(config: dict) -> list[Path]:
    """The tables of the earlier run a run is set beside (``recheck.against``), which its report reads; none without."""
    against = config["recheck"].get("against")
    return [Layout(against).configs_table(), Layout(against).measurements_table()] if against else []
