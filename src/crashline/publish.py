"""Send a correction section back upstream: the patched file and its diff, always; a branch pushed
to a git remote, or a pull request on a Hugging Face model repository, only when asked.

Dry run by default (``publish.push: false``, ``publish.open_pr: false``): the patched upstream
file, the section alone and the diff are written under ``results/publish/<claims name>/`` and
nothing leaves the machine. A Hugging Face token is read from the environment (``HF_TOKEN``) at
the moment of the call and is never written: not in the files, the record or an error message.
"""

from __future__ import annotations

import difflib
import os
import posixpath
import re
import subprocess
import tempfile
from pathlib import Path
from collections.abc import Mapping

from .core.atomic import atomic_path, write_json
from .config.claims import load_claims
from .report.markdown import CORRECTION_END as END_MARKER
from .report.markdown import CORRECTION_START as START_MARKER
from .report.markdown import headings
from .core.errors import CrashlineError

AUTHOR_NAME = "crashline"
AUTHOR_EMAIL = "crashline@localhost"
TOKEN_VARIABLES = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")  # read here alone: no llama-server gets them


class PublishError(CrashlineError, RuntimeError):
    """Publishing failed or was refused; the message says why (and never holds a secret)."""


class GitError(PublishError):
    """A git command failed; the message is one line: the command, its exit status and what git said."""


def one_line(text: str) -> str:
    """``text`` on one line (git and the hub answer in several): an error is one line on the console."""
    return " ".join(str(text).split())


def redact(text: str, *secrets: str | None) -> str:
    """``text`` without credentials in URLs (``https://user:pass@host``) and without ``secrets``."""
    text = re.sub(r"(\w+://)[^/@\s]+@", r"\1***@", str(text))
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return text


def repo_file(file: str) -> str:
    """``source.file``, a path inside the upstream repository: refused when it is absolute, leaves the
    repository with ``..`` or lies in ``.git`` (where a write could plant a hook)."""
    norm = posixpath.normpath(file or ".")
    top = norm.split("/")[0].lower()
    if norm == "." or posixpath.isabs(norm) or top in ("..", ".git"):
        raise PublishError(
            f"source.file = {file!r} is not a file inside the repository: give a relative path "
            "that stays inside it (no leading '/', no '..' out of it, nothing under .git)"
        )
    return norm


def inside(base: Path, relative: str, what: str) -> Path:
    """``base / relative``, refused unless it resolves (symbolic links followed) inside ``base``."""
    path = (base / relative).resolve()
    if not path.is_relative_to(base.resolve()):
        raise PublishError(f"{what} = {relative!r} resolves to {path}, outside {base}: refused")
    return path


def local_copy(claim: dict) -> Path:
    """The claims file's copy of the upstream file; a relative ``source.local_copy`` must stay in the
    claims file's folder (an absolute one is the author's explicit choice)."""
    given = claim["source"].get("local_copy")
    if given and not Path(given).is_absolute():
        inside(Path(claim["path"]).parent, given, f"claims file {claim['path']}: source.local_copy")
    return Path(claim["source"]["local_copy_path"])


def not_an_option(value: str | None, what: str) -> str | None:
    """Refuse a value git would read as an option (``--upload-pack=...`` runs a command)."""
    if value is not None and str(value).startswith("-"):
        raise PublishError(f"{what} = {value!r} starts with '-': refused (git would read it as an option)")
    return value


def render_upstream(readme_text: str, section: str, anchor: str | None = None) -> str:
    """The upstream text with ``section`` in it.

    Where both markers are present, the text between them (markers included) is replaced, so a
    second run changes only the section. Otherwise the section goes at the end of the part under
    the heading ``anchor`` (before the next heading of the same or a higher level), or at the end
    of the file."""
    section = section.strip("\n")
    if not (section.startswith(START_MARKER) and section.endswith(END_MARKER)):
        raise PublishError("a correction section must start and end with the crashline:correction markers")
    start, end = readme_text.find(START_MARKER), readme_text.find(END_MARKER)
    if start >= 0 and end > start:
        return readme_text[:start] + section + readme_text[end + len(END_MARKER) :]
    if start >= 0 or end >= 0:
        raise PublishError(
            "the upstream file has only one of the crashline:correction markers, or they are out "
            "of order: fix it by hand before publishing again"
        )
    lines = readme_text.splitlines(keepends=True)
    if anchor:
        found = [
            (i, level) for i, level, title in headings(readme_text) if title.strip().lower() == anchor.strip().lower()
        ]
        if not found:
            raise PublishError(f"source.anchor = {anchor!r}: no such heading in the upstream file")
        at, level = found[0]
        following = [i for i, lv, _ in headings(readme_text) if i > at and lv <= level]
        if following:
            cut = following[0]
            head = "".join(lines[:cut]).rstrip("\n")
            return head + "\n\n" + section + "\n\n" + "".join(lines[cut:])
    body = readme_text.rstrip("\n")
    return (body + "\n\n" if body else "") + section + "\n"


def unified_diff(old: str, new: str, path: str) -> str:
    """A unified diff of the upstream file, applicable with ``git apply`` / ``patch -p1``."""
    return "".join(
        difflib.unified_diff(
            old.splitlines(keepends=True),
            new.splitlines(keepends=True),
            fromfile=f"a/{path}",
            tofile=f"b/{path}",
        )
    )


def _write(path: Path, text: str) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_text(text)
    return path


def write_publication(claim: dict, section: str, out_dir: str | os.PathLike) -> dict:
    """Write ``README.md`` (the upstream file with the section), ``correction.md`` (the section
    alone) and ``correction.diff`` under ``out_dir``. Returns {"readme", "diff", "section"} paths."""
    out, file = Path(out_dir), repo_file(claim["source"]["file"])
    old = local_copy(claim).read_text()
    new = render_upstream(old, section, claim["source"].get("anchor"))
    return {
        "readme": str(_write(out / "README.md", new)),
        "diff": str(_write(out / "correction.diff", unified_diff(old, new, file))),
        "section": str(_write(out / "correction.md", section.strip("\n") + "\n")),
    }


# -- git -----------------------------------------------------------------------------------------


def _git(args: list[str], cwd: Path | None = None, check: bool = True) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "GIT_TERMINAL_PROMPT": "0",  # never wait for a password on a terminal nobody watches
        "GIT_AUTHOR_NAME": AUTHOR_NAME,
        "GIT_AUTHOR_EMAIL": AUTHOR_EMAIL,
        "GIT_COMMITTER_NAME": AUTHOR_NAME,
        "GIT_COMMITTER_EMAIL": AUTHOR_EMAIL,
    }
    proc = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    if check and proc.returncode != 0:
        detail = one_line(proc.stderr or proc.stdout)
        raise GitError(redact(f"git {args[0]} failed (exit {proc.returncode}): {detail}"))
    return proc


def push_branch(
    repo_url: str,
    branch: str,
    file_path_in_repo: str,
    new_text: str,
    message: str,
    base_ref: str | None = None,
    base_text: str | None = None,
) -> str:
    """Commit ``new_text`` as ``file_path_in_repo`` on ``branch`` and push it to ``repo_url``.

    The repository is cloned into a temporary folder. A new branch starts at ``base_ref`` (the
    revision the claims were read from; default the remote's default branch); if ``base_text``
    is given, the file there must equal it (the local copy), else the upstream changed and the
    correction would overwrite someone's edit. If the branch already exists on the remote, the
    commit goes on top of it, and nothing is committed when the file is already ``new_text``:
    publishing twice is harmless. The author is ``crashline <crashline@localhost>``.
    Returns the sha of the branch's head."""
    file_path_in_repo = repo_file(file_path_in_repo)
    not_an_option(repo_url, "source.git")
    not_an_option(branch, "publish.branch")
    not_an_option(base_ref, "source.revision")
    with tempfile.TemporaryDirectory(prefix="crashline-publish-") as tmp:
        work = Path(tmp) / "repo"
        _git(["clone", "--quiet", "--no-hardlinks", "--", repo_url, str(work)])
        existing = _git(["ls-remote", "--heads", "origin", branch], cwd=work).stdout.strip()
        if existing:
            _git(["checkout", "--quiet", "-B", branch, f"origin/{branch}"], cwd=work)
        else:
            start = base_ref or "HEAD"
            found = [
                ref
                for ref in (start, f"origin/{start}")
                if not _git(["rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"], cwd=work, check=False).returncode
            ]
            if not found:
                raise PublishError(redact(f"revision {start!r} is not in {repo_url}"))
            start = found[0]
            _git(["checkout", "--quiet", "-B", branch, start], cwd=work)
            target = inside(work, file_path_in_repo, "source.file")
            current = target.read_text() if target.exists() else ""
            if base_text is not None and current != base_text:
                raise PublishError(
                    f"{file_path_in_repo} at {start} in the remote differs from the local copy the correction was "
                    "made from: update source.local_copy (and source.revision) and publish again"
                )
        target = inside(work, file_path_in_repo, "source.file")  # a symbolic link of the upstream tree too
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(new_text)
        _git(["add", "--", file_path_in_repo], cwd=work)
        if _git(["diff", "--cached", "--quiet"], cwd=work, check=False).returncode:
            _git(["-c", "commit.gpgsign=false", "commit", "--quiet", "-m", message], cwd=work)
        if not existing or _git(["rev-parse", "HEAD"], cwd=work).stdout.strip() != existing.split()[0]:
            _git(["push", "--quiet", "origin", f"HEAD:refs/heads/{branch}"], cwd=work)
        return _git(["rev-parse", "HEAD"], cwd=work).stdout.strip()


# -- Hugging Face --------------------------------------------------------------------------------


def token_from(env: Mapping[str, str] | None = None) -> str | None:
    env = os.environ if env is None else env
    return next((env[k] for k in TOKEN_VARIABLES if env.get(k)), None)


def open_hf_pr(
    repo_id: str,
    path_in_repo: str,
    new_text: str,
    token: str | None,
    title: str,
    description: str = "",
    revision: str | None = None,
) -> str:
    """Open a pull request on the Hugging Face model repository ``repo_id`` that replaces
    ``path_in_repo`` by ``new_text``; returns its URL. Refuses without a token."""
    if not token:
        raise PublishError(
            f"publish.open_pr is on, but there is no Hugging Face token: set {TOKEN_VARIABLES[0]} in the environment "
            f"to open a pull request on {repo_id} (crashline never writes it anywhere)"
        )
    from huggingface_hub import CommitOperationAdd, HfApi

    parent = revision if revision and re.fullmatch(r"[0-9a-f]{40}", revision) else None
    try:
        info = HfApi(token=token).create_commit(
            repo_id=repo_id,
            repo_type="model",
            operations=[CommitOperationAdd(path_in_repo=path_in_repo, path_or_fileobj=new_text.encode())],
            commit_message=title,
            commit_description=description,
            create_pr=True,
            parent_commit=parent,
        )
    except Exception as exc:  # any failure of the hub, reported without the token
        said = one_line(f"{type(exc).__name__}: {exc}")
        raise PublishError(redact(f"pull request on {repo_id} failed: {said}", token)) from None
    return info.pr_url


# -- one claim, as the workflow's publish job runs it --------------------------------------------


def publish(
    claim: dict, section: str, out_dir: str | os.PathLike, options: dict, env: Mapping[str, str] | None = None
) -> dict:
    """Write the publication; push and open a pull request if ``options`` say so; write and
    return the record (``publish.json``) of what was done. A pull request that fails after the branch was
    pushed is recorded there (``complete`` False, the error), not raised: the push happened."""
    options = {"push": False, "open_pr": False, "branch": "crashline/correction", "dry_run": False, **(options or {})}
    source = claim["source"]
    paths = write_publication(claim, section, out_dir)
    new_text = Path(paths["readme"]).read_text()
    title = f"Speed table: re-measured under the settings each row states ({claim['model']})"
    message = (
        f"{title}\n\nThe correction section between the crashline:correction markers sets each published "
        "number beside a re-measurement under the settings its row states, and names the rows that differ "
        "in speed-relevant settings."
    )
    token = token_from(env)
    record = {
        "claim": claim["name"],
        "source": {"url": redact(source["url"]), "revision": source.get("revision"), "file": source["file"]},
        "dry_run": options["dry_run"] or not (options["push"] or options["open_pr"]),
        "files": paths,
        "push": None,
        "pull_request": None,
        "complete": True,
    }
    if options["dry_run"]:  # what would leave the machine, exactly, and nothing does
        record["would"] = {
            "push": {"remote": redact(source.get("git") or "(no source.git)"), "branch": options["branch"],
                     "file": source["file"], "base": source.get("revision"), "message": message}
            if options["push"] else None,
            "pull_request": {"repo": source.get("hf_repo") or "(no source.hf_repo)", "file": source["file"],
                             "title": title} if options["open_pr"] else None,
        }  # fmt: skip
        write_json(Path(out_dir) / "publish.json", record)
        return record
    if options["push"]:
        if not source.get("git"):
            raise PublishError(f"publish.push is on, but claims file {claim['path']} gives no source.git to push to")
        try:
            sha = push_branch(
                source["git"],
                options["branch"],
                source["file"],
                new_text,
                message,
                base_ref=source.get("revision"),
                base_text=local_copy(claim).read_text(),
            )
        except GitError as exc:  # nothing was pushed: what failed, and what to check
            raise PublishError(
                f"{claim['name']}: the push of branch {options['branch']} to {redact(source['git'])} failed: {exc}; "
                f"check source.git in {claim['path']} and that you may push there, then run publish again"
            ) from None
        record["push"] = {"remote": redact(source["git"]), "branch": options["branch"], "commit": sha}
    if options["open_pr"]:
        if not source.get("hf_repo"):
            raise PublishError(f"publish.open_pr is on, but claims file {claim['path']} gives no source.hf_repo")
        try:
            url = open_hf_pr(
                source["hf_repo"],
                source["file"],
                new_text,
                token,
                title,
                message.split("\n\n", 1)[1],
                revision=source.get("revision"),
            )
        except PublishError as exc:
            if record["push"] is None:
                raise  # nothing left the machine: the error alone
            # the branch is pushed: what was done is recorded, not lost with the error
            record.update(pull_request={"repo": source["hf_repo"], "error": str(exc)}, complete=False)
        else:
            record["pull_request"] = {"repo": source["hf_repo"], "url": url}
    write_json(Path(out_dir) / "publish.json", record)
    return record


def run(
    config: dict,
    configs_path: str | os.PathLike,
    measurements_path: str | os.PathLike,
    out_root: str | os.PathLike,
    only: str | None = None,
    out_dir: str | os.PathLike | None = None,
    env: Mapping[str, str] | None = None,
) -> list[dict]:
    """The ``publish`` verb: every claims file of the config (or ``only`` that one) into
    ``out_root/<name>/`` (or ``out_dir`` for a single one)."""
    import pandas as pd

    from .report import correction  # the section: pandas and the presentation, only when publishing

    claims = load_claims(config.get("claims") or [], config)
    if only is not None:
        claims = [c for c in claims if c["name"] == only]
        if not claims:
            names = ", ".join(c["name"] for c in load_claims(config.get("claims") or [], config))
            raise PublishError(f"no claims file named {only!r} in the config; claims are: {names or 'none'}")
    configs, measurements = pd.read_parquet(configs_path), pd.read_parquet(measurements_path)
    records = []
    for claim in claims:
        text = correction.section(claim, configs, measurements)
        target = Path(out_dir) if out_dir is not None and len(claims) == 1 else Path(out_root) / claim["name"]
        records.append(publish(claim, text, target, config.get("publish") or {}, env))
    return records


def said(record: dict) -> str:
    """What one claim's publish did, in one line: the files written, and what left the machine (the branch pushed,
    where and at which commit; the pull request), or that nothing did."""
    files = f"{record['files']['readme']} {record['files']['diff']}"
    would = record.get("would") or {}
    if would.get("push") or would.get("pull_request"):
        p, pr = would.get("push"), would.get("pull_request")
        sends = []
        if p:
            base = p["base"] or "its default branch"
            sends.append(f"push {p['file']} as branch {p['branch']} to {p['remote']} on top of {base}")
        if pr:
            sends.append(f"open a pull request on {pr['repo']} changing {pr['file']}: {pr['title']!r}")
        what = "; ".join(sends)
        return f"{record['claim']}: {files} (dry run: it would {what}, the change being {record['files']['diff']})"
    if record["dry_run"]:
        return f"{record['claim']}: {files} (dry run: nothing pushed; publish.push or publish.open_pr sends it)"
    done = []
    if record["push"]:
        p = record["push"]
        done.append(f"pushed branch {p['branch']} to {p['remote']} at {p['commit'][:12]}")
    pr = record["pull_request"] or {}
    if pr.get("url"):
        done.append(f"opened pull request {pr['url']}")
    return f"{record['claim']}: {files} ({'; '.join(done)})"


def incomplete(record: dict) -> str | None:
    """Why a claim's publish is not done (its branch pushed, its pull request failed), as one error line with
    what to do; None when it is done."""
    pr = record["pull_request"] or {}
    if record["complete"] or not pr.get("error"):
        return None
    p = record["push"]
    return (
        f"{record['claim']}: branch {p['branch']} was pushed to {p['remote']} at {p['commit'][:12]}, but the pull "
        f"request on {pr['repo']} failed: {pr['error']}; fix that and run publish again (the push is repeated "
        "harmlessly and the pull request tried again)"
    )
