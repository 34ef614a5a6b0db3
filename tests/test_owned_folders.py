"""Results folders you own (issue #38 item 3): a folder another user can write, or a link they planted, never
redirects what crashline writes. ``results_dir``, ``tune --out``, ``recheck --out`` and ``compare --out`` are
refused when they, a folder on the way or ``.crashline/`` inside belong to another user or are writable by others;
a link at an output's name is replaced or refused, never written through; ``compare`` and ``recheck`` never write
into one of their inputs. The other user is a real one, made for these tests (root only)."""

from __future__ import annotations

import os
import pwd
import re
import secrets
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from conftest import REPO
from helpers import copy_workflow, dry_run
from crashline.core.errors import CrashlineError

RECHECK = REPO / "bench" / "results" / "recheck-portable"
NATIVE, PORTABLE = RECHECK / "native" / "results", RECHECK / "portable" / "results"
SECRET = '{"mine": "not crashline\'s"}\n'
CONFIG = (
    "results_dir: {results}\nmodels: {{m: {{source: 'synthetic:tiny-moe'}}}}\n"
    "configurations: [{{settings: {{}}}}]\nworkloads: [{{name: w, prompt_tokens: 16, gen_tokens: 4}}]\n"
)


@pytest.fixture(scope="module")
def evil():
    """Another local user, made for these tests and removed after them."""
    if os.geteuid() != 0 or not shutil.which("useradd") or not shutil.which("userdel"):
        pytest.skip("needs root and useradd to make a second user")
    name = f"crashline-evil-{secrets.token_hex(3)}"
    subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name], check=True)
    try:
        yield pwd.getpwnam(name)
    finally:
        subprocess.run(["userdel", name], check=False)


def as_user(user, *command: str) -> None:
    """``command`` run as ``user``, as they would run it."""
    subprocess.run(command, user=user.pw_uid, group=user.pw_gid, extra_groups=[], check=True, timeout=30)


def made_first_by(user, folder: Path, mode: str) -> None:
    """``folder`` made by ``user`` in a parent that was open to all (sticky, as /tmp) at the time."""
    was = folder.parent.stat().st_mode
    folder.parent.chmod(0o1777)
    try:
        as_user(user, "mkdir", "-m", mode, str(folder))
    finally:
        folder.parent.chmod(was)


@pytest.fixture
def base():
    """A folder the other user can reach (pytest's own tmp_path is root's alone, 0700)."""
    folder = Path(tempfile.mkdtemp(prefix="crashline-owned-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def victim(base):
    """A file of the user's own that a planted link points crashline's writes at."""
    folder = base / "victim"
    folder.mkdir(mode=0o700)
    (folder / "config.json").write_text(SECRET)
    (folder / "config.json").chmod(0o600)
    return folder


def untouched(victim: Path) -> bool:
    config = victim / "config.json"
    return sorted(os.listdir(victim)) == ["config.json"] and (
        config.read_text(),
        stat.S_IMODE(config.stat().st_mode),
    ) == (SECRET, 0o600)


def planted_crashline_link(results: Path, victim: Path, evil) -> None:
    """results/.crashline -> the victim's folder, planted by the other user while results was open to all; its
    owner then closed it (chmod 755), the link left inside."""
    results.mkdir(mode=0o755)
    results.chmod(0o777)
    as_user(evil, "ln", "-s", str(victim), str(results / ".crashline"))
    results.chmod(0o755)


def workflow(tmp_path: Path, results: Path) -> tuple[Path, Path]:
    """A copy of the workflow and a config of one configuration writing into ``results``."""
    work = tmp_path / "work"
    work.mkdir()
    copy_workflow(work)
    config = work / "owned.yaml"
    config.write_text(CONFIG.format(results=results))
    return work, config


def dry_run_fails(work: Path, config: Path) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "-n", "report", "--configfile", str(config)],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO / "src")},
    )
    said = proc.stdout + proc.stderr
    assert proc.returncode != 0, said
    assert "Traceback" not in said, said
    return said


def crashline(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "crashline", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO / "src")},
    )


# ----------------------------------------------------------------------------- results_dir


def test_a_planted_crashline_link_makes_the_dry_run_refuse_and_the_victim_stays_as_it_was(tmp_path, base, victim, evil):
    """The issue's case: a planted results/.crashline made even `snakemake -n` rewrite config.json in the victim's
    folder (0600 -> 0644)."""
    results = base / "results"
    planted_crashline_link(results, victim, evil)
    work, config = workflow(tmp_path, results)
    said = dry_run_fails(work, config)
    assert f"results_dir {results}: {results / '.crashline'} is a symbolic link (to {victim})" in said, said
    assert untouched(victim)


def test_a_planted_crashline_link_makes_the_cli_refuse(base, victim, evil, tmp_path):
    results = base / "results"
    planted_crashline_link(results, victim, evil)
    config = tmp_path / "owned.yaml"
    config.write_text(CONFIG.format(results=results))
    proc = crashline("plan", "--config", str(config))
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stdout + proc.stderr
    assert f"crashline plan: error: results_dir {results}: {results / '.crashline'} is a symbolic link" in proc.stderr
    assert untouched(victim)


def _open_to_all(results: Path, evil) -> str:
    results.mkdir()
    results.chmod(0o777)
    return f"{results} is writable by others (mode 777); chmod go-w {results}"


def _made_by_the_other_user(results: Path, evil) -> str:
    made_first_by(evil, results, "755")
    return f"{results} belongs to {evil.pw_name} (uid {evil.pw_uid}), who could swap what crashline writes there"


def _crashline_a_file(results: Path, evil) -> str:
    results.mkdir()
    (results / ".crashline").write_text("")
    return f"{results / '.crashline'} is not a folder; remove {results / '.crashline'}"


def _crashline_of_the_other_user(results: Path, evil) -> str:
    results.mkdir()
    (results / ".crashline").mkdir()
    os.chown(results / ".crashline", evil.pw_uid, evil.pw_gid)
    return f"{results / '.crashline'} belongs to {evil.pw_name}"


def _under_a_folder_open_to_all(results: Path, evil) -> str:
    results.parent.mkdir()
    results.parent.chmod(0o777)
    return f"{results.parent} is writable by others (mode 777) without the sticky bit"


UNSAFE = [_open_to_all, _made_by_the_other_user, _crashline_a_file, _crashline_of_the_other_user]


@pytest.mark.parametrize("unsafe", UNSAFE, ids=lambda f: f.__name__.strip("_"))
def test_a_results_folder_another_user_can_change_is_refused_by_the_cli(base, evil, tmp_path, unsafe):
    results = base / "results"
    expected = unsafe(results, evil)
    before = sorted(p.name for p in results.iterdir())
    config = tmp_path / "owned.yaml"
    config.write_text(CONFIG.format(results=results))
    proc = crashline("needle-table", "--config", str(config))
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stdout + proc.stderr
    assert f"error: results_dir {results}: {expected}" in proc.stderr, proc.stderr
    assert sorted(p.name for p in results.iterdir()) == before  # nothing written


def test_a_results_folder_under_a_folder_open_to_all_is_refused(base, evil, tmp_path):
    results = base / "open" / "results"
    expected = _under_a_folder_open_to_all(results, evil)
    config = tmp_path / "owned.yaml"
    config.write_text(CONFIG.format(results=results))
    proc = crashline("needle-table", "--config", str(config))
    assert proc.returncode == 2 and f"results_dir {results}: {expected}" in proc.stderr, proc.stderr
    assert not results.exists()


@pytest.mark.parametrize("unsafe", [_open_to_all, _made_by_the_other_user], ids=lambda f: f.__name__.strip("_"))
def test_a_results_folder_another_user_can_change_is_refused_by_the_dry_run(base, evil, tmp_path, unsafe):
    results = base / "results"
    expected = unsafe(results, evil)
    work, config = workflow(tmp_path, results)
    said = dry_run_fails(work, config)
    assert f"results_dir {results}: {expected}" in said, said
    assert not (results / ".crashline").exists()


def test_a_fresh_results_folder_is_made_and_accepted(base, tmp_path):
    results = base / "new" / "deeper" / "results"
    work, config = workflow(tmp_path, results)
    dry_run(work, "--configfile", str(config))
    assert (results / ".crashline" / "config.json").is_file()
    for folder in (base / "new", base / "new" / "deeper", results, results / ".crashline"):
        st = folder.lstat()
        assert stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o022


# ----------------------------------------------------------------------------- own_folder itself


def test_own_folder_walks_links_of_the_user_and_refuses_the_other_users(base, evil):
    from crashline.core.owned import UnsafeFolderError, own_folder

    (base / "real").mkdir()
    (base / "mine").symlink_to(base / "real")
    assert own_folder(base / "mine" / "out", "--out") == base / "real" / "out"
    assert (base / "real" / "out").is_dir()
    sticky = base / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    as_user(evil, "ln", "-s", str(base / "real"), str(sticky / "theirs"))
    with pytest.raises(UnsafeFolderError, match=f"is a symbolic link of {evil.pw_name} .*, who could point"):
        own_folder(sticky / "theirs" / "out2", "--out")
    assert not (base / "real" / "out2").exists()
    assert own_folder(sticky / "mine", "--out") == sticky / "mine"  # a sticky folder on the way is fine
    with pytest.raises(UnsafeFolderError, match=r"is writable by others \(mode 1777\)"):
        own_folder(sticky, "--out")  # but not as the folder written into


def test_group_write_is_refused_unless_the_group_is_the_owners_own(base, evil):
    from crashline.core.owned import UnsafeFolderError, own_folder

    private = base / "private"
    private.mkdir()
    os.chown(private, -1, pwd.getpwuid(os.getuid()).pw_gid)
    private.chmod(0o775)
    if pwd.getpwuid(os.getuid()).pw_name != __import__("grp").getgrgid(private.stat().st_gid).gr_name:
        pytest.skip("this user's primary group is not a private one")
    assert own_folder(private, "results_dir") == private  # umask 002 on a system of user private groups
    shared = base / "shared"
    shared.mkdir()
    os.chown(shared, -1, evil.pw_gid)
    shared.chmod(0o775)
    with pytest.raises(UnsafeFolderError, match=r"is writable by others \(mode 775\)"):
        own_folder(shared, "results_dir")


# ----------------------------------------------------------------------------- tune --out, recheck, compare


@pytest.fixture
def no_workflow(monkeypatch):
    """tune and recheck without the workflow: what they write before it runs is what is checked."""
    from crashline.cli import tune as T
    from crashline.cli.exits import Said

    from crashline.core.supervision import WORKFLOW_PID

    monkeypatch.setenv(WORKFLOW_PID, "")  # run_folder sets it for the jobs: restored after the test
    ran = []
    monkeypatch.setattr(T, "run_workflow", lambda *a: ran.append(a) or True)
    monkeypatch.setattr(T, "answer", lambda cfg: Said())  # no lines, status 0
    return ran


@pytest.mark.parametrize("under", [True, False], ids=["under-their-sticky-folder", "their-folder"])
def test_tune_out_in_a_folder_the_other_user_made_first_is_refused_before_anything_is_written(
    base, evil, no_workflow, under
):
    from crashline.cli.tune import tune

    if under:  # the other user made a shared sticky folder in /tmp first; we tune into a folder inside it
        made_first_by(evil, base / "shared", "1777")
        out = base / "shared" / "tune"
    else:  # the other user made the very folder first
        made_first_by(evil, base / "tune", "1777")
        out = base / "tune"
    with pytest.raises(
        CrashlineError, match=rf"^--out {re.escape(str(out))}: .* belongs to {evil.pw_name} \(uid {evil.pw_uid}\)"
    ):
        tune("synthetic:tiny-moe", 4096, 1024, out=out)
    assert not no_workflow
    assert os.listdir(base / ("shared" if under else "tune")) == []


def test_tune_out_is_refused_by_the_cli_in_one_line(base, evil):
    made_first_by(evil, base / "shared", "1777")
    out = base / "shared" / "tune"
    proc = crashline("tune", "synthetic:tiny-moe", "--ctx", "4096", "--prompt", "1024", "--out", str(out))
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stdout + proc.stderr
    assert f"crashline tune: error: --out {out}: {base / 'shared'} belongs to {evil.pw_name}" in proc.stderr
    assert not out.exists()


def test_tune_into_a_fresh_folder_writes_its_config(base, no_workflow):
    from crashline.cli.tune import tune

    tune("synthetic:tiny-moe", 4096, 1024, out=base / "t")
    assert (base / "t" / "tune.yaml").is_file() and len(no_workflow) == 1
    assert (base / "t" / "results" / ".crashline").is_dir()


def _copy_run(source: Path, dest: Path) -> tuple[Path, set[str]]:
    shutil.copytree(source, dest)
    return dest, set(os.listdir(dest / "figures"))


@pytest.mark.parametrize("where", ["is", "inside", "holds"])
def test_compare_never_writes_into_an_input(tmp_path, where):
    from crashline.report.compare import compare

    a, figures = _copy_run(NATIVE, tmp_path / "runs" / "a")
    b, _ = _copy_run(PORTABLE, tmp_path / "runs" / "b")
    out = {"is": a, "inside": a / "cmp", "holds": tmp_path / "runs"}[where]
    before = {p: p.stat().st_mtime_ns for p in a.rglob("*")}
    with pytest.raises(
        CrashlineError, match=rf"^--out {re.escape(str(out))}: ({where} the input|lies inside the input) "
    ):
        compare([str(a), str(b)], out)
    assert set(os.listdir(a / "figures")) == figures  # the report's figures, which it links, are all there
    assert {p: p.stat().st_mtime_ns for p in a.rglob("*")} == before


def test_compare_out_equal_to_an_input_is_refused_by_the_cli(tmp_path):
    a, figures = _copy_run(NATIVE, tmp_path / "a")
    b, _ = _copy_run(PORTABLE, tmp_path / "b")
    proc = crashline("compare", f"x={a}", f"y={b}", "--out", str(a))
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stdout + proc.stderr
    assert f"crashline compare: error: --out {a}: is the input {a} ({a})" in proc.stderr
    assert set(os.listdir(a / "figures")) == figures


@pytest.mark.parametrize("where", ["is", "inside"])
def test_recheck_out_in_its_input_is_refused(tmp_path, no_workflow, where):
    from crashline.cli.recheck import recheck

    earlier, _ = _copy_run(NATIVE, tmp_path / "earlier")
    before = {p: p.stat().st_mtime_ns for p in earlier.rglob("*")}
    out = earlier if where == "is" else earlier / "re"
    with pytest.raises(
        CrashlineError,
        match=rf"^--out {re.escape(str(out))}: ({where} the input|lies inside the input) {re.escape(str(earlier))}",
    ):
        recheck(earlier, "/bin/true", out)
    assert not no_workflow
    assert {p: p.stat().st_mtime_ns for p in earlier.rglob("*")} == before


# ----------------------------------------------------------------------------- a link at an output's name


def test_a_link_planted_at_a_records_name_is_replaced_not_followed(base, victim, evil):
    from crashline.core import records

    folder = base / "records"
    folder.mkdir()
    folder.chmod(0o777)
    record = folder / "measure.json"
    as_user(evil, "ln", "-s", str(victim / "config.json"), str(record))
    records.write(record, "measure", {"config_id": "x"})
    assert not record.is_symlink() and "config_id" in record.read_text()
    assert untouched(victim)


def test_a_link_planted_at_a_logs_name_is_refused_not_written_through(base, victim, evil):
    from crashline.jobs.needle import _note

    folder = base / "records"
    folder.mkdir()
    folder.chmod(0o777)
    log = folder / "needle-server.log"
    as_user(evil, "ln", "-s", str(victim / "config.json"), str(log))
    with pytest.raises(CrashlineError, match=f"{re.escape(str(log))} is a symbolic link; remove it"):
        _note(log, "crashline: no llama-server started\n")
    assert untouched(victim)
    log.unlink()
    _note(log, "one\n")
    _note(log, "two\n")
    assert log.read_text() == "two\n" and stat.S_IMODE(log.stat().st_mode) == 0o666 & ~_umask()


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


# ----------------------------------------------------------------------------- cache_dir


@pytest.mark.parametrize("verb", ["fetch", "provision"])
def test_a_cache_another_user_can_change_is_refused_before_a_model_or_server_lands_there(base, evil, tmp_path, verb):
    """The cache holds the llama-server binary every job starts and the models: in a folder another user made
    (here under a sticky folder open to all, as /tmp), they could swap the binary after its check."""
    cache = base / "cache"
    made_first_by(evil, cache, "755")
    config = tmp_path / "owned.yaml"
    config.write_text(CONFIG.format(results=base / "results") + f"cache_dir: {cache}\n")
    proc = crashline(verb, "--config", str(config), *(["--model", "m"] if verb == "fetch" else []))
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stdout + proc.stderr
    assert f"error: cache_dir {cache}: {cache} belongs to {evil.pw_name}" in proc.stderr, proc.stderr
    assert list(cache.iterdir()) == []
