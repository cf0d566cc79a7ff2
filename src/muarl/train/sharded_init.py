"""A sharded run's models built without a whole copy on any rank (``--fsdp``).

Loading the checkpoint whole on every rank and sharding it afterwards costs each rank the full model at
start-up, in float32, once for the policy and once more for the KL reference: for Qwen3-8B about 64 GB on
every GPU before the first step, and a node of 8 ranks reads 8 copies into host memory. Here every rank
instead builds the architecture with its parameters on the meta device (no memory), shards it, allocates
its shards only, and fills them with its own rows read from the checkpoint's safetensors files (dim-0
slices, the way FSDP2 cuts every parameter): each byte of the checkpoint is read by one rank, and no rank
ever holds more than its shards. The KL reference is built alike, frozen, in the dtype the sharded
forwards compute in (bfloat16 on GPUs). The rollout copy of muarl's engine
(:func:`muarl.train.meta_models.empty_copy`) is the
architecture with uninitialised weights: what fills it is the gather from the shards, so the checkpoint is
not read for it at all.

A checkpoint whose parameter names are not the model's (a LoRA adapter directory as ``--model``, older
formats transformers renames on load) and LoRA runs (peft builds its adapter from the loaded base) take
the plain path: load, then shard (:func:`muarl.train.sharding.shard_for_training`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from muarl.train.distributed import Dist
from muarl.train.meta_models import checkpoint_files, empty_model, materialize
from muarl.train.sharding import mixed_precision, shard, shard_for_training, shard_rows

if TYPE_CHECKING:
    from muarl.models import ModelFiles


def fill_shards(model: Any, files: dict[str, Path], dist: Dist) -> None:
    """Copy into every (sharded) parameter of ``model`` this rank's rows of the checkpoint's tensor of the
    same name, cast to the parameter's dtype. Only those rows are read (safetensors slices a memory map)."""
    from safetensors import safe_open

    by_file: dict[Path, list[tuple[str, torch.Tensor]]] = {}
    for name, param in model.named_parameters():
        by_file.setdefault(files[name], []).append((name, param))
    with torch.no_grad():
        for file, params in by_file.items():
            with safe_open(str(file), framework="pt") as handle:
                for name, param in params:
                    local = param.to_local() if hasattr(param, "to_local") else param
                    world, rank = (dist.world, dist.rank) if hasattr(param, "to_local") else (1, 0)
                    start, end = shard_rows(param.shape[0], rank, world)
                    if local.shape[0] != end - start:
                        raise RuntimeError(f"{name}: this rank holds {local.shape[0]} rows, expected {end - start} "
                                           f"(rows {start}..{end} of {param.shape[0]} over {world} ranks)")
                    if end > start:
                        local.copy_(handle.get_slice(name)[start:end].to(local.dtype))


def loadable(config: Any, located: ModelFiles | None = None) -> Path | None:
    """The checkpoint directory a sharded run of ``config`` builds on meta and fills from, or None where it
    takes the plain path (see the module docstring); ``located``: ``config.model``'s files, where the run
    located them already."""
    from muarl.models import locate

    if config.lora_r > 0:
        return None
    model = located if located is not None else locate(config.model)
    root = model.root
    if model.adapters:
        return None
    files = checkpoint_files(root)
    if not files:
        return None
    with torch.device("meta"):
        names = [name for name, _ in empty_model(root, torch.float32).named_parameters()]
    return root if all(name in files for name in names) else None


def sharded_model(root: Path, dist: Dist, dtype: torch.dtype, bf16: bool, offload: bool,
                  trainable: bool) -> Any:
    """The checkpoint in ``root`` built on meta, sharded over ``dist``, its shards filled from the files;
    frozen unless ``trainable``."""
    model = empty_model(root, dtype)
    model.requires_grad_(trainable)
    shard(model, dist, bf16=bf16, offload=offload)
    materialize(model, "cpu" if offload else dist.device)
    fill_shards(model, checkpoint_files(root), dist)
    return model if trainable else model.eval()


def load_sharded(config: Any, dist: Dist, want_reference: bool = False,
                 files: ModelFiles | None = None) -> tuple[Any, Any, Any]:
    """(sharded model to train, sharded reference or None, tokenizer) of a ``--fsdp`` run, as
    :func:`muarl.train.weights.load_trainable` returns them unsharded: without a whole copy on any rank
    where the checkpoint allows it, else loaded and then sharded. ``want_reference``: the frozen starting
    model of full fine-tuning, in the dtype the sharded forwards compute in; ``files``: ``config.model``'s,
    where the run located them already (:attr:`muarl.train.run.Run.model`)."""
    from transformers import AutoTokenizer

    from muarl.models import locate
    from muarl.train.weights import load_trainable

    files = files if files is not None else locate(config.model)
    root = loadable(config, files)
    if root is None:
        model, reference, tokenizer = load_trainable(config, str(dist.device), None, want_reference=want_reference,
                                                     files=files)
        shard_for_training(model, reference, config, dist)
        return model, reference, tokenizer
    bf16 = mixed_precision(config, dist.device)
    model = sharded_model(root, dist, torch.float32, bf16, config.fsdp_offload, trainable=True)
    reference = None
    if want_reference:
        reference = sharded_model(root, dist, torch.bfloat16 if bf16 else torch.float32, bf16, config.fsdp_offload,
                                  trainable=False)
    model.eval()
    return model, reference, AutoTokenizer.from_pretrained(files.tokenizer)
