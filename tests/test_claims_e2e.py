"""A real published table corrected in one go, end to end: `crashline claims import` of a committed fixture
(llama.cpp#15952, two rows), the claims file pointed at the real small model by `--model`, the workflow's `publish`
on a real llama-server, then `correction.md`, the patched README and a diff that `git apply` takes on the fixture; a
second run over the corrected file replaces the section, never adds a second one."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from crashline.config import claims_import as CI
from crashline.report.markdown import CORRECTION_END, CORRECTION_START

from conftest import FIXTURES, GEMMA_SHA256, GEMMA_SOURCE, REPO
from helpers import snakemake

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

FIXTURE = FIXTURES / "claims" / "real" / "llama-cpp-pr15952-build-line.md"
# The claims are about Qwen3-30B-A3B; the model measured here is the one the config names (`--model gemma`).
CONFIG = f"""\
models:
  gemma: {{source: "{GEMMA_SOURCE}", sha256: {GEMMA_SHA256}, prompt_style: continuation}}
defaults: {{ctx: 1024, threads: 2}}
configurations:  # the rows' own configuration (-ngl 99 as the table states): one server measures all
  - settings: {{n_gpu_layers: 99}}
workloads:
  - {{name: short, prompt_tokens: 32, gen_tokens: 8}}
repetitions: 1
validity: {{enabled: false}}
claims: [config/claims/theirs.yaml]
"""


def git(*args: str, cwd=None) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True)


@pytest.fixture(scope="module")
def published(tmp_path_factory, server_provenance, gemma_fetch):
    """The workflow copied into a folder, the fixture imported as its claims file, `snakemake publish` run once. The
    package goes with it: the jobs find it at the workflow's src/ (rules/common.smk), so they run this code."""
    work = tmp_path_factory.mktemp("claims-e2e")
    for name in ("Snakefile", "rules", "scripts", "profiles", "envs", "src"):
        (shutil.copytree if (REPO / name).is_dir() else shutil.copy)(REPO / name, work / name)
    (work / "config" / "claims").mkdir(parents=True)
    (work / "config" / "config.yaml").write_text(CONFIG)
    result = CI.import_claims(str(FIXTURE), work / "config" / "claims" / "theirs.yaml", model="gemma")
    snakemake(work, "publish")
    return work, result


def test_the_rows_are_measured_by_one_server(published):
    work, _ = published
    records = sorted((work / "results" / "records" / "gemma").iterdir())
    assert len(records) == 1  # the sweep's configuration is the rows': measured once, with the rows' workloads


def test_import_then_publish_on_the_real_small_model(published, tmp_path):
    work, _ = published
    out = work / "results" / "publish" / "theirs"
    section, readme, diff = ((out / n).read_text() for n in ("correction.md", "README.md", "correction.diff"))
    upstream = FIXTURE.read_text()
    # every claimed number beside one measured here (median [min–max] n), none missing
    for label, claimed in (("pp512", "378.5 ± 1.4"), ("tg128", "11.1 ± 0.0")):
        line = next(x for x in section.splitlines() if x.startswith(f"| {label} |"))
        assert claimed in line and "n=1" in line, line
        assert "not measured" not in line and "no record" not in line, line
        # its line of settings says what the table never states for it (ubatch, threads, ...), never the build
        settings = next(x for x in section.splitlines() if x.startswith(f"- {label}: stated n\\_gpu\\_layers=99"))
        assert "mixed with the other rows: not stated: ubatch (-ub), slots (-np), threads (-t)" in settings
        assert "build" not in settings.split("mixed with the other rows:")[1]
    assert readme.startswith(upstream.rstrip("\n")) and readme.endswith(section)  # no anchor: after the table
    assert readme.count(CORRECTION_START) == 1 and readme.count(CORRECTION_END) == 1
    # the diff applies to the fixture as the upstream repository holds it, with git itself
    repo = tmp_path / "upstream"
    git("init", "--quiet", str(repo))
    shutil.copy(FIXTURE, repo / FIXTURE.name)
    git("apply", str(out / "correction.diff"), cwd=repo)
    assert (repo / FIXTURE.name).read_text() == readme
    assert diff.startswith(f"--- a/{FIXTURE.name}\n+++ b/{FIXTURE.name}\n")


def test_a_second_run_over_the_corrected_file_replaces_the_section(published):
    work, _ = published
    out = work / "results" / "publish" / "theirs"
    first = (out / "README.md").read_text()
    copy = work / "config" / "claims" / "theirs.source.md"
    copy.write_text(first)  # upstream took the correction: the file now holds the section between the markers
    snakemake(work, "publish")
    again = (out / "README.md").read_text()
    assert again.count(CORRECTION_START) == 1 and again.count(CORRECTION_END) == 1
    assert again == first  # the same measurements: the section replaced by the same one, nothing added
    assert (out / "correction.diff").read_text() == ""  # nothing to change upstream
