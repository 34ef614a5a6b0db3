"""Read a llama-server log (run with ``-lv 4``) and say where memory went and what happened.

``parse_log`` extracts placement facts (buffers, layers, context settings, the exit memory
breakdown); ``classify`` turns the log plus the exit status into an outcome; ``summarize`` does
both for a log file whose exit status is unknown (the ``parse-log`` CLI verb).

The line shapes matched here come from real logs in ``tests/fixtures/`` (llama.cpp build
11434, CUDA and CPU). Only the stdlib is used.
"""

from __future__ import annotations

import os
import re
import signal
import stat
from pathlib import Path

from ..core.records import Outcome
from .hostmem import OOM_MARK
from ..core.errors import CrashlineError

TAIL_LINES = 40

# "0.01.379.033 E " -- elapsed time and level letter, printed with -lv >= 1 timestamps.
PREFIX_RE = re.compile(r"^\s*\d+(?:\.\d+){3}\s+[A-Z]\s+")
LEVEL_E_RE = re.compile(r"^\s*\d+(?:\.\d+){3}\s+E\s+")
# Frames of a glibc backtrace: "/path/lib.so.0(+0x329fb)[0x7f..]" or "llama-server(+0x..)[0x..]".
BACKTRACE_RE = re.compile(r"\(.*\)\s*\[0x[0-9a-f]+\]\s*$")

# --- placement ---------------------------------------------------------------------------------
BUFFER_RE = re.compile(r":\s+(?P<device>\S+)\s+(?P<kind>\w+) buffer size\s*=\s*(?P<mib>[\d.]+) MiB")
# Buffers in the machine's RAM, not on an accelerator: CPU, CPU_Mapped (the mmap'd file), CPU_REPACK, AMX, and
# the pinned host memory of a GPU backend (CUDA_Host holds the CPU's weights when mmap is off).
HOST_BUFFER_RE = re.compile(r"^(?:CPU\w*|\w+_Host|AMX)$")
# iSWA models (e.g. Gemma 3) report two KV buffers per device: "creating [non-]SWA KV cache" precedes each.
SWA_KV_RE = re.compile(r"creating\s+(non-)?SWA KV cache")
OFFLOADED_RE = re.compile(r"offloaded (\d+)/(\d+) layers to GPU")
CONTEXT_PARAM_RE = re.compile(r"llama_context:\s+(\w+)\s+=\s+(\S+)\s*$")
SLOTS_RE = re.compile(r"initializing, n_slots = (\d+), n_ctx_slot = (\d+)")
# a speculative draft model's load (common/speculative.cpp): its tensors, KV cache and compute buffer follow, each
# printed as the model's were, until the server initialises its slots
DRAFT_LOAD_RE = re.compile(r"loading draft model '")
THREADS_RE = re.compile(r"system_info: n_threads = (\d+) \(n_threads_batch = (\d+)\)")
KV_TYPES_RE = re.compile(r"K \((\w+)\):\s*[\d.]+ MiB, V \((\w+)\):\s*[\d.]+ MiB")
BUILD_RE = re.compile(r"\bbuild:?\s+(\d+ \(.*)$")
FA_RESOLVED_RE = re.compile(r"Flash Attention (enabled|disabled)")
# device_info block: "  - CUDA0   : NVIDIA H200 (143155 MiB, 11237 MiB free)"
DEVICE_INFO_RE = re.compile(r"-\s+(\S+)\s+:\s+(.*?)\s+\((\d+) MiB, (\d+) MiB free\)\s*$")
# "using device CUDA0 (NVIDIA H200) (0000:00:06.0) - 11237 MiB free"
USING_DEVICE_RE = re.compile(r"using device (\S+) \((.*?)\)(?: \(.*?\))? - (\d+) MiB free")
# --fit on's placement per device, printed at each of its steps (the last is the one it loads):
# "common_params_fit_impl:   - CUDA0 (NVIDIA H200): 49 layers (19 overflowing),  30021 MiB used,   1184 MiB free"
FIT_PLACED_RE = re.compile(r"common_params_fit_impl:\s+-\s+(\S+) \(.*\):\s+\d+ layers.*,\s+(-?\d+) MiB free\s*$")

# memory breakdown table printed at exit (common_/llama_memory_breakdown_print):
#   | memory breakdown [MiB] | total free self model context compute unaccounted |
#   |   - CUDA0 (H200)       | 143155 = 465 + (10563 = 7015 + 3072 + 476) + 132127 |
#   |   - Host               |                   9576 = 9384 +    0 + 192          |
BREAKDOWN_HEADER_RE = re.compile(r"memory_breakdown_print:\s*\|\s*memory breakdown")
BREAKDOWN_ROW_RE = re.compile(r"memory_breakdown_print:\s*\|\s*-\s+(?P<label>.*?)\s*\|(?P<body>.*)\|\s*$")
BREAKDOWN_FULL_RE = re.compile(
    r"^\s*(\d+)\s*=\s*(\d+)\s*\+\s*\(\s*(\d+)\s*=\s*(\d+)\s*\+\s*(\d+)\s*\+\s*(\d+)\s*\)\s*\+\s*(\d+)\s*$"
)
BREAKDOWN_SELF_RE = re.compile(r"^\s*(\d+)\s*=\s*(\d+)\s*\+\s*(\d+)\s*\+\s*(\d+)\s*$")
BREAKDOWN_COLUMNS = ("total", "free", "self", "model", "context", "compute", "unaccounted")

# --- milestones ----------------------------------------------------------------------------------
CONTEXT_RE = re.compile(r"llama_context: constructing|llama_new_context_with_model")
WARMUP_RE = re.compile(r"warming up the model")
LISTENING_RE = re.compile(r"llama_server: listening on|server is listening|main: model loaded")
SHUTDOWN_RE = re.compile(r"cleaning up before exit|memory_breakdown_print:")

# --- failures ----------------------------------------------------------------------------------
KV_FAIL_RE = re.compile(r"failed to allocate buffer for kv cache")
COMPUTE_FAIL_RE = re.compile(r"failed to allocate compute (?:\w+ )?buffers")
WEIGHTS_FAIL_RE = re.compile(r"unable to allocate \S+ buffer")
ALLOC_FAIL_RE = re.compile(r"failed to allocate \S+ buffer")
ALLOC_DETAIL_RE = re.compile(
    r"allocating [\d.]+ MiB on device \d+: .*failed.*|insufficient memory \(attempted to allocate [\d.]+ MB\)"
)
OOM_RE = re.compile(
    r"CUDA error: out of memory|cudaMalloc failed: out of memory|_alloc_buffer: allocating .* failed"
    r"|ErrorOutOfDeviceMemory|insufficient memory|failed to allocate \S+ buffer"
)
HOST_OOM_RE = re.compile(re.escape(OOM_MARK))  # hostmem's line: the OOM killer ended it at the host budget
MODEL_FILE_RE = re.compile(r"gguf_init_from_\w+|failed to load model|error loading model")
# llama.cpp refused the context's settings before allocating anything: "llama_init_from_model: failed to
# initialize the context: n_seq_max must be <= 256" (-np above LLAMA_MAX_SEQ), "quantized V cache was requested,
# but this requires Flash Attention". A memory failure names its buffer on an earlier line (checked first).
CONTEXT_REFUSED_RE = re.compile(r"failed to initialize the context: (?P<why>.+)$")
# What llama.cpp's names in such a refusal are called in crashline's settings.
CONTEXT_NAMES = {"n_seq_max": "parallel (-np)", "n_ctx_seq": "ctx (-c) per slot", "n_ubatch": "ubatch (-ub)"}
CRASH_RE = re.compile(r"GGML_ASSERT|Segmentation fault|terminate called|CUDA error|Aborted|core dumped")
GENERIC_ERROR_RE = re.compile(r"\b(?:error|failed)\b", re.IGNORECASE)
# The command-line parser's own refusal: "error: invalid argument: -lm", "error while handling argument ...".
ARGUMENT_ERROR_RE = re.compile(r"^(?:error: .*|error while handling argument .*)$")

OK_SIGNALS = {signal.SIGINT, signal.SIGTERM}
OK_RETURNCODES = {0, 128 + signal.SIGINT, 128 + signal.SIGTERM}


def _strip(line: str) -> str:
    """Drop the timestamp/level prefix and surrounding whitespace."""
    return PREFIX_RE.sub("", line).strip()


def _first(pattern: re.Pattern, lines: list[str], start: int = 0, stop: int | None = None):
    """Index of the first line in lines[start:stop] matching pattern, or None."""
    for i in range(start, len(lines) if stop is None else stop):
        if pattern.search(lines[i]):
            return i
    return None


# --- parse_log ---------------------------------------------------------------------------------


def parse_buffers(lines: list[str]) -> list[dict]:
    """Buffer allocations, one per device+kind (a later line replaces an earlier one; SWA KV is kv_swa)."""
    found: dict[tuple[str, str], float] = {}
    kv_kind = "kv"
    for line in lines:
        if swa := SWA_KV_RE.search(line):
            kv_kind = "kv" if swa[1] else "kv_swa"
        elif m := BUFFER_RE.search(line):
            kind = m["kind"].lower()
            key = (m["device"], kv_kind if kind == "kv" else kind)
            found.pop(key, None)  # re-insert so order follows the last report
            found[key] = float(m["mib"])
    return [{"device": d, "kind": k, "mib": mib} for (d, k), mib in found.items()]


def on_host(device: str) -> bool:
    """Whether a buffer's device (as the log names it) is the machine's RAM rather than an accelerator."""
    return bool(HOST_BUFFER_RE.match(device))


def accelerator_share(placement: dict | None) -> dict | None:
    """What the log says went to accelerators: MiB of weights (model buffers) and of KV cache on every
    non-host device together, the KV cache in all, and the layers offloaded; None when the log shows no
    model buffer (the load failed before placing the weights, or the log is not there).

    The weights in RAM are not given: with mmap, CPU_Mapped is the span of the file from the first to the
    last tensor kept on the CPU, GPU tensors in between included (the whole file when the embedding at its
    start and one expert at its end stay on the CPU), so it is no sum of tensors."""
    buffers = (placement or {}).get("buffers") or []
    if not any(b["kind"] == "model" for b in buffers):
        return None
    kv = [b for b in buffers if b["kind"] in ("kv", "kv_swa")]
    return {
        "weights_mib": sum(b["mib"] for b in buffers if b["kind"] == "model" and not on_host(b["device"])),
        "kv_mib": sum(b["mib"] for b in kv if not on_host(b["device"])),
        "kv_total_mib": sum(b["mib"] for b in kv) if kv else None,
        "layers_offloaded": placement.get("layers_offloaded"),
    }


def parse_context(lines: list[str]) -> dict:
    """Context, batch, thread and KV settings as printed; missing ones are None."""
    ctx: dict[str, str] = {}
    out: dict = dict.fromkeys(
        (
            "layers_offloaded",
            "layers_total",
            "n_ctx",
            "n_ctx_seq",
            "n_ctx_slot",
            "n_batch",
            "n_ubatch",
            "n_seq_max",
            "n_parallel",
            "flash_attn",
            "flash_attn_resolved",
            "n_threads",
            "n_threads_batch",
            "type_k",
            "type_v",
            "build",
        )
    )
    for line in lines:
        if m := CONTEXT_PARAM_RE.search(line):
            ctx[m[1]] = m[2]
        elif m := OFFLOADED_RE.search(line):
            out["layers_offloaded"], out["layers_total"] = int(m[1]), int(m[2])
        elif m := SLOTS_RE.search(line):
            out["n_parallel"], out["n_ctx_slot"] = int(m[1]), int(m[2])
        elif m := THREADS_RE.search(line):
            out["n_threads"], out["n_threads_batch"] = int(m[1]), int(m[2])
        elif m := KV_TYPES_RE.search(line):
            out["type_k"], out["type_v"] = m[1], m[2]
        elif (m := FA_RESOLVED_RE.search(line)) and out["flash_attn_resolved"] is None:
            out["flash_attn_resolved"] = m[1]
        elif out["build"] is None and (m := BUILD_RE.search(line)):
            out["build"] = m[1].strip()
    for key in ("n_ctx", "n_ctx_seq", "n_batch", "n_ubatch", "n_seq_max"):
        if ctx.get(key, "").isdigit():
            out[key] = int(ctx[key])
    out["flash_attn"] = ctx.get("flash_attn")
    return out


def parse_devices(lines: list[str]) -> list[dict] | None:
    """GPU devices with total/free MiB (device_info block, else 'using device' lines); None if unprinted."""
    devices: dict[str, dict] = {}
    printed = False
    for line in lines:
        if m := DEVICE_INFO_RE.search(line):
            printed = True
            if not m[1].startswith("CPU"):
                devices[m[1]] = {"name": m[1], "description": m[2], "total_mib": int(m[3]), "free_mib": int(m[4])}
        elif m := USING_DEVICE_RE.search(line):
            printed = True
            devices.setdefault(m[1], {"name": m[1], "description": m[2], "total_mib": None, "free_mib": int(m[3])})
    return list(devices.values()) if printed else None


def parse_fit_free(lines: list[str]) -> dict[str, int] | None:
    """What ``--fit on`` projected to leave free per device with the placement it chose (its last placement line per
    device), or None where it printed none (--fit off, or nothing needed changing)."""
    free = {m[1]: int(m[2]) for line in lines if (m := FIT_PLACED_RE.search(line))}
    return free or None


def parse_breakdown(lines: list[str]) -> list[dict]:
    """Rows of the exit memory breakdown table (MiB); [] if none was printed after 'listening'.

    With --fit on (the default) a projected table is also printed before loading; it is skipped.
    """
    rows: list[dict] = []
    listening = _first(LISTENING_RE, lines)
    for line in lines[len(lines) if listening is None else listening :]:
        if BREAKDOWN_HEADER_RE.search(line):
            rows = []
            continue
        m = BREAKDOWN_ROW_RE.search(line)
        if not m:
            continue
        device, _, desc = m["label"].partition(" (")
        row = {"device": device, "description": desc.rstrip(")") or None, **dict.fromkeys(BREAKDOWN_COLUMNS)}
        if full := BREAKDOWN_FULL_RE.match(m["body"]):
            row.update(zip(BREAKDOWN_COLUMNS, map(int, full.groups())))
        elif short := BREAKDOWN_SELF_RE.match(m["body"]):
            row.update(zip(("self", "model", "context", "compute"), map(int, short.groups())))
        rows.append(row)
    return rows


def _is_failure_line(line: str) -> bool:
    return bool(
        KV_FAIL_RE.search(line)
        or COMPUTE_FAIL_RE.search(line)
        or WEIGHTS_FAIL_RE.search(line)
        or ALLOC_FAIL_RE.search(line)
        or OOM_RE.search(line)
        or MODEL_FILE_RE.search(line)
    )


def parse_errors(lines: list[str]) -> list[str]:
    """Error-level lines, failure-pattern lines and error/failed lines, prefix stripped, in order."""
    errors = []
    for line in lines:
        if BACKTRACE_RE.search(line):
            continue
        if LEVEL_E_RE.match(line) or _is_failure_line(line) or GENERIC_ERROR_RE.search(line):
            if text := _strip(line):
                errors.append(text)
    return errors


# llama-server's context checkpoints (sliding-window and hybrid models): made while a prompt is evaluated, restored
# when a later prompt shares less than the slot holds, erased when old or invalidated (tools/server/server-context).
CHECKPOINT_RE = re.compile(
    r"id\s+(?P<slot>\d+) \| task -?\d+ \| (?P<action>created|restored|erased invalidated|erasing old|erasing) "
    r"context checkpoint(?: (?P<held>\d+) of (?P<most>\d+))?.*?size = (?P<mib>[\d.]+) MiB"
)


CACHE_STATE_RE = re.compile(
    r"cache state: (?P<entries>\d+) prompts, (?P<mib>[\d.]+) MiB \(limits: (?P<limit>[\d.]+) MiB"
)


def prompt_cache_state(text: str) -> dict | None:
    """llama-server's last word on its host prompt cache (--cache-ram) in ``text``: entries, MiB and its limit."""
    found = None
    for found in CACHE_STATE_RE.finditer(text):
        pass
    if found is None:
        return None
    return {"entries": int(found["entries"]), "mib": float(found["mib"]), "limit_mib": float(found["limit"])}


def checkpoint_events(text: str) -> list[dict]:
    """Each context checkpoint line in ``text``: its slot, what happened (created, restored, erased), the size, and
    for a new one how many its slot holds with it and the most it may hold (--ctx-checkpoints)."""
    out = []
    for line in text.splitlines():
        m = CHECKPOINT_RE.search(line)
        if m:
            out.append(
                {
                    "slot": int(m["slot"]),
                    "action": m["action"].split()[0].replace("erasing", "erased"),
                    "mib": float(m["mib"]),
                    "held": int(m["held"]) if m["held"] else None,
                    "most": int(m["most"]) if m["most"] else None,
                }
            )
    return out


def split_draft(lines: list[str]) -> tuple[list[str], list[str]]:
    """The log's lines of the model and those of a speculative draft's load (from 'loading draft model' to the
    slots' initialisation); without a draft, every line and none. The draft prints buffers, context and offload
    lines as the model does: read together, the draft's would stand for the model's."""
    begin = _first(DRAFT_LOAD_RE, lines)
    if begin is None:
        return lines, []
    end = _first(SLOTS_RE, lines, begin)
    end = len(lines) if end is None else end
    return lines[:begin] + lines[end:], lines[begin:end]


def parse_log(text: str) -> dict:
    """Placement facts from a llama-server log; JSON-serialisable, fields not printed are None. ``draft_buffers``:
    a speculative draft's own buffers ([] without one)."""
    lines, draft = split_draft(text.splitlines())
    buffers = parse_buffers(lines)
    return {
        "buffers": buffers,
        "buffers_mib": {f"{b['device']}:{b['kind']}": b["mib"] for b in buffers},
        "draft_buffers": parse_buffers(draft),
        **parse_context(lines),
        "devices": parse_devices(lines),
        "fit_free_mib": parse_fit_free(lines),
        "memory_breakdown": parse_breakdown(lines),
        "errors": parse_errors(lines),
        "tail": "\n".join(lines[-TAIL_LINES:]),
    }


# --- classify ----------------------------------------------------------------------------------


def _milestones(lines: list[str]) -> dict:
    """Line indices of context creation, warm-up start, 'listening', and shutdown (None when absent)."""
    listening = _first(LISTENING_RE, lines)
    return {
        "context": _first(CONTEXT_RE, lines),
        "warmup": _first(WARMUP_RE, lines),
        "listening": listening,
        "shutdown": None if listening is None else _first(SHUTDOWN_RE, lines, listening),
    }


def _phase_at(index: int, ms: dict, phase_hint: str | None) -> str:
    """Which phase line `index` belongs to: load, warmup, or the caller's workload (default serving)."""
    if ms["listening"] is not None and index > ms["listening"]:
        return phase_hint or "serving"
    if ms["warmup"] is not None and index > ms["warmup"]:
        return "warmup"
    return "load"


def _with_alloc_detail(lines: list[str], index: int) -> str:
    """The failure line, plus the preceding 'allocating X MiB on device N ... failed' line if any."""
    message = _strip(lines[index])
    for line in reversed(lines[max(0, index - 5) : index]):
        if m := ALLOC_DETAIL_RE.search(line):
            return f"{message} ({m[0].strip()})"
    return message


def _result(outcome: Outcome, failure: str | None, phase: str | None, message: str | None) -> dict:
    return {"outcome": outcome, "failure": failure, "phase": phase, "message": message}


def _before(*indices: int | None) -> int | None:
    """The first of the given milestone indices that is set (a search bound), or None."""
    return next((i for i in indices if i is not None), None)


def _recognised_failure(lines: list[str], ms: dict, phase_hint: str | None) -> dict | None:
    """A failure recognised from the log text alone, or None."""
    i = _first(HOST_OOM_RE, lines)
    if i is not None:  # first: killed by the kernel, llama.cpp printed nothing of it
        return _result(Outcome.OOM_HOST, "oom_host", _phase_at(i, ms, phase_hint), _strip(lines[i]))
    load_end = _before(ms["warmup"], ms["listening"])
    checks = (
        (KV_FAIL_RE, "kv_cache", load_end),
        (COMPUTE_FAIL_RE, "compute_buffer", load_end),
        (WEIGHTS_FAIL_RE, "weights", load_end),
        # a bare "failed to allocate CUDA0 buffer" while tensors load (before the context) is the weights
        (ALLOC_FAIL_RE, "weights", _before(ms["context"], load_end)),
    )
    for pattern, failure, stop in checks:
        i = _first(pattern, lines, 0, stop)
        if i is not None:
            return _result(Outcome.LOAD_FAILED, failure, "load", _with_alloc_detail(lines, i))
    i = _first(OOM_RE, lines)
    if i is not None:
        phase = _phase_at(i, ms, phase_hint)
        # out of memory while loading, but not in one of the buffers named above
        outcome = Outcome.LOAD_FAILED if phase == "load" else Outcome.OOM
        return _result(outcome, "oom", phase, _with_alloc_detail(lines, i))
    i = _first(CONTEXT_REFUSED_RE, lines, 0, load_end)
    if i is not None:
        return _result(Outcome.LOAD_FAILED, "settings", "load", _context_refusal(lines[i]))
    i = _first(MODEL_FILE_RE, lines, 0, ms["listening"])
    if i is not None:
        detail = _first(GENERIC_ERROR_RE, lines, 0, i + 1)  # the first error usually names the cause
        return _result(Outcome.LOAD_FAILED, "model_file", "load", _strip(lines[detail if detail is not None else i]))
    return None


def _context_refusal(line: str) -> str:
    """llama.cpp's reason for refusing the context, with the crashline setting it names:
    "llama.cpp refused the settings: n_seq_max must be <= 256 (n_seq_max is parallel (-np))"."""
    why = CONTEXT_REFUSED_RE.search(line)["why"].strip()
    named = [f"{name} is {setting}" for name, setting in CONTEXT_NAMES.items() if re.search(rf"\b{name}\b", why)]
    return f"llama.cpp refused the settings: {why}" + (f" ({'; '.join(named)})" if named else "")


def _argument_error(lines: list[str]) -> str | None:
    """llama.cpp's own line refusing its command line, if it printed one."""
    return next((text for line in lines if ARGUMENT_ERROR_RE.match(text := _strip(line))), None)


def _crash_line(lines: list[str]) -> str | None:
    i = _first(CRASH_RE, lines)
    return None if i is None else _strip(lines[i])


def classify(text: str, returncode: int | None, *, phase_hint: str | None = None, timed_out: bool = False) -> dict:
    """Outcome (ok, load_failed, oom, crashed, timeout), failure kind, phase and the key message.

    A recognised failure in the log wins over the exit status (and over a timeout, which it explains).
    returncode None means unknown (log file only): inferred from the log's last milestone.
    """
    lines = text.splitlines()
    ms = _milestones(lines)
    found = _recognised_failure(lines, ms, phase_hint)
    if found:
        return found
    last_phase = _phase_at(len(lines), ms, phase_hint)
    if timed_out:
        phase = phase_hint or last_phase
        return _result(Outcome.TIMEOUT, "timeout", phase, f"timed out during {phase}")
    crash = _crash_line(lines)
    if returncode is None:
        return _classify_without_returncode(ms, crash, last_phase)
    if returncode in OK_RETURNCODES or (returncode < 0 and -returncode in OK_SIGNALS):
        return _result(Outcome.OK, None, None, None)
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        message = f"killed by {name}" + (f": {crash}" if crash else "")
        return _result(Outcome.CRASHED, "signal", last_phase, message)
    if ms["listening"] is None:
        refused = _argument_error(lines)
        if refused and not crash:
            return _result(
                Outcome.LOAD_FAILED, "arguments", "load", f"{refused} (exit status {returncode} before listening)"
            )
        return _result(Outcome.LOAD_FAILED, "unknown", "load", crash or f"exit status {returncode} before listening")
    return _result(Outcome.CRASHED, "exit_code", last_phase, crash or f"exit status {returncode}")


def _classify_without_returncode(ms: dict, crash: str | None, last_phase: str) -> dict:
    """Exit status unknown: judge by how far the log got and how it ends."""
    if crash:
        return _result(Outcome.CRASHED, "crash", last_phase, crash)
    if ms["listening"] is None:
        return _result(Outcome.LOAD_FAILED, "unknown", "load", "log ends before the server was listening")
    if ms["shutdown"] is not None:
        return _result(Outcome.OK, None, None, None)
    # no shutdown lines: killed without a chance to log (SIGKILL, the OOM killer) or still running
    return _result(Outcome.CRASHED, "unknown", last_phase, f"log ends during {last_phase} without shutdown lines")


# --- is this a llama-server log at all? ------------------------------------------------------------
# llama.cpp's own line shapes: its timestamp/level prefix (every line of a log written with -lv), or, where
# there is none (an older build, a line printed before logging starts), a function tag of llama.cpp
# ("llama_model_loader: ...", "srv  load_model: ...", "build: ..."), or its argument parser's refusal.
SERVER_TAG_RE = re.compile(
    r"^(?:[a-z]{3}\s+)?(?:(?:llama|common|gguf|ggml)_\w+|load_tensors|load_model|load_backend|print_info"
    r"|system_info):\s|^build: \d+ \("
)
ARGUMENT_REFUSAL_RE = re.compile(r"^error(?: while handling argument |: invalid argument: )")
NOT_A_LOG_REASON = (
    "none of its lines looks like llama.cpp's output (a timestamped log line, a function tag "
    "such as 'llama_model_loader:', or an argument error)"
)


class NotServerLog(CrashlineError, ValueError):
    """A file given as a llama-server log has no line llama-server would have written."""


def _server_line(line: str) -> bool:
    text = line.strip()
    return bool(PREFIX_RE.match(line) or SERVER_TAG_RE.match(text) or ARGUMENT_REFUSAL_RE.match(text))


def is_server_log(text: str) -> bool:
    """Whether ``text`` looks written by llama-server: at least one of its lines has one of llama.cpp's
    shapes above. A log that ends early (a load failure, a refused argument, a file not a GGUF) still
    passes; a README, a JSON record, an empty file or a binary one does not."""
    return any(_server_line(line) for line in text.splitlines())


# What ``summarize`` reads of a longer file: its head (the load: buffers, layers, context) and its tail (how it
# ended); a log of hours of verbose serving in between is skipped, not read into memory.
HEAD_BYTES = 2 * 1024 * 1024
TAIL_BYTES = 6 * 1024 * 1024
_KINDS = {
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFIFO: "a named pipe",
    stat.S_IFSOCK: "a socket",
    stat.S_IFDIR: "a folder",
}


def read_bounded(path: str | Path, head: int = HEAD_BYTES, tail: int = TAIL_BYTES) -> str:
    """A log file's text, at most ``head`` bytes from its start and ``tail`` from its end (whole lines), refused
    with NotServerLog unless it is a regular file: a device (/dev/zero) or a pipe would be read without end. Opened
    without blocking (a pipe with no writer) and checked on the open file, not on its name."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        kind = _KINDS.get(stat.S_IFMT(info.st_mode), "not a regular file")
        raise NotServerLog(f"{path} is {kind}, not a log file: give the path of a llama-server log file")
    size = info.st_size
    with open(fd, "rb") as f:
        if size <= head + tail:
            data = f.read(head + tail)
        else:
            start = f.read(head)
            f.seek(size - tail)
            end = f.read(tail)
            # whole lines only: the head up to its last newline, the tail from its first
            data = start[: start.rfind(b"\n") + 1] + end[end.find(b"\n") + 1 :]
    return data.decode(errors="replace")


def summarize(path: str | Path) -> dict:
    """parse_log + classify for a log file alone (exit status unknown); NotServerLog if it is none. A longer file
    is read in part (``read_bounded``)."""
    text = read_bounded(path)
    if not is_server_log(text):
        raise NotServerLog(f"{path} is not a llama-server log: {NOT_A_LOG_REASON if text.strip() else 'it is empty'}")
    return {"placement": parse_log(text), "classification": classify(text, None)}
