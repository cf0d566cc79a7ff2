"""Run by tests/test_sharded_init.py on each of two ranks (``accelerate launch``): a sharded run's models are
built without a whole copy on any rank, and its rollout copy is gathered where it is needed and released
during the update. Every check is an assert: a failing rank exits non-zero."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import transformers
from safetensors.torch import load_file
from torch.distributed.tensor import DTensor

from muarl.models import checkpoint_root
from muarl.train.distributed import setup
from muarl.train.grpo_config import preset
from muarl.train.meta_models import empty_copy
from muarl.train.samplers import CopySampler, rollout_copy
from muarl.train.sharded_init import load_sharded
from muarl.train.sharding import gather_into, shard_rows


def refuse(*args, **kwargs):
    raise AssertionError("a whole copy of the model was built on this rank")


def no_all_gather(*args, **kwargs):
    raise AssertionError("a rank all-gathered a whole parameter where only rank 0 should receive it")


def same_as(plain, expected: dict[str, torch.Tensor], shift: float = 0.0) -> None:
    for name, param in plain.named_parameters():
        assert torch.equal(param.detach(), expected[name] + shift), name


if __name__ == "__main__":
    out = Path(sys.argv[1])
    dist = setup("cpu", group=True)
    assert dist.world == 2
    checkpoint = load_file(checkpoint_root("tiny") / "model.safetensors")
    full = preset("tiny", domain="train_fixtures:coin", fsdp=True, out=str(out))
    # loading the checkpoint whole (what load-then-shard does) is refused on every rank
    transformers.AutoModelForCausalLM.from_pretrained = refuse
    model, reference, tokenizer = load_sharded(full, dist, want_reference=True)
    held = total = 0
    for which, sharded in (("model", model), ("reference", reference)):
        for name, param in sharded.named_parameters():
            assert isinstance(param, DTensor), (which, name)
            assert param.requires_grad == (which == "model"), (which, name)
            start, end = shard_rows(param.shape[0], dist.rank, dist.world)
            assert torch.equal(param.to_local(), checkpoint[name][start:end]), (which, name, start, end)
            held, total = held + param.to_local().numel(), total + param.numel()
    assert held <= 0.55 * total, (held, total)  # this rank's half, not the whole
    # servers: rank 0 alone holds a copy and receives the shards; no rank all-gathers a whole parameter
    server = preset("tiny", domain="train_fixtures:coin", fsdp=True, out=str(out),
                    rollout_engine="vllm-server:http://127.0.0.1:9#m")
    copy = rollout_copy(server, dist)
    assert (copy is not None) == dist.main
    full_tensor, all_gather = DTensor.full_tensor, torch.distributed.all_gather
    DTensor.full_tensor = torch.distributed.all_gather = no_all_gather
    gather_into(model, copy, to_main=True)
    DTensor.full_tensor, torch.distributed.all_gather = full_tensor, all_gather
    if copy is not None:
        same_as(copy, checkpoint)
    # a copy in another dtype than the shards' (bfloat16 on GPUs) is filled through a buffer, cast
    low = empty_copy(full, torch.bfloat16)
    gather_into(model, low)
    same_as(low, {name: tensor.to(torch.bfloat16) for name, tensor in checkpoint.items()})
    # muarl's engine: every rank samples from its own copy; released during the update, gathered again after
    sampler = CopySampler(full, model, rollout_copy(full, dist), tokenizer, dist)
    same_as(sampler.plain, checkpoint)
    sampler.release()
    assert all(p.numel() == 0 for p in sampler.plain.parameters())
    with torch.no_grad():
        for param in model.parameters():
            param.to_local().add_(1.0)  # an update
    sampler.sync(model)
    same_as(sampler.plain, checkpoint, shift=1.0)
    (out / f"rank{os.environ['RANK']}.json").write_text(json.dumps({"held": held, "total": total}))
