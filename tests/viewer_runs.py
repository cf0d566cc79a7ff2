"""Real run directories for the viewer's tests, built once per test session.

- an evaluation run: ``muarl.evaluate.evaluate`` of the expert that skips confirmations, against the
  scripted user, on retail test tasks including a change-of-mind task (which it fails, with a diff
  against gold and violations): ``trajectories.jsonl`` + ``results.json``;
- a training-style run: the embedded tiny model (an end-of-turn bias so its turns end and the user
  answers) plays groups of two on two steps' worth of train tasks; every step's file
  ``rollouts/step_00000N.jsonl`` carries metadata step / group / member / advantage / trained as
  ``muarl grpo`` writes them (GRPO advantages from ``muarl.algorithms``), ``metrics.jsonl`` holds ``muarl.train.groups.rollout_metrics`` of each step, the
  tokenizer is saved in ``model/``. A third step groups a real expert episode with a real
  expert-noconfirm episode of the same change-of-mind task, so one group has non-zero advantages;
- a telecom expert rollout (user tool calls on the phone), for the lanes' ordering.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import torch

from muarl.algorithms import get_algorithm
from muarl.domain import get_domain
from muarl.policies.expert import ExpertPolicy
from muarl.rollout import EpisodeConfig, RolloutEngine
from muarl.types import Trajectory
from muarl.users.scripted import ScriptedUser


def retail_eval_tasks() -> list:
    tasks = get_domain("retail").tasks("test")
    picked = []
    for family in ("change_of_mind", "cancel_order", "modify_user_address", "info_request"):
        picked.append(next(t for t in tasks if t.family == family))
    return picked


def build_eval_run(out: Path) -> Path:
    from muarl.evaluate import evaluate

    evaluate(get_domain("retail"), ExpertPolicy(skip_confirmation=True), ScriptedUser(), retail_eval_tasks(), k=2,
             out_dir=out, progress=False)
    return out


def _play(domain_name: str, policy, tasks, group_size: int, max_turns: int, seed: int = 0) -> list[list[Trajectory]]:
    domain = get_domain(domain_name)
    engine = RolloutEngine(domain, policy, ScriptedUser(), EpisodeConfig(max_turns=max_turns, require_outputs=False),
                           group_size=group_size, common_user_seed=True, seed=seed, progress=False)
    return asyncio.run(engine.run(tasks))


def _write_step(out: Path, step: int, groups: list[list[Trajectory]]) -> None:
    from muarl.train.groups import rollout_metrics

    rewards = torch.tensor([[t.reward.reward for t in g] for g in groups])
    adv = get_algorithm("grpo").advantages(rewards)
    (out / "rollouts").mkdir(parents=True, exist_ok=True)
    with (out / "rollouts" / f"step_{step:06d}.jsonl").open("w") as f:
        for g, group in enumerate(groups):
            for m, traj in enumerate(group):
                traj.metadata.update(step=step, group=g, member=m, advantage=float(adv[g, m]), trained=True)
                f.write(traj.model_dump_json() + "\n")
    with (out / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({"step": step, **rollout_metrics(groups, get_domain(groups[0][0].domain).general_tools)}) + "\n")


def build_training_run(out: Path) -> Path:
    from muarl.models import load
    from muarl.policies.hf import HFPolicy
    from muarl.tiny_model import bias_end_of_turn

    out.mkdir(parents=True, exist_ok=True)
    model, tokenizer = load("tiny")
    bias_end_of_turn(model, tokenizer, 6.0)
    policy = HFPolicy((model, tokenizer), temperature=1.0, max_new_tokens=24, seed=3)
    train = get_domain("retail").tasks("train")
    for step in (1, 2):
        _write_step(out, step, _play("retail", policy, train[2 * step - 2: 2 * step], 2, max_turns=4, seed=step))
    task = next(t for t in train if t.family == "change_of_mind")
    [[good]] = _play("retail", ExpertPolicy(), [task], 1, max_turns=30)
    [[bad]] = _play("retail", ExpertPolicy(skip_confirmation=True), [task], 1, max_turns=30)
    _write_step(out, 3, [[good, bad]])
    tokenizer.save_pretrained(out / "model")
    (out / "config.json").write_text(json.dumps({"model": "tiny", "domain": "retail", "group_size": 2}))
    return out


def build_telecom_run(out: Path) -> Path:
    tasks = [t for t in get_domain("telecom").tasks("test") if t.family in ("airplane_mode", "apn_reset")][:2]
    groups = _play("telecom", ExpertPolicy(), tasks, 1, max_turns=30)
    out.mkdir(parents=True, exist_ok=True)
    (out / "trajectories.jsonl").write_text("".join(g[0].model_dump_json() + "\n" for g in groups))
    return out


@pytest.fixture(scope="session")
def eval_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_eval_run(tmp_path_factory.mktemp("viewer") / "eval")


@pytest.fixture(scope="session")
def training_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_training_run(tmp_path_factory.mktemp("viewer") / "grpo")


@pytest.fixture(scope="session")
def telecom_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_telecom_run(tmp_path_factory.mktemp("viewer") / "telecom")
