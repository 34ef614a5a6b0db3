"""Security checks (issue #13): no shell sees a path from the config, the server listens on loopback
only, no subprocess is started through a shell, a Hugging Face token is never written, and a claims
file cannot make publishing write outside its folders or pass options to git.

Nothing leaves the machine unless the config asks: tests/test_publish.py proves it for the
function (test_publish_dry_run_by_default_then_push); test_the_publish_verb_never_writes_the_token
checks it for the verb too (the remote keeps its single branch)."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd
import psutil
import pytest
import yaml

from crashline.config import claims as K
from crashline import publish as P
from crashline.core import settings
from crashline.engine.server import HOST, ServerProcess

import test_publish
from conftest import FIXTURES, REPO
from test_publish import claim_for, git, section
from helpers import copy_workflow, dry_run

bare = test_publish.bare  # the fixture: a real bare repository with the upstream README on main

EVIL_RESULTS = "res dir $(touch PWNED)"
SECRET = "hf_crashlineSecurityTestSecretNeverWritten987"


def evil_config(workdir: Path) -> str:
    """A config whose results folder is shell syntax, with one claims file (for the publish rule)."""
    for name in ("mixed.yaml", "upstream-README.md"):
        shutil.copy(FIXTURES / "claims" / name, workdir)
    (workdir / "evil.yaml").write_text(
        yaml.safe_dump(
            {
                "results_dir": EVIL_RESULTS,
                "cache_dir": str(workdir / "cache"),
                "models": {"m": {"source": "synthetic:tiny-moe"}},
                "configurations": [{"settings": {}}],
                "workloads": [{"name": "short", "prompt_tokens": 64, "gen_tokens": 16}],
                "claims": ["mixed.yaml"],
            }
        )
    )
    return "evil.yaml"


def pwned(workdir: Path) -> list[Path]:
    return list(workdir.rglob("PWNED"))  # what `touch PWNED` would create, wherever a job ran it


# -- the workflow's shell commands ---------------------------------------------------------------


def test_no_rule_runs_a_shell_command(tmp_path):
    """Every rule runs scripts/job.py: paths from the config reach the verb as arguments, never a shell."""
    copy_workflow(tmp_path)
    out = dry_run(tmp_path, "publish", "-p", "--configfile", evil_config(tmp_path))
    assert "rule publish_claim:" in out and "rule measure:" in out and "rule provision_server:" in out, out
    assert re.findall(r"Shell command: (.*)", out) == ["None"] * out.count("Shell command"), out
    assert not pwned(tmp_path)
    for rule in (REPO / "rules").glob("*.smk"):
        text = rule.read_text()
        assert "shell:" not in text and "run:" not in text, rule
        assert text.count("script:") == text.count('"../scripts/job.py"'), rule


def test_a_real_run_makes_the_folder_the_config_names_and_runs_nothing_from_it(tmp_path):
    copy_workflow(tmp_path)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "snakemake",
            "--cores",
            "1",
            "--until",
            "fetch_model",
            "--configfile",
            evil_config(tmp_path),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO / "src")},
    )
    assert not pwned(tmp_path), "a job ran the shell syntax in results_dir"
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / EVIL_RESULTS / "models" / "m" / "fetch.json").is_file()


# -- the server ----------------------------------------------------------------------------------


def test_the_server_listens_on_loopback_only_whatever_extra_args_say(tmp_path, server_binary, tiny_moe):
    # The config refuses it; and a command that carries it anyway (built by hand) is still overridden.
    with pytest.raises(settings.SettingsError, match="which crashline sets itself"):
        settings.resolve({"extra_args": ["--host", "0.0.0.0"]})
    resolved = settings.resolve({"ctx": 512, "parallel": 1})
    command = [*settings.command_line(server_binary, str(tiny_moe), resolved), "--host", "0.0.0.0"]
    with ServerProcess(command, tmp_path / "s.log") as server:
        command = server.command
        # llama.cpp takes the last --host: crashline's own comes after extra_args
        assert len(command) - 1 - command[::-1].index("--host") > command.index("0.0.0.0")
        assert server.start_ready(120) == "ready", server.log_text()[-2000:]
        sockets = psutil.Process(server.proc.pid).net_connections(kind="inet")
        assert any(s.status == psutil.CONN_LISTEN for s in sockets)
        assert {s.laddr.ip for s in sockets} == {HOST}, sockets


@pytest.mark.parametrize(
    "args, flag, fix",
    [
        (["-m", "other.gguf"], "-m", "name the model under models:"),
        (["--model=other.gguf"], "--model", "name the model under models:"),
        (["-hf", "org/repo"], "-hf", "name the model under models:"),
        (["-mu", "https://example.invalid/m.gguf"], "-mu", "name the model under models:"),
        (["-md", "draft.gguf"], "-md", "setting 'draft_model' sets"),
        (["--path", "/etc"], "--path", "reads its model and nothing else"),
        (["--slot-save-path=/tmp/x"], "--slot-save-path", "reads its model and nothing else"),
        (["--api-key", "k"], "--api-key", "a key only crashline's client knows"),
        (["--ssl-key-file", "k.pem"], "--ssl-key-file", "answers crashline's key alone"),
        (["--tools", "all"], "--tools", "runs no tools"),
        (["--rpc", "10.0.0.1:50052"], "--rpc", "listens on loopback"),
    ],
)
def test_extra_args_may_not_choose_the_model_files_or_who_reaches_the_server(args, flag, fix):
    """A config (or claims file: both resolve settings here) that passes one of them is refused, naming the flag."""
    with pytest.raises(settings.SettingsError) as err:
        settings.resolve({"extra_args": ["--poll", "50", *args]})
    assert f"passes {flag}," in str(err.value) and fix in str(err.value), err.value
    settings.resolve({"extra_args": ["--poll", "50", "--no-op-offload"]})  # flags that only tune the server pass


def test_a_server_answers_only_the_key_crashline_holds(tmp_path, server_binary, tiny_moe, monkeypatch):
    """Even a command built by hand with --path: another local process reaches the port, gets 401 for files and
    completions alike, finds the key neither on the command line nor on disk, and LLAMA_ARG_* reach no server."""
    import requests

    from crashline.engine.workloads import Client

    served = tmp_path / "served"
    served.mkdir()
    (served / "secret.txt").write_text("not for other users\n")
    monkeypatch.setenv("LLAMA_ARG_MODEL", "/elsewhere/other.gguf")
    resolved = settings.resolve({"ctx": 512, "parallel": 1})
    command = [*settings.command_line(server_binary, str(tiny_moe), resolved), "--path", str(served)]
    with ServerProcess(command, tmp_path / "s.log") as server:
        assert server.start_ready(120) == "ready", server.log_text()[-2000:]
        assert requests.get(f"{server.url}/secret.txt", timeout=10).status_code == 401
        body = {"prompt": "The", "n_predict": 2}
        assert requests.post(f"{server.url}/completion", json=body, timeout=30).status_code == 401
        assert Client.of(server, 60).complete("The", 2)["tokens_predicted"] == 2
        cmdline = Path(f"/proc/{server.proc.pid}/cmdline").read_bytes().decode()
        assert server.api_key not in cmdline and "--api-key-file" in cmdline
        assert not Path(server.command[server.command.index("--api-key-file") + 1]).exists()
        environ = Path(f"/proc/{server.proc.pid}/environ").read_bytes().decode()
        assert "LLAMA_ARG_" not in environ


# -- no shell ------------------------------------------------------------------------------------

SHELL_CALLS = {
    "os.system",
    "os.popen",
    "subprocess.getoutput",
    "subprocess.getstatusoutput",
    "asyncio.create_subprocess_shell",
}


def _dotted(node: ast.AST, aliases: dict[str, str]) -> str | None:
    """``os.system`` for ``os.system`` or a ``system`` imported from os; None if not a plain name."""
    if isinstance(node, ast.Name):
        return aliases.get(node.id, node.id)
    if isinstance(node, ast.Attribute) and (base := _dotted(node.value, aliases)):
        return f"{base}.{node.attr}"
    return None


def shell_uses(source: str) -> list[str]:
    """Calls in ``source`` that give a command to a shell: shell=<anything but False>, os.system and kin."""
    tree = ast.parse(source)
    aliases = {
        a.asname or a.name: f"{n.module}.{a.name}"
        for n in ast.walk(tree)
        if isinstance(n, ast.ImportFrom)
        for a in n.names
    }
    aliases |= {a.asname: a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names if a.asname}
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = _dotted(node.func, aliases)
        shell = [
            k
            for k in node.keywords
            if k.arg == "shell" and not (isinstance(k.value, ast.Constant) and k.value.value is False)
        ]
        if name in SHELL_CALLS or shell:
            found.append(f"line {node.lineno}: {ast.unparse(node)[:80]}")
    return found


def test_the_scan_finds_each_way_to_a_shell():
    assert shell_uses("import subprocess\nsubprocess.run('x', shell=True)\nsubprocess.run(['x'], shell=False)")
    assert len(shell_uses("import os\nos.system('x')\nfrom os import popen as p\np('x')\n")) == 2
    assert not shell_uses("import subprocess\nsubprocess.run(['x'], shell=False)\n")


def test_no_subprocess_gets_a_shell():
    found = {
        str(p.relative_to(REPO)): uses
        for p in sorted((REPO / "src").rglob("*.py"))
        if (uses := shell_uses(p.read_text()))
    }
    assert not found, found


# -- the token -----------------------------------------------------------------------------------


def publish_setup(tmp_path: Path, remote: Path) -> Path:
    """A config with the test claims file (its local copy beside it, source.git a real bare repository)
    and the two tables the verb reads, empty; returns the config file."""
    claims = tmp_path / "claims"
    claims.mkdir()
    shutil.copy(FIXTURES / "claims" / "upstream-README.md", claims)
    raw = yaml.safe_load((FIXTURES / "claims" / "mixed.yaml").read_text())
    raw["source"]["git"] = str(remote)
    (claims / "mixed.yaml").write_text(yaml.safe_dump(raw))
    tables = tmp_path / "results" / "tables"
    tables.mkdir(parents=True)
    pd.DataFrame(columns=["model", "config_id", "outcome"]).to_parquet(tables / "configs.parquet")
    pd.DataFrame(columns=["model", "config_id"]).to_parquet(tables / "measurements.parquet")
    config = tmp_path / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "results_dir": str(tmp_path / "results"),
                "models": {"m": {"source": "file:/x.gguf"}},
                "defaults": {"threads": 2},
                "configurations": [{"grid": {"ubatch": [128, 512]}}],
                "workloads": [{"name": "short", "prompt_tokens": 512, "gen_tokens": 64}],
                "claims": [str(claims / "mixed.yaml")],
            }
        )
    )
    return config


def test_the_publish_verb_never_writes_the_token(tmp_path, bare):
    remote, _ = bare
    config = publish_setup(tmp_path, remote)
    proc = subprocess.run(
        [sys.executable, "-m", "crashline", "publish", "--config", str(config)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO / "src"), "HF_TOKEN": SECRET},
    )
    assert proc.returncode == 0 and "dry run" in proc.stdout, proc.stderr
    logs = tmp_path / "results" / "logs" / "publish"  # where the workflow's job sends the verb's output
    logs.mkdir(parents=True)
    (logs / "mixed.log").write_text(proc.stdout + proc.stderr)
    written = [p for p in (tmp_path / "results").rglob("*") if p.is_file()]
    assert {p.name for p in written} >= {"README.md", "correction.md", "correction.diff", "publish.json"}
    for path in written:
        assert SECRET.encode() not in path.read_bytes(), path
    assert git(f"--git-dir={remote}", "branch", "--list") == "* main"  # nothing pushed: the config did not ask


# -- a claims file cannot reach outside ----------------------------------------------------------


@pytest.mark.parametrize("file", ["../../escaped.md", "ABSOLUTE", ".git/hooks/post-commit"])
def test_source_file_outside_the_repository_is_refused(tmp_path, bare, monkeypatch, file):
    remote, seed = bare
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))  # the clone goes to tmp/crashline-publish-*/repo
    (tmp_path / "tmp").mkdir()
    escaped = tmp_path / "tmp" / "escaped.md"
    file = str(escaped) if file == "ABSOLUTE" else file
    with pytest.raises(P.PublishError) as refused:
        P.push_branch(str(remote), "fix", file, "planted\n", "m", base_ref=seed)
    assert not escaped.exists(), "written outside the clone"
    assert "is not a file inside the repository" in str(refused.value)
    assert "fix" not in git(f"--git-dir={remote}", "branch", "--list")
    claim = claim_for(tmp_path, file=file)  # the dry run refuses it too, before writing anything
    with pytest.raises(P.PublishError, match="is not a file inside the repository"):
        P.publish(claim, section(), tmp_path / "out", {})
    assert not (tmp_path / "out").exists()


def test_a_symbolic_link_in_the_upstream_tree_does_not_lead_outside(tmp_path, bare):
    remote, _ = bare
    outside = tmp_path / "outside"
    outside.mkdir()
    seed = tmp_path / "seed"
    (seed / "docs").symlink_to(outside)
    git("add", "docs", cwd=seed)
    git("commit", "--quiet", "-m", "a link", cwd=seed)
    git("push", "--quiet", "origin", "main", cwd=seed)
    with pytest.raises(P.PublishError, match="outside"):
        P.push_branch(str(remote), "fix", "docs/README.md", "planted\n", "m", base_ref="main")
    assert not list(outside.iterdir())


def test_local_copy_outside_the_claims_folder_is_refused(tmp_path):
    (tmp_path / "secret.md").write_text("# not for publishing\n")
    folder = tmp_path / "claims"
    folder.mkdir()
    raw = yaml.safe_load((FIXTURES / "claims" / "mixed.yaml").read_text())
    raw["source"].update(local_copy="../secret.md", anchor=None)
    (folder / "c.yaml").write_text(yaml.safe_dump(raw))
    cfg = {"models": {"m": {"source": "file:/x.gguf"}}, "defaults": {}, "budget": {"margin_mib": 1024}}
    claim = K.load_claims([folder / "c.yaml"], cfg)[0]
    with pytest.raises(P.PublishError, match="source.local_copy = '../secret.md' resolves to .*, outside"):
        P.write_publication(claim, section(), tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("where", ["repo_url", "branch", "base_ref"])
def test_nothing_given_to_git_is_read_as_an_option(tmp_path, bare, where):
    remote, seed = bare
    marker = tmp_path / "PWNED"
    given = {"repo_url": str(remote), "branch": "fix", "base_ref": seed, where: f"--upload-pack=touch {marker};git"}
    with pytest.raises(P.PublishError, match="starts with '-'"):
        P.push_branch(given["repo_url"], given["branch"], "README.md", "new\n", "m", base_ref=given["base_ref"])
    assert not marker.exists()


# -- the lock files (issue #26) ---------------------------------------------------------------------
#
# Another local user is real here: the tests run as root and act as `nobody` through subprocess's user=.

OTHER_USER = 65534  # nobody


def _as_other_user(*command: str) -> subprocess.CompletedProcess:
    if os.getuid() != 0:
        pytest.skip("acting as another local user needs root")
    return subprocess.run(list(command), user=OTHER_USER, capture_output=True, text=True, timeout=30)


@pytest.fixture
def shared_folder():
    """A folder every user may write to, as /tmp is: root's, mode 1777, under a folder everyone may enter."""
    base = Path(tempfile.mkdtemp(prefix="crashline-security-", dir="/tmp"))
    base.chmod(0o755)
    shared = base / "locks"
    shared.mkdir()
    shared.chmod(0o1777)
    yield base, shared
    shutil.rmtree(base)


def test_a_lock_planted_as_a_symbolic_link_is_refused_and_its_target_untouched(shared_folder):
    from crashline.core import locks

    base, shared = shared_folder
    victim = base / "victims-file"
    victim.write_text("the victim's data\n")
    victim.chmod(0o600)
    planted = _as_other_user("ln", "-s", str(victim), str(shared / "server.lock"))
    assert planted.returncode == 0, planted.stderr
    with pytest.raises(locks.UnsafeLockError, match="symbolic link"):
        with locks.held(shared / "server.lock", "a job", "waits"):
            pass
    assert victim.read_text() == "the victim's data\n"
    assert oct(victim.stat().st_mode & 0o777) == oct(0o600)


def test_the_default_lock_folder_is_each_users_own_and_unsafe_folders_are_refused(tmp_path, shared_folder):
    from crashline.core import locks

    assert str(os.getuid()) in locks.LOCK_DIR.name
    made = locks._lock_dir(tmp_path / "new" / "locks")
    assert made.stat().st_mode & 0o777 == 0o700
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, OTHER_USER, OTHER_USER)
    with pytest.raises(locks.UnsafeLockError, match="belongs to user 65534"):
        locks._lock_dir(theirs)
    open_to_all = tmp_path / "open"
    open_to_all.mkdir()
    open_to_all.chmod(0o777)
    with pytest.raises(locks.UnsafeLockError, match="without the sticky bit"):
        locks._lock_dir(open_to_all)
    link = tmp_path / "link"
    link.symlink_to(made)
    with pytest.raises(locks.UnsafeLockError, match="symbolic link"):
        locks._lock_dir(link)
    assert locks._lock_dir(shared_folder[1]) == shared_folder[1]  # root's and sticky: shared on purpose


def test_another_users_lock_in_a_shared_folder_excludes_them_and_is_not_written(shared_folder):
    """In a folder an administrator shares (root's, sticky), another user's lock file still excludes their run
    while ours holds it, and we neither chmod it nor write into it."""
    from crashline.core import locks

    _, shared = shared_folder
    lock = shared / "server.lock"
    made = _as_other_user("sh", "-c", f"umask 022; printf 'pid 1 (theirs)\\n' > {lock}")
    assert made.returncode == 0, made.stderr
    before = lock.stat()
    with locks.held(lock, "a job", "waits"):
        tried = _as_other_user("flock", "-n", str(lock), "true")
        assert tried.returncode == 1, "their run got the lock while ours held it"
    after = lock.stat()
    assert (after.st_mode, after.st_uid, lock.read_text()) == (before.st_mode, OTHER_USER, "pid 1 (theirs)\n")
    assert _as_other_user("flock", "-n", str(lock), "true").returncode == 0  # released
