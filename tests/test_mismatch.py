"""The rollout-training mismatch (issue 18, item 4): what the trainer logs about the sampler's log-probs
against its own, and truncated importance sampling, checked against values computed by hand.

The off-policy case is produced for real: episodes are sampled by the shipped model, then the trainer's
copy is moved (one SGD step on noise) before the update, so sampler and trainer disagree as they would
after a missed weight sync or with an engine of other numerics.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

from muarl.algorithms import LossBatch, get_algorithm
from muarl.algorithms.mismatch import mismatch_sums, truncated_is_weights
from muarl.models import load
from muarl.train.grpo_config import GRPOConfig
from muarl.train.grpo_update import update_on_rollouts
from muarl.train.scoring import sequence_logprobs
from train_fixtures import sample_coin_batch


def test_mismatch_sums_and_weights_equal_hand_values():
    trainer = torch.tensor([[math.log(0.5), math.log(0.2), math.log(0.9), 0.0]])
    sampler = torch.tensor([[math.log(0.5), math.log(0.5), math.log(0.3), 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    kl, outside, tokens = mismatch_sums(trainer, sampler, mask)
    # k3 per token with ratio q = trainer / sampler: q - log q - 1; 1, 0.4, 3
    hand = [0.0, 0.4 - math.log(0.4) - 1, 3.0 - math.log(3.0) - 1]
    assert kl == pytest.approx(sum(hand), abs=1e-6)
    assert outside == 2 and tokens == 3  # 0.4 < 0.5 and 3 > 2; the masked position does not count
    weights = truncated_is_weights(trainer, sampler, cap=2.0)
    assert weights[0, :3].tolist() == pytest.approx([1.0, 0.4, 2.0], abs=1e-6)  # 3 truncated to 2
    with pytest.raises(ValueError, match="cap must be above 0"):
        truncated_is_weights(trainer, sampler, cap=0.0)


def test_importance_weights_scale_the_policy_term_only():
    """loss = -A * w * ratio per token (ratio inside the clip), token-mean; the KL term is not weighted."""
    logprobs = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    old = torch.tensor([[-1.0, -2.0]])
    batch = LossBatch(logprobs=logprobs, old_logprobs=old, advantages=torch.tensor([[2.0, 2.0]]),
                      mask=torch.ones(1, 2), ref_logprobs=torch.tensor([[-1.5, -2.0]]),
                      is_weights=torch.tensor([[0.5, 1.5]]))
    loss, stats = get_algorithm("grpo", kl_beta=0.1).loss(batch)
    k3 = math.exp(-0.5) + 0.5 - 1
    assert float(loss.detach()) == pytest.approx(-(2 * 0.5 + 2 * 1.5) / 2 + 0.1 * k3 / 2, abs=1e-6)
    loss.backward()
    assert logprobs.grad.tolist()[0][1] == pytest.approx(-2 * 1.5 / 2, abs=1e-6)


@pytest.fixture(scope="module")
def off_policy():
    """(batch sampled by the shipped model, a trainer copy moved away from it)."""
    batch = sample_coin_batch()
    model, _ = load("tiny")
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.02 * torch.randn_like(p))
    return batch, model


def _hand(model, batch, cap: float | None):
    """Hand values of the first update: the mismatch over the agent tokens, and the loss at ratio 1."""
    kl = outside = tokens = 0.0
    policy_sum = 0.0
    for traj, advantage in batch:
        with torch.no_grad():
            trainer = sequence_logprobs(model, traj.token_ids, 1.0)[0].double()
        mask = torch.tensor(traj.loss_mask, dtype=torch.bool)
        r = trainer[mask] - torch.tensor(traj.logprobs, dtype=torch.float64)[mask]
        kl += float((r.exp() - r - 1).sum())
        outside += float(((r.exp() < 0.5) | (r.exp() > 2)).sum())
        tokens += float(mask.sum())
        # without correction the ratio is trainer / sampler (clipped); with it 1, weighted by min(q, cap)
        q = r.exp()
        if cap is None:
            per = torch.maximum(-advantage * q, -advantage * q.clamp(0.8, 1.2))
        else:
            per = -advantage * q.clamp(max=cap)
        policy_sum += float(per.sum())
    return kl / tokens, outside / tokens, policy_sum / tokens


@pytest.mark.parametrize("cap", [None, 2.0])
def test_the_update_logs_the_mismatch_and_applies_truncated_is(off_policy, cap):
    batch, moved = off_policy
    model = copy.deepcopy(moved)
    config = GRPOConfig(kl_beta=0.0, lr=1e-3, tis_cap=cap or 0.0, num_iterations=2, micro_batch_size=3,
                        skip_zero_advantage=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    stats, _, _ = update_on_rollouts(model, None, optimizer, get_algorithm("grpo", kl_beta=0.0), batch, config)
    kl, outside, loss = _hand(moved, batch, cap)
    assert kl > 1e-3 and outside > 0  # the case is really off-policy
    assert stats["mismatch_kl"] == pytest.approx(kl, rel=1e-3)
    assert stats["mismatch_outside"] == pytest.approx(outside, abs=1e-6)
    # the loss is averaged over the two updates; check the first alone
    model = copy.deepcopy(moved)
    config.num_iterations = 1
    first, _, _ = update_on_rollouts(model, None, torch.optim.SGD(model.parameters(), lr=1e-3),
                                     get_algorithm("grpo", kl_beta=0.0), batch, config)
    assert first["loss"] == pytest.approx(loss, rel=1e-3, abs=1e-5)


def test_on_policy_rollouts_show_no_mismatch():
    """Episodes sampled by muarl's engine and recomputed by the trainer on the same weights: the
    mismatch is float noise (the KV-cached sampling forward against one full forward)."""
    batch = sample_coin_batch()
    model, _ = load("tiny")
    config = GRPOConfig(kl_beta=0.0, lr=1e-4, skip_zero_advantage=False)
    stats, _, _ = update_on_rollouts(model, None, torch.optim.SGD(model.parameters(), lr=1e-4),
                                     get_algorithm("grpo", kl_beta=0.0), batch, config)
    assert stats["mismatch_kl"] < 1e-8
    assert stats["mismatch_outside"] == 0.0


def test_bad_options_are_refused_with_their_name():
    with pytest.raises(ValueError, match="--tis-cap"):
        GRPOConfig(tis_cap=-1)
    with pytest.raises(ValueError, match="--rollout-engine"):
        GRPOConfig(rollout_engine="sglang")
    with pytest.raises(ValueError, match="--vllm-gpu-memory"):
        GRPOConfig(vllm_gpu_memory=1.5)
    with pytest.raises(ValueError, match="--vllm-sync-dir .* needs --rollout-engine vllm-server:URL#MODEL"):
        GRPOConfig(rollout_engine="vllm", vllm_sync_dir="/tmp/x")


def test_rollout_engine_vllm_where_vllm_is_missing_is_one_line_and_writes_nothing(tmp_path):
    """In an environment without vLLM (the main one; the vLLM venv runs tests/test_vllm.py instead)."""
    import subprocess
    import sys

    from muarl.policies.vllm_engine import available

    if available():
        pytest.skip("vLLM is installed here: tests/test_vllm.py covers --rollout-engine vllm")
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "muarl", "grpo", "--preset", "tiny", "--steps", "1",
                           "--rollout-engine", "vllm", "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [done.stderr.strip()]
    assert "--rollout-engine vllm" in done.stderr and "install_vllm.sh" in done.stderr
    assert not out.exists()


def test_rollout_engine_vllm_server_is_checked_in_one_line_before_anything_is_written(tmp_path, capsys):
    """``--rollout-engine vllm-server:URL#MODEL`` needs no vLLM here: a malformed value is refused by the
    config, and a server that is not there fails before the run directory exists; one line, exit 2 each."""
    import socket

    from muarl.cli import main

    assert GRPOConfig(rollout_engine="vllm-server:http://127.0.0.1:8000/v1#tiny").rollout_engine.endswith("#tiny")
    for bad, message in (("vllm-server:nohash", "expected vllm-server:URL#MODEL"),
                         ("vllm-server:127.0.0.1:8000#m", "must start with http:// or https://")):
        with pytest.raises(ValueError, match=message):
            GRPOConfig(rollout_engine=bad)
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        dead = sock.getsockname()[1]
    cases = {"vllm-server:nohash": "expected vllm-server:URL#MODEL",
             f"vllm-server:http://127.0.0.1:{dead}#m": f"no vLLM server at http://127.0.0.1:{dead}"}
    for engine, message in cases.items():
        out = tmp_path / "run"
        code = main(["grpo", "--preset", "tiny", "--steps", "1", "--rollout-engine", engine, "--out", str(out),
                     "--no-progress"])
        err = capsys.readouterr().err.strip()
        assert code == 2 and err.splitlines() == [err], err
        assert err.startswith(f"muarl: error: --rollout-engine '{engine}': ") and message in err, err
        assert not out.exists()


def test_the_server_backend_does_not_import_vllm():
    """``vllm-server:`` runs where vLLM is not installed: importing its module and building the server
    command pulls in no vllm. vLLM is made unimportable in the child (``sys.modules["vllm"] = None``), so an
    import of it fails there even in an environment that has it; the check runs here, in the main
    environment (moved from tests/test_vllm.py, which runs only where vLLM imports)."""
    import subprocess
    import sys

    code = ("import sys; sys.modules['vllm'] = None; import muarl.policies.vllm_server as s; "
            "s.server_command('m', port=1); "
            "bad = [m for m in sys.modules if m.startswith('vllm.')]; assert not bad, bad")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_a_user_the_run_would_train_is_refused_in_one_line(tmp_path, capsys):
    """An llm: user on the --rollout-engine server: full fine-tuning would reload the user's weights with
    the policy's, and a LoRA run's user must not be the trained adapter; the base model with LoRA is the
    frozen user of a one-GPU run. Refused by the config (no connection is made), exit 2, nothing written."""
    from muarl.cli import main
    from muarl.policies.vllm import LORA_NAME

    engine = "vllm-server:http://127.0.0.1:8000/v1#tiny"
    for user, lora, message in (("llm:http://localhost:8000#tiny", 0, "the user would learn with the policy"),
                                (f"llm:http://127.0.0.1:8000/v1#{LORA_NAME}", 4, "names the adapter the run trains")):
        with pytest.raises(ValueError, match=message):
            GRPOConfig(rollout_engine=engine, user=user, lora_r=lora)
        out = tmp_path / "run"
        code = main(["grpo", "--preset", "tiny", "--steps", "1", "--rollout-engine", engine, "--user", user,
                     "--lora-r", str(lora), "--out", str(out), "--no-progress"])
        err = capsys.readouterr().err.strip()
        assert code == 2 and err.splitlines() == [err] and message in err, err
        assert not out.exists()
    # allowed: the base model under LoRA, and any model on another server
    GRPOConfig(rollout_engine=engine, user="llm:http://127.0.0.1:8000/v1#tiny", lora_r=4)
    GRPOConfig(rollout_engine=engine, user="llm:http://127.0.0.1:8001/v1#tiny", lora_r=0)


def test_vllm_sleep_is_refused_in_one_line_where_it_cannot_sleep(tmp_path, capsys):
    """--vllm-sleep sleeps an engine in this process: refused with another rollout engine, and on a machine
    without a GPU (vLLM's CPU build has no sleep mode); one line, exit 2, nothing written."""
    from muarl.cli import main

    if torch.cuda.is_available():
        pytest.skip("a GPU is here: --vllm-sleep is allowed")
    with pytest.raises(ValueError, match="needs --rollout-engine vllm"):
        GRPOConfig(vllm_sleep=True)
    for engine, message in (("hf", "needs --rollout-engine vllm"),
                            ("vllm", "--vllm-sleep needs a GPU: vLLM's CPU build has no sleep mode")):
        out = tmp_path / "run"
        code = main(["grpo", "--preset", "tiny", "--steps", "1", "--rollout-engine", engine, "--vllm-sleep",
                     "--out", str(out), "--no-progress"])
        err = capsys.readouterr().err.strip()
        assert code == 2 and err.splitlines() == [err] and message in err, err
        assert not out.exists()


def test_the_sampler_is_released_before_each_update_and_synced_after_it(tmp_path, monkeypatch):
    """Where --vllm-sleep acts in the GRPO loop: each step's update lies between the sampler's release (a
    vLLM engine falls asleep) and its sync (it wakes and takes the new weights), and every rollout sees
    synced weights. A recording wrapper around the real transformers sampler stands in for the engine:
    no sleeping engine can run here (tests/test_vllm.py drives vLLM's own sleep and wake on the CPU build)."""
    from muarl.train import orchestrator
    from muarl.train.grpo import train_grpo
    from muarl.train.grpo_config import preset
    from muarl.train.samplers import HFSampler

    events: list[tuple[str, float]] = []

    def weights(model) -> float:
        return float(sum(p.detach().double().sum() for p in model.parameters()))

    class Recording(HFSampler):
        def policy(self, seed):
            events.append(("rollout", weights(self.model)))
            return super().policy(seed)

        def release(self):
            events.append(("release", weights(self.model)))

        def sync(self, model):
            events.append(("sync", weights(model)))
            return 0.0

    monkeypatch.setattr(orchestrator, "make_sampler",
                        lambda config, model, tokenizer, dist=None, files=None: Recording(
                            model, tokenizer, config.temperature, config.max_new_tokens))
    config = preset("tiny", out=str(tmp_path / "run"), domain="train_fixtures:coin", steps=2, tasks_per_step=2,
                    group_size=4, max_new_tokens=8, max_turns=2, lr=1e-2, kl_beta=0.0, save_every=0)
    train_grpo(config, progress=False)
    kinds = [kind for kind, _ in events]
    assert kinds == ["rollout", "release", "sync", "rollout", "release", "sync"], kinds
    for (_, at_rollout), (_, at_release), (_, at_sync) in (events[0:3], events[3:6]):
        assert at_release == at_rollout and at_sync != at_release  # the update ran between release and sync
    assert events[3][1] == events[2][1]  # step 2 rolls out on the weights step 1 synced


def test_a_rollout_engine_on_other_weights_is_warned_once(tmp_path, monkeypatch, capsys):
    """An engine that samples from other weights than the trainer's (a server on another checkpoint, a sync
    that did not happen) makes every step off-policy: the run says so once, in one line, and goes on. The
    other weights are real: muarl's own engine on a copy of the model with noised weights, never synced.
    A run whose engine is the trainer's model says nothing."""
    from muarl.train import orchestrator
    from muarl.train.grpo import train_grpo
    from muarl.train.grpo_config import preset
    from muarl.train.samplers import HFSampler

    def config(out):
        return preset("tiny", out=str(out), domain="train_fixtures:coin", steps=2, tasks_per_step=2, group_size=4,
                      max_new_tokens=8, max_turns=2, lr=1e-3, kl_beta=0.0, save_every=0)

    train_grpo(config(tmp_path / "same"), progress=False)
    assert "warning" not in capsys.readouterr().err

    def elsewhere(config, model, tokenizer, dist=None, files=None):
        other = copy.deepcopy(model).requires_grad_(False)
        generator = torch.Generator().manual_seed(0)
        for p in other.parameters():
            p.add_(0.5 * p.std() * torch.randn(p.shape, generator=generator))
        return HFSampler(other, tokenizer, config.temperature, config.max_new_tokens)

    monkeypatch.setattr(orchestrator, "make_sampler", elsewhere)
    result = train_grpo(config(tmp_path / "other"), progress=False)
    err = capsys.readouterr().err
    warnings = [line for line in err.splitlines() if line.startswith("muarl: warning:")]
    assert len(warnings) == 1 and "is the engine serving --model's weights?" in warnings[0], err
    assert all(m["mismatch_outside"] > 0.1 for m in result["metrics"] if m["trained_sequences"])
    print(warnings[0])
