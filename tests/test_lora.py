"""LoRA through peft: the reference is the adapter switched off, only the adapter trains, runs end to end."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from muarl.models import load
from muarl.train.grpo import train_grpo
from muarl.train.grpo_config import GRPOConfig, preset
from muarl.train.grpo_update import policy_update
from muarl.train.scoring import batch_logprobs
from muarl.train.weights import load_trainable, reference_mode, trainable_parameters
from train_fixtures import LoraSettings, sample_coin_batch


@pytest.fixture(scope="module")
def coin_batch():
    return sample_coin_batch()


def _adapted():
    torch.manual_seed(0)
    model, reference, _ = load_trainable(LoraSettings(), "cpu", None, want_reference=True)
    assert reference is None  # no second copy of the model
    with torch.no_grad():  # a trained-looking adapter (peft starts B at zero, which changes nothing)
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.add_(0.05 * torch.randn_like(p))
    return model


def test_reference_logprobs_with_the_adapter_off_equal_the_base_model(coin_batch):
    base = load("tiny")[0]
    model = _adapted()
    ids = [t.token_ids for t, _ in coin_batch[:3]]
    masks = [t.loss_mask for t, _ in coin_batch[:3]]
    with torch.no_grad():
        expected, _ = batch_logprobs(base, ids, 1.0, masks)
        adapted, _ = batch_logprobs(model, ids, 1.0, masks)
        with reference_mode(model, None) as scorer:
            off, _ = batch_logprobs(scorer, ids, 1.0, masks)
        again, _ = batch_logprobs(model, ids, 1.0, masks)
    assert torch.allclose(off, expected, atol=1e-6)
    assert not torch.allclose(adapted, expected, atol=1e-3)  # the adapter does change the policy...
    assert torch.equal(again, adapted)  # ...and is back on after the reference pass


def test_a_lora_update_changes_only_the_adapter(coin_batch):
    from muarl.algorithms import get_algorithm

    model = _adapted()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    params = trainable_parameters(model)
    assert params and all("lora_" in n for n, p in model.named_parameters() if p.requires_grad)
    optimizer = torch.optim.AdamW(params, lr=1e-2)
    stats, _, _ = policy_update(model, None, optimizer, get_algorithm("grpo"), coin_batch, GRPOConfig(kl_beta=0.1))
    assert stats["grad_norm"] > 0 and stats["kl"] > 0  # the adapter makes the policy differ from the reference
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all("lora_" in n for n in changed)
    assert {n for n in before if "lora_" in n} == changed


@pytest.mark.slow
def test_lora_grpo_runs_saves_the_adapter_and_a_merged_model(tmp_path, monkeypatch):
    config = preset("tiny", domain="train_fixtures:coin", out=str(tmp_path), steps=2, tasks_per_step=2,
                    group_size=4, max_new_tokens=12, max_turns=3, lr=1e-2, lora_r=4, save_every=1)
    result = train_grpo(config, progress=False)
    metrics = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2] and metrics[0]["grad_norm"] > 0
    assert metrics[1]["kl"] > 0  # after one update the adapter moved the policy away from the reference
    saved = load_file(tmp_path / "checkpoints" / "step_2" / "adapter" / "adapter_model.safetensors")
    assert saved and all("lora_" in k for k in saved)  # a checkpoint holds the adapter only
    assert not (tmp_path / "checkpoints" / "step_2" / "model").exists()
    merged, base = load(result["checkpoint"])[0], load("tiny")[0]
    assert result["checkpoint"].endswith("model") and (tmp_path / "adapter" / "adapter_config.json").exists()
    differ = [n for (n, a), (_, b) in zip(merged.named_parameters(), base.named_parameters(), strict=True)
              if not torch.equal(a, b)]
    assert differ and all("proj" in n for n in differ)  # the adapter folded into the linear layers only


def _logits(model, text: str = "Hi, I want to cancel order #W1234567, please.") -> torch.Tensor:
    ids = torch.tensor([load("tiny")[1].encode(text)])
    with torch.no_grad():
        return model(ids).logits


def test_an_adapter_directory_loads_as_its_merged_model_and_trains_on(tmp_path):
    """``--no-merge-lora`` leaves only ``OUT/adapter``: it loads (``hf:OUT/adapter``) as the model the
    run's merged ``OUT/model`` is; a LoRA run started from it trains a second adapter whose config names
    the first as its base, and that loads as its own merged model (base + first + second adapter). An
    adapter whose base is not here is one line naming the file to fix."""
    from muarl.factory import make_policy
    from muarl.models import checkpoint_root, resolve

    first = preset("tiny", domain="train_fixtures:coin", out=str(tmp_path / "first"), steps=1, tasks_per_step=2,
                   group_size=4, max_new_tokens=12, max_turns=3, lr=1e-2, lora_r=4, save_every=0)
    train_grpo(first, progress=False)
    adapter = tmp_path / "first" / "adapter"
    merged = _logits(load(tmp_path / "first" / "model")[0])
    assert torch.allclose(_logits(load(adapter)[0]), merged, atol=1e-5)
    assert torch.allclose(_logits(make_policy(f"hf:{adapter}").model), merged, atol=1e-5)  # --policy hf:OUT/adapter
    assert not torch.allclose(_logits(load(adapter)[0]), _logits(load("tiny")[0]), atol=1e-3)
    with pytest.raises(FileNotFoundError, match="is a LoRA adapter, not a whole checkpoint"):
        resolve(adapter)
    assert checkpoint_root(adapter) == resolve("tiny")

    second = preset("tiny", model=str(adapter), domain="train_fixtures:coin", out=str(tmp_path / "second"), steps=1,
                    tasks_per_step=2, group_size=4, max_new_tokens=12, max_turns=3, lr=1e-2, lora_r=4, save_every=0)
    train_grpo(second, progress=False)
    config = json.loads((tmp_path / "second" / "adapter" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(adapter.resolve())
    chained = _logits(load(tmp_path / "second" / "adapter")[0])
    assert torch.allclose(chained, _logits(load(tmp_path / "second" / "model")[0]), atol=1e-5)
    assert not torch.allclose(chained, _logits(load(adapter)[0]), atol=1e-3)  # the second adapter moved it
    assert checkpoint_root(tmp_path / "second" / "adapter") == resolve("tiny")

    config["base_model_name_or_path"] = str(tmp_path / "gone")
    lost = tmp_path / "lost"
    lost.mkdir()
    (lost / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(FileNotFoundError, match="is a LoRA adapter of .*gone, which is not a checkpoint directory "
                       "here: set base_model_name_or_path in"):
        load(lost)
