"""Which llama-server flags a config or a claims file may pass (``extra_args``), read as llama.cpp reads them.

Configs and claims files come from strangers' READMEs, and llama-server's flags can run commands (``--agent``,
``--mcp-servers-json``), serve files (``--path``), write them (``--log-file``), load other weights (``-hf``, presets
such as ``--fim-qwen-7b-default``) or take a key (``--api-key``). So ``extra_args`` passes only what ``ALLOWED``
lists: options that change where tensors live or how fast the server computes, and that no crashline setting sets.
Everything else is refused by name, with why and the fix (``REFUSED``, ``SETTING_FLAGS``); a flag in neither (a newer
build's) is refused as unknown. tests/test_serverflags.py walks every flag the pinned build's ``--help`` lists and
checks it is in one of them.

The arguments are read as llama.cpp's parser reads them (common/arg.cpp, ``common_params_parse_ex``): an argument
that starts with ``--`` has ``_`` read as ``-`` (``--api_key`` is ``--api-key``); every option takes its value from
the next argument, whatever it looks like (``-C -1`` is -C with "-1"), so a value can never be taken for a flag and a
flag missing its value would take crashline's own ``--host`` as one; an argument where a flag belongs that is no flag
fails the server. ``--flag=value``, which this llama.cpp reads as one unknown argument, is split in two.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import CrashlineError

SWITCH, VALUE = 0, 1

# Options that change placement or speed and that no setting covers: every spelling, and whether it takes a value.
ALLOWED: tuple[tuple[tuple[str, ...], int], ...] = (
    # CPU threads: affinity, priority, polling (the thread counts are the settings threads and threads_batch)
    (("-C", "--cpu-mask"), VALUE),
    (("-Cr", "--cpu-range"), VALUE),
    (("--cpu-strict",), VALUE),
    (("--prio",), VALUE),
    (("--poll",), VALUE),
    (("-Cb", "--cpu-mask-batch"), VALUE),
    (("-Crb", "--cpu-range-batch"), VALUE),
    (("--cpu-strict-batch",), VALUE),
    (("--prio-batch",), VALUE),
    (("--poll-batch",), VALUE),
    (("--numa",), VALUE),
    # where weights, the KV cache and host operations live
    (("-kvo", "--kv-offload", "-nkvo", "--no-kv-offload"), SWITCH),
    (("--repack", "-nr", "--no-repack"), SWITCH),
    (("--no-host",), SWITCH),
    (("-lzm", "--lazy-mode"), VALUE),
    (("-dev", "--device"), VALUE),
    (("-cmoe", "--cpu-moe"), SWITCH),
    (("-ncffn", "--n-cpu-ffn"), VALUE),
    (("--op-offload", "--no-op-offload"), SWITCH),
    (("-dt", "--defrag-thold"), VALUE),
    (("--kv-unified-per-slot",), VALUE),
    (("--context-shift", "--no-context-shift"), SWITCH),
    (("--warmup", "--no-warmup"), SWITCH),
    (("--cache-prompt", "--no-cache-prompt"), SWITCH),
    (("-sps", "--slot-prompt-similarity"), VALUE),
    (("--threads-http",), VALUE),
    (("-bs", "--backend-sampling"), SWITCH),
    # a speculative draft's placement and threads (the draft model itself is the setting draft_model)
    (("--spec-draft-type-k", "-ctkd", "--cache-type-k-draft"), VALUE),
    (("--spec-draft-type-v", "-ctvd", "--cache-type-v-draft"), VALUE),
    (("--spec-draft-threads", "-td", "--threads-draft"), VALUE),
    (("--spec-draft-threads-batch", "-tbd", "--threads-batch-draft"), VALUE),
    (("--spec-draft-cpu-mask", "-Cd", "--cpu-mask-draft"), VALUE),
    (("--spec-draft-cpu-range", "-Crd", "--cpu-range-draft"), VALUE),
    (("--spec-draft-cpu-strict", "--cpu-strict-draft"), VALUE),
    (("--spec-draft-prio", "--prio-draft"), VALUE),
    (("--spec-draft-poll", "--poll-draft"), VALUE),
    (("--spec-draft-cpu-mask-batch", "-Cbd", "--cpu-mask-batch-draft"), VALUE),
    (("--spec-draft-cpu-strict-batch", "--cpu-strict-batch-draft"), VALUE),
    (("--spec-draft-prio-batch", "--prio-batch-draft"), VALUE),
    (("--spec-draft-poll-batch", "--poll-batch-draft"), VALUE),
    (("--spec-draft-override-tensor", "-otd", "--override-tensor-draft"), VALUE),
    (("--spec-draft-cpu-moe", "-cmoed", "--cpu-moe-draft"), SWITCH),
    (("--spec-draft-n-cpu-moe", "--spec-draft-ncmoe", "-ncmoed", "--n-cpu-moe-draft"), VALUE),
    (("--spec-draft-device", "-devd", "--device-draft"), VALUE),
    (("--spec-draft-p-split", "--draft-p-split"), VALUE),
    (("--spec-draft-p-min", "--draft-p-min"), VALUE),
    (("--spec-draft-backend-sampling", "--no-spec-draft-backend-sampling"), SWITCH),
    (("--spec-draft-sampling",), VALUE),
    (("--spec-ngram-mod-n-min",), VALUE),
    (("--spec-ngram-mod-n-max",), VALUE),
    (("--spec-ngram-mod-n-match",), VALUE),
    (("--spec-ngram-simple-size-n",), VALUE),
    (("--spec-ngram-simple-size-m",), VALUE),
    (("--spec-ngram-simple-min-hits",), VALUE),
    (("--spec-ngram-map-k-size-n",), VALUE),
    (("--spec-ngram-map-k-size-m",), VALUE),
    (("--spec-ngram-map-k-min-hits",), VALUE),
    (("--spec-ngram-map-k4v-size-n",), VALUE),
    (("--spec-ngram-map-k4v-size-m",), VALUE),
    (("--spec-ngram-map-k4v-min-hits",), VALUE),
)

# The options crashline's settings pass (core/settings.py), every spelling: given in extra_args they would run
# while the record, the tables and the configuration's id show the setting.
SETTING_FLAGS: dict[str, tuple[str, ...]] = {
    "n_gpu_layers": ("-ngl", "--gpu-layers", "--n-gpu-layers"),
    "n_cpu_moe": ("-ncmoe", "--n-cpu-moe"),
    "ctx": ("-c", "--ctx-size"),
    "batch": ("-b", "--batch-size"),
    "ubatch": ("-ub", "--ubatch-size"),
    "cache_type_k": ("-ctk", "--cache-type-k"),
    "cache_type_v": ("-ctv", "--cache-type-v"),
    "flash_attn": ("-fa", "--flash-attn"),
    "parallel": ("-np", "--parallel"),
    "threads": ("-t", "--threads"),
    "threads_batch": ("-tb", "--threads-batch"),
    "split_mode": ("-sm", "--split-mode"),
    "tensor_split": ("-ts", "--tensor-split"),
    "main_gpu": ("-mg", "--main-gpu"),
    "override_tensor": ("-ot", "--override-tensor"),
    "load_mode": ("-lm", "--load-mode"),
    "fit": ("-fit", "--fit"),
    "fit_target": ("-fitt", "--fit-target"),
    "fit_ctx": ("-fitc", "--fit-ctx"),
    "kv_unified": ("-kvu", "--kv-unified", "-no-kvu", "--no-kv-unified"),
    "cont_batching": ("-cb", "--cont-batching", "-nocb", "--no-cont-batching"),
    "cache_ram": ("-cram", "--cache-ram"),
    "ctx_checkpoints": ("-ctxcp", "--ctx-checkpoints", "--swa-checkpoints"),
    "swa_full": ("--swa-full",),
    "checkpoint_min_step": ("-cms", "--checkpoint-min-step"),
    "cache_reuse": ("--cache-reuse",),
    "cache_idle_slots": ("--cache-idle-slots", "--no-cache-idle-slots"),
    "draft_model": ("--spec-draft-model", "-md", "--model-draft"),
    "spec_type": ("--spec-type",),
    "draft_max": ("--spec-draft-n-max",),
    "draft_min": ("--spec-draft-n-min",),
    "draft_n_gpu_layers": ("--spec-draft-ngl", "-ngld", "--gpu-layers-draft", "--n-gpu-layers-draft"),
}

# Every other flag of the pinned llama-server, by why it may not come from a config: (why, fix) -> spellings.
OWN = (
    "crashline sets itself (loopback only, a free port, a key only crashline's client knows, logging at level 4)",
    "remove it",
)
REFUSED: dict[tuple[str, str], tuple[str, ...]] = {
    OWN: (
        "--host", "--port", "--api-key", "--api-key-file",
        "-lv", "--verbosity", "--log-verbosity", "-v", "--verbose", "--log-verbose",
    ),
    (
        "selects another model, downloads one or adds weights to it, so the record would name a model that did not run",
        "name the model under models: (a speculative draft with the draft_model setting)",
    ): (
        "-m", "--model", "-mu", "--model-url", "-dr", "--docker-repo", "-hf", "-hfr", "--hf-repo", "-hff", "--hf-file",
        "-hft", "--hf-token", "--spec-draft-hf", "-hfd", "-hfrd", "--hf-repo-draft", "-cl", "--cache-list",
        "--offline", "--lora", "--lora-scaled", "--lora-init-without-apply", "--control-vector",
        "--control-vector-scaled", "--control-vector-layer-range", "--override-kv", "-mm", "--mmproj", "-mmu",
        "--mmproj-url", "--mmproj-auto", "--no-mmproj", "--no-mmproj-auto", "--mmproj-offload",
        "--no-mmproj-offload", "-mmdev", "--mmproj-device", "--models-dir", "--models-preset", "--models-max",
        "--models-autoload", "--no-models-autoload", "--embd-gemma-default", "--fim-qwen-1.5b-default",
        "--fim-qwen-3b-default", "--fim-qwen-7b-default", "--fim-qwen-7b-spec", "--fim-qwen-14b-spec",
        "--fim-qwen-30b-default", "--gpt-oss-20b-default", "--gpt-oss-120b-default", "--vision-gemma-4b-default",
        "--vision-gemma-12b-default", "--spec-default",
    ),
    (
        "makes the server read or write files of this machine, which it would serve to any local process",
        "remove it: crashline measures a server that reads its model and nothing else",
    ): (
        "--path", "--slot-save-path", "--media-path", "--log-prompts-dir", "--log-file", "--chat-template-file",
        "--grammar-file", "-jf", "--json-schema-file", "-lcs", "--lookup-cache-static", "-lcd",
        "--lookup-cache-dynamic", "--ui-config-file", "--webui-config-file", "--video-ffmpeg-dir",
        "--mcp-servers-config",
    ),
    (
        "runs commands or tools for whoever reaches the server",
        "remove it: crashline's server runs no tools, agents or MCP servers",
    ): (
        "--tools", "--tools-runtime", "--mcp-servers-json", "-ag", "--agent", "-no-ag", "--no-agent",
        "--ui-mcp-proxy", "--webui-mcp-proxy", "--no-ui-mcp-proxy", "--no-webui-mcp-proxy",
    ),
    (
        "changes who may reach the server or what they may change in it",
        "remove it: crashline's server listens on loopback and answers crashline's key alone",
    ): (
        "--rpc", "--reuse-port", "--api-prefix", "--ssl-key-file", "--ssl-cert-file", "--cors-origins",
        "--cors-methods", "--cors-headers", "--cors-credentials", "--no-cors-credentials", "--ui", "--webui",
        "--no-ui", "--no-webui", "--ui-config", "--webui-config", "--metrics", "--props", "--slots", "--no-slots",
    ),
    (
        "changes the log crashline reads the placement and every failure from",
        "remove it",
    ): (
        "--log-disable", "--log-jsonl", "--no-log-jsonl", "--log-colors", "--log-prefix", "--no-log-prefix",
        "--log-timestamps", "--no-log-timestamps", "--perf", "--no-perf",
    ),
    (
        "ends llama-server before it serves",
        "remove it",
    ): ("-h", "--help", "--usage", "--version", "--completion-bash", "--list-devices"),
    (
        "fakes or no longer sets speculative decoding (llama.cpp removed it, or it replaces the model's "
        "acceptance by a synthetic one)",
        "remove it; draft_max, draft_min and spec_type are settings",
    ): (
        "--draft", "--draft-n", "--draft-max", "--draft-min", "--draft-n-min", "--spec-ngram-size-n",
        "--spec-ngram-size-m", "--spec-ngram-min-hits", "--spec-synth-len", "--spec-synth-rates",
    ),
    (
        "changes what the model computes or answers, not where or how fast: its numbers would not be the model's",
        "remove it: crashline's requests set their own sampling, and the model runs as its file says",
    ): (
        "-n", "--predict", "--n-predict", "--keep", "-e", "--escape", "--no-escape", "--rope-scaling",
        "--rope-scale", "--rope-freq-base", "--rope-freq-scale", "--yarn-orig-ctx", "--yarn-ext-factor",
        "--yarn-attn-factor", "--yarn-beta-slow", "--yarn-beta-fast", "--check-tensors", "--samplers", "-s",
        "--seed", "--sampler-seq", "--sampling-seq", "--ignore-eos", "--temp", "--temperature", "--top-k",
        "--top-p", "--min-p", "--top-nsigma", "--top-n-sigma", "--xtc-probability", "--xtc-threshold",
        "--typical", "--typical-p", "--repeat-last-n", "--repeat-penalty", "--presence-penalty",
        "--frequency-penalty", "--dry-multiplier", "--dry-base", "--dry-allowed-length", "--dry-penalty-last-n",
        "--dry-sequence-breaker", "--adaptive-target", "--adaptive-decay", "--dynatemp-range", "--dynatemp-exp",
        "--mirostat", "--mirostat-lr", "--mirostat-ent", "-l", "--logit-bias", "--grammar", "-j",
        "--json-schema", "-r", "--reverse-prompt", "-sp", "--special", "--spm-infill", "--pooling",
        "--embedding", "--embeddings", "--rerank", "--reranking", "-a", "--alias", "--tags", "--embd-normalize",
        "--image-min-tokens", "--image-max-tokens", "--mtmd-batch-max-tokens", "--video-fps",
        "--video-timestamp-interval", "--chat-template-kwargs", "-to", "--timeout", "--sse-ping-interval",
        "--sleep-idle-seconds", "--jinja", "--no-jinja", "--reasoning-format", "-rea", "--reasoning",
        "--reasoning-effort", "--reasoning-budget", "--reasoning-budget-message", "--reasoning-preserve",
        "--no-reasoning-preserve", "--chat-template", "--skip-chat-parsing", "--no-skip-chat-parsing",
        "--prefill-assistant", "--no-prefill-assistant",
    ),
}  # fmt: skip

_ARITY = {flag: arity for spellings, arity in ALLOWED for flag in spellings}
_SETTING = {flag: name for name, spellings in SETTING_FLAGS.items() for flag in spellings}
_REFUSED = {flag: reason for reason, spellings in REFUSED.items() for flag in spellings}
_HELP_FLAG_RE = re.compile(r"^-{1,2}[A-Za-z0-9][\w.-]*$")


class FlagRefused(CrashlineError, ValueError):
    """An ``extra_args`` that may not reach llama-server: ``reason`` says which argument, why and the fix."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def normalise(arg: str) -> str:
    """The flag llama.cpp looks up for ``arg``: in a ``--`` argument, ``_`` is ``-``."""
    return arg.replace("_", "-") if arg.startswith("--") else arg


def split_equals(args: list[str]) -> list[str]:
    """``--flag=value`` as the two arguments llama.cpp needs (it reads the joined form as one unknown flag); a value
    is left as it is, wherever it has an ``=``."""
    out: list[str] = []
    expects_value = False
    for arg in args:
        if not expects_value and arg.startswith("-") and "=" in arg:
            flag, value = arg.split("=", 1)
            out += [flag, value]
            expects_value = False
            continue
        out.append(arg)
        expects_value = not expects_value and _ARITY.get(normalise(arg)) == VALUE
    return out


@dataclass(frozen=True)
class Flag:
    """One option of ``extra_args`` as llama.cpp reads it: the argument as given, the spelling it is looked up by,
    and its value (None for a switch)."""

    given: str
    flag: str
    value: str | None


def parse(args: list[str]) -> list[Flag]:
    """``args`` (after ``split_equals``) as llama.cpp reads them; FlagRefused for the first argument that may not
    pass, naming it, why and the fix."""
    flags: list[Flag] = []
    i = 0
    while i < len(args):
        given = args[i]
        flag = normalise(given)
        refused = _refusal(given, flag)
        if refused:
            raise FlagRefused(refused)
        value = None
        if _ARITY[flag] == VALUE:
            if i + 1 >= len(args):
                raise FlagRefused(
                    f"passes {given} without its value, which would take crashline's own --host; give one"
                )
            value = args[i + 1]
            i += 1
        flags.append(Flag(given, flag, value))
        i += 1
    return flags


def _refusal(given: str, flag: str) -> str | None:
    """Why ``given`` (looked up as ``flag``) may not pass, or None where ALLOWED has it."""
    same = "" if flag == given else f" (llama.cpp reads it as {flag})"
    if flag in _ARITY:
        return None
    if not given.startswith("-"):
        return f"passes {given!r} where a flag belongs, which llama-server refuses; put each value after its flag"
    if flag in _SETTING:
        name = _SETTING[flag]
        return (
            f"passes {given}{same}, which crashline's setting {name!r} sets (so that the record, the tables and the "
            f"configuration's id show it); set {name} instead"
        )
    if flag in _REFUSED:
        why, fix = _REFUSED[flag]
        return f"passes {given}{same}, which {why}; {fix}"
    return (
        f"passes {given}{same}, which is not a llama-server flag crashline knows to change placement or speed; "
        f"remove it (the flags it passes: {', '.join(sorted(s[0] for s, _ in ALLOWED if s[0].startswith('--')))})"
    )


def help_flags(text: str) -> list[list[str]]:
    """Each option a llama-server ``--help`` lists, as its spellings (the first column: ``-cb, --cont-batching,
    -nocb, --no-cont-batching``); continuation lines, indented, are no options."""
    options = []
    for line in text.splitlines():
        if not line.startswith("-") or line.startswith("---"):
            continue
        spellings = []
        for token in re.split(r"[,\s]+", line.strip()):
            if not _HELP_FLAG_RE.match(token):
                break
            spellings.append(token)
        if spellings:
            options.append(spellings)
    return options


def setting_of(flag: str) -> str | None:
    """The crashline setting a llama-server flag sets (any spelling: ``-ub``, ``--ubatch-size``), or None."""
    return _SETTING.get(normalise(flag))


def classify(flag: str) -> str:
    """``allowed``, ``setting``, ``refused`` or ``unknown``: where this module puts one spelling."""
    if flag in _ARITY:
        return "allowed"
    if flag in _SETTING:
        return "setting"
    return "refused" if flag in _REFUSED else "unknown"
