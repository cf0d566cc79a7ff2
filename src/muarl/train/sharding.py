"""Sharded training on torch's FSDP2 (``--fsdp``): each rank holds 1/N of the parameters, gradients and
optimizer state.

``torch.distributed.fsdp.fully_shard`` is applied to every decoder layer, to the input embeddings and the
output head when they are not tied (each its own unit), and then to the causal LM itself (the root: the
final norm, and the embeddings and head when tied, one parameter used at both ends). A layer's parameters are
all-gathered just before it runs and freed after; its gradients are reduce-scattered as its backward ends,
so a rank never holds more than its shards plus a layer or two in full. Nothing here shards by itself:
this module only decides the units, the precision and the offload, and moves state in and out.

Three things FSDP2 asks of the code around it, and where muarl answers them:

- **Forward through the root.** The root unit's parameters are gathered by a hook on the root's forward,
  but muarl scores sequences by calling the decoder (``lm.model``) and the output head separately, so that
  vocabulary-sized logits are built only at scored positions. :func:`decoder` is that call; on a sharded
  model it goes through ``muarl_decoder``, a method of the root registered as an FSDP forward method. The
  root keeps its parameters gathered after its forward (FSDP2 does this for the root: backward needs
  them at once), so a tied output head applied afterwards sees whole weights; an untied head is a unit
  of its own, gathered by its own hooks when it is called.
- **The same collectives on every rank.** Every forward of a sharded model all-gathers, every backward
  reduce-scatters: all ranks must run the same number of passes, though their shares of a step differ in
  length and count. :func:`idle_passes` runs the missing passes on a two-token input with a zero loss.
- **Sums, not means.** muarl divides each loss by the whole step's token count, so gradients must be
  summed over ranks; FSDP2 averages by default, hence ``set_gradient_divide_factor(1.0)``.

Checkpoints go through ``torch.distributed.checkpoint`` (:func:`save_shards` / :func:`load_shards`): each
rank writes its own shard file, and the state dict is keyed by parameter name, so a checkpoint written by
N ranks loads on M. ``OUT/model`` is gathered into an ordinary checkpoint (:func:`gather_into`).
:func:`save_step`, :func:`resume_optimizer` and :func:`save_result` are where sft and grpo save, resume and
finish a run, sharded or not, so the two trainers cannot drift apart on it.
"""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

import torch

from muarl.train import gloo_comms
from muarl.train.checkpoint import load_trainer_state, save_checkpoint
from muarl.train.distributed import Dist
from muarl.train.tied_lookup import lookup_into_head_grad

#: the directory of a checkpoint that holds the ranks' shards (torch.distributed.checkpoint's format)
SHARDS = "shards"


def is_sharded(model: Any) -> bool:
    """Whether ``model`` (or the causal LM inside a peft model) was sharded by :func:`shard`."""
    from torch.distributed.fsdp import FSDPModule

    from muarl.models import causal_lm

    return isinstance(causal_lm(model), FSDPModule)


def _decoder_forward(self: Any, **kwargs: Any) -> Any:
    return self.model(**kwargs)


def decoder(lm: Any) -> Any:
    """The callable that runs ``lm``'s decoder (embeddings, layers, final norm) to its last hidden states:
    ``lm.model``, or on a sharded model the root's registered forward method, which gathers the root's
    parameters first (see the module docstring)."""
    return getattr(lm, "muarl_decoder", lm.model)


def shard(model: Any, dist: Dist, bf16: bool = False, offload: bool = False) -> Any:
    """Shard ``model`` in place over every rank of ``dist`` (a plain causal LM or a peft model).

    ``bf16``: gathered parameters in bfloat16 for the forward and backward, gradients reduced in float32
    (the shards and the optimizer stay float32). ``offload``: shards, gradients and optimizer state live
    in CPU memory, gathered onto the GPU per layer (FSDP2's ``CPUOffloadPolicy``); the optimizer step then
    runs on the CPU. Returns ``model``.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import (
        CPUOffloadPolicy,
        MixedPrecisionPolicy,
        OffloadPolicy,
        fully_shard,
        register_fsdp_forward_method,
    )

    from muarl.models import causal_lm

    lm = causal_lm(model)
    mesh = init_device_mesh(dist.device.type, (dist.world,))
    options: dict[str, Any] = {
        "mesh": mesh,
        "mp_policy": MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16
        else MixedPrecisionPolicy(),
        "offload_policy": CPUOffloadPolicy(pin_memory=dist.device.type == "cuda") if offload else OffloadPolicy(),
    }
    for layer in lm.model.layers:
        fully_shard(layer, **options)
    embeddings, head = lm.get_input_embeddings(), lm.get_output_embeddings()
    if head is not None and head.weight is not embeddings.weight:
        # untied (Qwen3-8B and up): each vocabulary-sized matrix is a unit of its own, gathered only around its
        # own use; in the root both stay gathered from the embedding's forward to the end of backward
        fully_shard(embeddings, **options)
        fully_shard(head, **options)
    elif head is not None:
        lookup_into_head_grad(embeddings)  # one vocabulary-sized gradient in backward, not three
    lm.muarl_decoder = types.MethodType(_decoder_forward, lm)
    fully_shard(lm, **options)
    register_fsdp_forward_method(lm, "muarl_decoder")
    for module in lm.modules():
        if hasattr(module, "set_gradient_divide_factor"):
            module.set_gradient_divide_factor(1.0)  # losses are normalised by the global count: sum, not mean
            module.set_force_sum_reduction_for_comms(True)  # a plain sum: gloo has no pre-multiplied one
    gloo_comms.install(lm, mesh.get_group())  # gloo's own collectives hold a whole buffer more per unit
    return model


def pass_count(model: Any, mine: int, dist: Dist) -> int:
    """How many forward passes every rank runs in a phase where this rank has ``mine`` to run: the most
    any rank has on a sharded model (each pass is a collective; agreed before the first one, itself a
    collective), else ``mine``."""
    return int(dist.max(mine)) if is_sharded(model) else mine


def idle_passes(model: Any, done: int, most: int, device: torch.device, backward: bool = True) -> int:
    """Run forward (and backward) passes on a two-token input with a zero loss until this rank, having run
    ``done``, has run ``most`` (:func:`pass_count`). A sharded model's every pass is a collective; the extra
    ones add exactly nothing to any gradient. Returns how many were run."""
    from muarl.models import causal_lm

    lm = causal_lm(model)
    ids = torch.zeros(1, 2, dtype=torch.long, device=device)
    for _ in range(most - done):
        with torch.set_grad_enabled(backward):
            hidden = decoder(lm)(input_ids=ids).last_hidden_state
            loss = lm.get_output_embeddings()(hidden[:, -1]).float().sum() * 0.0
        if backward:
            loss.backward()
    return most - done


def grad_norm(params: list[torch.nn.Parameter], max_norm: float) -> float:
    """Clip the gradients of ``params`` to ``max_norm`` (their norm over every rank's shards for a sharded
    model) and return the norm before clipping."""
    total = torch.nn.utils.clip_grad_norm_(params, max_norm)
    full = getattr(total, "full_tensor", None)
    return float(full() if full is not None else total)


def gather_into(model: Any, plain: Any | None, only_trainable: bool = False, to_main: bool = False) -> None:
    """Copy a sharded ``model``'s parameters, one at a time, into ``plain``, an unsharded model of the same
    architecture (None on ranks that only take part in the gathers). Every rank must call it: each
    parameter is one collective. The shards land in ``plain``'s own rows where its dtype and device are the
    shards' (no whole temporary: a 152k-vocabulary embedding gathered through one cost every rank three
    copies of it), else through one temporary per parameter. ``only_trainable``: the parameters the
    optimizer updates (a LoRA run's adapter), the rest being unchanged since ``plain`` was made.
    ``to_main``: only rank 0 receives the parameters (a gather, not an all-gather: the other ranks send
    their shards and hold no whole parameter at all). The ranks are those of each parameter's own mesh."""
    targets = dict(plain.named_parameters()) if plain is not None else {}
    with torch.no_grad():
        for name, param in model.named_parameters():
            if only_trainable and not param.requires_grad:
                continue
            target = targets.get(name)
            if hasattr(param, "to_local"):
                _gather_rows(param, target, to_main)
            elif target is not None:
                target.copy_(param.detach().to(device=target.device, dtype=target.dtype))


def shard_rows(full_rows: int, rank: int, world: int) -> tuple[int, int]:
    """The dim-0 rows [start, end) of a parameter with ``full_rows`` rows that ``rank`` of ``world`` holds:
    FSDP2 cuts dim 0 as ``torch.chunk`` does (equal chunks of ceil(rows / world), the last ones shorter or
    empty)."""
    chunk = -(-full_rows // world)
    start = min(rank * chunk, full_rows)
    return start, min(start + chunk, full_rows)


def _gather_rows(param: Any, target: torch.Tensor | None, to_main: bool) -> None:
    """Every rank's rows of the dim-0 sharded ``param`` into ``target`` (on every rank, or on rank 0 only
    with ``to_main``; None where nothing is received), with no whole-parameter temporary where ``target``
    can receive in place: gloo flattens a list all-gather or gather (and its ``all_gather_into_tensor``)
    through a whole buffer of its own and copies out after, a whole temporary of every parameter on every
    rank at each sync (0.6 GB for a 152k x 1,024 embedding; measured in benchmarks/fsdp_startup_memory.py).

    With ``to_main`` the ranks send their rows point to point and rank 0 receives each straight into its
    rows of ``target`` (through one shard-sized buffer where ``target``'s dtype or device differs: a bf16
    copy of float32 shards, a CPU copy of GPU shards). Otherwise every rank casts its shard to ``target``'s
    dtype (shard-sized) and one ``all_gather_into_tensor`` lands in ``target`` itself where its rows are
    whole chunks (the collective wants equal sizes; FSDP2's last chunks may be shorter), else in one buffer
    copied in after; a target on another device than the shards (an in-process vLLM engine's CPU copy of
    GPU shards) receives through such a buffer on the shards' device."""
    local = param.to_local().detach()
    mesh = param.device_mesh
    rows, world = param.shape[0], mesh.size()
    # a one-rank mesh asks no process group (an in-process vLLM engine re-registers the default one)
    main = world == 1 or mesh.get_local_rank() == 0
    if world == 1:
        if target is not None:
            target.copy_(local)
        return
    group = mesh.get_group()
    spans = [shard_rows(rows, r, world) for r in range(world)]
    if to_main:
        if not main:
            s, e = spans[mesh.get_local_rank()]
            if e > s:
                torch.distributed.send(local[:e - s].contiguous(), group=group, group_dst=0)
            return
        for r, (s, e) in enumerate(spans):
            if e == s:
                continue
            into = target[s:e] if target is not None else None  # None: received and dropped
            direct = into is not None and into.dtype == local.dtype and into.device == local.device
            piece = into if direct else local.new_empty((e - s, *local.shape[1:]))
            if r == 0:
                piece.copy_(local[:e - s])
            else:
                torch.distributed.recv(piece, group=group, group_src=r)
            if into is not None and not direct:
                into.copy_(piece)
        return
    if target is None:
        raise ValueError("an all-gather gives every rank the whole parameter: every rank needs a target "
                         "(to_main=True gathers to rank 0 alone)")
    local = local.to(target.dtype)  # every rank receives, so every rank casts its own rows (shard-sized)
    if torch.distributed.get_backend(group) == "gloo":  # its all-gather receives into a whole temporary first
        gloo_comms.exchange_rows(local, target, spans, mesh.get_local_rank(), group)
        return
    chunk = spans[0][1]
    if local.shape[0] < chunk:
        padded = local.new_zeros((chunk, *local.shape[1:]))
        padded[:local.shape[0]] = local
        local = padded
    whole = chunk * world == rows and target.device == local.device and target.is_contiguous()
    out = target if whole else local.new_empty((chunk * world, *local.shape[1:]))
    torch.distributed.all_gather_into_tensor(out, local.contiguous(), group=group)
    if not whole:
        target.copy_(out[:rows])


def _options() -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    # frozen parameters (a LoRA run's base) are not saved: they are the starting checkpoint's
    return StateDictOptions(ignore_frozen_params=True)


def save_shards(model: Any, optimizer: Any, directory: Path) -> None:
    """Every rank writes its shards of the trainable parameters and the optimizer state to ``directory``
    (torch.distributed.checkpoint; a collective)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    weights, optim = get_state_dict(model, optimizer, options=_options())
    dcp.save({"model": weights, "optimizer": optim}, checkpoint_id=str(directory))


def load_shards(model: Any, optimizer: Any, directory: Path) -> None:
    """Load the shards :func:`save_shards` wrote (by any number of ranks) into this run's sharded ``model``
    and ``optimizer`` (a collective)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    weights, optim = get_state_dict(model, optimizer, options=_options())
    state = {"model": weights, "optimizer": optim}
    dcp.load(state, checkpoint_id=str(directory))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"],
                   options=_options())


def resume_optimizer(resume_from: Path, dist: Dist, model: Any, optimizer: Any, sharded: bool) -> dict[str, Any]:
    """The trainer state saved in ``resume_from``, the optimizer's restored from it (from its shards where the
    run is sharded: then any world size may resume it). Call it last: it also restores the random
    generators as they were at the save (sft and grpo resume alike)."""
    state = load_trainer_state(resume_from, dist, any_world=sharded)
    if sharded:
        load_shards(model, optimizer, resume_from / SHARDS)
    else:
        optimizer.load_state_dict(state["optimizer"])
    return state


def save_step(out: Path, step: int, dist: Dist, model: Any, optimizer: Any, tokenizer: Any, state: dict[str, Any],
              sharded: bool, keep: int) -> None:
    """Checkpoint ``step`` of an sft or grpo run: where the run is sharded every rank writes its shards of the
    weights and optimizer state; otherwise the weights and ``state`` with the optimizer's (what
    :func:`resume_optimizer` reads back)."""
    from muarl.train.weights import write_weights

    if sharded:
        save_checkpoint(out, step, dist, lambda d: None, state, keep=keep,
                        write_shards=lambda d: save_shards(model, optimizer, d / SHARDS))
    else:
        save_checkpoint(out, step, dist, lambda d: write_weights(model, tokenizer, d),
                        {**state, "optimizer": optimizer.state_dict()}, keep=keep)


def save_result(out: Path, model: Any, tokenizer: Any, config: Any, dist: Dist) -> tuple[Path, Any]:
    """``out/model`` of a finished sft or grpo run (gathered from the shards where it is sharded), once every
    rank is done: (its path, the model rank 0 wrote or this rank's)."""
    from muarl.train.weights import save_final

    if config.fsdp:
        checkpoint, model = save_final_sharded(out, model, tokenizer, config, dist)
    else:
        checkpoint = save_final(out, model, tokenizer, config.merge_lora) if dist.main else out / "model"
    dist.barrier()
    return checkpoint, model


def mixed_precision(config: Any, device: torch.device) -> bool:
    """Whether a sharded run gathers its parameters in bfloat16: where its forwards autocast to it (the
    ``bf16`` setting, by default a GPU that supports it); float32 on the CPU."""
    if config.bf16 is not None:
        return bool(config.bf16)
    return device.type == "cuda" and torch.cuda.is_bf16_supported()


def shard_for_training(model: Any, reference: Any | None, config: Any, dist: Dist) -> None:
    """Shard a run's model and, for full fine-tuning, its frozen KL reference (a LoRA run's reference is
    the same model with its adapter off); the precision and offload follow ``config``."""
    bf16 = mixed_precision(config, dist.device)
    shard(model, dist, bf16=bf16, offload=config.fsdp_offload)
    if reference is not None:
        shard(reference, dist, bf16=bf16, offload=config.fsdp_offload)


def plain_copy(config: Any, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> Any:
    """An unsharded model of the run's architecture for :func:`gather_into` to fill: full fine-tuning's
    uninitialised in ``dtype`` (every weight is gathered; the checkpoint is not read), LoRA's from
    ``config.model`` with a fresh adapter of the run's shape (only the adapter is gathered)."""
    from muarl.train.meta_models import empty_copy
    from muarl.train.weights import load_trainable

    if config.lora_r == 0:
        return empty_copy(config, dtype, device)
    return load_trainable(config, str(device), None)[0]


def save_final_sharded(out: Path, model: Any, tokenizer: Any, config: Any, dist: Dist) -> tuple[Path, Any]:
    """``out/model`` of a sharded run: the weights gathered, one parameter at a time, into an ordinary
    checkpoint on rank 0 (every rank takes part). Returns (its path, the gathered model on rank 0 and the
    sharded one elsewhere)."""
    from muarl.models import is_lora
    from muarl.train.weights import save_final

    plain = plain_copy(config) if dist.main else None
    gather_into(model, plain, only_trainable=is_lora(model), to_main=True)
    if not dist.main:
        return out / "model", model
    return save_final(out, plain, tokenizer, config.merge_lora), plain
