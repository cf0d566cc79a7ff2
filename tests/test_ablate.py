"""`muarl ablate` (issue 32 items 2 and 3): the same GRPO with and without the user in the loop, from one cold
start, evaluated with every user. The arms' sameness is asserted from their run records (configs, cold-start
digests, every step's tasks and user seeds, every evaluation's tasks and user seeds), not from the code that
made them; the smoke preset runs end to end (CI), resumes, and refuses other settings; --method-from reuses a
demo run's model only when it is exactly what this run would train."""

from __future__ import annotations

import json
import os
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from conftest import run_muarl
from muarl.ablation.layout import eval_name
from muarl.ablation.records import arm_differences
from muarl.ablation.run import run_ablate
from muarl.demo import run_demo
from muarl.experiments.recipe import PRESETS
from muarl.experiments.stages import held_out_tasks
from muarl.users.scripted import ScriptedUser

ROOT = Path(__file__).resolve().parents[1]
SMOKE = PRESETS["smoke"]
MODELS = ("cold-start", "rl-scripted", "rl-static")


class QuickToGiveUp(ScriptedUser):
    """A third evaluation user (a plug-in, ``test_ablate:QuickToGiveUp``): the scripted user with less patience."""

    name = "quick-to-give-up"

    def __init__(self) -> None:
        super().__init__(max_stale=2)


def _muarl(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "COLUMNS": "200"}
    return run_muarl(*args, env=env, timeout=600)


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _episodes_by_step(grpo: Path) -> dict[str, list[tuple[str, int]]]:
    return {p.name: [(r["task_id"], r["user_seed"]) for r in _rows(p)] for p in sorted((grpo / "rollouts").glob("*.jsonl"))}


def assert_arms_share_all_but_the_user(method: Path, static: Path) -> None:
    """From the two GRPO runs' records: the same settings but the user (and their folders), the same cold
    start (its path and its files' digests), the same tasks with the same user seeds at every step."""
    a, b = (json.loads((run / "config.json").read_text()) for run in (method, static))
    assert (a["user"], b["user"]) == ("scripted", "static")
    assert {k for k in a if a[k] != b[k]} <= {"user", "out", "model"}
    assert a["seed"] == b["seed"] and a["steps"] == b["steps"] == SMOKE.grpo.steps
    digests = [json.loads((run / "provenance.json").read_text())["inputs"]["model"] for run in (method, static)]
    assert digests[0] and digests[0] == digests[1]
    steps_a, steps_b = _episodes_by_step(method), _episodes_by_step(static)
    assert len(steps_a) == SMOKE.grpo.steps and steps_a == steps_b
    assert all(len(eps) == SMOKE.grpo.tasks_per_step * SMOKE.grpo.group_size for eps in steps_a.values())


def assert_every_model_met_the_same_users(out: Path, users: tuple[str, ...], models: tuple[str, ...]) -> None:
    """Every evaluation of an evaluation user: the split's first tasks, the same (task, user seed) trials for
    every model, the user recorded as the one asked for."""
    tasks = [t.id for t in held_out_tasks(SMOKE)]
    for user in users:
        trials = []
        for model in models:
            run = out / eval_name(model, user)
            config = json.loads((run / "config.json").read_text())
            assert config["user"] == user and config["seed"] == 0 and config["k"] == SMOKE.eval_k
            trials.append(Counter((r["task_id"], r["user_seed"]) for r in _rows(run / "trajectories.jsonl")))
        assert all(t == trials[0] for t in trials)
        assert sorted({task for task, _ in trials[0]}) == sorted(tasks) and sum(trials[0].values()) == len(tasks) * SMOKE.eval_k


@pytest.mark.slow
def test_smoke_ablation_trains_both_arms_alike_evaluates_every_pair_and_resumes(tmp_path: Path) -> None:
    out = tmp_path / "ablate"
    done = _muarl("ablate", "--preset", "smoke", "--out", str(out), "--quiet")
    assert done.returncode == 0, done.stderr[-3000:]
    assert_arms_share_all_but_the_user(out / "rl-scripted" / "grpo", out / "rl-static" / "grpo")
    assert_every_model_met_the_same_users(out, ("scripted", "static"), MODELS)
    for model in MODELS:  # the greedy evaluations too
        assert (out / eval_name(model, "scripted", greedy=True) / "results.json").exists()

    summary = json.loads((out / "summary.json").read_text())
    assert summary["arms_share"] == {"rl-static": {"settings": ["user"], "same_cold_start": True,
                                                   "steps": SMOKE.grpo.steps, "same_episodes": True}}
    assert summary["models"]["rl-scripted"] == str(out / "rl-scripted" / "grpo" / "model")
    assert set(summary["matrix"]) == {"scripted", "scripted-greedy", "static", "static-greedy"}
    for row in summary["matrix"].values():
        assert set(row) == set(MODELS) and all(c["low"] <= c["value"] <= c["high"] for c in row.values())
    diff, low, high = summary["differences"]["rl-scripted - rl-static"]["scripted"]["pass^1"]
    assert low <= diff <= high
    report = json.loads((out / "comparisons" / "rl-scripted-minus-rl-static.scripted.json").read_text())
    assert report["shared_tasks"] == SMOKE.eval_tasks and report["pairs"] == 1  # paired over the same tasks

    table = (out / "table.md").read_text()
    assert table.startswith("## success (pass^1)") and "| RL scripted - RL static [95% interval] |" in table
    page = (out / "report.html").read_text()
    main = page[page.index('<main id="main">'):]
    assert main.index('<table class="grid comparison" id="comparison-table">') < main.index("<h2>")  # table first
    assert "evaluated with the scripted user (interactive)" in main
    for name in ("cold_start.png", "grpo_rl-scripted.png", "grpo_rl-static.png", "matrix.png"):
        assert (out / "plots" / name).exists()
    assert (out / "changed.md").read_text().startswith("# Held-out conversations with the scripted user")
    assert (out / "rl-static" / "grpo" / "report.html").exists()  # the viewer's pages, linked from the page

    again = _muarl("ablate", "--preset", "smoke", "--out", str(out), "--quiet")  # resumes: nothing played again
    assert again.returncode == 0, again.stderr[-3000:]
    timings = [json.loads(p.read_text())["timing"] for p in out.glob("eval/*/*/results.json")]
    assert len(timings) == 12 and all(t["episodes_run"] == 0 for t in timings)
    assert json.loads((out / "summary.json").read_text())["matrix"] == summary["matrix"]
    refused = _muarl("ablate", "--preset", "smoke", "--out", str(out), "--grpo-steps", "3")
    assert refused.returncode == 2 and "other settings (grpo.steps)" in refused.stderr


@pytest.mark.slow
def test_method_from_reuses_a_demo_model_only_when_it_is_this_runs(tmp_path: Path) -> None:
    demo = tmp_path / "demo"
    run_demo(demo, "smoke", progress=False, greedy=False)
    out = tmp_path / "ablate"
    summary = run_ablate(out, "smoke", progress=False, method_from=demo, greedy=False)
    assert summary["models"]["rl-scripted"] == str((demo / "grpo" / "model").resolve())
    assert not (out / "rl-scripted" / "grpo").exists()  # not trained again
    checked = json.loads((out / "method-from.json").read_text())
    assert checked["replay"]["same"] and checked["replay"]["steps"] == 2
    assert_arms_share_all_but_the_user(demo / "grpo", out / "rl-static" / "grpo")
    assert summary["arms_share"]["rl-static"]["same_episodes"]

    with pytest.raises(ValueError, match=r"grpo/config.json seed: 0 there, 1 here"):
        run_ablate(tmp_path / "other-seed", "smoke", seed=1, progress=False, method_from=demo, greedy=False)
    with pytest.raises(ValueError, match=r"grpo/config.json lr: 0.0002 there, 0.001 here"):
        run_ablate(tmp_path / "other-lr", "smoke", progress=False, method_from=demo, greedy=False, grpo={"lr": 1e-3})
    # a demo whose recorded episodes this code does not reproduce (another code, another machine): refused
    step = demo / "grpo" / "rollouts" / "step_000002.jsonl"
    rows = _rows(step)
    rows[0]["token_ids"] = rows[0]["token_ids"][:-1]
    step.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ValueError, match=r"gives other episodes \(steps \[2\]"):
        run_ablate(tmp_path / "tampered", "smoke", progress=False, method_from=demo, greedy=False)


@pytest.mark.slow
def test_cross_evaluation_one_model_per_training_user_every_evaluation_user(tmp_path: Path) -> None:
    """``--train-users static --eval-users scripted,static,<plug-in>``: one model (and the cold start), each
    evaluated with three users, a matrix row per user with intervals."""
    users = ("scripted", "static", "test_ablate:QuickToGiveUp")
    summary = run_ablate(tmp_path, "smoke", progress=False, train_users="static", eval_users=",".join(users),
                         greedy=False)
    assert summary["train_users"] == ["static"] and summary["eval_users"] == list(users)
    assert set(summary["matrix"]) == set(users)
    assert all(set(row) == {"cold-start", "rl-static"} for row in summary["matrix"].values())
    assert list(summary["differences"]) == ["rl-static - cold-start"]
    plugin = json.loads((tmp_path / eval_name("rl-static", users[2]) / "config.json").read_text())
    assert plugin["user"] == users[2]


def _record(run: Path, user: str, digest: str, seeds: list[int]) -> Path:
    """A GRPO run's records, as muarl grpo writes them (only what :func:`arm_differences` reads)."""
    (run / "rollouts").mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"user": user, "seed": 0, "steps": 1, "out": str(run)}))
    (run / "provenance.json").write_text(json.dumps({"inputs": {"model": {"model.safetensors": digest}}}))
    (run / "rollouts" / "step_000001.jsonl").write_text(
        "".join(json.dumps({"task_id": f"t{n}", "user_seed": s}) + "\n" for n, s in enumerate(seeds)))
    return run


def test_arm_differences_reads_each_kind_of_difference_from_the_records(tmp_path: Path) -> None:
    method = _record(tmp_path / "a", "scripted", "d1", [1, 2])
    alike = arm_differences(method, _record(tmp_path / "b", "static", "d1", [1, 2]))
    assert alike == {"settings": ["user"], "same_cold_start": True, "steps": 1, "same_episodes": True}
    other_start = arm_differences(method, _record(tmp_path / "c", "static", "d2", [1, 2]))
    assert not other_start["same_cold_start"] and other_start["same_episodes"]
    other_users = arm_differences(method, _record(tmp_path / "d", "static", "d1", [1, 3]))
    assert other_users["same_cold_start"] and not other_users["same_episodes"]


def test_bad_user_lists_and_bases_are_refused_before_anything_runs(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="listed twice"):
        run_ablate(tmp_path, "smoke", train_users="scripted,scripted")
    with pytest.raises(ValueError, match="unknown user"):
        run_ablate(tmp_path, "smoke", eval_users="scripted,nobody")
    with pytest.raises(ValueError, match="nor a model directory"):
        run_ablate(tmp_path, "smoke", base=str(tmp_path / "nowhere"))
    assert not (tmp_path / "ablate.json").exists()


@pytest.mark.slow
def test_an_arm_recipe_changes_that_arm_alone_and_is_recorded(tmp_path: Path) -> None:
    """``--arm-recipe static:lr=1e-3,steps=3``: the static arm trains 3 steps at lr 1e-3, the method's arm the
    preset's; the records say the arms differ in exactly those and the user (no warning), the summary and the
    labels name the recipe, a rerun with another arm recipe is refused, a malformed one is one line before
    anything runs."""
    out = tmp_path / "ablate"
    common = ("ablate", "--preset", "smoke", "--out", str(out), "--eval-users", "scripted", "--no-greedy", "--quiet")
    done = _muarl(*common, "--arm-recipe", "static:lr=1e-3,steps=3")
    assert done.returncode == 0, done.stderr[-3000:]
    method, static = (json.loads((out / a / "grpo" / "config.json").read_text()) for a in ("rl-scripted", "rl-static"))
    assert (method["lr"], method["steps"]) == (SMOKE.grpo.lr, SMOKE.grpo.steps) and SMOKE.grpo.lr != 1e-3
    assert (static["lr"], static["steps"]) == (1e-3, 3)
    assert len(list((out / "rl-static" / "grpo" / "rollouts").glob("*.jsonl"))) == 3
    summary = json.loads((out / "summary.json").read_text())
    assert summary["arm_recipes"] == {"rl-scripted": {}, "rl-static": {"lr": 1e-3, "steps": 3}}
    assert summary["arms_share"]["rl-static"]["settings"] == ["lr", "steps", "user"]
    assert "differ in more than" not in done.stdout and "RL, static user (lr 0.001, steps 3)" in \
        (out / "table.md").read_text()
    again = _muarl(*common, "--arm-recipe", "static:lr=1e-4")
    assert again.returncode == 2 and "other settings (arm_recipes)" in again.stderr
    bad = _muarl("ablate", "--preset", "smoke", "--out", str(tmp_path / "bad"), "--arm-recipe", "static:lr=fast")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "lr='fast'" in bad.stderr
    assert not (tmp_path / "bad").exists()
