"""The command line's options against their single definitions: every training config field is exactly one
option with help, a value given reaches the config, the command table (docs/cli.md) names the parser's options, and
every command line the README, docs and research show still parses (issue 30, item 1). Parsing only: nothing is
trained."""

from __future__ import annotations

import argparse
import dataclasses
import re
import shlex
import subprocess
import sys
import types
import typing
from pathlib import Path

import pytest

from muarl.cli import build_parser
from muarl.cli.config_options import given
from muarl.train.grpo_config import GRPOConfig
from muarl.train.pretrain import PretrainConfig
from muarl.train.sft import SFTConfig

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = {"sft": SFTConfig, "grpo": GRPOConfig, "pretrain": PretrainConfig}
#: what each command requires, so that a command line can be parsed
REQUIRED = {"sft": ["--data", "d.jsonl", "--out", "o"], "grpo": ["--out", "o"], "pretrain": ["--out", "o"]}


def _subparsers(parser: argparse.ArgumentParser | None = None) -> dict[str, argparse.ArgumentParser]:
    parser = parser or build_parser()
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices


def _options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if a.option_strings and a.dest != "help"]


@pytest.mark.parametrize("command", sorted(CONFIGS))
def test_every_config_field_is_exactly_one_option_with_help(command: str) -> None:
    """A new field without an option (or without help) fails here; so does one defined twice."""
    parser = _subparsers()[command]
    for f in dataclasses.fields(CONFIGS[command]):
        actions = [a for a in _options(parser) if a.dest == f.name]
        assert len(actions) == 1, f"{command}: field {f.name} has {len(actions)} options"
        assert f.metadata.get("help") and actions[0].help, f"{command}: field {f.name} has no help"
    flags = [s for a in _options(parser) for s in a.option_strings]
    assert len(flags) == len(set(flags))


def _value(hint: object, choices: object) -> tuple[list[str], object]:
    """Command-line words for a field of type ``hint``, and the value they should give."""
    if choices:
        choice = list(choices)[-1]
        return [choice], choice
    if typing.get_origin(hint) in (typing.Union, types.UnionType):  # X | None
        hint = typing.get_args(hint)[0]
    if typing.get_origin(hint) is list:
        return ["a", "b"], ["a", "b"]
    return {int: (["7"], 7), float: (["0.5"], 0.5), str: (["word"], "word")}[hint]


@pytest.mark.parametrize("command", sorted(CONFIGS))
@pytest.mark.parametrize("yes", [True, False])
def test_each_option_reaches_its_field(command: str, yes: bool) -> None:
    """Every field set at once from the command line (a bool as --x, then as --no-x) comes back as given."""
    cls = CONFIGS[command]
    hints = typing.get_type_hints(cls)
    parser = _subparsers()[command]
    by_dest = {a.dest: a for a in _options(parser)}
    argv, expected = [command], {}
    for f in dataclasses.fields(cls):
        action = by_dest[f.name]
        if isinstance(action, argparse.BooleanOptionalAction):
            argv.append(action.option_strings[0 if yes else 1])
            expected[f.name] = yes
        else:
            words, expected[f.name] = _value(hints[f.name], action.choices)
            argv += [action.option_strings[0], *words]
    assert given(build_parser().parse_args(argv), cls) == expected


def test_left_out_options_keep_the_preset_and_given_ones_reach_the_config() -> None:
    from muarl.cli.grpo import grpo_config
    from muarl.cli.pretrain import pretrain_config
    from muarl.cli.sft import sft_config
    from muarl.train import grpo_config as grpo
    from muarl.train import sft

    parser = build_parser()
    # the derived default filled in too: the run takes the settings as they are
    assert grpo_config(parser.parse_args(["grpo", "--out", "o"])).config == dataclasses.replace(
        grpo.PRESETS["tiny"], out="o", tis_cap=0.0)
    config = grpo_config(parser.parse_args([
        "grpo", "--out", "o", "--preset", "paper", "--no-shared-prefix", "--no-merge-lora", "--no-resume",
        "--user-timeout", "0", "--tis-cap", "2", "--optimizer", "sgd", "--no-mask-sim-faults", "--clip-high", "0.28"])).config
    assert (config.steps, config.shared_prefix, config.merge_lora, config.resume) == (25, False, False, False)
    assert (config.tis_cap, config.optimizer, config.mask_sim_faults, config.clip_high) == (2.0, "sgd", False, 0.28)
    assert config.episode_config().user_timeout is None  # 0: no limit, as before
    config = sft_config(parser.parse_args(["sft", "--data", "a.jsonl", "b.jsonl", "--out", "o", "--no-packing",
                                           "--fresh-ids", "--resume", "--warmup-steps", "5", "--lora-r", "8"]))
    assert config.data == ["a.jsonl", "b.jsonl"] and config.lr == sft.PRESETS["tiny"].lr
    assert (config.packing, config.fresh_ids, config.resume, config.warmup_steps, config.lora_r) == (
        False, True, True, 5, 8)
    config = pretrain_config(parser.parse_args(["pretrain", "--out", "o", "--domains", "retail-lite", "airline",
                                                "--exclude-behaviours", "changes_mind", "--head-dim", "32"]))
    assert (config.domains, config.exclude_behaviours, config.head_dim) == (["retail-lite", "airline"],
                                                                          ["changes_mind"], 32)
    with pytest.raises(ValueError, match="unknown user behaviour nope"):
        pretrain_config(parser.parse_args(["pretrain", "--out", "o", "--exclude-behaviours", "nope"]))


def test_demo_options_reach_the_nested_configs() -> None:
    """The demo's knobs land in the SFT and GRPO configs it nests; the rest of each stays the preset's."""
    from muarl.cli.demo import demo_overrides
    from muarl.experiments.recipe import PRESETS

    args = build_parser().parse_args(["demo", "--preset", "smoke", "--grpo-steps", "3", "--grpo-lr", "1e-3",
                                      "--no-mask-truncated", "--sft-batch", "4", "--fresh-ids", "--no-greedy",
                                      "--synth-families", "cancel", "return", "--domain", "retail-lite"])
    config = PRESETS["smoke"].with_overrides(**demo_overrides(args))
    smoke = PRESETS["smoke"]
    assert (config.grpo.steps, config.grpo.lr, config.grpo.mask_truncated) == (3, 1e-3, False)
    assert config.grpo.group_size == smoke.grpo.group_size and config.grpo.kl_beta == smoke.grpo.kl_beta
    assert (config.sft.batch_size, config.sft.fresh_ids, config.sft.lr) == (4, True, smoke.sft.lr)
    assert (config.greedy, config.synth_families, config.domain) == (False, ("cancel", "return"), "retail-lite")
    assert config.settings()["grpo.steps"] == 3 and "grpo.model" not in config.settings()
    plain = PRESETS["default"].with_overrides(**demo_overrides(build_parser().parse_args(["demo"])))
    assert plain == PRESETS["default"]


def _flags(text: str) -> set[str]:
    return set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", text))


def _command_table() -> dict[str, str]:
    """The command table of docs/cli.md (moved there from the README): each command's row text (the
    ``(sft and grpo)`` row under that name)."""
    section = (ROOT / "docs" / "cli.md").read_text().split("\n## Commands\n", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        found = re.match(r"\| (?:`muarl ([a-z-]+)|\((sft and grpo)\))", line)
        if found:
            rows[found.group(1) or found.group(2)] = line
    return rows


def test_command_table_matches_the_parser() -> None:
    """Every option a row names exists; the sft and grpo rows (with the shared row) name every option of
    theirs (``--x`` or ``--no-x`` for a yes/no option; ``--data DIR`` is documented above the table)."""
    rows, commands = _command_table(), _subparsers()
    assert {"sft", "grpo", "sft and grpo", "demo", "eval"} <= set(rows)
    for name, row in rows.items():
        for command in (["sft", "grpo"] if name == "sft and grpo" else [name]):
            known = {s for a in commands[command]._actions for s in a.option_strings}
            assert _flags(row) <= known, f"docs/cli.md names options {command} lacks: {sorted(_flags(row) - known)}"
    for command in ("sft", "grpo"):
        documented = _flags(rows[command]) | _flags(rows["sft and grpo"])
        missing = [a.option_strings[0] for a in _options(commands[command])
                   if a.dest != "data_dir" and not documented & set(a.option_strings)]
        assert not missing, f"docs/cli.md's {command} rows do not name {missing}"


def test_training_docs_options_table_names_real_options() -> None:
    text = (ROOT / "docs" / "training.md").read_text()
    table = text.split("## Command-line options (sft and grpo)", 1)[1].split("\n## ", 1)[0]
    commands = _subparsers()
    known = {s for c in ("sft", "grpo") for a in _options(commands[c]) for s in a.option_strings}
    assert _flags(table) and _flags(table) <= known, sorted(_flags(table) - known)


def documented_command_lines() -> list[tuple[str, list[str]]]:
    """Every ``muarl COMMAND ...`` line of a fenced code block in the README, docs and research (the lab
    notebook), as arguments (lines with placeholders such as ``...`` or ``[--x]`` left out)."""
    commands = list(_subparsers(build_parser(only="")))
    pattern = re.compile(r"(?:^|[\s/])muarl\s+(" + "|".join(map(re.escape, commands)) + r")(?=\s|$)")
    found = []
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "research").rglob("*.md"))]
    for path in pages:
        fenced, block = False, []
        for line in path.read_text().splitlines():
            if line.lstrip().startswith("```"):
                fenced = not fenced
                continue
            if not fenced:
                continue
            block.append(line)
            if line.endswith("\\"):
                continue
            joined, block = " ".join(part.rstrip("\\") for part in block), []
            match = pattern.search(joined)
            if not match:
                continue
            words = re.split(r"\s(?:#|&&|\||>|;)", joined[match.start(1):])[0]
            if "..." in words or "[" in words or "<" in words:
                continue
            found.append((str(path.relative_to(ROOT)), shlex.split(words)))
    return found


def test_every_documented_command_line_parses_and_builds_its_config() -> None:
    from muarl.cli.demo import demo_overrides
    from muarl.cli.grpo import grpo_config
    from muarl.cli.pretrain import pretrain_config
    from muarl.cli.sft import sft_config
    from muarl.experiments.recipe import PRESETS

    lines = documented_command_lines()
    assert len(lines) > 40 and {argv[0] for _, argv in lines} >= {"sft", "grpo", "demo", "eval", "pretrain"}
    parser = build_parser()
    for where, argv in lines:
        try:
            args = parser.parse_args(argv)
        except SystemExit:
            pytest.fail(f"{where}: `muarl {shlex.join(argv)}` no longer parses")
        build = {"sft": sft_config, "grpo": grpo_config, "pretrain": pretrain_config,
                 "demo": lambda a: PRESETS[a.preset].with_overrides(**demo_overrides(a))}.get(argv[0])
        if build:
            build(args)


def test_a_command_builds_only_its_own_options() -> None:
    """``muarl domains`` does not pay for the training commands' options (they import torch)."""
    code = ("import sys; from muarl.cli import main; main(['domains', '--json']); "
            "sys.stderr.write(str('torch' in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0 and done.stderr.endswith("False"), done.stderr[-2000:]
