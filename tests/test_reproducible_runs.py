"""The same synchronous GRPO command is the same run, whatever the timing (issue 60, item 5).

muarl's engine batches the episodes' agent turns; which rows share a pass changes the log-probs (CPU
matmul rounding depends on the batch's shape), so an engine admitting requests as they arrive samples what
timing decides. The engine's deterministic admission (:class:`~muarl.policies.hf.HFPolicy`'s default)
waits for every open episode and orders rows by episode: these tests perturb the timing and compare.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from muarl.policies import batched_generator
from muarl.policies.hf import HFPolicy
from muarl.rollout import EpisodeConfig, RolloutEngine
from muarl.train.run import computed
from muarl.users.scripted import ScriptedUser

TESTS = Path(__file__).parent


def _grpo_cmd(out: Path) -> list[str]:
    # the user's replies take a random time in every process (tests/jittery_user.py), and the runs share
    # the machine with each other and a CPU hog: what differs between them is timing alone
    return [sys.executable, "-m", "muarl", "grpo", "--preset", "tiny", "--domain", "train_fixtures:coin",
            "--user", "jittery_user:user", "--out", str(out), "--steps", "2", "--tasks-per-step", "2",
            "--group-size", "2", "--max-new-tokens", "16", "--max-turns", "3", "--lr", "3e-3",
            "--save-every", "1", "--keep-checkpoints", "0", "--no-progress"]


def _env() -> dict[str, str]:
    # one torch thread each: four runs and a hog share the machine without oversubscribing it further
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
            "OMP_NUM_THREADS": "1"}


@pytest.mark.slow
def test_the_same_grpo_command_under_load_and_killed_and_resumed_is_the_same_run(tmp_path):
    """Three runs of one command side by side beside a CPU hog, and a fourth killed with SIGKILL once its
    first checkpoint exists and then rerun: all four have the same metrics, episodes (log-probs included)
    at every step, and byte-identical final weights."""
    outs = [tmp_path / f"run{i}" for i in range(3)]
    killed = tmp_path / "killed"
    hog = subprocess.Popen([sys.executable, "-c", "while 1: pass"])
    try:
        runs = [subprocess.Popen(_grpo_cmd(out), env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
                for out in outs]
        victim = subprocess.Popen(_grpo_cmd(killed), env=_env(), stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 240
            while not (killed / "checkpoints" / "step_1").exists():
                assert victim.poll() is None, "the run ended before its first checkpoint"
                assert time.monotonic() < deadline
                time.sleep(0.05)
            os.kill(victim.pid, signal.SIGKILL)
        finally:
            victim.wait()
        for proc in runs:
            _, err = proc.communicate(timeout=300)
            assert proc.returncode == 0, err.decode()[-2000:]
        assert victim.returncode == -signal.SIGKILL
        assert not (killed / "model" / "model.safetensors").exists()  # killed before the end
        resumed = subprocess.run(_grpo_cmd(killed), env=_env(), capture_output=True, text=True, timeout=300)
        assert resumed.returncode == 0, resumed.stderr[-2000:]
    finally:
        hog.kill()
        hog.wait()
    first, *others = [computed(out) for out in [*outs, killed]]
    assert [m["step"] for m in first["metrics"]] == [1, 2]
    assert any(m["grad_norm"] > 0 for m in first["metrics"])  # the weights moved: step 2 sampled from new ones
    for i, other in enumerate(others, 1):
        assert other["metrics"] == first["metrics"], f"run {i}: other step metrics than run 0"
        assert other["episodes"] == first["episodes"], f"run {i}: other episodes than run 0"
        assert other["weights"] == first["weights"], f"run {i}: other final weights than run 0"


def test_a_batch_of_episodes_samples_the_same_whatever_the_timing(monkeypatch):
    """In one process: the same episodes played three times by a fresh policy with random delays before each
    agent turn and around each pass of the model give the same tokens and log-probs, bit for bit. (With
    admission by arrival, ``deterministic=False``, the batches and so the log-probs differ.)"""
    from muarl.models import load
    from train_fixtures import coin

    model, tokenizer = load("tiny")
    tasks = coin.tasks("train")[:2]
    clock = random.Random(7)  # seeded: the test itself is the same every time; the delays differ run to run
    decode, admit = batched_generator.BatchedGenerator._decode_step, batched_generator.BatchedGenerator._admit

    def play(policy: HFPolicy) -> list:
        engine = RolloutEngine(coin, policy, ScriptedUser(), EpisodeConfig(max_turns=3), group_size=3,
                               progress=False)
        groups = asyncio.run(engine.run(tasks))
        return [(t.token_ids, t.logprobs) for g in groups for t in g]

    def late_decode(self):
        time.sleep(clock.random() * 0.004)
        return decode(self)

    def late_admit(self, requests):
        time.sleep(clock.random() * 0.004)
        return admit(self, requests)

    turn = HFPolicy.session

    def late_session(self, *args, **kwargs):
        session = turn(self, *args, **kwargs)
        step = session.next

        async def later(messages):
            await asyncio.sleep(clock.random() * 0.01)
            return await step(messages)

        session.next = later
        return session

    def policy() -> HFPolicy:
        return HFPolicy((model, tokenizer), temperature=1.0, max_new_tokens=64, seed=5)

    first = play(policy())
    monkeypatch.setattr(batched_generator.BatchedGenerator, "_decode_step", late_decode)
    monkeypatch.setattr(batched_generator.BatchedGenerator, "_admit", late_admit)
    monkeypatch.setattr(HFPolicy, "session", late_session)
    for _ in range(2):
        engine_policy = policy()
        assert play(engine_policy) == first
        assert engine_policy.engine.holds > 0  # the delays did hold passes back


def test_a_deterministic_engine_does_not_wait_for_turns_held_outside_its_full_batch():
    """The asynchronous stream's gate (:class:`~muarl.train.async_rollouts.OldestFirst`, as wide as the
    engine's batch) keeps agent turns out of the engine while its batch is full; before its first weight swap
    the engine is still deterministic, and waiting for those open episodes would wait forever. Here a batch
    of 2 and three episodes of two turns each behind such a gate finish."""
    from muarl.models import load
    from muarl.train.async_rollouts import OldestFirst, _Prioritized
    from train_fixtures import coin

    policy = HFPolicy(load("tiny"), temperature=1.0, max_new_tokens=4, max_batch=2, seed=1)
    gated = _Prioritized(policy, OldestFirst(policy.engine.max_batch), 0)
    engine = RolloutEngine(coin, gated, ScriptedUser(), EpisodeConfig(max_turns=2), group_size=3, progress=False)

    async def play() -> list:
        return await asyncio.wait_for(engine.run(coin.tasks("train")[:1]), timeout=60)

    groups = asyncio.run(play())
    assert policy.engine.deterministic and len(groups[0]) == 3
    assert all(t.metadata.get("fault") is None for t in groups[0])
