"""Asynchronous GRPO (``--max-staleness N``, muarl.train.async_rollouts): rollouts go on while the trainer
updates, groups are used at most N updates old, stale tokens are weighed by their importance ratio, and
N = 0 is today's synchronous run. Real runs on the embedded model and the coin domain of
tests/train_fixtures.py (groups disagree, so every update is real)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from muarl.train.grpo import train_grpo
from muarl.train.grpo_config import preset

TESTS = Path(__file__).parent
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}


def _config(out: Path, **overrides):
    settings = dict(domain="train_fixtures:coin", out=str(out), steps=4, tasks_per_step=2, group_size=4,
                    max_new_tokens=12, max_turns=3, lr=1e-3, save_every=0, report_to="none")
    return preset("tiny", **{**settings, **overrides})


def _rollouts(out: Path) -> dict[int, list[dict]]:
    return {int(p.stem.split("_")[1]): [json.loads(line) for line in p.read_text().splitlines()]
            for p in sorted((out / "rollouts").glob("step_*.jsonl"))}


@pytest.mark.slow
def test_staleness_never_exceeds_n_with_a_slow_trainer(tmp_path):
    """A trainer slowed by 6 optimizer steps per batch (``num_iterations``) while the sampler runs ahead:
    every trained episode was sampled at most N = 1 updates before the update that used it, and the
    sampler did run ahead (some groups are 1 update old), recorded per episode and per step; each recorded
    version is the one whose saved weights give the episode's sampled log-probabilities."""
    result = train_grpo(_config(tmp_path / "run", steps=5, max_staleness=1, num_iterations=6, save_every=1,
                                keep_checkpoints=0),
                        progress=False)
    metrics = result["metrics"]
    assert all(m["staleness_max"] <= 1 for m in metrics)
    assert any(m["staleness_mean"] > 0 for m in metrics)  # the stream did sample while the trainer updated
    rollouts = _rollouts(tmp_path / "run")
    for step, episodes in rollouts.items():
        trained = [e for e in episodes if e["metadata"]["trained"]]
        assert trained
        # step s (1-based) trains after s - 1 updates: its episodes' weights are at most N = 1 behind that
        assert all(step - 1 - e["metadata"]["policy_version"] <= 1 for e in trained), step
    _versions_match_saved_weights(tmp_path / "run", rollouts)
    assert all({"trainer_idle_s", "sampler_idle_s", "dropped_groups"} <= m.keys() for m in metrics)
    assert json.loads((tmp_path / "run" / "config.json").read_text())["tis_cap"] == 2.0  # stale tokens weighed


def _versions_match_saved_weights(run: Path, rollouts: dict[int, list[dict]]) -> None:
    """Each trained episode's recorded ``policy_version`` checked against the weights themselves, not the
    stream's label: its sampled tokens' log-probabilities, recomputed under every saved version (0 the
    starting model, v the checkpoint after update v), are those of the version it names and of no other.
    A turn a sync overlapped (``turns_across_sync``) is left out: the engine swapped the weights between two
    of its passes, so its last tokens came from the new weights attending to its cache from the old ones,
    which no saved version reproduces (their log-probs are kept as drawn, and the importance weights use
    them as the behaviour's)."""
    from muarl.models import load
    from muarl.train.scoring import sequence_logprobs

    config = json.loads((run / "config.json").read_text())
    models = {0: load(config["model"])[0]}
    models.update({int(p.name.split("_")[1]): load(p / "model")[0] for p in (run / "checkpoints").glob("step_*")})
    checked = set()
    for step, episodes in rollouts.items():
        for e in [e for e in episodes if e["metadata"]["trained"]]:
            version = e["metadata"]["policy_version"]
            assert e["metadata"]["turn_versions"] == [version]  # one agent turn: one version of the weights
            if e["metadata"]["turns_across_sync"]:
                continue
            mask = torch.tensor(e["loss_mask"], dtype=torch.bool)
            sampled = torch.tensor(e["logprobs"])[mask]
            gaps = {}
            for v in range(step):  # the versions that existed when step `step` was played
                with torch.no_grad():
                    recomputed, _ = sequence_logprobs(models[v], e["token_ids"], config["temperature"],
                                                      e["loss_mask"])
                gaps[v] = (recomputed[mask] - sampled).abs().max().item()
            assert gaps[version] < 1e-3 and min(gaps, key=gaps.get) == version, (step, version, gaps)
            checked.add((step, version))
    assert {step - 1 - version for step, version in checked} == {0, 1}, checked  # fresh and stale both checked


@pytest.mark.slow
def test_max_staleness_0_is_the_synchronous_run(tmp_path):
    """N = 0 samples then updates as the code before the stream did: the run's episodes and final weights
    equal the digests in tests/lockstep_n0.json, recorded from the synchronous loop of commit c81a824^
    (tests/lockstep_digests.py says how), not from today's code. The stream with no lead would not pass:
    it seeds its one engine per run, the lockstep source a policy per step (so N = 0 is never streamed)."""
    from lockstep_digests import FIXTURE, SETTINGS, run_digests, weight_bounds, weight_mismatches

    out = tmp_path / "run"
    train_grpo(preset("tiny", out=str(out), max_staleness=0, **SETTINGS), progress=False)
    got, want = run_digests(out), json.loads(FIXTURE.read_text())
    assert got["rollouts"] == want["rollouts"]
    # within what another CPU's float32 rounding allows, derived per tensor (lockstep_digests.weight_bounds)
    assert weight_mismatches(got, want, weight_bounds(out)) == []


def test_importance_weights_of_a_stale_batch_equal_a_hand_computation():
    """Episodes sampled by the starting model (behaviour), trained by a model two updates ahead: the
    update's loss is the token-mean of -advantage x min(trainer / behaviour probability, 2), the ratio to
    the trainer's own pre-update log-probs being 1. Computed by hand from the trainer's log-probs."""
    from muarl.algorithms import get_algorithm
    from muarl.models import load
    from muarl.train.grpo_config import GRPOConfig
    from muarl.train.grpo_update import policy_update
    from muarl.train.scoring import sequence_logprobs
    from muarl.train.settings import complete
    from train_fixtures import sample_coin_batch

    batch = sample_coin_batch()  # the tiny model's episodes, its log-probs stored at sampling time
    model = load("tiny")[0]
    with torch.no_grad():  # two updates' worth of change: the behaviour policy is stale
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    settings = complete(GRPOConfig(kl_beta=0.0, lr=1e-9, max_staleness=2, skip_zero_advantage=False,
                                   shared_prefix=False, grad_clip=1e9))  # the raw gradient is compared
    config, filled = settings.config, settings.derived
    assert config.tis_cap == 2.0 and filled == {"tis_cap": 2.0}
    # a cap given is kept, 0 (off) included: nothing overrides a value the run was given
    assert complete(GRPOConfig(max_staleness=2, tis_cap=0.0)).config.tis_cap == 0.0
    assert complete(GRPOConfig()).config.tis_cap == 0.0
    tokens = sum(sum(t.loss_mask) for t, _ in batch)
    expected, weights = 0.0, []
    model.eval()
    with torch.no_grad():
        for traj, advantage in batch:
            current, _ = sequence_logprobs(model, traj.token_ids, config.temperature, traj.loss_mask)
            mask = torch.tensor(traj.loss_mask, dtype=torch.bool)
            w = torch.exp(current[mask].double() - torch.tensor(traj.logprobs, dtype=torch.float64)[mask]).clamp(max=2)
            weights.append(w)
            expected += float(-(advantage * w).sum()) / tokens
    assert any(float((w - 1).abs().max()) > 0.05 for w in weights)  # the weights are not all 1: a real test
    # and by its gradient: that of the token-mean of -advantage x w x log-prob, the weight w held constant
    # (the weight scales each token's push; it is not itself pushed on), computed by autograd by hand
    model.zero_grad(set_to_none=True)
    for (traj, advantage), w in zip(batch, weights, strict=True):
        current, _ = sequence_logprobs(model, traj.token_ids, config.temperature, traj.loss_mask)
        mask = torch.tensor(traj.loss_mask, dtype=torch.bool)
        (-(advantage * w.float() * current[mask]).sum() / tokens).backward()
    by_hand = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    algorithm = get_algorithm("grpo", clip_low=config.clip_low, clip_high=config.clip_high, kl_beta=0.0)
    optimizer = torch.optim.SGD(model.parameters(), lr=config.lr)
    stats, _, _ = policy_update(model, None, optimizer, algorithm, batch, config)
    assert stats["loss"] == pytest.approx(expected, rel=1e-4, abs=1e-6)
    update = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert update.keys() == by_hand.keys() and by_hand
    for name, grad in by_hand.items():  # float noise only; a weight left out or pushed on moves it by far more
        assert torch.allclose(update[name], grad, rtol=1e-3, atol=1e-6), (name, (update[name] - grad).abs().max())


@pytest.mark.slow
def test_a_killed_asynchronous_run_resumes_from_its_checkpoint(tmp_path):
    """SIGKILL after the step-2 checkpoint, rerun: the run resumes from it (the episodes in flight are
    played again) and finishes every step, the resumed steps asynchronous as before."""
    out = tmp_path / "run"
    args = [sys.executable, "-m", "muarl", "grpo", "--model", "tiny", "--domain", "train_fixtures:coin",
            "--out", str(out), "--steps", "6", "--tasks-per-step", "2", "--group-size", "4", "--max-new-tokens",
            "12", "--max-turns", "3", "--lr", "1e-3", "--save-every", "2", "--report-to", "none",
            "--max-staleness", "1", "--num-iterations", "4", "--no-progress"]
    run = subprocess.Popen(args, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 240
        while not (out / "checkpoints" / "step_2").exists() and run.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        run.send_signal(signal.SIGKILL)
    finally:
        run.wait()
    assert run.returncode == -signal.SIGKILL and not (out / "model").exists()
    kept = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    done = subprocess.run(args, env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2, 3, 4, 5, 6] and len(kept) >= 2
    assert all("staleness_max" in m and m["staleness_max"] <= 1 for m in metrics)
    assert (out / "model" / "model.safetensors").exists()


def test_options_that_cannot_run_asynchronously_are_refused():
    for overrides, words in (({"max_staleness": -1}, "must be 0"),
                             ({"max_staleness": 1, "rollout_engine": "vllm", "vllm_sleep": True}, "one of the two")):
        with pytest.raises(ValueError, match=words):
            _config(Path("unused"), **overrides)


def test_the_trainer_takes_groups_in_finishing_order_and_drops_those_too_stale():
    """``RolloutStream.take`` on finished groups of versions 0, 2, 1, 3 with the trainer at version 3 and
    N = 1: it drops the version-0 group and the version-1 group (3 - 1 > 1), keeps 2 and 3 in the order they
    finished, and every drop gives the stream room for one more group."""
    from muarl.domain import get_domain
    from muarl.models import load
    from muarl.train.async_rollouts import Finished, RolloutStream
    from muarl.train.samplers import HFSampler
    from muarl.users.scripted import ScriptedUser

    model, tokenizer = load("tiny")
    stream = RolloutStream(HFSampler(model, tokenizer, 1.0, 8), get_domain("retail-lite"), ScriptedUser(), None,
                           group_size=1, order=[], cursor=0, per_step=2, staleness=1, group_seed=lambda p: p,
                           policy_seed=0)  # not started: no thread plays; the finished groups are set by hand
    stream.version = 3
    stream.finished = [Finished(position, version, []) for position, version in enumerate([0, 2, 1, 3])]
    budget = stream.budget
    taken = stream.take(2, min_version=stream.version - 1)
    assert [item.version for item in taken.groups] == [2, 3] and taken.dropped == 2
    assert taken.staleness == [1, 0] and stream.budget == budget + 2 and not stream.finished


@pytest.mark.slow
def test_dynamic_sampling_fills_each_step_with_informative_groups_from_the_stream(tmp_path):
    """DAPO's refill on the stream: all-alike groups are discarded as they arrive (counted) and replaced, so
    every trained group of every step has a learning signal; the data position counts what was consumed."""
    # pairs: half of the coin domain's groups of two score alike, so the stream does deal all-alike groups
    result = train_grpo(_config(tmp_path / "run", steps=5, group_size=2, max_staleness=1, dynamic_sampling=True,
                                max_rollout_batches=4), progress=False)
    metrics = result["metrics"]
    assert sum(m["uninformative_groups"] for m in metrics) > 0
    for step, episodes in _rollouts(tmp_path / "run").items():
        groups: dict[int, list[float]] = {}
        for e in episodes:
            groups.setdefault(e["metadata"]["group"], []).append(e["reward"]["reward"])
        assert all(len(set(r)) > 1 for r in groups.values()), (step, groups)
    assert all(m["tasks_played"] == m["trained_groups"] + m["dropped_groups"] + m["uninformative_groups"]
               for m in metrics)


def test_episodes_in_flight_keep_a_system_turn_computed_by_the_synced_weights():
    """After a weight sync the engine's shared opening (the system turn every episode attends to) is the
    new weights' KV, at once: an asynchronous stream's episodes in flight decode on through the sync, and
    with the cached opening dropped their next passes would attend to no system turn at all."""
    import asyncio

    from muarl.domain import get_domain
    from muarl.models import load
    from muarl.policies.batched_generator import returned_cache
    from muarl.policies.hf import HFPolicy
    from muarl.rollout import EpisodeConfig, RolloutEngine
    from muarl.users.scripted import ScriptedUser

    model, tokenizer = load("tiny")
    policy = HFPolicy((model, tokenizer), max_new_tokens=4)
    domain = get_domain("retail-lite")
    engine = RolloutEngine(domain, policy, ScriptedUser(), EpisodeConfig(max_turns=1), progress=False)
    asyncio.run(engine.run(domain.tasks("train")[:1]))
    tokens = policy.engine.prefix.tokens
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01 * torch.randn_like(p))
        fresh = returned_cache(model(input_ids=torch.tensor([tokens]), use_cache=True)).layers
    policy.weights_updated()
    prefix = policy.engine.prefix
    assert prefix is not None and prefix.tokens == tokens
    for (keys, values), layer in zip(prefix.kv, fresh, strict=True):
        assert torch.allclose(keys, layer.keys[0], atol=1e-5) and torch.allclose(values, layer.values[0], atol=1e-5)


def test_oldest_first_gives_a_free_place_to_the_oldest_group_waiting():
    """The engine's batch (here 1 place) goes to the waiting agent turn of the oldest group (lowest
    position), not to the first that came; a waiter cancelled in line takes no place. First come first
    served (what the engine's own queue does) fails this."""
    import asyncio

    from muarl.train.async_rollouts import OldestFirst

    async def play() -> list[int]:
        gate, served = OldestFirst(1), []

        async def turn(priority: int) -> None:
            await gate.acquire(priority)
            served.append(priority)
            await asyncio.sleep(0.01)
            gate.release()

        await gate.acquire(9)  # the place is taken: everyone below waits
        waiters = {p: asyncio.create_task(turn(p)) for p in (5, 3, 7, 1)}
        await asyncio.sleep(0.01)
        waiters[1].cancel()  # in line, then gone
        await asyncio.sleep(0)
        gate.release()
        await asyncio.gather(*waiters.values(), return_exceptions=True)
        assert gate.busy == 0 and not gate.waiting
        return served

    assert asyncio.run(play()) == [3, 5, 7]


def test_the_stream_starts_no_group_the_run_will_not_take():
    """On the last step of a 3-step run (version 2), with 4 groups consumed and 2 more to take, the stream
    may start 6 groups in all though its staleness bound allows 8: the groups a last step would start for a
    next one are never played. A group the trainer drops is replaced (one more may start)."""
    from types import SimpleNamespace

    from muarl.domain import get_domain
    from muarl.models import load
    from muarl.train.async_rollouts import Finished, RolloutStream, take_step
    from muarl.train.samplers import HFSampler
    from muarl.types import Trajectory
    from muarl.users.scripted import ScriptedUser

    model, tokenizer = load("tiny")
    stream = RolloutStream(HFSampler(model, tokenizer, 1.0, 8), get_domain("retail-lite"), ScriptedUser(), None,
                           group_size=1, order=[], cursor=0, per_step=2, staleness=1, group_seed=lambda p: p,
                           policy_seed=0)  # not started: the groups are set by hand
    stream.version, stream.budget, stream.consumed, stream.started = 2, 8, 4, 6
    assert stream.gate is not None and stream.gate.width == stream.policy.engine.max_batch
    group = [Trajectory(task_id="t", domain="d")]
    stream.finished = [Finished(position, version, group) for position, version in ((4, 0), (5, 2), (6, 2))]
    config = SimpleNamespace(steps=3, tasks_per_step=2, group_size=1, max_staleness=1, dynamic_sampling=False,
                             max_rollout_batches=1)
    groups, _, _, cursor, metrics = take_step(stream, 4, config, lambda t: 0.0)
    assert len(groups) == 2 and metrics["dropped_groups"] == 1 and cursor == 7
    assert stream.end == 7 and stream.started == 6 and stream.room()  # the dropped group's replacement
    stream.started = 7
    assert not stream.room() and stream.started < stream.budget  # the bound would allow more: the run ends


def _two_ranks(out: Path, mode: str) -> tuple[list[dict], dict[int, list[dict]], list[list[dict]]]:
    """tests/async_worker.py on two training processes (torchrun, gloo): the run's metrics, its rollouts
    and each rank's records after every sync."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(TESTS / "async_worker.py"), str(out), mode]
    done = subprocess.run(cmd, env={**ENV, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = [json.loads(line) for line in (out / "run" / "metrics.jsonl").read_text().splitlines()]
    syncs = [[json.loads(line) for line in (out / f"syncs_rank{r}.jsonl").read_text().splitlines()] for r in (0, 1)]
    return metrics, _rollouts(out / "run"), syncs


def _assert_within_the_bound(metrics: list[dict], rollouts: dict[int, list[dict]]) -> None:
    """Every step trained, no group and no agent turn more than N = 1 updates behind the update that used it,
    and the stream ran ahead (some groups 1 update old)."""
    assert [m["step"] for m in metrics] == [1, 2, 3, 4] and all(m["trained_sequences"] > 0 for m in metrics)
    assert all(m["staleness_max"] <= 1 and m["turn_staleness_max"] <= 1 for m in metrics), metrics
    assert any(m["staleness_mean"] > 0 for m in metrics)
    for step, episodes in rollouts.items():
        trained = [e["metadata"] for e in episodes if e["metadata"]["trained"]]
        assert trained and all(step - 1 - e["policy_version"] <= 1 for e in trained), step
        # a turn never runs on weights older than its group's; its own version is at most N behind too
        assert all(e["policy_version"] <= v <= step - 1 for e in trained for v in e["turn_versions"]), step
        assert all(len(e["turn_versions"]) >= 1 for e in trained)


@pytest.mark.slow
def test_two_training_processes_share_one_stream_and_keep_identical_weights(tmp_path):
    """``--max-staleness 1`` on two processes (plain data parallelism): rank 0's stream plays every group and
    each step's groups reach both ranks, which train on their shares; both hold the same weights after every
    update, and the staleness bound holds per group and per agent turn."""
    metrics, rollouts, syncs = _two_ranks(tmp_path, "plain")
    _assert_within_the_bound(metrics, rollouts)
    assert len(syncs[0]) == len(syncs[1]) == 4
    assert [s["digest"] for s in syncs[0]] == [s["digest"] for s in syncs[1]]
    assert len({s["digest"] for s in syncs[0]}) == 4  # every update moved the weights


@pytest.mark.slow
def test_two_sharded_processes_stream_from_rank_0s_copy(tmp_path):
    """``--max-staleness 1 --fsdp`` on two processes: only rank 0 holds a rollout copy, and after every sync it
    equals the sharded model gathered whole; the staleness bound holds."""
    metrics, rollouts, syncs = _two_ranks(tmp_path, "fsdp")
    _assert_within_the_bound(metrics, rollouts)
    assert [s["copy_equals_model"] for s in syncs[0]] == [True] * 4
    assert [s["holds_copy"] for s in syncs[1]] == [False] * 4
