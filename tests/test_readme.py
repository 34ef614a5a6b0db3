"""The README is a newcomer's page (#39 item 6): its two set-up commands are the ones CI and the end-to-end test run,
and every relative link of the README, docs/ and config/README.md leads to a file (and heading) that exists."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import conftest
from conftest import REPO

PAGES = [REPO / "README.md", REPO / "config" / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def unfenced(text: str) -> str:
    """The Markdown outside fenced code blocks (shell sessions, configs, output)."""
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def prose(text: str) -> str:
    """The Markdown outside fenced code blocks and inline code, where a link or a heading means one."""
    return re.sub(r"`[^`\n]*`", "", unfenced(text))


def section(text: str, title: str) -> str:
    """The part of a Markdown page under the heading ``## TITLE``, up to the next heading of that level."""
    return text.split(f"\n## {title}\n")[1].split("\n## ")[0]


def quick_start_commands() -> list[str]:
    """The shell commands of the README's quick start, one per ``sh`` block."""
    return re.findall(r"```sh\n(.*?)\n```", section((REPO / "README.md").read_text(), "Quick start"), flags=re.S)


def test_the_readmes_two_commands_are_what_ci_and_the_end_to_end_test_run(monkeypatch):
    ci = [line for line in (REPO / ".ci" / "run").read_text().splitlines() if line and not line.startswith("#")]
    main, tests = quick_start_commands()
    assert tests == ci[-1], "the README's test command is .ci/run's last line"
    install, run = main.split(" && ")
    ci_install = shlex.split(tests.split(" && ")[0])
    assert shlex.split(install) == [*ci_install[:-1], ci_install[-1].removesuffix("[test]")], "the same install"

    ran = []
    monkeypatch.setattr(subprocess, "run", lambda argv, **kw: ran.append(argv))
    conftest.snakemake_in(REPO, "report")  # how tests/test_workflow_e2e.py runs the default workflow
    assert ["snakemake", *ran[0][3:]] == shlex.split(run)


def anchors(page: Path) -> set[str]:
    """GitHub's ids for a page's headings: lower case, punctuation dropped, spaces as hyphens."""
    headings = re.findall(r"^#+ +(.+?) *$", prose(page.read_text()), flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}


def broken_links(page: Path) -> list[str]:
    broken = []
    for target in LINK.findall(prose(page.read_text())):
        if re.match(r"[a-z]+:", target):
            continue  # a web address
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(f"{page.relative_to(REPO)}: {target} (no such file)")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{page.relative_to(REPO)}: {target} (no such heading)")
    return broken


def test_every_relative_link_of_the_readme_and_docs_leads_somewhere():
    assert LINK.search(prose((REPO / "README.md").read_text())), "the README links to the rest"
    assert [b for page in PAGES for b in broken_links(page)] == []
