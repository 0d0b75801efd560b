import argparse
import os
import re
import subprocess
import sys
import typing
from pathlib import Path

import msgspec
import pytest

from kernel import config, config_flags

REPO = Path(__file__).parents[2]


def parse(argv, env=None, monkeypatch=None):
    parser = argparse.ArgumentParser()
    config_flags.add_arguments(parser)
    return config_flags.from_args(parser.parse_args(argv))


def test_flags_override_environment_which_overrides_toml(tmp_path, monkeypatch):
    toml = tmp_path / "kernel.toml"
    toml.write_text('port = 7000\nnamespace = "from-toml"\nmax_num_seqs = 3\n')
    monkeypatch.setenv("KERNEL_NAMESPACE", "from-env")
    monkeypatch.setenv("KERNEL_MAX_NUM_SEQS", "5")
    cfg = parse(["--config", str(toml), "--max-num-seqs", "9"])
    assert (cfg.http.port, cfg.bus.namespace, cfg.engine.max_num_seqs) == (7000, "from-env", 9)


def test_to_argv_round_trips():
    cfg = parse(["--port", "9001", "--model", "/m/qwen", "--restart-period-s", "2.5"])
    assert parse(config_flags.to_argv(cfg)) == cfg
    assert cfg.engine.model_name == "qwen"


def test_bad_value_is_a_clear_exit(monkeypatch):
    monkeypatch.setenv("KERNEL_PORT", "eighty")
    with pytest.raises(SystemExit, match="invalid configuration"):
        parse([])


def test_a_switch_turns_off_by_flag_environment_or_toml(tmp_path, monkeypatch):
    assert parse([]).engine.prefix_caching is True
    assert parse(["--no-prefix-caching"]).engine.prefix_caching is False
    cfg = parse(["--no-prefix-caching"])
    assert config_flags.to_argv(cfg) == ["--no-prefix-caching"] and parse(config_flags.to_argv(cfg)) == cfg
    monkeypatch.setenv("KERNEL_PREFIX_CACHING", "false")
    assert parse([]).engine.prefix_caching is False
    assert parse(["--prefix-caching"]).engine.prefix_caching is True


def test_the_defaults_are_within_their_ranges():
    defaults = config.KernelConfig()
    assert msgspec.convert(msgspec.to_builtins(defaults), config.KernelConfig) == defaults


def run_cli(tmp_path, *flags, env=None, module="kernel.supervisor") -> subprocess.CompletedProcess:
    """The real command line; a bad setting must stop it before it makes its data dir."""
    data_dir = tmp_path / "data"
    done = subprocess.run(
        [sys.executable, "-m", module, "--data-dir", str(data_dir), *flags],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={**os.environ, **(env or {})},
    )
    assert not data_dir.exists(), "it started before checking its settings"
    return done


def assert_usage_error(done: subprocess.CompletedProcess, message: str, prog="python -m kernel.supervisor") -> None:
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"usage: {prog}")
    assert f"{prog}: error: {message}" in done.stderr


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--block-size", "0"], "argument --block-size: invalid value: '0' (expected `int` >= 1)"),
        (["--tokenizers", "0"], "argument --tokenizers: invalid value: '0' (expected `int` >= 1)"),
        (["--port", "70000"], "argument --port: invalid value: '70000' (expected `int` <= 65535)"),
        (["--restart-period-s", "0"], "argument --restart-period-s: invalid value: '0' (expected `float` > 0.0)"),
        (["--num-kv-blocks", "0"], "argument --num-kv-blocks: invalid value: '0' (expected `int` >= 1)"),
        (["--max-model-len", "many"], "argument --max-model-len: invalid value: 'many' (expected `int`)"),
        (
            ["--log-level", "loud"],
            "argument --log-level: invalid choice: 'loud' (choose from 'debug', 'info', 'warning', 'error')",
        ),
        (["--device", "gpu"], "argument --device: invalid value: 'gpu' (expected `str` matching regex"),
        (["--namespace", "llm.>"], "argument --namespace: invalid value: 'llm.>' (expected `str` matching regex"),
    ],
)
def test_a_flag_out_of_its_range_or_choices_is_a_usage_error(tmp_path, flags, message):
    assert_usage_error(run_cli(tmp_path, *flags), message)


@pytest.mark.parametrize(
    "env, message",
    [
        ({"KERNEL_TOKENIZERS": "0"}, "KERNEL_TOKENIZERS (--tokenizers): invalid value: '0' (expected `int` >= 1)"),
        (
            {"KERNEL_PUBLIC_PREFIX_WINDOW_S": "-1"},
            "KERNEL_PUBLIC_PREFIX_WINDOW_S (--public-prefix-window-s): invalid value: '-1' (expected `float` > 0.0)",
        ),
        (
            {"KERNEL_LOG_FORMAT": "xml"},
            "KERNEL_LOG_FORMAT (--log-format): invalid choice: 'xml' (choose from 'json', 'console')",
        ),
    ],
)
def test_an_environment_variable_out_of_range_names_itself_and_its_flag(tmp_path, env, message):
    assert_usage_error(run_cli(tmp_path, env=env), f"invalid configuration: {message}")


@pytest.mark.parametrize(
    "toml, message",
    [
        ("block_size = 0\n", "block_size (--block-size): invalid value: 0 (expected `int` >= 1)"),
        (
            'attention_backend = "cudnn"\n',
            "attention_backend (--attention-backend): invalid choice: 'cudnn' "
            "(choose from 'auto', 'flashinfer', 'triton', 'torch')",
        ),
        ("blok_size = 16\n", "unknown setting 'blok_size'"),
    ],
)
def test_a_toml_setting_out_of_range_names_the_file_and_its_flag(tmp_path, toml, message):
    path = tmp_path / "kernel.toml"
    path.write_text(toml)
    assert_usage_error(run_cli(tmp_path, "--config", str(path)), f"invalid configuration: {path}: {message}")


def test_deterministic_with_another_attention_backend_is_a_usage_error(tmp_path):
    done = run_cli(tmp_path, "--deterministic", "--attention-backend", "flashinfer")
    assert_usage_error(done, "--deterministic attends with its own batch-invariant kernels")


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--disk-kv-gb", "1"], "invalid configuration: --disk-kv-gb keeps the blocks of the host tier"),
        (["--host-kv-blocks", "8", "--no-prefix-caching"], "invalid configuration: --host-kv-blocks keeps the prefix"),
        (["--host-kv-blocks", "8", "--disk-kv-gb", "inf"], "argument --disk-kv-gb: invalid value: 'inf' (expected"),
    ],
)
def test_kv_tier_flags_that_cannot_work_are_a_usage_error(tmp_path, flags, message):
    assert_usage_error(run_cli(tmp_path, *flags), message)


def test_a_disk_tier_dir_that_is_a_file_is_a_usage_error(tmp_path):
    file = tmp_path / "blocks"
    file.write_text("")
    done = run_cli(tmp_path, "--host-kv-blocks", "8", "--disk-kv-gb", "1", "--disk-kv-dir", str(file))
    assert_usage_error(done, f"--disk-kv-dir {file}: exists and is not a directory")


def test_a_missing_toml_file_is_a_usage_error(tmp_path):
    missing = tmp_path / "missing.toml"
    assert_usage_error(run_cli(tmp_path, "--config", str(missing)), f"invalid configuration: --config {missing}: ")


def test_an_actor_started_by_hand_checks_its_flags_too(tmp_path):
    done = run_cli(tmp_path, "--nats-url", "nats://127.0.0.1:1", "--max-num-seqs", "0", module="actors.scheduler")
    assert_usage_error(
        done, "argument --max-num-seqs: invalid value: '0' (expected `int` >= 1)", prog="python -m actors.scheduler"
    )


def test_help_groups_the_same_flags_by_component():
    """`--help` shows a heading per component of the config, and the flags are those users always had."""
    out = subprocess.run(
        [sys.executable, "-m", "kernel.supervisor", "--help"], capture_output=True, text=True, check=True, cwd=REPO
    ).stdout
    sections, heading = {}, None
    for line in out.splitlines():
        if line and not line.startswith(" ") and line.endswith(":"):
            heading = line[:-1]
            sections[heading] = []
        elif heading and (flag := re.match(r"  (--?[a-z-]+)", line)):
            sections[heading].append(flag.group(1))
    assert sections == {
        "options": ["-h", "--config"],
        "bus": ["--nats-url", "--nats-credentials", "--namespace", "--bus-max-payload-bytes", "--busy-poll-ms"],
        "engine": [
            "--model",
            "--served-model-name",
            "--device",
            "--dtype",
            "--attention-backend",
            "--deterministic",
            "--max-model-len",
            "--block-size",
            "--num-kv-blocks",
            "--max-num-seqs",
            "--max-prefill-tokens",
            "--prefix-caching",
            "--host-kv-blocks",
            "--disk-kv-gb",
            "--disk-kv-dir",
            "--session-budget-tokens",
            "--step-deadline-s",
            "--weight-version",
            "--weight-group-join-timeout-s",
            "--embedding-pooling",
        ],
        "http": ["--host", "--port", "--max-body-bytes", "--max-concurrent-requests", "--incremental-streaming-output"],
        "chat": ["--tool-call-parser", "--reasoning-parser"],
        "requests": ["--request-timeout-s", "--max-migrations"],
        "tenancy": ["--api-keys", "--admin-key", "--public-prefix-tenants", "--public-prefix-window-s"],
        "supervision": ["--data-dir", "--session-store", "--tokenizers", "--max-restarts", "--restart-period-s"],
        "logging": ["--log-format", "--log-level"],
    }


def test_the_chat_flags_take_the_parsers_names():
    from actors.lib.reasoning import PARSER_NAMES as REASONING
    from actors.lib.tool_calls.families import PARSER_NAMES as TOOL_CALLS

    fields = {f.name: f.type for f in msgspec.structs.fields(config.ChatConfig)}
    assert set(typing.get_args(fields["tool_call_parser"])) == set(TOOL_CALLS)
    assert set(typing.get_args(fields["reasoning_parser"])) == set(REASONING)
