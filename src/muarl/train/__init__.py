"""Training: data preparation, packing, SFT and the GRPO loop."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

T = TypeVar("T")


@dataclass
class RunSettings:
    """The settings every training run shares (SFT and GRPO configs extend it): seeding, precision, LoRA,
    checkpoints, trackers and device."""

    seed: int = field(default=0, metadata={"help": "seeds the model init, data order, sampling and users"})
    bf16: bool | None = field(default=None, metadata={
        "help": "bfloat16 autocast for training forwards (default: on where CUDA supports it)"})
    lora_r: int = field(default=0, metadata={
        "help": "LoRA rank (peft); 0: full fine-tuning. The KL reference is the adapter switched off"})
    lora_alpha: int = field(default=16, metadata={"help": "LoRA alpha"})
    lora_dropout: float = field(default=0.0, metadata={"help": "LoRA dropout"})
    lora_targets: str = field(default="all-linear", metadata={
        "help": "modules to adapt: all-linear or comma-separated names like q_proj,v_proj"})
    merge_lora: bool = field(default=True, metadata={
        "help": "with LoRA, also write the adapter merged into the base as OUT/model (--no-merge-lora: only "
                "OUT/adapter)"})
    keep_checkpoints: int = field(default=2, metadata={"help": "newest checkpoints kept (0: all)"})
    resume: bool | None = field(default=None, metadata={
        "help": "--resume: continue from OUT's newest checkpoint, an error if there is none; --no-resume: start "
                "over, deleting OUT's checkpoints (default: continue when there is one, else start fresh)"})
    report_to: str = field(default="tensorboard", metadata={
        "help": "comma-separated trackers: tensorboard, wandb, mlflow, or none; metrics.jsonl is always written",
        "metavar": "LIST"})
    device: str | None = field(default=None, metadata={
        "help": "cpu, cuda, cuda:1 ... (default: this process's GPU if any, else the CPU)"})
    fsdp: bool = field(default=False, metadata={
        "help": "shard parameters, gradients and optimizer state over the processes (torch FSDP2, "
                "muarl.train.sharding; launch with torchrun or accelerate launch; docs/gpu.md)"})
    fsdp_offload: bool = field(default=False, metadata={
        "help": "with --fsdp on GPUs: keep the shards and the optimizer state in CPU memory"})
    optimizer: str = field(default="adamw", metadata={
        "help": "adamw, or sgd (plain gradient steps, no momentum: what cross-rank equality tests use)",
        "choices": ["adamw", "sgd"]})

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
