"""Training: data preparation, packing, SFT and the GRPO loop."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, TypeVar

T = TypeVar("T")


@dataclass
class RunSettings:
    """The settings every training run shares (SFT and GRPO configs extend it): seeding, precision, LoRA,
    checkpoints, trackers and device."""

    seed: int = 0
    bf16: bool | None = None  # autocast forwards to bfloat16; None: where CUDA supports it
    lora_r: int = 0  # LoRA rank through peft; 0 = full fine-tuning. The reference is the adapter switched off
    lora_alpha: int = 16
    lora_dropout: float = 0.0
    lora_targets: str = "all-linear"  # or comma-separated module names, e.g. "q_proj,v_proj"
    merge_lora: bool = True  # also write the adapter merged into the base as out/model
    keep_checkpoints: int = 2  # newest checkpoints kept (0: all)
    resume: bool | None = None  # None: continue from out's newest checkpoint if any; False: start over
    report_to: str = "tensorboard"  # comma-separated: tensorboard, wandb, mlflow, or none
    device: str | None = None  # None: this process's GPU when there is one, else the CPU
    # shard parameters, gradients and optimizer state over the ranks (torch FSDP2, muarl.train.sharding)
    fsdp: bool = False
    fsdp_offload: bool = False  # with fsdp on a GPU: shards and optimizer state in CPU memory
    optimizer: str = "adamw"  # or "sgd" (plain gradient steps, no momentum: what cross-rank equality tests use)

    def check_sharding(self) -> None:
        """Refuse sharding options that cannot apply, naming the option."""
        if self.optimizer not in ("adamw", "sgd"):
            raise ValueError(f"--optimizer must be adamw or sgd, not {self.optimizer!r}")
        if self.fsdp_offload and not self.fsdp:
            raise ValueError("--fsdp-offload moves a sharded run's optimizer state to CPU memory: it needs --fsdp")
        if self.fsdp_offload and (self.device or "").startswith("cpu"):
            raise ValueError("--fsdp-offload moves the optimizer state from the GPU to CPU memory; this run is on "
                             "the CPU already")


def make_optimizer(params: list[Any], config: Any) -> Any:
    """The optimizer ``config.optimizer`` names over ``params``, at ``config.lr`` and its weight decay."""
    import torch

    if config.optimizer == "sgd":
        return torch.optim.SGD(params, lr=config.lr, weight_decay=config.weight_decay)
    return torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)


def from_preset(presets: dict[str, T], name: str, kind: str, **overrides: Any) -> T:
    """A preset config with the overrides that were given (None means "keep the preset's value")."""
    if name not in presets:
        raise ValueError(f"unknown {kind} preset {name!r}; choose from {', '.join(presets)}")
    return replace(presets[name], **{k: v for k, v in overrides.items() if v is not None})  # type: ignore[type-var]


def autocast(bf16: bool | None, device: Any) -> Any:
    """A bfloat16 autocast context for training forwards, or a no-op.

    ``bf16`` None means "where the hardware has it": a CUDA device that supports bfloat16. On the CPU
    autocast would only slow the small matmuls down, so it is off unless asked for.
    """
    import contextlib

    import torch

    device = torch.device(device)
    enabled = bf16 if bf16 is not None else device.type == "cuda" and torch.cuda.is_bf16_supported()
    if not enabled:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
