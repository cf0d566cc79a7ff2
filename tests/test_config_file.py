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


@pytest.mark.parametrize(("command", "text", "says"), [
    ("grpo", "steps: 2\nkl_beta: 0.1\nsteps: 3\n", "'steps' is given twice (lines 1 and 3)"),
    ("grpo", "{steps: 2, kl_beta: 0.1, steps: 3}\n", "'steps' is given twice (lines 1 and 1)"),
    ("grpo", "kl_beta: 0.1\nkl-beta: 0.2\n", "kl_beta and kl-beta are the same option (--kl-beta); give it once"),
    ("demo", "grpo:\n  steps: 2\ngrpo.steps: 3\n", "grpo.steps is given twice"),
    ("grpo", "seed: 1.5\n", "seed: 1.5 is not a whole number (--seed takes one)"),
    ("grpo", "steps: 2.5\n", "steps: 2.5 is not a whole number (--steps takes one)"),
], ids=["key-twice", "key-twice-flow", "two-spellings", "nested-and-dotted", "seed-1.5", "steps-2.5"])
def test_a_key_given_twice_or_a_fraction_for_a_whole_number_is_refused(tmp_path, command, text, says):
    """Issue 60, item 7. Before: each was accepted, the last value winning, and 1.5 became 1 (``int(1.5)``)."""
    (tmp_path / "run.yaml").write_text(text)
    parser = build_parser(only=command)
    with pytest.raises(ValueError) as caught:
        config_file.apply(config_file.subparser(parser, command), str(tmp_path / "run.yaml"), command)
    assert str(caught.value) == f"--config {tmp_path / 'run.yaml'}: {says}"


def test_a_whole_number_written_as_a_float_is_that_number_and_merge_keys_may_be_overridden(tmp_path):
    """``seed: 2.0`` is the integer 2 (nothing is lost, unlike 1.5); a ``<<: *base`` merge is not a repeat."""
    (tmp_path / "run.yaml").write_text("seed: 2.0\nbase: &b {steps: 2}\ngrpo:\n  <<: *b\n  steps: 3\n")
    assert config_file.read(str(tmp_path / "run.yaml")) == {"seed": 2.0, "base.steps": 2, "grpo.steps": 3}
    (tmp_path / "run.yaml").write_text("seed: 2.0\n")
    parser = build_parser(only="eval")
    config_file.apply(config_file.subparser(parser, "eval"), str(tmp_path / "run.yaml"), "eval")
    seed = parser.parse_args(["eval", "--domain", "retail", "--out", "x"]).seed
    assert seed == 2 and type(seed) is int


def test_a_seed_the_command_line_refuses_the_file_refuses_too(tmp_path, capsys):
    """Before: ``--seed 1.5`` was refused, ``seed: 1.5`` in the file ran with seed 1."""
    with pytest.raises(SystemExit):
        main(["eval", "--domain", "retail", "--seed", "1.5", "--out", str(tmp_path / "a")])
    assert "invalid int value: '1.5'" in capsys.readouterr().err
    (tmp_path / "run.yaml").write_text("domain: retail\nlimit: 1\nk: 1\nquiet: true\nseed: 1.5\n")
    assert main(["eval", "--config", str(tmp_path / "run.yaml"), "--out", str(tmp_path / "b")]) == 2
    assert capsys.readouterr().err == (f"muarl: error: --config {tmp_path / 'run.yaml'}: seed: 1.5 is not a whole "
                                       "number (--seed takes one)\n")
    assert not (tmp_path / "b").exists()


def test_a_file_that_is_not_utf8_is_refused_naming_it(tmp_path, capsys, monkeypatch):
    """Before: ``muarl: error: 'utf-8' codec can't decode byte 0xff in position 17`` (which file?)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "latin1.yaml").write_bytes("domain: retail\nuser: caf\u00e9\n".encode("latin-1"))
    assert main(["eval", "--config", "latin1.yaml", "--out", "runs/x"]) == 2
    assert capsys.readouterr().err == ("muarl: error: --config latin1.yaml: not UTF-8 text (byte 0xe9 on line 2); "
                                       "save it as UTF-8\n")
    assert not (tmp_path / "runs").exists()


def _laughs(levels: int, width: int = 9) -> str:
    """A "billion laughs": each list holds ``width`` aliases of the one before, ``width ** levels`` values."""
    parts, prev = ['&l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]'], "l0"
    for n in range(1, levels):
        parts.append(f"&l{n} [" + ", ".join([f"*{prev}"] * width) + "]")
        prev = f"l{n}"
    return "seed: [" + ", ".join(parts) + "]\n"


@pytest.mark.parametrize(("text", "says"), [
    (_laughs(7), "its aliases expand to more than 10000 values (nested aliases?); refused before reading them"),
    (_laughs(20, width=2), "its aliases expand to more than 10000 values"),  # 9.4 million: never built
    ("".join(f"m{n}: &m{n} {{a: *m{n - 1}, b: *m{n - 1}}}\n" if n else "m0: &m0 {a: 1, b: 1}\n" for n in range(20)),
     "its aliases expand to more than 10000 values"),  # 2 ** 20 keys once flattened
    ("grpo: &g {steps: *g}\n", "an alias refers to the mapping or list that contains it"),
    ("seed: " + "[" * 5000 + "]" * 5000 + "\n", "nested too deeply"),
    ("seed: " + "x" * 100_000 + "\n", "seed: 'xxxxxxxxxxxxxxxxxxxxxxxxxxx...xxxxxxxxxxxxxxxxxxxxxxxxxxxx' is not valid"),
    ("a:\n  ? " + "k" * 100_000 + "\n  : 1\n? a." + "k" * 100_000 + "\n: 2\n", "a.kkkkkkkk"),  # cut to 400
], ids=["laughs-9^7", "laughs-2^20", "mapping-laughs", "recursive", "deep", "long-value", "long-key-twice"])
def test_aliases_are_bounded_and_every_error_line_is_short(tmp_path, capsys, text, says):
    """Before: the first file's error line was 39 MB (its 4.8 million values, printed), the second's 66 MB,
    the third was flattened into 2 ** 20 keys before its first was refused, the fourth and fifth were
    RecursionError tracebacks, the sixth quoted all 100,000 characters, and the seventh was accepted (two
    keys that flatten to one)."""
    (tmp_path / "bad.yaml").write_text(text)
    assert main(["eval", "--config", str(tmp_path / "bad.yaml"), "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and len(err) <= 420, err[:500]  # config_file.MAX_MESSAGE is 400
    assert err.startswith(f"muarl: error: --config {tmp_path / 'bad.yaml'}: ") and says in err, err[:500]
