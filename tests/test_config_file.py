"""``--config FILE.yaml`` (muarl.cli.config_file): a run from a file records the settings the same run from
flags records, the run directory's ``config.yaml`` reruns it, and a file that names no option is refused
in one line before anything runs."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from muarl.cli import build_parser, config_file, main

RUN = {"model": "tiny", "domain": "retail-lite", "steps": 1, "tasks_per_step": 1, "group_size": 2,
       "max_new_tokens": 8, "max_turns": 2, "lr": "1e-5", "kl_beta": 0.02, "report_to": "none"}
FLAGS = ["--model", "tiny", "--domain", "retail-lite", "--steps", "1", "--tasks-per-step", "1", "--group-size", "2",
         "--max-new-tokens", "8", "--max-turns", "2", "--lr", "1e-5", "--kl-beta", "0.02", "--report-to", "none"]


def _settings(run_dir) -> dict:
    recorded = yaml.safe_load((run_dir / "config.yaml").read_text())
    recorded.pop("out")
    return recorded


def test_a_run_from_a_file_records_what_the_same_run_from_flags_records(tmp_path, monkeypatch):
    """From a working directory with relative paths, as the README runs: ``muarl grpo --config run.yaml``
    (the console command, a process of its own), the same options as flags, and a rerun from the first
    run's ``config.yaml``: three identical resolved configs, every field of GRPOConfig in them."""
    from dataclasses import fields

    from muarl.train.grpo_config import GRPOConfig

    monkeypatch.chdir(tmp_path)
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(RUN))
    done = subprocess.run([sys.executable, "-m", "muarl", "grpo", "--config", "run.yaml", "--out", "runs/file",
                           "--no-progress"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert main(["grpo", *FLAGS, "--out", "runs/flags", "--no-progress"]) == 0
    assert main(["grpo", "--config", "runs/file/config.yaml", "--out", "runs/rerun", "--no-progress"]) == 0
    recorded = _settings(tmp_path / "runs/file")
    assert set(recorded) | {"out"} == {f.name for f in fields(GRPOConfig)}
    assert recorded["kl_beta"] == 0.02 and recorded["lr"] == 1e-5 and recorded["tasks_per_step"] == 1
    assert _settings(tmp_path / "runs/flags") == recorded
    assert _settings(tmp_path / "runs/rerun") == recorded


def test_the_command_line_wins_over_the_file_and_nested_keys_reach_prefixed_options(tmp_path):
    (tmp_path / "grpo.yaml").write_text("kl-beta: 0.5\nsteps: 4\nfsdp: true\n")
    parser = build_parser(only="grpo")
    config_file.apply(config_file.subparser(parser, "grpo"), str(tmp_path / "grpo.yaml"), "grpo")
    args = parser.parse_args(["grpo", "--steps", "2", "--out", "runs/x"])
    assert (args.kl_beta, args.steps, args.fsdp) == (0.5, 2, True)

    (tmp_path / "pretrain.yaml").write_text("domains: [retail-lite, airline]\nusers: scripted\n")
    parser = build_parser(only="pretrain")
    config_file.apply(config_file.subparser(parser, "pretrain"), str(tmp_path / "pretrain.yaml"), "pretrain")
    args = parser.parse_args(["pretrain", "--out", "runs/x"])
    assert (args.domains, args.users) == (["retail-lite", "airline"], ["scripted"])  # one value: a list of one

    (tmp_path / "demo.yaml").write_text("preset: smoke\ngrpo:\n  steps: 2\nsft_epochs: 1\n")
    parser = build_parser(only="demo")
    config_file.apply(config_file.subparser(parser, "demo"), str(tmp_path / "demo.yaml"), "demo")
    args = parser.parse_args(["demo", "--grpo-steps", "3"])
    assert (args.preset, getattr(args, "grpo.steps"), getattr(args, "sft.epochs")) == ("smoke", 3, 1)


def test_an_out_given_by_the_file_is_not_asked_for_again(tmp_path):
    (tmp_path / "grpo.yaml").write_text("out: runs/x\n")
    parser = build_parser(only="grpo")
    config_file.apply(config_file.subparser(parser, "grpo"), str(tmp_path / "grpo.yaml"), "grpo")
    assert parser.parse_args(["grpo"]).out == "runs/x"


@pytest.mark.parametrize(("text", "says"), [
    ("kl_betta: 0.1\n", "'kl_betta' is not an option of muarl grpo (did you mean kl_beta?)"),
    ("steps: many\n", "steps: 'many' is not valid"),
    ("fsdp: 3\n", "fsdp: expected true or false, got 3"),
    ("rollout_engine: yes\n", "rollout_engine: expected a value, got true (quote it if it is text)"),
    ("steps: [1, 2]\n", "steps: expected one value"),
    ("- steps\n", "the file must be a mapping of option names to values, not a list"),
    ("steps: [1\n", "not valid YAML"),
])
def test_a_file_that_names_no_option_is_refused_in_one_line_before_anything_runs(tmp_path, monkeypatch, capsys,
                                                                                 text, says):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.yaml").write_text(text)
    assert main(["grpo", "--config", "bad.yaml", "--out", "runs/x"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("muarl: error: --config bad.yaml: ") and says in err, err
    assert not (tmp_path / "runs").exists()


def test_a_missing_file_is_one_line(tmp_path, capsys):
    assert main(["eval", "--config", str(tmp_path / "none.yaml")]) == 2
    assert capsys.readouterr().err == f"muarl: error: --config {tmp_path / 'none.yaml'}: no such file\n"


def test_every_command_that_runs_something_takes_a_config_file():
    # named here, not read from config_file.TAKES_CONFIG: a command dropped from that list must fail this
    for command in ("sft", "grpo", "pretrain", "eval", "rollout", "synth", "demo", "ablate"):
        sub = config_file.subparser(build_parser(only=command), command)
        assert any(config_file.OPTION in a.option_strings for a in sub._actions), command
