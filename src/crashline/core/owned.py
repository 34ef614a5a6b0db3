"""Folders crashline writes into are the user's own: nobody else can make its writes land elsewhere.

A results folder (``results_dir``), ``tune --out``, ``recheck --out`` and ``compare --out`` are walked from ``/``
one name at a time, as the kernel walks them, without following anything unchecked (``lstat``): each folder passed
through must be the user's or root's, and where others may write to it, sticky (as /tmp), so that nobody can rename
what the walk passes through or plant a link there; a symbolic link is followed only when the user or root made it.
The folder itself must be the user's (or root's) and writable by nobody else; missing folders are made on the way
(0755 at most, less as the umask says). Inside a results folder, ``.crashline/`` (whose config.json every job
reads) must be a folder of the same kind, never a link. This is the rule the lock folder follows (core.locks).

Group write is "others" unless the group is the owner's private group (named as the owner, the owner's primary
group, no other member): the usual umask 002 of such systems makes every folder group-writable and lets no one in.
"""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
import stat
from pathlib import Path

from .errors import CrashlineError

MAX_LINKS = 40  # as the kernel's limit on links followed in one path


class UnsafeFolderError(CrashlineError, ValueError):
    """A folder another user could swap or make crashline write through; the message says which, why and the fix."""


class OutIsInputError(CrashlineError, ValueError):
    """An output folder that is, holds or lies inside one of the verb's inputs: writing it would change them."""


def _who(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _private_group(st: os.stat_result) -> bool:
    """Whether the folder's group is its owner's own: the owner's primary group, of the owner's name, no other
    member."""
    try:
        owner, group = pwd.getpwuid(st.st_uid), grp.getgrgid(st.st_gid)
    except KeyError:
        return False
    return owner.pw_gid == st.st_gid and group.gr_name == owner.pw_name and set(group.gr_mem) <= {owner.pw_name}


def _others_may_write(st: os.stat_result) -> bool:
    return bool(st.st_mode & stat.S_IWOTH) or bool(st.st_mode & stat.S_IWGRP) and not _private_group(st)


def _unsafe(folder: Path, st: os.stat_result, last: bool, what: str) -> tuple[str, str] | None:
    """Why one folder of the walk is unsafe, and the fix; None if it is safe. ``last``: the folder crashline writes
    into, else one it passes through."""
    if not stat.S_ISDIR(st.st_mode):
        return f"{folder} is not a folder", f"remove it or give another {what}"
    if st.st_uid not in (os.getuid(), 0):
        return f"{folder} belongs to {_who(st.st_uid)}, who could swap what crashline writes there", (
            f"give a {what} in a folder of your own"
        )
    if _others_may_write(st) and (last or not st.st_mode & stat.S_ISVTX):
        mode = f"mode {stat.S_IMODE(st.st_mode):o}"
        if last:
            return f"{folder} is writable by others ({mode})", f"chmod go-w {folder}, or give a folder of your own"
        return f"{folder} is writable by others ({mode}) without the sticky bit, so they could swap what it holds", (
            f"chmod go-w {folder} (or +t), or give a {what} elsewhere"
        )
    return None


def own_folder(path: str | os.PathLike, what: str, create: bool = True) -> Path:
    """The folder ``path`` (given as option or key ``what``), made where missing unless ``create`` is False, once
    every folder on the way and the folder itself are safe to write through (the module's rule); its real path.
    Refused with UnsafeFolderError naming ``what``, the path, the owner or mode found and the fix. With ``create``
    False, what is missing is only checked as far as it exists."""

    def check(folder: Path, st: os.stat_result, last: bool) -> None:
        if found := _unsafe(folder, st, last, what):
            raise UnsafeFolderError(f"{what} {path}: {found[0]}; {found[1]} (nothing was written there)")

    todo = list(Path(os.path.abspath(Path(path).expanduser())).parts[1:])
    current = Path("/")
    links = 0
    check(current, os.lstat(current), False)
    while todo:
        name = todo.pop(0)
        if name in ("", "."):
            continue
        if name == "..":
            current = current.parent  # the folder walked into is a real one: its parent is the kernel's ".."
            continue
        step = current / name
        try:
            st = os.lstat(step)
        except FileNotFoundError:
            if not create:
                return Path(os.path.normpath(current.joinpath(name, *todo)))
            with contextlib.suppress(FileExistsError):
                os.mkdir(step, 0o755)  # in a folder just found safe; never more than the owner may write
            st = os.lstat(step)
        if stat.S_ISLNK(st.st_mode):
            if st.st_uid not in (os.getuid(), 0):
                raise UnsafeFolderError(
                    f"{what} {path}: {step} is a symbolic link of {_who(st.st_uid)}, who could point crashline's "
                    f"writes anywhere; give a {what} that does not pass through it (nothing was written there)"
                )
            links += 1
            if links > MAX_LINKS:
                raise UnsafeFolderError(f"{what} {path}: more than {MAX_LINKS} symbolic links; give its real path")
            target = os.readlink(step)
            if os.path.isabs(target):
                current = Path("/")
            todo = [p for p in Path(target).parts if p != "/"] + todo
            continue
        if todo:  # the last folder is checked once, as the one written into, below
            check(step, st, False)
        current = step
    check(current, os.lstat(current), True)
    return current


def own_results(path: str | os.PathLike, what: str = "results_dir", create: bool = True) -> Path:
    """A results folder (``own_folder``) and its ``.crashline/`` (the effective config every job reads), which must
    be a folder of the user's that nobody else may write to, never a symbolic link; made where missing."""
    root = own_folder(path, what, create)
    inner = root / ".crashline"
    try:
        st = os.lstat(inner)
    except FileNotFoundError:
        if not create:
            return root
        with contextlib.suppress(FileExistsError):
            os.mkdir(inner, 0o755)
        st = os.lstat(inner)
    anew = f"remove {inner}; crashline makes it anew"
    if stat.S_ISLNK(st.st_mode):
        found = (f"{inner} is a symbolic link (to {os.readlink(inner)})", anew)
    elif found := _unsafe(inner, st, True, what):
        found = (found[0], f"chmod go-w {inner}" if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() else anew)
    if found:
        raise UnsafeFolderError(f"{what} {path}: {found[0]}; {found[1]} (nothing was written there)")
    return root


def _real(path: str | os.PathLike) -> Path:
    return Path(path).expanduser().resolve()


def outside_inputs(out: str | os.PathLike, what: str, inputs: list[str | os.PathLike]) -> None:
    """Refuse an output folder ``out`` (option ``what``) that is, holds or lies inside one of ``inputs`` (both
    resolved): writing there would change or delete what the inputs hold (a report's figures)."""
    mine = _real(out)
    for given in inputs:
        theirs = _real(given)
        if mine == theirs:
            how = "is"
        elif theirs in mine.parents:
            how = "lies inside"
        elif mine in theirs.parents:
            how = "holds"
        else:
            continue
        raise OutIsInputError(
            f"{what} {out}: {how} the input {given} ({theirs}), whose files it would overwrite or delete; "
            f"give a {what} outside every input"
        )
