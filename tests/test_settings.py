"""A run's settings are resolved in one place (muarl.train.settings.resolve) in one order: the preset, then a
config file, then the flags, then the derived defaults; each layer wins over the ones before it, and a value
a layer leaves out keeps the one below."""

from __future__ import annotations

import dataclasses

import pytest

from muarl.cli import build_parser, config_file
from muarl.train.grpo_config import PRESETS, GRPOConfig
from muarl.train.settings import Resolved, complete, resolve


def test_the_flags_win_over_the_file_which_wins_over_the_preset():
    tiny = PRESETS["tiny"]
    settings = resolve(PRESETS, "tiny", "GRPO", file={"lr": 0.5, "steps": 3, "kl_beta": 0.2},
                       flags={"lr": 0.25, "kl_beta": None})
    config = settings.config
    assert config.lr == 0.25  # the flag over the file
    assert (config.steps, config.kl_beta) == (3, 0.2)  # the file over the preset; None keeps the layer below
    assert (config.group_size, config.max_new_tokens) == (tiny.group_size, tiny.max_new_tokens)  # the preset's
    assert resolve(PRESETS, "tiny", "GRPO", file={"lr": 0.5}).config.lr == 0.5
    assert resolve(PRESETS, "tiny", "GRPO", flags={"lr": 0.5}).config.lr == 0.5
    assert resolve(PRESETS, "tiny", "GRPO").config == dataclasses.replace(tiny, tis_cap=0.0)


def test_the_derived_defaults_come_last_and_never_override_a_value_given():
    streamed = resolve(PRESETS, "tiny", "GRPO", file={"max_staleness": 2})
    assert streamed.config.tis_cap == 2.0 and streamed.derived == {"tis_cap": 2.0}  # follows the file's value
    assert resolve(PRESETS, "tiny", "GRPO", flags={"max_staleness": 2}).config.tis_cap == 2.0  # and a flag's
    chosen = resolve(PRESETS, "tiny", "GRPO", file={"max_staleness": 2}, flags={"tis_cap": 0.0})
    assert chosen.config.tis_cap == 0.0 and chosen.derived == {}  # a value given stands
    assert resolve(PRESETS, "tiny", "GRPO", file={"tis_cap": 3.0}, flags={"max_staleness": 1}).config.tis_cap == 3.0
    assert complete(streamed.config) == Resolved(streamed.config, {})  # filling in twice changes nothing


def test_the_layers_are_checked_whole_and_a_preset_must_exist():
    # neither layer alone is a valid run (--vllm-sleep needs --rollout-engine vllm); together they are
    both = resolve(PRESETS, "tiny", "GRPO", file={"vllm_sleep": True}, flags={"rollout_engine": "vllm"})
    assert both.config.vllm_sleep and both.config.rollout_engine == "vllm"
    with pytest.raises(ValueError, match="--vllm-sleep"):
        resolve(PRESETS, "tiny", "GRPO", file={"vllm_sleep": True})
    with pytest.raises(ValueError, match="unknown GRPO preset 'huge'; choose from paper, tiny"):
        resolve(PRESETS, "huge", "GRPO")


def _command_line(tmp_path, command: str, file: str, argv: list[str]):
    (tmp_path / "run.yaml").write_text(file)
    parser = build_parser(only=command)
    config_file.apply(config_file.subparser(parser, command), str(tmp_path / "run.yaml"), command)
    return parser.parse_args([command, *argv])


def test_a_command_line_resolves_preset_file_flags_and_derived_in_that_order(tmp_path):
    """``muarl grpo --preset paper --config FILE --steps 2``: the preset, then the file, then the flags, then
    the derived default, through the parser as the command line goes."""
    from muarl.cli.grpo import grpo_config

    args = _command_line(tmp_path, "grpo", "preset: paper\nsteps: 4\nkl_beta: 0.5\nmax_staleness: 1\nlr: 0.1\n",
                         ["--steps", "2", "--lr", "0.1", "--out", "runs/x"])
    settings = grpo_config(args)
    config = settings.config
    assert isinstance(config, GRPOConfig)
    assert config.steps == 2 and config.out == "runs/x"  # flags
    assert (config.kl_beta, config.max_staleness, config.lr) == (0.5, 1, 0.1)  # the file (a flag equal to it too)
    assert config.group_size == PRESETS["paper"].group_size == 8  # the preset the file named
    assert config.tis_cap == 2.0 and settings.derived == {"tis_cap": 2.0}  # derived from the file's staleness


def test_sft_resolves_through_the_same_layers(tmp_path):
    from muarl.cli.sft import sft_config
    from muarl.train.sft import PRESETS as SFT_PRESETS

    config = sft_config(_command_line(tmp_path, "sft", "epochs: 3\nlr: 0.5\n",
                                      ["--lr", "0.25", "--data", "a.jsonl", "--out", "o"]))
    assert (config.epochs, config.lr, config.batch_size) == (3, 0.25, SFT_PRESETS["tiny"].batch_size)
