"""Publishing a correction: the section inserted into the upstream file (then replaced between
its markers, idempotently), the diff, a branch pushed to a real local bare git repository, and
the Hugging Face pull request's refusal without a token.

Nothing is mocked. The pull request itself is not tested (no hub access here): only that it
refuses without a token, and that a token in the environment ends up in no written file and no
error message when the call fails."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pandas as pd
import pytest
import yaml

from crashline.config.plan import load_schema
from crashline.config import claims as K, plan as C
from crashline import publish as P

from conftest import FIXTURES

SCHEMA = load_schema()
UPSTREAM = FIXTURES / "claims" / "upstream-README.md"
SENTINEL = "hf_crashlineTestTokenThatMustNeverBeWritten0123"


def section(text: str = "the correction") -> str:
    return f"{P.START_MARKER}\n### Re-measured\n\n{text}\n{P.END_MARKER}\n"


def git(*args, cwd=None) -> str:
    env = {
        "GIT_AUTHOR_NAME": "upstream",
        "GIT_AUTHOR_EMAIL": "up@example.com",
        "GIT_COMMITTER_NAME": "upstream",
        "GIT_COMMITTER_EMAIL": "up@example.com",
        "PATH": "/usr/bin:/bin:/usr/local/bin",
        "HOME": str(cwd or "/tmp"),
    }
    return subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture
def bare(tmp_path) -> tuple[Path, str]:
    """A real bare repository on disk, seeded with one commit of the upstream README on main."""
    remote = tmp_path / "upstream.git"
    git("init", "--quiet", "--bare", "--initial-branch=main", str(remote))
    seed = tmp_path / "seed"
    git("clone", "--quiet", str(remote), str(seed))
    git("checkout", "--quiet", "-b", "main", cwd=seed)
    (seed / "README.md").write_text(UPSTREAM.read_text())
    git("add", "README.md", cwd=seed)
    git("commit", "--quiet", "-m", "model card", cwd=seed)
    git("push", "--quiet", "origin", "main", cwd=seed)
    return remote, git("rev-parse", "HEAD", cwd=seed)


def claim_for(tmp_path, **source) -> dict:
    cfg = C.validate(
        {
            "models": {"m": {"source": "file:/x.gguf"}},
            "defaults": {"threads": 2},
            "configurations": [{"grid": {"ubatch": [128, 512]}}],
            "workloads": [{"name": "short", "prompt_tokens": 512, "gen_tokens": 64}],
        },
        SCHEMA,
    )
    raw = yaml.safe_load((FIXTURES / "claims" / "mixed.yaml").read_text())
    raw["source"]["local_copy"] = str(UPSTREAM)
    raw["source"].update(source)
    path = tmp_path / "mixed.yaml"
    path.write_text(yaml.safe_dump(raw))
    return K.load_claims([path], cfg)[0]


# -- the upstream text ---------------------------------------------------------------------------


def test_insert_at_the_end_of_the_anchor_section_then_replace_between_markers():
    old = UPSTREAM.read_text()
    first = P.render_upstream(old, section("one"), anchor="Performance")
    # after the whole "## Performance" part (its "###" subsection included), before "## License"
    assert first.index("Measured on a test machine.") < first.index(P.START_MARKER) < first.index("## License")
    assert P.render_upstream(first, section("one"), anchor="Performance") == first  # a second run: no change
    second = P.render_upstream(first, section("two"), anchor="Performance")
    assert "two" in second and "\none\n" not in second
    assert second.count(P.START_MARKER) == 1 and second.count(P.END_MARKER) == 1
    assert second.replace(section("two").strip("\n"), "") == first.replace(section("one").strip("\n"), "")


def test_insert_at_the_end_without_anchor_and_refusals():
    text = P.render_upstream("# Title\n\nBody.\n", section())
    assert text == "# Title\n\nBody.\n\n" + section()
    with pytest.raises(P.PublishError, match="no such heading"):
        P.render_upstream("# Title\n", section(), anchor="Speed")
    with pytest.raises(P.PublishError, match="only one of the crashline:correction markers"):
        P.render_upstream(f"# Title\n{P.START_MARKER}\n", section())
    with pytest.raises(P.PublishError, match="must start and end"):
        P.render_upstream("# Title\n", "no markers")
    # a heading inside a code fence is not a heading
    fenced = "# A\n\n```\n# Speed\n```\n\n## Speed\n\ntable\n\n## B\n"
    out = P.render_upstream(fenced, section(), anchor="Speed")
    assert out.index("table") < out.index(P.START_MARKER) < out.index("## B")


def test_write_publication_writes_readme_section_and_an_applicable_diff(tmp_path):
    claim = claim_for(tmp_path)
    paths = P.write_publication(claim, section(), tmp_path / "out")
    readme, diff = Path(paths["readme"]).read_text(), Path(paths["diff"]).read_text()
    assert readme == P.render_upstream(UPSTREAM.read_text(), section(), "Performance")
    assert Path(paths["section"]).read_text() == section()
    assert diff.startswith("--- a/README.md\n+++ b/README.md\n") and f"+{P.START_MARKER}" in diff
    # the diff applies to the upstream file with git itself
    repo = tmp_path / "apply"
    git("init", "--quiet", str(repo))
    (repo / "README.md").write_text(UPSTREAM.read_text())
    git("apply", str(paths["diff"]), cwd=repo)
    assert (repo / "README.md").read_text() == readme
    # a second run over the same copy writes the same files
    again = P.write_publication(claim, section(), tmp_path / "out")
    assert Path(again["readme"]).read_text() == readme and Path(again["diff"]).read_text() == diff


# -- git -----------------------------------------------------------------------------------------


def test_push_branch_to_a_real_bare_repository(bare):
    remote, seed = bare
    old = UPSTREAM.read_text()
    new = P.render_upstream(old, section("one"), "Performance")
    sha = P.push_branch(
        str(remote), "crashline/correction", "README.md", new, "Correct the speed table", base_ref=seed, base_text=old
    )
    gd = f"--git-dir={remote}"
    assert git(gd, "rev-parse", "crashline/correction") == sha
    assert git(gd, "show", "crashline/correction:README.md") + "\n" == new
    assert git(gd, "log", "-1", "--format=%an <%ae>|%cn <%ce>|%s|%P", "crashline/correction") == (
        f"crashline <crashline@localhost>|crashline <crashline@localhost>|Correct the speed table|{seed}"
    )
    assert git(gd, "rev-parse", "main") == seed  # upstream's own branch untouched
    # the same text again: nothing new on the branch
    assert (
        P.push_branch(str(remote), "crashline/correction", "README.md", new, "again", base_ref=seed, base_text=old)
        == sha
    )
    # a new correction: one more commit on top of the branch
    newer = P.render_upstream(new, section("two"), "Performance")
    sha2 = P.push_branch(
        str(remote), "crashline/correction", "README.md", newer, "Update", base_ref=seed, base_text=old
    )
    assert sha2 != sha and git(gd, "log", "-1", "--format=%P", "crashline/correction") == sha
    assert "two" in git(gd, "show", "crashline/correction:README.md")


def test_push_refuses_when_upstream_differs_from_the_local_copy(bare):
    remote, seed = bare
    with pytest.raises(P.PublishError, match="differs from the local copy"):
        P.push_branch(str(remote), "fix", "README.md", "new\n", "m", base_ref=seed, base_text="another text\n")
    with pytest.raises(P.PublishError, match="is not in"):
        P.push_branch(str(remote), "fix", "README.md", "new\n", "m", base_ref="0" * 40)
    assert "fix" not in git(f"--git-dir={remote}", "branch", "--list")


def test_push_branch_from_a_branch_name(bare):
    remote, seed = bare
    sha = P.push_branch(str(remote), "fix", "docs/NOTE.md", "a new file\n", "Add a note", base_ref="main")
    assert git(f"--git-dir={remote}", "log", "-1", "--format=%P", "fix") == seed
    assert git(f"--git-dir={remote}", "show", "fix:docs/NOTE.md") == "a new file" and len(sha) == 40


def test_publish_dry_run_by_default_then_push(tmp_path, bare):
    remote, seed = bare
    claim = claim_for(tmp_path, git=str(remote), revision=seed)
    dry = P.publish(claim, section(), tmp_path / "dry", {})
    assert dry["dry_run"] and dry["push"] is None and dry["pull_request"] is None
    assert json.loads((tmp_path / "dry" / "publish.json").read_text()) == dry
    assert git(f"--git-dir={remote}", "branch", "--list") == "* main"  # nothing left the machine
    done = P.publish(claim, section(), tmp_path / "push", {"push": True, "branch": "crashline/fix"})
    assert not done["dry_run"] and done["push"]["branch"] == "crashline/fix"
    assert git(f"--git-dir={remote}", "rev-parse", "crashline/fix") == done["push"]["commit"]
    assert (
        git(f"--git-dir={remote}", "show", "crashline/fix:README.md") + "\n"
        == (tmp_path / "push" / "README.md").read_text()
    )


def test_redact_credentials():
    assert P.redact("https://user:secret@example.com/r.git failed") == "https://***@example.com/r.git failed"
    assert P.redact(f"token {SENTINEL} here", SENTINEL) == "token *** here"


# -- Hugging Face --------------------------------------------------------------------------------


def test_pull_request_refused_without_a_token(tmp_path):
    with pytest.raises(P.PublishError, match="no Hugging Face token: set HF_TOKEN"):
        P.open_hf_pr("owner/model", "README.md", "text", None, "title")
    claim = claim_for(tmp_path, hf_repo="owner/model")
    with pytest.raises(P.PublishError, match="no Hugging Face token"):
        P.publish(claim, section(), tmp_path / "out", {"open_pr": True}, env={})
    assert P.token_from({"HF_TOKEN": "a"}) == "a" and P.token_from({}) is None


def test_token_is_never_written(tmp_path):
    """A token in the environment, a real call to the hub that cannot succeed here (no network,
    or a token the hub rejects): the error names the repository, and neither it nor any file
    written holds the token."""
    claim = claim_for(tmp_path, hf_repo="crashline-test/does-not-exist")
    out = tmp_path / "out"
    with pytest.raises(P.PublishError) as err:
        P.publish(claim, section(), out, {"open_pr": True}, env={"HF_TOKEN": SENTINEL})
    assert "crashline-test/does-not-exist" in str(err.value)
    assert SENTINEL not in str(err.value) and err.value.__cause__ is None
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert {p.name for p in written} >= {"README.md", "correction.md", "correction.diff"}
    for path in written:
        assert SENTINEL.encode() not in path.read_bytes(), path


def test_run_writes_every_claim_from_the_tables(tmp_path):
    """The publish verb's function, on empty tables: the section says what is not measured yet."""
    claim = claim_for(tmp_path)
    cfg = {
        "models": {"m": {}},
        "defaults": {"threads": 2},
        "claims": [claim["path"]],
        "publish": {},
        "budget": {"margin_mib": 1024},
    }
    empty = pd.DataFrame(columns=["model", "config_id", "outcome"])
    empty.to_parquet(tmp_path / "configs.parquet")
    pd.DataFrame(columns=["model", "config_id"]).to_parquet(tmp_path / "measurements.parquet")
    records = P.run(cfg, tmp_path / "configs.parquet", tmp_path / "measurements.parquet", tmp_path / "publish")
    assert [r["claim"] for r in records] == ["mixed"] and records[0]["dry_run"]
    md = (tmp_path / "publish" / "mixed" / "correction.md").read_text()
    assert "not measured: no record of configuration" in md
    with pytest.raises(P.PublishError, match="no claims file named 'other'"):
        P.run(cfg, tmp_path / "configs.parquet", tmp_path / "measurements.parquet", tmp_path / "publish", only="other")


def test_a_pull_request_that_fails_after_the_push_is_recorded_not_lost(tmp_path, bare):
    """A partial publish (branch pushed, pull request failed) left no publish.json (issue #26): what left the
    machine must be on record."""
    remote, seed = bare
    claim = claim_for(tmp_path, git=str(remote), revision=seed, hf_repo="owner/model")
    out = tmp_path / "out"
    done = P.publish(claim, section(), out, {"push": True, "open_pr": True, "branch": "crashline/fix"}, env={})
    assert done["push"]["branch"] == "crashline/fix" and done["complete"] is False
    assert "no Hugging Face token" in done["pull_request"]["error"] and done["pull_request"]["repo"] == "owner/model"
    assert json.loads((out / "publish.json").read_text()) == done
    assert git(f"--git-dir={remote}", "rev-parse", "crashline/fix") == done["push"]["commit"]


def test_a_dry_run_says_exactly_what_it_would_send_and_sends_nothing(tmp_path, bare):
    """#42 item 5: with publish.push and open_pr set, --dry-run writes the files and names the remote, the branch,
    the base, the pull request and the diff, and nothing leaves the machine."""
    remote, seed = bare
    claim = claim_for(tmp_path, git=str(remote), revision=seed, hf_repo="owner/model-GGUF")
    options = {"push": True, "open_pr": True, "branch": "crashline/fix", "dry_run": True}
    dry = P.publish(claim, section(), tmp_path / "dry", options, env={})
    assert dry["dry_run"] and dry["push"] is None and dry["pull_request"] is None
    assert git(f"--git-dir={remote}", "branch", "--list") == "* main"  # nothing left the machine
    said = P.said(dry)
    assert f"push README.md as branch crashline/fix to {remote} on top of {seed}" in said
    assert "open a pull request on owner/model-GGUF changing README.md: 'Speed table: re-measured" in said
    assert said.endswith(f"the change being {dry['files']['diff']})") and (tmp_path / "dry" / "README.md").exists()
    assert json.loads((tmp_path / "dry" / "publish.json").read_text())["would"]["push"]["branch"] == "crashline/fix"
