"""What a GGUF model is: its shape, its quantisation and where its bytes are.

``inspect_gguf`` reads only the header (metadata and tensor infos; no tensor data) and returns a
JSON-serialisable dict. It reads the header itself, as llama.cpp's loader does, leaving out what it does
not need (a vocabulary's strings become their count): gemma-3's 262K-token vocabulary took gguf-py's
reader 16 s, this under a second. For split models
(``NAME-00001-of-00003.gguf``) the first shard's ``split.count`` names how many shards follow; the
tensors of every shard are counted.

``required_size`` reads a GGUF's header the way llama.cpp's loader does and returns the size the
file must have to hold the data of every tensor; ``check_complete`` raises ``ManifestError`` when a
file (or a shard) is shorter than that, its header is cut, or it is not a GGUF at all.
"""

from __future__ import annotations

import mmap
import re
import struct
from collections import Counter
from pathlib import Path
from typing import Any

import gguf
from ..core.errors import CrashlineError

SPLIT_RE = re.compile(r"^(?P<stem>.+)-(?P<index>\d{5})-of-(?P<count>\d{5})\.gguf$")
GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
# struct formats of GGUF metadata value types; 8 (string) and 9 (array) have a variable size.
VALUE_FORMATS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
VALUE_SIZES = {t: struct.calcsize(f) for t, f in VALUE_FORMATS.items()}
STRING, ARRAY, UINT32 = 8, 9, 4
ARRAY_KEPT = 4096  # a numeric array up to this long is read (per-layer values); a longer one becomes its length


class ManifestError(CrashlineError):
    """A file is not a whole, readable GGUF; the message names the file and what is wrong with it."""


class _Cut(Exception):
    """The header asks for bytes beyond the end of the file (``needed``: where that read ends)."""

    def __init__(self, needed: int):
        super().__init__(needed)
        self.needed = needed


class _Header:
    """A bounds-checked cursor over the bytes of a GGUF file."""

    def __init__(self, data: mmap.mmap | bytes, order: str = "<"):
        self.data, self.pos, self.order = data, 0, order

    def unpack(self, fmt: str) -> Any:
        size = struct.calcsize(self.order + fmt)
        self.skip(size)
        return struct.unpack_from(self.order + fmt, self.data, self.pos - size)[0]

    def skip(self, n: int) -> None:
        if self.pos + n > len(self.data):
            raise _Cut(self.pos + n)
        self.pos += n

    def string(self) -> str:
        n = self.unpack("Q")
        self.skip(n)
        return bytes(self.data[self.pos - n : self.pos]).decode("utf-8", "replace")

    def value(self, vtype: int) -> Any:
        """Read one metadata value: a number, a bool, a string, or an array: a list of its numbers (up to
        ``ARRAY_KEPT``), else its length (an array of strings, a vocabulary, is always its length)."""
        if vtype == STRING:
            return self.string()
        if vtype == ARRAY:
            item_type, count = self.unpack("I"), self.unpack("Q")
            if item_type in VALUE_SIZES:
                size = count * VALUE_SIZES[item_type]
                self.skip(size)
                if count > ARRAY_KEPT:
                    return count
                return list(
                    struct.unpack_from(f"{self.order}{count}{VALUE_FORMATS[item_type]}", self.data, self.pos - size)
                )
            for _ in range(count):
                if item_type == STRING:
                    self.skip(self.unpack("Q"))
                else:
                    self.value(item_type)
            return count
        if vtype in VALUE_FORMATS:
            return self.unpack(VALUE_FORMATS[vtype])
        raise ValueError(f"unknown metadata value type {vtype}")


def _tensor_nbytes(name: str, dims: list[int], tensor_type: int) -> int:
    try:
        block, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(tensor_type)]
    except (ValueError, KeyError):
        raise ValueError(f"tensor {name!r} has unknown type {tensor_type}") from None
    n = 1
    for d in dims:
        n *= d
    return n // block * type_size


def _parse(h: _Header) -> dict:
    """Parse the header at ``h`` (after the magic): its metadata, its tensors (name, type, bytes) and where the
    last tensor's data ends."""
    version = h.unpack("I")
    if version & 0xFFFF == 0:  # written on a big-endian machine
        h.order, version = ">", struct.unpack(">I", struct.pack("<I", version))[0]
    if version < 2:
        raise ValueError(f"GGUF version {version} is not supported")
    n_tensors, n_kv = h.unpack("Q"), h.unpack("Q")
    kv: dict[str, Any] = {}
    for _ in range(n_kv):
        key, vtype = h.string(), h.unpack("I")
        kv[key] = h.value(vtype)
    alignment = kv.get("general.alignment") or DEFAULT_ALIGNMENT
    tensors = []
    for _ in range(n_tensors):
        name = h.string()
        dims = [h.unpack("Q") for _ in range(h.unpack("I"))]
        tensor_type, offset = h.unpack("I"), h.unpack("Q")
        tensors.append(
            {"name": name, "type": tensor_type, "offset": offset, "n_bytes": _tensor_nbytes(name, dims, tensor_type)}
        )
    start = -(-h.pos // alignment) * alignment
    end = max((start + t["offset"] + t["n_bytes"] for t in tensors), default=h.pos)
    return {"kv": kv, "tensors": tensors, "data_end": end}


def read_header(path: Path) -> dict:
    """The header of the GGUF at ``path`` (``_parse``). ManifestError if the file is not a GGUF, its header is cut
    or cannot be parsed.
    """
    path = Path(path)
    with open(path, "rb") as f:
        size = path.stat().st_size
        head = f.read(4)
        if head != GGUF_MAGIC:
            raise ManifestError(f"{path} is not a GGUF file (it starts with {head!r}, not {GGUF_MAGIC!r})")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            h = _Header(data)
            h.skip(4)
            try:
                return _parse(h)
            except _Cut as cut:
                raise ManifestError(
                    f"{path} is cut short: it has {size} bytes but its GGUF header alone needs "
                    f"at least {cut.needed} bytes"
                ) from None
            except (ValueError, struct.error) as e:
                raise ManifestError(f"{path} has a GGUF header that cannot be read ({e})") from None


def required_size(path: Path) -> int:
    """The size ``path`` must have, by its header, to hold every tensor's data (ManifestError as ``read_header``)."""
    return read_header(path)["data_end"]


def check_complete(path: Path, header: dict | None = None) -> None:
    """ManifestError unless ``path`` is a GGUF whose file holds all the tensor data its header declares."""
    path = Path(path)
    needed, size = (header or read_header(path))["data_end"], path.stat().st_size
    if size < needed:
        raise ManifestError(
            f"{path} is truncated: it has {size} bytes but its header says the tensor data ends at {needed} bytes"
        )


def shard_paths(path: Path, count: int) -> list[Path]:
    """The paths of all ``count`` shards of the split model whose first shard is ``path``."""
    m = SPLIT_RE.match(path.name)
    if count <= 1:
        return [path]
    if not m:
        raise ValueError(f"{path}: split.count is {count} but the name is not NAME-00001-of-{count:05d}.gguf")
    return [path.with_name(name) for name in shard_names(m["stem"], count)]


def shard_names(stem: str, count: int) -> list[str]:
    """llama.cpp's names of a split model's shards: ``STEM-00001-of-00003.gguf`` ..."""
    return [f"{stem}-{i:05d}-of-{count:05d}.gguf" for i in range(1, count + 1)]


# The sliding-window layout llama.cpp 11434 gives each architecture that has one, where the GGUF does not
# say (its ``load_swa_pattern(ml, n, dense_first)`` calls): every n-th layer attends to the whole context,
# the last of each n (the first, where dense_first), the others to the window.
SWA_PATTERNS: dict[str, tuple[int, bool]] = {
    "gemma2": (2, False),
    "gemma3": (6, False),
    "gemma-embedding": (6, False),
    "gpt-oss": (2, False),
    "cohere2": (4, False),
    "cohere2moe": (4, True),
    "exaone-moe": (4, False),
    "afmoe": (4, False),
    "olmo2": (4, False),
    "plamo3": (8, False),
    "smallthinker": (4, True),
    "laguna": (4, True),
    "mellum": (4, False),
    "muse-glimmer": (4, False),
}


def swa_layers(arch: str | None, layers: int, window: int, pattern: Any) -> list[int] | None:
    """The layers that attend to a sliding window only, as llama.cpp decides: ``[]`` without a window, the
    GGUF's own ``sliding_window_pattern`` (one bool per layer, or a period) where it has one, else the
    architecture's layout; ``None`` where the model has a window but this table does not know its layout
    (the planner then counts every layer at full size, an upper bound)."""
    if window <= 0:
        return []
    if isinstance(pattern, list):
        return [i for i, swa in enumerate(pattern[:layers]) if swa]
    period, dense_first = SWA_PATTERNS.get(arch or "", (None, False))
    if isinstance(pattern, int) and not isinstance(pattern, bool):
        period = pattern
    if period is None:
        return None
    if period == 0:
        return list(range(layers))
    if dense_first:
        return [i for i in range(layers) if i % period != 0]
    return [i for i in range(layers) if i % period < period - 1]


def _per_layer(value: Any) -> list[int] | int | None:
    """Some architectures store per-layer arrays (e.g. head_count_kv); keep them as lists."""
    if isinstance(value, list):
        return [int(v) for v in value]
    return None if value is None else int(value)


def _type_name(tensor_type: int) -> str:
    try:
        return gguf.GGMLQuantizationType(tensor_type).name
    except ValueError:
        return f"type{int(tensor_type)}"


def _file_type_name(value: Any) -> str | None:
    if value is None:
        return None
    try:
        name = gguf.LlamaFileType(int(value)).name
    except ValueError:
        return f"file_type{int(value)}"
    return name.removeprefix("MOSTLY_").removeprefix("ALL_")


def _header(path: Path) -> dict:
    """The header of a GGUF checked whole first; ManifestError names the file if it cannot be read."""
    try:
        header = read_header(path)
        check_complete(path, header)
        return header
    except ManifestError as e:
        raise ManifestError(f"{e}; fetch the model again (crashline fetch)") from None


def inspect_gguf(path: Path) -> dict[str, Any]:
    """Architecture, shape, quantisation and byte breakdown of the GGUF model at ``path``.

    ``kv_bytes_per_token_f16`` is the size of one token's K and V cache at f16 over all layers:
    ``sum over layers of n_head_kv * (key_length + value_length) * 2 bytes``, which for uniform
    layers and key_length == value_length == head_dim is ``2 * layers * n_head_kv * head_dim * 2``.
    Sliding-window layers keep fewer cells: ``sliding_window`` and ``swa_layers`` say which (see
    ``swa_layers``), and the planner counts them. It ignores architectures whose cache is not plain K/V
    (MLA, recurrent), so read it as the upper bound there.
    """
    path = Path(path)
    first = _header(path)
    kv = first["kv"]
    split_count = int(kv.get("split.count", 1))
    paths = shard_paths(path, split_count)
    headers = [first] + [_header(p) for p in paths[1:]]

    arch = kv.get("general.architecture")

    def key(name: str) -> Any:
        return kv.get(f"{arch}.{name}")

    layers = int(key("block_count") or 0)
    n_embd = _per_layer(key("embedding_length"))
    n_head = _per_layer(key("attention.head_count"))
    n_head_kv = _per_layer(key("attention.head_count_kv"))
    if n_head_kv is None:
        n_head_kv = n_head
    key_length = key("attention.key_length")
    value_length = key("attention.value_length")
    head_dim = None
    if key_length is not None:
        head_dim = int(key_length)
    elif isinstance(n_embd, int) and isinstance(n_head, int) and n_head:
        head_dim = n_embd // n_head
    key_length = int(key_length) if key_length is not None else head_dim
    value_length = int(value_length) if value_length is not None else head_dim

    tensor_types: Counter[str] = Counter()
    per_layer = [
        {"layer": i, "expert_bytes": 0, "shared_expert_bytes": 0, "other_bytes": 0, "expert_tensor_bytes": {}}
        for i in range(layers)
    ]
    embedding_bytes = output_bytes = other_bytes = 0
    n_tensors = 0
    for header in headers:
        for t in header["tensors"]:
            n_tensors += 1
            nbytes = t["n_bytes"]
            tensor_types[_type_name(t["type"])] += nbytes
            m = re.match(r"^blk\.(\d+)\.(.+)$", t["name"])
            if m and int(m[1]) < layers:
                row = per_layer[int(m[1])]
                part = m[2]
                if "_shexp" in part:
                    row["shared_expert_bytes"] += nbytes
                elif "_exps" in part:
                    row["expert_bytes"] += nbytes
                    # each expert tensor's own bytes (up, gate, down, or a fused gate_up), for a placement that
                    # keeps part of a layer's experts on the CPU (planner.Partial)
                    kind = re.match(r"ffn_([a-z_]+?)_(?:ch)?exps", part)
                    if kind:
                        split = row["expert_tensor_bytes"]
                        split[kind[1]] = split.get(kind[1], 0) + nbytes
                else:
                    row["other_bytes"] += nbytes
            elif t["name"].startswith("token_embd."):
                embedding_bytes += nbytes
            elif t["name"].startswith(("output.", "output_norm.")):
                output_bytes += nbytes
            else:
                other_bytes += nbytes

    vocab = key("vocab_size")
    if vocab is None:
        vocab = kv.get("tokenizer.ggml.tokens")  # the length of the token list
    # general.file_type names the quantisation ("Q4_K_M"); without it, the tensor type holding most bytes.
    file_type = _file_type_name(kv.get("general.file_type"))
    file_type_from = "general.file_type"
    if file_type is None:
        file_type = max(tensor_types, key=tensor_types.get) if tensor_types else None
        file_type_from = "most common tensor type"

    window = int(key("attention.sliding_window") or 0)
    kv_heads = n_head_kv if isinstance(n_head_kv, list) else [n_head_kv or 0] * layers
    kv_bytes_per_token = sum(h * ((key_length or 0) + (value_length or 0)) * 2 for h in kv_heads[:layers])

    return {
        "path": str(path),
        "files": [str(p) for p in paths],
        "architecture": arch,
        "name": kv.get("general.name"),
        "layers": layers,
        "n_embd": n_embd,
        "n_head": n_head,
        "n_head_kv": n_head_kv,
        "head_dim": head_dim,
        "n_expert": int(key("expert_count") or 0),
        "n_expert_used": int(key("expert_used_count") or 0),
        "expert_ffn": _per_layer(key("expert_feed_forward_length")),
        "context_length": _per_layer(key("context_length")),
        "vocab": int(vocab) if vocab is not None else None,
        "file_type": file_type,
        "quantisation": file_type,
        "file_type_from": file_type_from,
        "total_bytes": sum(p.stat().st_size for p in paths),
        "tensor_bytes": sum(tensor_types.values()),
        "n_tensors": n_tensors,
        "per_layer": per_layer,
        "embedding_bytes": embedding_bytes,
        "output_bytes": output_bytes,
        "other_bytes": other_bytes,
        "tensor_types": dict(sorted(tensor_types.items(), key=lambda kv_: -kv_[1])),
        "kv_bytes_per_token_f16": kv_bytes_per_token,
        "sliding_window": window or None,
        "swa_layers": swa_layers(arch, layers, window, key("attention.sliding_window_pattern")),
    }
