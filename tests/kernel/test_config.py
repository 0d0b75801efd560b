import argparse

import pytest

from kernel import config


def parse(argv, env=None, monkeypatch=None):
    parser = argparse.ArgumentParser()
    config.add_arguments(parser)
    return config.from_args(parser.parse_args(argv))


def test_flags_override_environment_which_overrides_toml(tmp_path, monkeypatch):
    toml = tmp_path / "kernel.toml"
    toml.write_text('port = 7000\nnamespace = "from-toml"\nmax_num_seqs = 3\n')
    monkeypatch.setenv("KERNEL_NAMESPACE", "from-env")
    monkeypatch.setenv("KERNEL_MAX_NUM_SEQS", "5")
    cfg = parse(["--config", str(toml), "--max-num-seqs", "9"])
    assert (cfg.port, cfg.namespace, cfg.max_num_seqs) == (7000, "from-env", 9)


def test_to_argv_round_trips():
    cfg = parse(["--port", "9001", "--model", "/m/qwen", "--restart-period-s", "2.5"])
    assert parse(config.to_argv(cfg)) == cfg
    assert cfg.model_name == "qwen"


def test_bad_value_is_a_clear_exit(monkeypatch):
    monkeypatch.setenv("KERNEL_PORT", "eighty")
    with pytest.raises(SystemExit, match="invalid configuration"):
        parse([])


def test_a_switch_turns_off_by_flag_environment_or_toml(tmp_path, monkeypatch):
    assert parse([]).prefix_caching is True
    assert parse(["--no-prefix-caching"]).prefix_caching is False
    cfg = parse(["--no-prefix-caching"])
    assert config.to_argv(cfg) == ["--no-prefix-caching"] and parse(config.to_argv(cfg)) == cfg
    monkeypatch.setenv("KERNEL_PREFIX_CACHING", "false")
    assert parse([]).prefix_caching is False
    assert parse(["--prefix-caching"]).prefix_caching is True
