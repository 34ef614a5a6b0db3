"""``hf:`` sources: a file of a Hugging Face repository, used where a hub cache on this machine has it (the cache
`hf download` and `llama-server -hf` fill) or downloaded there by huggingface_hub; the hub's LFS sha256 (the cached
blob's name) is the expected hash when the config gives none. crashline never changes that cache."""

from __future__ import annotations

import os
from pathlib import Path


from ..core import progress
from ..core.atomic import read_json, write_json
from ..config.source import SourceError
from . import verify as V


# --- hf:
#
# hf: sources live in the Hugging Face hub cache, the one `hf download`, huggingface_hub and `llama-server -hf` share
# (models--OWNER--REPO/blobs/<etag>, snapshots/<commit>/<path> links to the blobs, refs/<branch> = commit). A file
# there is used in place, without asking the hub; one that is not is downloaded there by huggingface_hub. crashline
# never changes a file of that cache: one that fails its check is refused and left as it is. A blob of an LFS (or
# Xet) file is named by the hub's sha256 of it, which is the expected hash when the config gives none; the bytes
# are hashed all the same (once: a sidecar under dest_dir/.hf-cache/ records the hash while the blob keeps its
# size and mtime).

HF_SIDECARS = ".hf-cache"  # under dest_dir: crashline's records of the files it verified in a hub cache


def hf_cache_dirs() -> list[Path]:
    """The hub caches an hf: file may already be in, read from the environment at each call.

    First huggingface_hub's own (where crashline downloads): ``HF_HUB_CACHE``, else ``HUGGINGFACE_HUB_CACHE``,
    else ``HF_HOME/hub``, else ``$XDG_CACHE_HOME/huggingface/hub``, else ``~/.cache/huggingface/hub``. Then
    ``LLAMA_CACHE`` when it is set: llama.cpp (common/hf-cache.cpp) keeps `-hf` downloads in the same layout
    there, and otherwise in the same folder as huggingface_hub."""
    env = os.environ
    home = env.get("HF_HOME") or os.path.join(
        env.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "huggingface"
    )
    hub = env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE") or os.path.join(home, "hub")
    dirs = [Path(os.path.expandvars(os.path.expanduser(hub)))]
    if env.get("LLAMA_CACHE"):
        llama = Path(os.path.expanduser(env["LLAMA_CACHE"]))
        if llama.resolve() != dirs[0].resolve():
            dirs.append(llama)
    return dirs


def _hf_offline() -> bool:
    import huggingface_hub.constants

    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.strip().upper() in ("1", "ON", "YES", "TRUE") or huggingface_hub.constants.HF_HUB_OFFLINE


def _repo_folder(cache: Path, repo: str) -> Path:
    return cache / ("models--" + repo.replace("/", "--"))


def fetch_hf(source: str, parsed: dict, dest_dir: Path, sha256: str | list[str] | None) -> tuple[list[dict], dict]:
    """Each file (shard) from a hub cache, downloaded there first if no cache has it, and verified.

    A file an earlier crashline downloaded into ``dest_dir`` and verified is used as before."""
    repo, revision = parsed["repo"], parsed["revision"]
    folder, _, first_name = parsed["path"].rpartition("/")
    names = V.all_shard_names(first_name)
    expected = V.expected_hashes(source, sha256, len(names))
    entries, found = [], []
    for name, want in zip(names, expected):
        filename = f"{folder}/{name}" if folder else name
        entry = V.reuse_verified(dest_dir / filename, want, "config")
        if entry is None:
            cached = _hf_cached(repo, filename, revision) or _hf_download(source, repo, filename, revision)
            entry = _verify_hf_cached(source, cached, filename, want, dest_dir)
            found.append(cached)
        entries.append(entry)
    details = {"repo": repo, "revision": revision}
    if found:
        details |= {"commit": found[0]["commit"], "hf_cache": str(found[0]["cache"])}
    return entries, details


def _hf_cached(repo: str, filename: str, revision: str | None) -> dict | None:
    """The file in a hub cache (its snapshot path, the cache, the commit, the blob's etag), without the network."""
    import huggingface_hub

    for cache in hf_cache_dirs():
        found = huggingface_hub.try_to_load_from_cache(repo, filename, cache_dir=cache, revision=revision)
        if isinstance(found, str):
            return _in_cache(Path(found), cache, repo, fetched=False)
    return None


def _in_cache(path: Path, cache: Path, repo: str, fetched: bool) -> dict:
    snapshots = _repo_folder(cache, repo) / "snapshots"
    commit = path.relative_to(snapshots).parts[0] if path.is_relative_to(snapshots) else None
    etag = None
    if path.is_symlink():
        target = Path(os.readlink(path))
        if target.parent.name == "blobs":  # named by the hub's etag: the sha256 of an LFS or Xet file
            etag = target.name.lower()
    return {"path": path, "cache": cache, "commit": commit, "etag": etag, "fetched": fetched}


def _hf_download(source: str, repo: str, filename: str, revision: str | None) -> dict:
    """Download into huggingface_hub's cache (its own resume, locks and layout); where it is."""
    import huggingface_hub

    cache = hf_cache_dirs()[0]
    if _hf_offline():
        looked = ", ".join(str(d) for d in hf_cache_dirs())
        raise SourceError(
            f"model source {source!r}: {filename} is not in the Hugging Face cache ({looked}) and HF_HUB_OFFLINE "
            f"is set; download it there (`hf download {repo} {filename}`) or unset HF_HUB_OFFLINE"
        )
    blobs = _repo_folder(cache, repo) / "blobs"
    before = _tree_bytes(blobs)
    try:
        with progress.watching(f"downloading {filename} from {repo} into {cache}", lambda: _tree_bytes(blobs) - before):
            found = huggingface_hub.hf_hub_download(
                repo, filename, revision=revision, cache_dir=cache, endpoint=os.environ.get("HF_ENDPOINT") or None
            )
    except Exception as e:
        raise SourceError(
            f"model source {source!r}: download of {filename} into the Hugging Face cache {cache} failed: "
            f"{type(e).__name__}: {e}"
        ) from None
    return _in_cache(Path(found), cache, repo, fetched=True)


def _hf_sidecar(dest_dir: Path, filename: str) -> Path:
    return dest_dir / HF_SIDECARS / f"{filename}.sha256"


def _hf_recorded(dest_dir: Path, filename: str, path: Path) -> dict | None:
    """crashline's record of the hash of a hub-cache file, if the file is still the one it hashed."""
    try:
        record = read_json(_hf_sidecar(dest_dir, filename))
        st = path.stat()
    except (OSError, ValueError):
        return None
    now = {"path": str(path), "blob": str(path.resolve()), "bytes": st.st_size, "mtime_ns": st.st_mtime_ns}
    return record if isinstance(record, dict) and all(record.get(k) == v for k, v in now.items()) else None


def _verify_hf_cached(source: str, cached: dict, filename: str, want: str | None, dest_dir: Path) -> dict:
    """The entry of a file in a hub cache once it is a whole GGUF with the expected sha256; else SourceError,
    naming the file, which stays as it is."""
    path, etag = cached["path"], cached["etag"]
    hub = etag if etag and V.SHA256_RE.match(etag) else None
    blob = path.resolve()
    revision = f" (revision {cached['commit']})" if cached["commit"] else ""
    where = f"{path} in the Hugging Face cache{revision}"
    kept = "the file is left as it is (crashline never changes the Hugging Face cache)"
    delete = f"delete it (`hf cache delete`, or remove {blob} and {path}) and fetch again"
    if want and hub and hub != want:  # cheap: the cache holds another file than the one configured
        raise SourceError(
            f"model source {source!r}: sha256 mismatch for {where}: expected {want} (the config's sha256), got "
            f"{hub} (the hub's sha256 of it, which names its blob): another file; {kept}; pin the source to the "
            f"revision that has {want} (...@REV), or set the model's sha256 to {hub} if that is the right file"
        )
    origin = "config" if want else ("hub metadata" if hub else "computed")
    want = want or hub
    V.check_gguf(source, path, f"{where}: {kept}; {delete}")
    record = _hf_recorded(dest_dir, filename, path)
    if record is not None and (want is None or record.get("sha256") == want):
        actual = record["sha256"]
    else:
        actual = V.sha256_file(path)
        if want is not None and actual != want:
            if origin == "hub metadata":
                raise SourceError(
                    f"model source {source!r}: {where} is corrupt: its sha256 is {actual}, but huggingface_hub "
                    f"stored it as the hub's sha256 {want} (the name of its blob); {kept}; {delete}"
                )
            raise SourceError(
                f"model source {source!r}: sha256 mismatch for {where}: expected {want} ({V.ORIGINS[origin]}), got "
                f"{actual}; {kept}; if {actual} is the right hash, set the model's sha256 to it, otherwise {delete}"
            )
        st = path.stat()
        record = {"path": str(path), "blob": str(blob), "bytes": st.st_size, "mtime_ns": st.st_mtime_ns}
        try:
            write_json(_hf_sidecar(dest_dir, filename), {**record, "sha256": actual, "verified_against": origin})
        except OSError:  # hashed again next time
            pass
    return V.file_entry(path, actual, origin if want else "computed", fetched=cached["fetched"])


def _tree_bytes(folder: Path) -> int:
    """The bytes of every file under ``folder`` (what a download into it has written so far)."""
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else 0
