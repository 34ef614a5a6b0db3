"""Each file name of a record folder (``core.paths.RecordFolder``) and of a search folder is spelled in
``core/paths.py`` alone (#39): every other module, rule, script and bench tool takes it from there."""

from __future__ import annotations

import ast
import re

from conftest import REPO
from crashline.core.paths import RecordFolder, SearchFolder

NAMES = (
    RecordFolder.MEASURE,
    RecordFolder.SERVER_LOG,
    RecordFolder.TELEMETRY,
    RecordFolder.NEEDLE,
    RecordFolder.NEEDLE_SERVER_LOG,
    SearchFolder.SUMMARY,
    SearchFolder.RECALL,
)
OWNER = REPO / "src" / "crashline" / "core" / "paths.py"
# Path literals that name no record folder's file: a server check's and a bench tool's log in a scratch folder.
ALLOWED = {
    ("src/crashline/engine/servercheck.py", RecordFolder.SERVER_LOG),
    ("bench/sampler_overhead.py", RecordFolder.SERVER_LOG),
}


def path_literals(text: str, suffix: str) -> list[str]:
    """The string literals of a Python file or a Snakemake rule file that may be a path: no space in them (prose,
    help texts and docstrings name the files in words, and are not read)."""
    if suffix == ".smk":
        return re.findall(r"""["']([^"'\s]*)["']""", text)
    return [n.value for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def spellers() -> list[tuple[str, str]]:
    """(file, name) for each record or search file name spelled as a path outside ``core/paths.py``."""
    files = [
        *(REPO / "src").rglob("*.py"),
        *(REPO / "scripts").rglob("*.py"),
        *(REPO / "bench").glob("*.py"),
        *(REPO / "rules").glob("*.smk"),
        REPO / "Snakefile",
    ]
    found = set()
    for path in files:
        if path == OWNER:
            continue
        rel = path.relative_to(REPO).as_posix()
        for literal in path_literals(path.read_text(), path.suffix or ".smk"):
            if " " in literal:
                continue
            found |= {(rel, name) for name in NAMES if re.search(rf"(^|[/*]){re.escape(name)}$", literal)}
    return sorted(found - ALLOWED)


def test_record_file_names_are_spelled_in_core_paths_alone():
    assert not spellers(), f"record file names spelled outside core/paths.py: {spellers()}"


def test_every_allowed_speller_still_spells_its_name():
    """An allowance whose file no longer spells the name is stale: the list shrinks with the code."""
    found = set()
    for rel, name in ALLOWED:
        literals = path_literals((REPO / rel).read_text(), ".py")
        found |= {(rel, name) for literal in literals if literal == name}
    assert found == ALLOWED
