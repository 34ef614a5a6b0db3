"""Atomic writes: a final name only ever holds a complete file, readable as the umask says."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any
from collections.abc import Iterator

from .errors import CrashlineError


def current_umask() -> int:
    """The process's umask, read from /proc (Linux >= 4.7) without changing it; elsewhere set and restored."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o077)  # the restrictive value, should another thread create a file meanwhile
    os.umask(mask)
    return mask


def new_file_mode() -> int:
    """The mode open() would give a new file: 0o666 less the umask (mkstemp's 0600 is only for the temp)."""
    return 0o666 & ~current_umask()


FULL = (errno.ENOSPC, errno.EDQUOT)


def named(exc: OSError, path: Path) -> OSError:
    """A full disk's error with the file it was writing and what to do ("No space left on device" alone names
    neither); other errors as they are."""
    if exc.errno in FULL:
        return OSError(exc.errno, f"{exc.strerror} writing {path}: free space in {path.parent}, or write elsewhere")
    return exc


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it onto ``path`` only if the block succeeds."""
    final = Path(path)
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".part", dir=final.parent)
    except OSError as exc:
        raise named(exc, final) from None
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        os.chmod(tmp_path, new_file_mode())
        os.replace(tmp_path, final)
    except OSError as exc:
        if exc.errno in FULL:
            raise named(exc, final) from exc
        raise
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


class UnsafeFileError(CrashlineError, ValueError):
    """An output path that is a symbolic link or no plain file: nothing is written through it."""


def open_output(path: str | os.PathLike, append: bool = False, binary: bool = False):
    """``path`` opened for writing (appending with ``append``) as open() would, made as the umask says (0644 under
    022), except that a symbolic link there is never followed (O_NOFOLLOW) and anything but a plain file of one link
    is refused: what is written lands in that file, not in one another user pointed it at. For what is written
    as it goes (a log); a whole file at once is ``atomic_path``'s."""
    path = Path(path)
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | (os.O_APPEND if append else 0)
    try:
        fd = os.open(path, flags, 0o666)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafeFileError(f"{path} is a symbolic link; remove it (nothing was written through it)") from None
        if exc.errno == errno.ENXIO:  # a FIFO nobody reads
            raise UnsafeFileError(f"{path} is not a plain file; remove it (nothing was written to it)") from None
        raise named(exc, path) from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
        os.close(fd)
        raise UnsafeFileError(f"{path} is not a plain file of one link; remove it (nothing was written to it)")
    os.set_blocking(fd, True)
    if not append:
        os.ftruncate(fd, 0)
    return os.fdopen(fd, ("a" if append else "w") + ("b" if binary else ""))


def write_json(path: str | os.PathLike, obj: Any) -> None:
    """Write ``obj`` as indented JSON to ``path`` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")


def read_json(path: str | os.PathLike) -> Any:
    return json.loads(Path(path).read_text())
