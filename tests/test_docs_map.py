"""Every module, file, line and function the docs and the docstrings name exists (issue #39 item 5: a map that
cannot go stale).

Where references are read:

- README.md, docs/*.md and config/README.md (``test_readme.PAGES``): each `backticked` span that is one reference
  as a whole, outside fenced code blocks (shell commands, not names). Their links are tests/test_readme.py's.
- The docstrings and comments of the package, scripts/job.py, the Snakefile and rules/*.smk: the same references
  found inside the prose, by the narrower patterns below (backticks or none).

What a reference is, and when it exists:

- A path: from the package when it is a ``.py`` under a stage folder or ``crashline/`` (``engine/eta.py``,
  ``crashline/jobs/spec.py``), else from the repository root when it starts with one of ``ROOTS``
  (``rules/common.smk``, ``bench/results/...``, ``config/claims/``). The file or folder exists; a ``*`` matches one.
- A bare ``name.py`` or ``name.smk``: a file of that name is in the package, scripts/, rules/, bench/ or tests/.
- ``:NNN`` (or ``:NNN-MMM``) after either: the file has that many lines (a bare name must then be one file);
  ``:Name`` after a ``.py``: the module defines Name.
- A dotted name that starts with ``crashline.`` or with a stage (``tables.recommend.decide``, ``core.paths.Layout``,
  ``publish.run``): after its longest prefix that is a module comes a name the module defines (a top-level def,
  class, assignment or import), and after a class one its body defines. A dotted name that ends in a file suffix
  (``report.md``) or is a configuration key (``models.NAME.source``, ``publish.push``; src/crashline/data/schema.yaml)
  is no module reference. A dotted name that does not start with a stage (``records.load``) is not checked: it
  reads the same as a record field (``host.gpu``) or a claims key (``source.git``).
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from functools import cache
from glob import glob
from pathlib import Path

import pytest
import yaml

from conftest import REPO
from test_readme import PAGES, unfenced

PACKAGE = REPO / "src" / "crashline"
STAGES = ("core", "config", "models", "engine", "jobs", "tables", "crosscheck", "report", "publish", "cli")
ROOTS = ("src/crashline", "rules", "scripts", "bench", "tests", "docs", "config", "profiles", "envs", ".ci")
# where a bare file name is looked for
BARE_HOMES = (PACKAGE, REPO / "scripts", REPO / "rules", REPO / "bench", REPO / "tests")
FILE_SUFFIXES = {"py", "smk", "md", "html", "json", "yaml", "yml", "ini", "parquet", "csv", "log", "svg", "diff"}
FILE_SUFFIXES |= {"gguf", "lock", "txt", "tsv", "h", "toml", "js", "sh"}

PATH = r"[\w.*-]+(?:/[\w.*-]+)*/?"
AFTER = r"(?::(?P<line>\d+)(?:-(?P<last>\d+))?|:(?P<name>[A-Za-z_]\w*))?"
DOTTED = r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+"
# in docs: the whole backticked span
SPAN_PATH = re.compile(rf"(?P<path>{PATH}){AFTER}")
SPAN_DOTTED = re.compile(rf"(?P<dotted>{DOTTED})(?:\(\))?")
# in docstrings and comments: a path with a folder or a .py/.smk file, and a dotted name from a stage
TEXT_PATH = re.compile(rf"(?<![\w./-])(?P<path>(?:[\w.-]+/)+[\w.*-]*\w/?|[\w-]+\.(?:py|smk)\b){AFTER}")
TEXT_DOTTED = re.compile(rf"(?<![\w./-])(?P<dotted>(?:crashline|{'|'.join(STAGES)})(?:\.[A-Za-z_]\w*)+)")


def code_texts(path: Path) -> list[str]:
    """A Python file's docstrings and comments."""
    source = path.read_text()
    nodes = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    docstrings = [ast.get_docstring(n, clean=False) for n in ast.walk(ast.parse(source)) if isinstance(n, nodes)]
    comments = [t.string for t in tokenize.generate_tokens(io.StringIO(source).readline) if t.type == tokenize.COMMENT]
    return [d for d in docstrings if d] + comments


def code_files() -> list[Path]:
    return [*sorted(PACKAGE.rglob("*.py")), REPO / "scripts" / "job.py"]


def workflow_texts(path: Path) -> list[str]:
    """A Snakemake file's comments and docstrings (read as text: Snakemake's grammar is not Python's)."""
    source = path.read_text()
    return re.findall(r"#.*$", source, flags=re.M) + re.findall(r'"""(.*?)"""', source, flags=re.S)


def workflow_files() -> list[Path]:
    return [REPO / "Snakefile", *sorted((REPO / "rules").glob("*.smk"))]


@cache
def modules() -> dict[str, Path]:
    """Each module's dotted name below crashline (``core.paths``; ``core`` for its __init__) -> its file."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


@cache
def defined(path: Path) -> dict[str, set[str]]:
    """The names a module binds at its top level -> for a class, the names its body binds (else empty)."""

    def bound(body) -> dict[str, ast.AST]:
        names = {}
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names[node.name] = node
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names |= {n.id: node for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names |= {(a.asname or a.name).split(".")[0]: node for a in node.names}
            elif isinstance(node, (ast.If, ast.Try)):
                names |= bound(node.body)
        return names

    top = bound(ast.parse(path.read_text()).body)
    return {name: set(bound(n.body)) if isinstance(n, ast.ClassDef) else set() for name, n in top.items()}


def lines_of(path: Path) -> int:
    return len(path.read_text(errors="replace").splitlines())


@cache
def config_schemas() -> list[dict]:
    data = PACKAGE / "data"
    return [yaml.safe_load((data / name).read_text()) for name in ("schema.yaml", "claims.schema.yaml")]


def is_config_key(parts: list[str]) -> bool:
    """Whether the dotted parts walk down a config schema (any name passes where the schema takes any key)."""

    def walk(node: dict, rest: list[str]) -> bool:
        if not rest:
            return True
        node = node.get("items", node)
        if rest[0] in node.get("properties", {}):
            return walk(node["properties"][rest[0]], rest[1:])
        return isinstance(node.get("additionalProperties"), dict) and walk(node["additionalProperties"], rest[1:])

    return any(walk(schema, parts) for schema in config_schemas())


def dotted_problem(dotted: str) -> str | None:
    """Why a dotted name from a stage does not resolve (None when it does, or when it is no module reference)."""
    parts = dotted.split(".")
    if parts[-1] in FILE_SUFFIXES or is_config_key(parts):
        return None
    parts = parts[1:] if parts[0] == "crashline" else parts
    known = [n for n in range(len(parts), 0, -1) if ".".join(parts[:n]) in modules()]
    if not known:
        return f"no module {'.'.join(parts[:2])}"
    module, rest = ".".join(parts[: known[0]]), parts[known[0] :]
    names = defined(modules()[module])
    if rest and rest[0] not in names:
        return f"{module} defines no {rest[0]}"
    if len(rest) > 1 and names[rest[0]] and rest[1] not in names[rest[0]]:
        return f"{module}.{rest[0]} defines no {rest[1]}"
    return None


def path_files(path: str) -> list[Path] | None:
    """The files or folders a path names (a ``*`` may match several), or None when it is not a path checked here."""
    first, _, rest = path.partition("/")
    if path.endswith((".py", ".smk")) and "/" not in path:
        return [found for home in BARE_HOMES for found in home.rglob(path)]
    if first in (*STAGES, "crashline") and path.endswith(".py"):
        where = PACKAGE / (rest if first == "crashline" else path)
    elif any(path.startswith(f"{root}/") for root in ROOTS):
        where = REPO / path
    else:
        return None
    return [Path(found) for found in sorted(glob(str(where)))]


def path_problem(match: re.Match) -> str | None:
    """Why a path reference (with its line or name) does not resolve; None when it does or is not checked."""
    files = path_files(match["path"])
    if files is None:
        return None
    if not files:
        return "no such file"
    line = match["last"] or match["line"]
    if line:
        if len(files) > 1:
            return f"{len(files)} files of this name: give its folder"
        if int(line) > lines_of(files[0]):
            return f"line {line} is past the end ({lines_of(files[0])} lines)"
    name = match["name"]
    if name and files[0].suffix == ".py" and not any(name in defined(f) for f in files):
        return f"defines no {name}"
    return None


def span_problem(span: str) -> str | None:
    """A backticked span of the docs: a path or a dotted name from a stage as a whole, else no reference."""
    if found := SPAN_PATH.fullmatch(span):
        if "/" in found["path"] or found["path"].endswith((".py", ".smk")):
            return path_problem(found)
    if found := SPAN_DOTTED.fullmatch(span):
        if found["dotted"].split(".")[0] in ("crashline", *STAGES):
            return dotted_problem(found["dotted"])
    return None


def text_problems(text: str) -> list[tuple[str, str]]:
    """The references in prose (docstrings, comments, workflow files) that do not resolve: (reference, why)."""
    found = [(m[0], path_problem(m)) for m in TEXT_PATH.finditer(text)]
    found += [(m[0], dotted_problem(m["dotted"])) for m in TEXT_DOTTED.finditer(text)]
    return [(ref, why) for ref, why in found if why]


def doc_problems(path: Path) -> list[tuple[str, str]]:
    spans = re.findall(r"`([^`\n]+)`", unfenced(path.read_text()))
    return [(f"`{span}`", why) for span in spans if (why := span_problem(span.strip()))]


def shown(problems: list[tuple[str, str]]) -> str:
    return "\n".join(f"  {ref}: {why}" for ref, why in problems)


@pytest.mark.parametrize("doc", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_the_docs_name_only_what_exists(doc):
    problems = doc_problems(doc)
    assert not problems, f"{doc.relative_to(REPO)} names what does not exist:\n{shown(problems)}"


def test_docstrings_and_comments_name_only_what_exists():
    problems = [
        (f"{path.relative_to(REPO)}: {ref}", why)
        for path in code_files()
        for text in code_texts(path)
        for ref, why in text_problems(text)
    ]
    problems += [
        (f"{path.relative_to(REPO)}: {ref}", why)
        for path in workflow_files()
        for text in workflow_texts(path)
        for ref, why in text_problems(text)
    ]
    assert not problems, "docstrings and comments name what does not exist:\n" + shown(problems)


def test_each_kind_of_reference_is_checked():
    """The checks find a missing module, function, file and line, in docs and in docstrings alike."""
    assert span_problem("tables.recommend.decide") is None
    assert span_problem("tables.recommend.no_such_function")
    assert span_problem("core.paths.Layout.no_such_method")
    assert span_problem("crashline.present.sections")
    assert span_problem("jobs/no_such_module.py")
    assert span_problem("jobs/serve.py:ServerJob") is None
    assert span_problem("jobs/serve.py:NoSuchClass")
    assert span_problem(f"core/paths.py:{lines_of(PACKAGE / 'core' / 'paths.py') + 1}")
    assert span_problem("needle.py:1")  # four modules of that name
    assert span_problem("publish.push") is None  # a configuration key
    said = "see crashline.engine.eta.no_such_name, tables/no_such.py:3 and rules/no_such.smk"
    assert [ref for ref, _ in text_problems(said)] == [
        "tables/no_such.py:3",
        "rules/no_such.smk",
        "crashline.engine.eta.no_such_name",
    ]
