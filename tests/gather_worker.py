"""Run by tests/test_sharded_init.py on each of three ranks (``torchrun``, gloo): ``gather_into`` fills an
unsharded copy from FSDP2 shards whose rows do not divide evenly (a 2-row parameter leaves rank 2 no rows, a
7-row one gives the ranks 3, 3 and 1), into a copy of the shards' dtype and into a bfloat16 one, on every
rank (all-gather) and on rank 0 alone; on gloo without its whole-buffer collectives. Then muarl's units:
an untied model's embeddings and head are units of their own, a tied model's one parameter stays in the
root; a forward and backward of both run FSDP2's own gathers and gradient scatters point to point, with
gloo's whole-buffer collectives refused, and sum the ranks' gradients; a tied model's backward allocates no
vocabulary-sized gradient beyond the head's (``tied_lookup.lookup_into_head_grad``) and FSDP2's
reduce-scatter copies its gradient in without a whole temporary (``gloo_comms.copy_in``). Every check is an assert:
a failing rank exits non-zero."""

from __future__ import annotations

import torch
from torch.distributed.fsdp import fully_shard
from torch.profiler import ProfilerActivity, profile

from muarl.train.distributed import setup
from muarl.train.sharding import gather_into


class Toy(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.few = torch.nn.Parameter(torch.arange(6, dtype=torch.float32).reshape(2, 3))
        self.uneven = torch.nn.Parameter(torch.arange(28, dtype=torch.float32).reshape(7, 4) / 7)
        self.flat = torch.nn.Parameter(torch.arange(9, dtype=torch.float32) - 4)


def parents(event):
    """The profiler event and the ops it ran inside of."""
    while event is not None:
        yield event
        event = event.cpu_parent


def whole_buffer(*args, **kwargs):
    raise AssertionError("gloo's all-gather receives into a whole temporary: the rows go point to point")


if __name__ == "__main__":
    from torch.distributed.device_mesh import init_device_mesh

    dist = setup("cpu", group=True)
    assert dist.world == 3
    expected = Toy()
    model = fully_shard(Toy(), mesh=init_device_mesh("cpu", (3,)))
    assert model.few.to_local().shape[0] == (0 if dist.rank == 2 else 1)
    all_gather_into_tensor, all_gather = torch.distributed.all_gather_into_tensor, torch.distributed.all_gather
    torch.distributed.all_gather_into_tensor = torch.distributed.all_gather = whole_buffer
    for dtype in (torch.float32, torch.bfloat16):
        every = Toy().to(dtype)
        with torch.no_grad():
            for p in every.parameters():
                p.zero_()
        gather_into(model, every)
        for name, param in every.named_parameters():
            assert torch.equal(param, getattr(expected, name).to(dtype)), (dtype, name, param)
        main = Toy().to(dtype) if dist.main else None
        if main is not None:
            with torch.no_grad():
                for p in main.parameters():
                    p.zero_()
        gather_into(model, main, to_main=True)
        if main is not None:
            for name, param in main.named_parameters():
                assert torch.equal(param, getattr(expected, name).to(dtype)), (dtype, name, param)
    torch.distributed.all_gather_into_tensor, torch.distributed.all_gather = all_gather_into_tensor, all_gather
    from torch.distributed.fsdp import FSDPModule
    from transformers import AutoConfig, AutoModelForCausalLM

    from muarl.models import checkpoint_root
    from muarl.train.sharding import shard

    for tied in (True, False):
        config = AutoConfig.from_pretrained(checkpoint_root("tiny"), tie_word_embeddings=tied)
        torch.manual_seed(0)
        plain = AutoModelForCausalLM.from_config(config)
        torch.manual_seed(0)
        lm = shard(AutoModelForCausalLM.from_config(config), dist)
        units = [isinstance(m, FSDPModule) for m in (lm.get_input_embeddings(), lm.get_output_embeddings())]
        assert units == [not tied, not tied], (tied, units)
        # a forward and backward through FSDP2 with gloo's whole-buffer collectives refused: the units gather
        # and scatter point to point (muarl.train.gloo_comms), and every rank's gradient rows are the sum of
        # the ranks' gradients (each rank runs the same input here: 3 x the unsharded model's)
        ids = torch.tensor([[1, 5, 9, 2, 7, 3]])
        plain(input_ids=ids).logits.square().mean().backward()
        saved = {name: getattr(torch.distributed, name) for name in
                 ("all_gather_into_tensor", "all_gather_single", "reduce_scatter_tensor", "reduce_scatter_single")
                 if hasattr(torch.distributed, name)}
        for name in saved:
            setattr(torch.distributed, name, whole_buffer)
        loss = lm(input_ids=ids).logits.square().mean()
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            loss.backward()
        if tied:  # one vocabulary-sized gradient, the head's: the lookup adds into it, the scatter copies no temporary
            size = config.vocab_size * config.hidden_size * 4  # the whole table's bytes
            tables = [[p.name for p in parents(e)] for e in prof.events() if e.self_cpu_memory_usage >= size]
            in_backward = [names for names in tables if not any("post_backward" in n for n in names)]
            assert len(tables) > len(in_backward), f"the profiler saw no reduce-scatter of the tied weight: {tables}"
            assert len(in_backward) == 1, f"the tied weight's backward allocated {len(in_backward)} tables: {in_backward}"
            temporaries = [names for names in tables if any("chunk_cat" in n for n in names)]
            assert not temporaries, f"the reduce-scatter's copy-in allocated a whole temporary: {temporaries}"
        for name, fn in saved.items():
            setattr(torch.distributed, name, fn)
        grads = dict(plain.named_parameters())
        for name, param in lm.named_parameters():
            rows = param.grad.to_local()
            start = sum(chunk.shape[0] for chunk in grads[name].grad.chunk(3)[:dist.rank])
            want = 3 * grads[name].grad[start:start + rows.shape[0]]
            assert torch.allclose(rows, want, rtol=1e-4, atol=1e-6), (tied, name, (rows - want).abs().max())
    torch.distributed.barrier()
