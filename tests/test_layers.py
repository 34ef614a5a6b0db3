"""Modules split by layer (issue #12): loading the config pulls in no table, template, Parquet or HTTP
library; the package's import graph, top-level and function-level imports alike, has no cycle; no module
imports one of a higher layer; and no module takes another's private (underscore) name (#39)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys


from conftest import REPO

PACKAGE = REPO / "src" / "crashline"

# Lowest first: the folders in the pipeline's order. A module may import modules of its own folder or of a lower one.
LAYERS = {
    "core": ["__init__", "core"],
    "config": ["config"],
    "models": ["models"],
    "engine": ["engine"],
    "jobs": ["jobs"],
    "tables": ["tables"],
    "crosscheck": ["crosscheck"],
    "report": ["report"],
    "publish": ["publish"],
    "cli": ["cli", "__main__"],
}
# What loading the config may import, and what it must not.
CONFIG_MODULES = {
    "crashline",
    "crashline.core",
    "crashline.config",
    "crashline.config.plan",
    "crashline.config.validate",
    "crashline.config.expand",
    "crashline.config.file",
    "crashline.core.settings",
    "crashline.core.serverflags",  # which llama-server flags extra_args may pass (re alone)
    "crashline.config.source",
    "crashline.config.shape",
    "crashline.config.needle",
    "crashline.config.claims",
    "crashline.core.paths",  # pathlib alone: where an earlier run's tables are (recheck.against)
    "crashline.core.errors",  # the base of ConfigError
}
HEAVY = ("pandas", "jinja2", "pyarrow", "requests", "numpy", "gguf")
KNOWN_CYCLES: list[set[str]] = []
# (importer, module, name) of the underscore names a module may still take from another: a helper one module
# shares with another is public and documented, or the two are one module. None is left.
ALLOWED_PRIVATE_IMPORTS: set[tuple[str, str, str]] = set()


def module_names() -> list[str]:
    """Every module of the package, dotted below ``crashline`` (``present.doc``; ``present`` for its __init__)."""
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
        if parts[-1] == "__init__" and len(parts) > 1:
            parts = parts[:-1]
        names.append(".".join(parts))
    return names


def _package_of(name: str, modules: set[str]) -> list[str]:
    """The package a module's relative imports start from, as parts."""
    parts = name.split(".")
    return parts if name in modules and (PACKAGE / name.replace(".", "/")).is_dir() else parts[:-1]


def _source(node: ast.ImportFrom, name: str, modules: set[str]) -> str | None:
    """What module ``name``'s ``from X import ...`` reads, dotted below ``crashline``; None outside the package."""
    if node.level:
        base = _package_of(name, modules)[: len(_package_of(name, modules)) - node.level + 1]
        return ".".join([*base, *(node.module.split(".") if node.module else [])])
    if node.module and node.module.split(".")[0] == "crashline":
        return node.module.removeprefix("crashline").strip(".")
    return None


def _targets(node: ast.ImportFrom | ast.Import, name: str, modules: set[str]) -> set[str]:
    """The package modules an import statement names."""
    if isinstance(node, ast.Import):
        dotted = [a.name.removeprefix("crashline.") for a in node.names if a.name.startswith("crashline.")]
    elif (module := _source(node, name, modules)) is not None:
        dotted = [f"{module}.{a.name}".strip(".") for a in node.names] + [module]
    else:
        return set()
    return {_known(d, modules) for d in dotted if d} - {None}


def _known(dotted: str, modules: set[str]) -> str | None:
    """The longest prefix of ``dotted`` that is a module (``present.doc.Para`` -> ``present.doc``)."""
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in modules:
            return ".".join(parts[:n])
    return None


def syntax_tree(name: str) -> ast.Module:
    """The parsed source of package module ``name``."""
    path = PACKAGE / (name.replace(".", "/") + ("/__init__.py" if (PACKAGE / name).is_dir() else ".py"))
    return ast.parse(path.read_text())


def import_graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports, anywhere in it (top level and inside functions)."""
    modules = set(module_names())
    graph = {}
    for name in modules:
        tree = syntax_tree(name)
        deps = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                deps |= _targets(node, name, modules)
        graph[name] = deps - {name}
    return graph


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_imports() -> set[tuple[str, str, str]]:
    """(importer, module, name) of each underscore name a package module takes from another, anywhere in it:
    ``from .m import _x``, or ``m._x`` on a module ``m`` it imported."""
    modules = set(module_names())
    found = set()
    for name in modules:
        tree = syntax_tree(name)
        module_aliases = {}  # a name bound to a package module in ``name``: that module
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (module := _source(node, name, modules)) is not None:
                for alias in node.names:
                    dotted = f"{module}.{alias.name}".strip(".")
                    if dotted in modules:
                        module_aliases[alias.asname or alias.name] = dotted
                    elif _private(alias.name) and module != name:
                        found.add((name, module, alias.name))
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname and alias.name.removeprefix("crashline.") in modules:
                        module_aliases[alias.asname] = alias.name.removeprefix("crashline.")
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and _private(node.attr):
                module = module_aliases.get(node.value.id, name)
                if module != name:
                    found.add((name, module, node.attr))
    return found


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan): the modules of each cycle."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(set(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def shown(graph: dict[str, set[str]], component: set[str]) -> str:
    """A cycle through the component, to print: a -> b -> ... -> a (and all of its modules)."""
    start = min(component)
    path, seen = [start], {start}
    while True:
        nxt = sorted(w for w in graph[path[-1]] if w in component)
        step = next((w for w in nxt if w not in seen), None) or next(w for w in nxt if w in seen)
        path.append(step)
        if step in seen:
            return " -> ".join(path[path.index(step) :]) + f" (all of: {', '.join(sorted(component))})"
        seen.add(step)


def layer_of(name: str) -> int | None:
    """The layer of a module (a package's modules share its layer)."""
    for rank, members in enumerate(LAYERS.values()):
        if name in members or name.split(".")[0] in members:
            return rank
    return None


def test_loading_the_config_imports_no_table_template_parquet_or_http_library():
    code = (
        "import json, sys; import crashline.config.plan as c; c.load('config/config.yaml'); "
        "print(json.dumps(sorted(m for m in sys.modules if m == 'crashline' or m.startswith('crashline.') "
        f"or m.split('.')[0] in {list(HEAVY)!r})))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO / "src")},
    )
    assert proc.returncode == 0, proc.stderr
    loaded = set(json.loads(proc.stdout))
    heavy = sorted(m for m in loaded if m.split(".")[0] in HEAVY)
    assert not heavy, f"loading the config imported {heavy}"
    assert loaded <= CONFIG_MODULES, f"loading the config imported {sorted(loaded - CONFIG_MODULES)}"


def test_the_graph_sees_top_level_and_function_level_imports():
    graph = import_graph()
    checked = {"config.claims", "config.needle", "config.file", "config.source", "config.shape"}
    assert checked <= graph["config.validate"]
    assert {"config.expand", "config.validate", "config.file"} <= graph["config.plan"]
    assert {"report.correction", "report.markdown", "config.claims"} <= graph["publish"]  # top level
    assert "jobs.needle" in graph["jobs.spec"] and "tables.needle" in graph["cli.verbs"]  # inside functions
    assert {"report.doc", "report.needle", "core.thresholds"} <= graph["report.sections"]  # relative, two levels


def test_the_import_graph_has_no_cycle():
    graph = import_graph()
    found = [c for c in cycles(graph) if c not in KNOWN_CYCLES]
    assert not found, "import cycles: " + "; ".join(shown(graph, c) for c in found)


def test_no_known_cycle_is_left():
    graph = import_graph()
    assert not cycles(graph), "; ".join(shown(graph, c) for c in cycles(graph))


def test_every_module_is_in_a_layer_and_imports_none_above_it():
    graph = import_graph()
    unplaced = sorted(m for m in graph if layer_of(m) is None)
    assert not unplaced, f"modules in no layer of LAYERS: {unplaced}"
    names = list(LAYERS)
    upward = [
        f"{m} ({names[layer_of(m)]}) imports {d} ({names[layer_of(d)]})"
        for m, deps in sorted(graph.items())
        for d in sorted(deps)
        if layer_of(d) > layer_of(m)
    ]
    assert not upward, "imports of a higher layer:\n" + "\n".join(upward)


def test_no_module_takes_another_modules_private_name():
    found = private_imports()
    unlisted = sorted(found - ALLOWED_PRIVATE_IMPORTS)
    assert not unlisted, "private names taken from another module (make them public, or one module):\n" + "\n".join(
        f"{importer} takes {module}.{private}" for importer, module, private in unlisted
    )
    assert not ALLOWED_PRIVATE_IMPORTS - found, f"allowed but no longer taken: {ALLOWED_PRIVATE_IMPORTS - found}"


def test_synthetic_shape_knows_the_block_sizes_gguf_knows():
    import gguf

    from crashline.models import synthetic
    from crashline.config import shape as synthetic_shape

    blocks = {name: gguf.GGML_QUANT_SIZES[qtype][0] for name, (qtype, _) in synthetic.QUANTS.items()}
    assert blocks == synthetic_shape.QUANT_BLOCKS
