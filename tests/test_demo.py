"""`muarl demo --preset smoke`: every stage end to end, as CI runs it, and a rerun that resumes."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from conftest import run_muarl
from muarl.demo import run_demo
from muarl.experiments.recipe import PRESETS

ROOT = Path(__file__).resolve().parents[1]


def _muarl(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "COLUMNS": "200"}  # table rows on one line each
    return run_muarl(*args, env=env, timeout=600, cwd=cwd)


@pytest.mark.slow
def test_smoke_demo_runs_every_stage_and_resumes(tmp_path: Path) -> None:
    """Run as the README runs it: from a working directory, with a relative ``--out``."""
    out = tmp_path / "runs" / "demo"
    done = _muarl("demo", "--preset", "smoke", "--out", "runs/demo", "--quiet", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (out / "grpo" / "DONE").exists()
    assert not (out / "synth").exists() and not (out / "sft").exists()  # the shipped base is the cold start
    grpo_config = json.loads((out / "grpo" / "config.json").read_text())
    assert Path(grpo_config["model"]).parent.name == "muarl" and Path(grpo_config["model"]).name == "base"
    summary = json.loads((out / "summary.json").read_text())
    smoke = PRESETS["smoke"]
    for name, key, temperature in (("eval-sft", "sft", 1.0), ("eval-rl", "rl", 1.0), ("eval-sft-greedy", "sft_greedy", 0.0),
                                   ("eval-rl-greedy", "rl_greedy", 0.0)):
        results = json.loads((out / name / "results.json").read_text())
        assert results["metrics"]["episodes"] == smoke.eval_tasks * smoke.eval_k
        assert results["config"]["temperature"] == temperature
        assert summary[key] == results["metrics"]
    for name, key in (("comparison.json", "comparison"), ("comparison-greedy.json", "comparison_greedy")):
        comparison = json.loads((out / name).read_text())
        pass1 = next(m for m in comparison["metrics"] if m["metric"] == "pass^1")
        assert pass1["tasks"] == smoke.eval_tasks and pass1["low"] <= pass1["diff"] <= pass1["high"]
        assert summary[key]["pass^1"] == [pass1["diff"], pass1["low"], pass1["high"]]
    assert (out / "changed.md").read_text().startswith("# Held-out conversations that changed with RL")
    grpo = [json.loads(line) for line in (out / "grpo" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in grpo] == list(range(1, smoke.grpo.steps + 1))
    assert all("reward" in r and "violation_rate" in r for r in grpo)
    for plot in ("cold_start.png", "grpo_dynamics.png", "eval.png"):
        assert (out / "plots" / plot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = (out / "report.html").read_text()
    assert 'class="missing"' not in page, page[page.find('class="missing"'):][:300]  # a plot it did not find
    assert page.count('<img src="data:image/png;base64,') == 3  # each plot inlined
    assert "cold start" in done.stdout and "after RL" in done.stdout and "95% interval" in done.stdout
    table = [line for line in done.stdout.splitlines() if "│" in line]
    at = next(i for i, line in enumerate(table) if line.startswith("│ pass^1 "))
    assert [table[at + i].split("│")[1].strip() for i in range(8)] == [  # T = 1, then T = 0, faults by party
        "pass^1", "policy faults", "user faults", "tool faults",
        "pass^1, T = 0", "policy faults, T = 0", "user faults, T = 0", "tool faults, T = 0"]

    # a rerun finds every stage done: nothing is trained or played again and the summary is the same
    files = ["grpo/metrics.jsonl", "eval-sft/trajectories.jsonl", "eval-rl/trajectories.jsonl",
             "eval-sft-greedy/trajectories.jsonl", "eval-rl-greedy/trajectories.jsonl", "grpo/model/model.safetensors"]
    before = {f: (out / f).read_bytes() for f in files}
    # a run recorded before the greedy knob existed had its default: it resumes, not "other settings"
    recorded = json.loads((out / "demo.json").read_text())
    del recorded["greedy"]
    (out / "demo.json").write_text(json.dumps(recorded))
    again = run_demo(out, "smoke", progress=False)
    assert {f: (out / f).read_bytes() for f in files} == before
    assert again["sft"] == summary["sft"] and again["rl"] == summary["rl"]
    assert again["rl_greedy"] == summary["rl_greedy"]
    with pytest.raises(ValueError, match=r"holds a demo run with other settings \(greedy\)"):
        run_demo(out, "smoke", progress=False, greedy=False)


@pytest.mark.slow
def test_scratch_demo_trains_its_own_cold_start_first(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    done = _muarl("demo", "--preset", "smoke-scratch", "--out", str(out), "--quiet", "--stop-after", "eval-sft")
    assert done.returncode == 0, done.stderr[-3000:]
    for stage in ("model", "synth", "sft-prefix", "sft"):
        assert (out / stage / "DONE").exists(), stage
    # the openings stage trained on exact prefixes, and whole-conversation SFT started from its model
    openings = (out / "sft-prefix" / "openings.jsonl").read_text().splitlines()
    whole = (out / "synth" / "sft_used.jsonl").read_text().splitlines()
    assert len(openings) == len(whole) == PRESETS["smoke-scratch"].sft_conversations
    first, full = json.loads(openings[0]), json.loads(whole[0])
    n = len(first["messages"])
    assert first["messages"] == full["messages"][:n] and n < len(full["messages"])
    assert json.loads((out / "sft" / "config.json").read_text())["model"] == str(out / "sft-prefix" / "model")
    sft = [json.loads(line) for line in (out / "sft" / "metrics.jsonl").read_text().splitlines()]
    assert sft and all(r["loss"] > 0 for r in sft)
    assert (out / "eval-sft" / "results.json").exists() and not (out / "grpo").exists()


def test_demo_refuses_other_settings_in_the_same_directory(tmp_path: Path) -> None:
    (tmp_path / "demo.json").write_text(json.dumps({"preset": "default", "seed": 1}))
    with pytest.raises(ValueError, match="other settings"):
        run_demo(tmp_path, "smoke", seed=0, progress=False)


def test_unknown_preset_is_a_clear_error(tmp_path: Path) -> None:
    result = _muarl("demo", "--preset", "huge", "--out", str(tmp_path / "x"))
    assert result.returncode == 2 and "invalid choice" in result.stderr


def test_demo_model_takes_the_head_shape_from_its_config(tmp_path: Path) -> None:
    from dataclasses import replace

    from transformers import AutoConfig

    from muarl.experiments.stages import build_model

    scratch = replace(PRESETS["default"], base="scratch")
    default = AutoConfig.from_pretrained(build_model(tmp_path / "a", scratch, seed=0))
    wide = AutoConfig.from_pretrained(build_model(tmp_path / "b", replace(scratch, head_dim=64, kv_heads=4), seed=0))
    assert (default.head_dim, default.num_key_value_heads) == (16, 2)
    assert (wide.head_dim, wide.num_key_value_heads, wide.hidden_size) == (64, 4, default.hidden_size)


def test_stop_after_ends_the_run_there_and_recipe_flags_reach_the_config(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    done = _muarl("demo", "--preset", "smoke-scratch", "--out", str(out), "--quiet", "--stop-after", "synth",
                  "--head-dim", "32", "--kv-heads", "1", "--prompt", "full", "--sft-epochs", "3")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "stopped after synth" in done.stdout
    assert (out / "model" / "DONE").exists() and (out / "synth" / "DONE").exists()
    assert not (out / "sft-prefix").exists() and not (out / "sft").exists() and not (out / "summary.json").exists()
    settings = json.loads((out / "demo.json").read_text())
    assert (settings["head_dim"], settings["kv_heads"], settings["prompt"], settings["sft.epochs"]) == (32, 1, "full", 3)
    assert settings["prefix_calls"] == PRESETS["smoke-scratch"].prefix_calls  # not given: the preset's
    model = json.loads((out / "model" / "config.json").read_text())
    assert (model["head_dim"], model["num_key_value_heads"]) == (32, 1)
    bad = _muarl("demo", "--preset", "smoke", "--out", str(tmp_path / "x"), "--stop-after", "nope")
    assert bad.returncode == 2 and "invalid choice" in bad.stderr


def test_eval_split_picks_the_evaluated_tasks_and_both_splits_share_one_run(tmp_path: Path) -> None:
    """``--eval-split dev`` evaluates dev tasks, in ``dev/``; the same directory then takes the test split
    (the trained model is shared, so the split is not a setting the run must match) into its top level."""
    from muarl.cli import build_parser
    from muarl.cli.demo import demo_overrides
    from muarl.domain import get_domain

    args = build_parser().parse_args(["demo", "--eval-split", "dev", "--eval-tasks", "2", "--eval-k", "1",
                                      "--no-greedy"])
    overrides = demo_overrides(args)
    assert overrides["eval_split"] == "dev"
    out = tmp_path / "demo"
    run_demo(out, "smoke", progress=False, stop_after="eval-sft", **overrides)
    domain = get_domain(PRESETS["smoke"].domain)

    def evaluated(folder: Path) -> list[str]:
        lines = (folder / "trajectories.jsonl").read_text().splitlines()
        return sorted({json.loads(line)["task_id"] for line in lines})

    assert evaluated(out / "dev" / "eval-sft") == sorted(t.id for t in domain.tasks("dev")[:2])
    assert not (out / "eval-sft").exists() and "eval_split" not in json.loads((out / "demo.json").read_text())
    run_demo(out, "smoke", progress=False, stop_after="eval-sft", **{**overrides, "eval_split": "test"})
    assert evaluated(out / "eval-sft") == sorted(t.id for t in domain.tasks("test")[:2])
    seconds = json.loads((out / "seconds.json").read_text())
    assert {"dev/eval-sft", "eval-sft"} <= set(seconds)
    with pytest.raises(ValueError, match="fewer than"):  # before any stage runs, not after the training
        run_demo(tmp_path / "big", "smoke", progress=False, eval_split="dev", eval_tasks=len(domain.tasks("dev")) + 1)
    assert not (tmp_path / "big").exists()


def test_a_model_directory_is_a_cold_start_of_ones_own(tmp_path: Path) -> None:
    """``--base DIR``: the demo (and ``muarl ablate``, which shares its cold start) evaluates and trains the
    given model, not the shipped base; anything else that is not a model directory is one clear error."""
    import shutil

    from muarl.models import base_path

    mine = tmp_path / "mine"
    shutil.copytree(base_path(), mine)
    out = tmp_path / "demo"
    done = _muarl("demo", "--preset", "smoke", "--base", str(mine), "--out", str(out), "--quiet", "--no-greedy",
                  "--stop-after", "eval-sft")
    assert done.returncode == 0, done.stderr[-3000:]
    evaluated = json.loads((out / "eval-sft" / "results.json").read_text())
    assert evaluated["config"]["model"] == str(mine), evaluated["config"]
    assert json.loads((out / "demo.json").read_text())["base"] == str(mine)
    for bad in (tmp_path / "nowhere", tmp_path):
        refused = _muarl("demo", "--preset", "smoke", "--base", str(bad), "--out", str(tmp_path / "x"))
        assert refused.returncode == 2 and "nor a model directory" in refused.stderr, refused.stderr
        assert "Traceback" not in refused.stderr
