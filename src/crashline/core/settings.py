"""The server-settings vocabulary: names users write, the llama-server flags they become, defaults.

A configuration is a mapping of these names to values. Its canonical form has every name
resolved (crashline's defaults filled in), keys sorted; its id is a short hash of that form, so
two spellings of the same configuration share one id and one measurement.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import re
import shlex
from dataclasses import dataclass
from typing import Any
from collections.abc import Callable, Iterable
from . import serverflags
from .errors import CrashlineError

MAX_INT = 2**31 - 1  # llama.cpp reads an integer flag as a C int
MAX_CTX = 2**24  # 16M tokens: above every model's training context (the longest are 10M)
MAX_THREADS = 4096  # more than any machine has; llama.cpp crashed at load at 100000 with nothing naming the count


class SettingsError(CrashlineError, ValueError):
    """A configuration names an unknown setting or gives a value of the wrong kind.

    ``reason`` is the message without the setting's name (for callers that name the key themselves)."""

    def __init__(self, message: str, reason: str | None = None):
        super().__init__(message)
        self.reason = reason or message


def did_you_mean(name: Any, known: Iterable[str], what: str = "known keys") -> str:
    """ "did you mean 'X'?" for a near miss of one of ``known``, else the list of them."""
    known = list(known)
    close = difflib.get_close_matches(str(name), known, n=1)
    return f"did you mean {close[0]!r}?" if close else f"{what}: {', '.join(known)}"


@dataclass(frozen=True)
class Setting:
    name: str
    flag: str | None  # None: handled specially (boolean pairs, lists)
    kind: str  # "int", "str", "choice", "bool", "list"
    default: Any
    doc: str
    choices: tuple = ()
    server: bool = True  # False: a setting of the measurement, not a llama-server flag
    minimum: int = 0  # bounds of an "int" setting
    maximum: int = MAX_INT


CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")

SETTINGS: dict[str, Setting] = {
    s.name: s
    for s in [
        Setting("n_gpu_layers", "-ngl", "int", 999, "layers offloaded to the GPU (999: all)"),
        Setting("n_cpu_moe", "--n-cpu-moe", "int", 0, "keep the expert FFNs of the first N layers on the CPU"),
        Setting("ctx", "-c", "int", 4096, "context size in tokens (all slots together)", minimum=1, maximum=MAX_CTX),
        Setting("batch", "-b", "int", 2048, "logical batch size", minimum=1),
        Setting("ubatch", "-ub", "int", 512, "physical micro-batch size; sets the compute buffer", minimum=1),
        Setting("cache_type_k", "-ctk", "choice", "f16", "KV cache type for K", CACHE_TYPES),
        Setting("cache_type_v", "-ctv", "choice", "f16", "KV cache type for V", CACHE_TYPES),
        Setting("flash_attn", "-fa", "choice", "auto", "flash attention", ("on", "off", "auto")),
        # llama.cpp refuses more than LLAMA_MAX_SEQ (256) sequences at load (src/llama-cparams.h)
        Setting("parallel", "-np", "int", 1, "parallel slots", minimum=1, maximum=256),
        Setting(
            "threads",
            "-t",
            "int",
            None,
            "generation threads (default: llama.cpp's choice, read back from the log)",
            minimum=1,
            maximum=MAX_THREADS,
        ),
        Setting(
            "threads_batch",
            "-tb",
            "int",
            None,
            "prompt-processing threads (default: as threads)",
            minimum=1,
            maximum=MAX_THREADS,
        ),
        Setting(
            "split_mode",
            "-sm",
            "choice",
            None,
            "how a model spans several GPUs (llama.cpp's default: layer)",
            ("none", "layer", "row", "tensor"),
        ),
        Setting("tensor_split", "-ts", "str", None, "the share of the model on each GPU, e.g. 3,1"),
        Setting("main_gpu", "-mg", "int", None, "the GPU for the whole model with split_mode none"),
        Setting("override_tensor", "-ot", "str", None, "tensor placement overrides, PATTERN=BUFFER,..."),
        Setting(
            "load_mode",
            "-lm",
            "choice",
            "auto",
            "model loading mode",
            ("auto", "none", "mmap", "mlock", "mmap+mlock", "dio"),
        ),
        Setting("fit", "--fit", "choice", "off", "let llama.cpp choose placement itself (--fit on)", ("on", "off")),
        Setting(
            "fit_target",
            "--fit-target",
            "int",
            None,
            "MiB of VRAM --fit on leaves free on each device (with fit on, default: budget.margin_mib)",
        ),
        Setting(
            "fit_ctx",
            "--fit-ctx",
            "int",
            None,
            "the smallest context --fit on may cut the context to (with fit on, default: ctx)",
            minimum=1,
            maximum=MAX_CTX,
        ),
        Setting("kv_unified", None, "bool", None, "one KV buffer shared by all slots (-kvu / -no-kvu)"),
        Setting("cont_batching", None, "bool", True, "continuous batching (-cb / -nocb)"),
        Setting(
            "cache_ram",
            "--cache-ram",
            "int",
            None,
            "MiB of host RAM for the prompt cache (-1: no limit, 0: off; llama.cpp's default 8192)",
            minimum=-1,
        ),
        Setting(
            "ctx_checkpoints", "--ctx-checkpoints", "int", None, "context checkpoints per slot (llama.cpp's default 32)"
        ),
        Setting(
            "swa_full",
            "--swa-full",
            "bool",
            None,
            "a full-size KV cache for sliding-window layers (--swa-full): more memory, no context checkpoints",
        ),
        Setting(
            "checkpoint_min_step",
            "--checkpoint-min-step",
            "int",
            None,
            "tokens between context checkpoints (llama.cpp's default 8192)",
        ),
        Setting(
            "cache_reuse",
            "--cache-reuse",
            "int",
            None,
            "smallest chunk reused from the prompt cache by shifting the KV cache (llama.cpp's default 0: off)",
        ),
        Setting(
            "cache_idle_slots",
            None,
            "bool",
            None,
            "save idle slots to the prompt cache when a new task starts (--cache-idle-slots / --no-cache-idle-slots)",
        ),
        Setting("draft_model", "-md", "str", None, "name of a model in `models:` used as speculative draft"),
        Setting(
            "spec_type",
            "--spec-type",
            "str",
            None,
            "speculative decoding: draft-simple, ngram-simple, ... comma-separated (with a draft_model, default "
            "draft-simple: the pinned llama.cpp loads a draft model but drafts nothing without it)",
        ),
        Setting("draft_max", "--spec-draft-n-max", "int", None, "tokens drafted per step"),
        Setting("draft_min", "--spec-draft-n-min", "int", None, "minimum drafted tokens"),
        Setting("draft_n_gpu_layers", "-ngld", "int", None, "draft model layers on the GPU"),
        Setting("extra_args", None, "list", (), "further llama-server arguments, passed through verbatim"),
        Setting(
            "page_cache",
            None,
            "choice",
            "warm",
            "model file in the page cache at load (warm) or evicted (cold)",
            ("warm", "cold"),
            server=False,
        ),
        Setting(
            "gpus",
            None,
            "int",
            None,
            "GPUs the server gets, each held by its job alone (default 1; with tensor_split, one per share)",
            server=False,
            minimum=1,
        ),
    ]
}

_BOOL_FLAGS = {
    "kv_unified": ("-kvu", "-no-kvu"),
    "cont_batching": ("-cb", "-nocb"),
    "cache_idle_slots": ("--cache-idle-slots", "--no-cache-idle-slots"),
}


def _int_expected(setting: Setting, value: Any) -> str:
    if setting.maximum == MAX_INT and not (isinstance(value, int) and value > MAX_INT):
        return "a non-negative integer" if setting.minimum == 0 else f"an integer of at least {setting.minimum}"
    return f"an integer from {setting.minimum} to {setting.maximum}"


def _check_value(setting: Setting, value: Any) -> Any:
    def bad(expected: str) -> SettingsError:
        return SettingsError(f"setting {setting.name!r}: expected {expected}, got {value!r}", f"expected {expected}")

    if value is None:
        return None
    if setting.kind == "int":
        if isinstance(value, bool) or not isinstance(value, int) or not setting.minimum <= value <= setting.maximum:
            raise bad(_int_expected(setting, value))
        return value
    if setting.kind == "bool":
        if not isinstance(value, bool):
            raise bad("true or false")
        return value
    if setting.kind == "choice":
        text = str(value).lower() if not isinstance(value, bool) else ("on" if value else "off")
        if text not in setting.choices:
            raise bad("one of " + ", ".join(setting.choices))
        return text
    if setting.kind == "str":
        if not isinstance(value, str) or not value:
            raise bad("a non-empty string")
        return value
    if setting.kind == "list":
        if isinstance(value, str):
            value = value.split()
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, (str, int, float)) for v in value):
            raise bad("a list of arguments")
        return [str(v) for v in value]
    raise AssertionError(setting.kind)


def _unknown(names: list[str]) -> SettingsError:
    """Unknown setting names: a near miss gets "did you mean", else the known settings are listed."""
    hint = (
        did_you_mean(names[0], SETTINGS, "known settings")
        if len(names) == 1
        else "known settings: " + ", ".join(SETTINGS)
    )
    reason = f"unknown server setting(s) {', '.join(map(repr, names))}; {hint}"
    return SettingsError(reason, reason)


def check_value(name: str, value: Any) -> Any:
    """One setting's value, normalised; SettingsError for an unknown name or a value of the wrong kind."""
    if name not in SETTINGS:
        raise _unknown([name])
    return _check_value(SETTINGS[name], value)


def _check_batches(resolved: dict[str, Any]) -> None:
    ubatch, batch = resolved["ubatch"], resolved["batch"]
    if ubatch is not None and batch is not None and ubatch > batch:
        reason = (
            f"ubatch = {ubatch} is above batch = {batch}: llama.cpp silently clamps ubatch to batch, so the "
            f"server would run with ubatch {batch}; raise batch to at least {ubatch} or lower ubatch to {batch}"
        )
        raise SettingsError(f"setting {reason}", reason)


def _check_nulls(settings: dict[str, Any]) -> None:
    """A null where crashline passes a default would drop the flag silently (``ubatch: null`` ran llama.cpp's own
    ubatch while the record showed none): refused, naming the default and how to get llama.cpp's."""
    for name, value in settings.items():
        default = SETTINGS[name].default
        if value is None and default not in (None, ()):
            what = SETTINGS[name].flag or _BOOL_FLAGS.get(name, (None,))[0]
            dropped = f"would leave out {what}, which crashline passes" if what else "would unset what crashline sets"
            reason = (
                f"{name} = null {dropped} as {default!r} by default; remove the key for that default, or give a value"
            )
            raise SettingsError(f"setting {reason}", reason)


def resolve(settings: dict[str, Any]) -> dict[str, Any]:
    """Every known setting with the user's value or crashline's default; unknown names fail."""
    unknown = sorted(set(settings) - set(SETTINGS))
    if unknown:
        raise _unknown(unknown)
    _check_nulls(settings)
    resolved = {}
    for name, setting in SETTINGS.items():
        value = settings.get(name, setting.default)
        resolved[name] = _check_value(setting, value)
    _check_batches(resolved)
    if resolved["fit"] == "on":
        # llama.cpp's --fit gives up once -ngl or --n-cpu-moe is set: with fit on it places alone.
        chosen = [k for k in ("n_gpu_layers", "n_cpu_moe") if settings.get(k) is not None]
        if chosen:
            raise SettingsError(f"setting fit = 'on' lets llama.cpp choose placement; remove {', '.join(chosen)}")
        resolved["n_gpu_layers"] = resolved["n_cpu_moe"] = None
    else:
        aims = [k for k in FIT_AIMS if resolved[k] is not None]
        if aims:
            reason = (
                f"{aims[0]} = {resolved[aims[0]]} aims llama.cpp's --fit placement, which runs only with fit = 'on'; "
                "set fit: on or remove it"
            )
            raise SettingsError(f"setting {reason}", reason)
    _check_split(resolved)
    _check_gpus(resolved)
    if resolved["draft_model"] and resolved["spec_type"] is None:
        resolved["spec_type"] = "draft-simple"
    if resolved["extra_args"] is None:
        resolved["extra_args"] = []
    resolved["extra_args"] = _check_extra_args(list(resolved["extra_args"]))
    return resolved


def _shares(resolved: dict[str, Any]) -> int:
    """How many GPUs tensor_split shares the model between (1 without it)."""
    split = resolved.get("tensor_split")
    return len(re.split(r"[,/]", split)) if isinstance(split, str) and split else 1


def gpu_count(resolved: dict[str, Any]) -> int:
    """The GPUs a configuration's server gets: ``gpus``, else one per tensor_split share, else 1."""
    gpus = resolved.get("gpus")
    return int(gpus) if isinstance(gpus, (int, float)) and gpus == gpus and gpus else _shares(resolved)


SPLIT_RE = re.compile(r"^\d+(\.\d+)?([,/]\d+(\.\d+)?)*$")


def _check_split(resolved: dict[str, Any]) -> None:
    """tensor_split is numbers, one share per GPU: llama.cpp reads 'a,b' as zeros and splits nothing."""
    split = resolved.get("tensor_split")
    if split is not None and not SPLIT_RE.match(split):
        reason = f"tensor_split = {split!r}: expected a share per GPU as numbers, e.g. 3,1 or 0.6/0.4"
        raise SettingsError(f"setting {reason}", reason)


def _check_gpus(resolved: dict[str, Any]) -> None:
    """A split or main GPU beyond the GPUs the server gets fails; ``gpus`` equal to what it would be anyway (1, or
    tensor_split's shares) is dropped, so that it names the same configuration (and id) as without it."""
    shares, gpus = _shares(resolved), gpu_count(resolved)
    if shares > gpus:
        split = resolved["tensor_split"]
        reason = f"tensor_split = {split!r} has {shares} shares but gpus = {gpus}; set gpus: {shares}"
        raise SettingsError(f"setting {reason}", reason)
    if resolved["main_gpu"] is not None and resolved["main_gpu"] >= gpus:
        reason = (
            f"main_gpu = {resolved['main_gpu']} names GPU {resolved['main_gpu']} of the server's {gpus} "
            f"(numbered from 0 among the GPUs the job holds); set gpus: {resolved['main_gpu'] + 1} or lower main_gpu"
        )
        raise SettingsError(f"setting {reason}", reason)
    if resolved["gpus"] == shares:
        resolved["gpus"] = None


# The aims of llama.cpp's --fit placement: the VRAM it leaves free per device, the smallest context it may cut to.
FIT_AIMS = ("fit_target", "fit_ctx")


def aim_fit(resolved: dict[str, Any], margin_mib: int | None) -> dict[str, Any]:
    """With ``fit: on``, llama.cpp's --fit aims at crashline's headroom: --fit-target is the budget's margin
    (MiB left free on each device, which is what a survivor needs to be recommended) and --fit-ctx the
    configuration's ctx, unless the settings set them. Other configurations are unchanged.

    llama.cpp's own defaults are --fit-target 1024 and --fit-ctx 4096. With -c given, --fit never cuts the
    context (common/fit.cpp: "context size set by user"), so --fit-ctx only states the intent there."""
    if resolved.get("fit") != "on":
        return resolved
    aimed = dict(resolved)
    wanted = {"fit_target": margin_mib, "fit_ctx": resolved.get("ctx")}
    for name, value in wanted.items():
        if aimed.get(name) is None and value is not None:
            aimed[name] = int(value)
    return aimed


def fit_aimed(resolved: dict[str, Any], given: dict[str, Any]) -> bool:
    """Whether crashline chose this ``fit: on`` configuration's --fit-target (``aim_fit``: the margin), so the
    measurement may raise it until the peak leaves the margin (jobs.measure.measure_aimed); a target the config
    gives is run as given."""
    return resolved.get("fit") == "on" and resolved.get("fit_target") is not None and given.get("fit_target") is None


def _check_extra_args(args: list[str]) -> list[str]:
    """extra_args as llama-server will get them (``--flag=value`` split in two), if every flag may pass
    (core/serverflags.py); SettingsError naming the first that may not, why and the fix."""
    args = serverflags.split_equals(args)
    try:
        serverflags.parse(args)
    except serverflags.FlagRefused as exc:
        reason = f"extra_args = {args!r} {exc.reason}"
        raise SettingsError(f"setting {reason}", reason) from None
    return args


def canonical(resolved: dict[str, Any]) -> str:
    return json.dumps(resolved, sort_keys=True, separators=(",", ":"))


def config_id(model: str, resolved: dict[str, Any], extra: str = "") -> str:
    """Short stable hash of what runs: the model's name, the llama-server arguments the settings
    become (host, port, paths and logging excluded) and crashline's own settings that are not flags
    (page cache, GPUs; unset ones leave no trace). A new setting whose default adds no argument changes no id."""
    measurement = {name: resolved.get(name) for name, s in SETTINGS.items() if not s.server}
    measurement = {k: v for k, v in measurement.items() if v is not None}
    text = "\n".join([model, json.dumps(server_args(resolved)), canonical(measurement), extra])
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def _flags(name: str, value: Any) -> list[str]:
    """The flag a setting with this value passes (none for an unset one or a measurement setting)."""
    setting = SETTINGS[name]
    if value is None or name == "extra_args" or not setting.server:
        return []
    if name in _BOOL_FLAGS:
        return [_BOOL_FLAGS[name][0] if value else _BOOL_FLAGS[name][1]]
    if setting.kind == "bool":  # a flag without a negative form: off is llama.cpp's default
        return [setting.flag] if value else []
    return [setting.flag]


def for_binary(
    resolved: dict[str, Any], given: dict[str, Any], supported: set[str] | None, build: str
) -> tuple[dict[str, Any], dict[str, str]]:
    """The settings this llama-server build can take, and the flags left out because it lacks them.

    A setting left at crashline's default whose flag the build does not know is left out (the
    build has no such knob, so its own behaviour is that default). One the config asked for is an
    error naming the setting and the build. ``supported`` None: the flags are unknown, pass all.
    """
    if supported is None:
        return resolved, {}
    kept, dropped = dict(resolved), {}
    for name, value in resolved.items():
        missing = [f for f in _flags(name, value) if f not in supported]
        if not missing:
            continue
        if name in given:
            raise SettingsError(
                f"setting {name} = {value!r} needs llama-server's {missing[0]} flag, which "
                f"this build ({build}) does not have; remove the setting or use a newer build"
            )
        kept[name], dropped[name] = None, missing[0]
    for f in serverflags.parse(resolved.get("extra_args") or []):
        if f.flag not in supported:
            raise SettingsError(
                f"setting extra_args passes {f.given}, which this build ({build}) does not list in its --help; "
                "remove it or use a newer build"
            )
    return kept, dropped


def server_args(resolved: dict[str, Any], draft_path: Callable[[str], str] | None = None) -> list[str]:
    """The llama-server arguments for resolved settings (model, host, port and logging excluded)."""
    args: list[str] = []
    for name in SETTINGS:
        value = resolved.get(name)
        flags = _flags(name, value)
        if not flags or SETTINGS[name].kind == "bool":
            args += flags
        elif name == "draft_model":
            args += [*flags, draft_path(value) if draft_path else value]
        else:
            args += [*flags, str(value)]
    return args + list(resolved.get("extra_args") or [])


def label(resolved: dict[str, Any]) -> str:
    """The llama-server arguments, plus the measurement settings that are not server flags."""
    text = shlex.join(server_args(resolved))  # pasteable: an -ot pattern holds ( | and \\ for the shell
    if resolved.get("page_cache") == "cold":
        text += " · cold page cache"
    if resolved.get("gpus"):  # set only where more GPUs than tensor_split's shares (or than 1)
        text += f" · {resolved['gpus']} GPUs"
    return text


def differing(resolved: dict[str, Any], defaults: dict[str, Any] | None = None) -> dict[str, Any]:
    """The settings that differ from crashline's defaults (for compact labels; tables keep all)."""
    base = defaults if defaults is not None else resolve({})
    return {k: v for k, v in resolved.items() if v != base.get(k)}


def command_line(binary: str, model_path: str, resolved: dict[str, Any], draft_path=None) -> list[str]:
    return [binary, "-m", model_path, *server_args(resolved, draft_path)]


def weights_on_cpu(resolved: dict[str, Any], layers: int | None = None) -> bool:
    """Whether a configuration keeps model weights in host memory, read at every token: experts on the CPU,
    fewer layers on the GPU than the model has (``layers``, where known), tensors overridden to the CPU, or
    llama.cpp's own --fit placement (which may put any of them there)."""
    ngl, overrides = resolved.get("n_gpu_layers"), resolved.get("override_tensor")
    return (
        (resolved.get("n_cpu_moe") or 0) > 0
        or (ngl is not None and layers is not None and ngl <= layers)
        or resolved.get("fit") == "on"
        or (isinstance(overrides, str) and "cpu" in overrides.lower())
    )


def concurrency(workload: dict, settings: dict) -> int:
    """How many requests a workload sends at once for a configuration ("slots": its parallel)."""
    n = workload.get("concurrency", 1)
    return int(settings.get("parallel") or 1) if n == "slots" else int(n)
