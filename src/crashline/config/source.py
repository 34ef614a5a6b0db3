"""A model's ``source`` string, parsed and checked without fetching anything (``crashline.models.sources``
fetches; this light part is what a config check needs: no HTTP client, no GGUF reader)."""

from __future__ import annotations

import hashlib
import re
from pathlib import PurePosixPath
from typing import Any
from urllib.parse import unquote, urlsplit
from ..core.errors import CrashlineError

DIST_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$")
VERSION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.+!_-]*$")
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class SourceError(CrashlineError):
    """A model could not be obtained or verified; the message names the source and what is wrong."""


def parse_source(spec: str) -> dict[str, Any]:
    """Validate a source string and split it into its parts (``kind`` plus kind-specific keys)."""
    if not isinstance(spec, str) or not spec.strip():
        raise SourceError(f"model source {spec!r}: empty or not a string")
    if spec.startswith("pypi:"):
        dist, _, version = spec[5:].partition("==")
        if not DIST_RE.match(dist):
            raise SourceError(f"model source {spec!r}: {dist!r} is not a PyPI distribution name")
        if _ and not VERSION_RE.match(version):
            raise SourceError(f"model source {spec!r}: {version!r} is not a version")
        return {"kind": "pypi", "dist": dist, "version": version or None}
    if spec.startswith("hf:"):
        rest, revision = spec[3:], None
        if "@" in rest:
            rest, revision = rest.rsplit("@", 1)
            if not revision:
                raise SourceError(f"model source {spec!r}: empty revision after '@'")
        parts = rest.split("/")
        if len(parts) < 3 or not all(parts) or not parts[-1].endswith(".gguf"):
            raise SourceError(f"model source {spec!r}: expected hf:OWNER/REPO/PATH/IN/REPO.gguf[@REVISION]")
        return {"kind": "hf", "repo": "/".join(parts[:2]), "path": "/".join(parts[2:]), "revision": revision}
    if spec.startswith(("https://", "http://")):
        url = urlsplit(spec)
        name = unquote(url.path.rsplit("/", 1)[-1])
        if not url.netloc or not name:
            raise SourceError(f"model source {spec!r}: a URL must name a host and a file")
        return {"kind": "url", "url": spec, "name": name}
    if spec.startswith("file:"):
        path = spec[5:]
        if path.startswith("//"):  # file:///abs/path
            path = path[2:]
        if not path:
            raise SourceError(f"model source {spec!r}: no path after 'file:'")
        return {"kind": "file", "path": path}
    if spec.startswith("synthetic:"):
        name = spec[10:]
        if not NAME_RE.match(name):
            raise SourceError(f"model source {spec!r}: {name!r} is not a plain file name")
        return {"kind": "synthetic", "name": name}
    raise SourceError(
        f"model source {spec!r}: unknown kind; expected pypi:, hf:, https://, http://, file: or synthetic:"
    )


NAME_HASH_CHARS = 8  # hex digits of sha256 of the file name: a name's suffix where its characters had to go


def model_name(source: str) -> str:
    """A model's name in a config, from its source's file name (``tune``): what a folder and a Snakemake wildcard
    may hold (NAME_RE: ASCII letters, digits, '.', '_', '-'). A file name of those characters alone is the name
    (``Qwen3-30B-A3B-Q4_K_M.gguf``: ``Qwen3-30B-A3B-Q4_K_M``). Any other file name loses characters on the way
    (``模型.gguf``, ``модель.gguf``, ``my model.gguf``), so the name keeps what is left (``model`` where nothing
    is) and adds the first NAME_HASH_CHARS hex digits of the sha256 of the whole file name: two files whose names
    differ stay two models (both were ``model``, and the second run's records replaced the first's), and the same
    file is the same model in every run."""
    rest = source.split(":", 1)[1] if ":" in source else source
    if source.startswith(("https://", "http://")):
        rest = unquote(urlsplit(source).path)  # the file's own name, not its percent-escapes
    stem = PurePosixPath(rest.split("@")[0]).name.removesuffix(".gguf")
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", stem).strip("-.")
    if slug and slug == stem:
        return slug
    digest = hashlib.sha256(stem.encode("utf-8", "surrogateescape")).hexdigest()[:NAME_HASH_CHARS]
    return f"{slug or 'model'}-{digest}"
