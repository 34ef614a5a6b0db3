"""A model's ``source`` string, parsed and checked without fetching anything (``crashline.models.sources``
fetches; this light part is what a config check needs: no HTTP client, no GGUF reader)."""

from __future__ import annotations

import re
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
