"""SFT on synthesized data: the loss falls, only agent tokens are learned, the checkpoint plays episodes."""

import asyncio
import json

import pytest

from muarl.domain import get_domain
from muarl.policies.expert import ExpertPolicy
from muarl.policies.hf import HFPolicy
from muarl.rollout import EpisodeConfig, RolloutEngine
from muarl.synth import synthesize
from muarl.train.sft import PRESETS, cosine, preset, train_sft
from muarl.users.scripted import ScriptedUser


def test_cosine_schedule():
    assert [round(cosine(s, 10, 2), 3) for s in (0, 1, 2, 6, 10)] == [0.5, 1.0, 1.0, 0.5, 0.0]
    assert PRESETS["paper"].lr == 5e-6 and PRESETS["paper"].epochs == 2 and PRESETS["paper"].batch_size == 128
    with pytest.raises(ValueError, match="unknown SFT preset"):
        preset("huge")


@pytest.mark.slow
def test_sft_learns_the_teacher_and_the_checkpoint_plays(tmp_path):
    synthesize([get_domain("airline")], ExpertPolicy(), ScriptedUser(), tmp_path / "synth",
               families=["add_baggage"], progress=False)
    data = tmp_path / "synth" / "sft.jsonl"
    lines = data.read_text().splitlines()[:12]
    data.write_text("\n".join(lines) + "\n")
    config = preset("tiny", data=[str(data)], out=str(tmp_path / "sft"), epochs=4, batch_size=4, max_len=8192)
    result = train_sft(config, progress=False)
    metrics = [json.loads(line) for line in (tmp_path / "sft" / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == result["steps"] == 12
    first = sum(m["loss"] for m in metrics[:3]) / 3
    last = sum(m["loss"] for m in metrics[-3:]) / 3
    assert last < first - 1.0, (first, last)  # nats per agent token, from a random start
    assert all(m["rows"] <= 4 for m in metrics)
    # the checkpoint is an ordinary HF model that the rollout engine can run
    policy = HFPolicy(result["checkpoint"], temperature=1.0, max_new_tokens=32)
    domain = get_domain("airline")
    engine = RolloutEngine(domain, policy, ScriptedUser(), EpisodeConfig(max_turns=4), progress=False)
    [[traj]] = asyncio.run(engine.run(domain.tasks("test")[:1]))
    assert traj.reward is not None and sum(traj.loss_mask) > 0
