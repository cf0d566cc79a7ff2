"""The trained weights: a full model or a LoRA adapter on a frozen base, and the reference beside it.

Full fine-tuning keeps a frozen copy of the starting model as the KL reference. With LoRA (``lora_r``
> 0, through peft) there is no second copy: the reference is the same model with its adapter switched
off (``with model.disable_adapter():``), which is exactly the starting model because the adapter
starts at zero and the base never changes. Checkpoints hold the whole model, or only the adapter.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from muarl.models import ModelFiles, is_lora, load
from muarl.train.diskspace import OutOfSpace, free_bytes, out_of_space, size_text


def load_trainable(config: Any, device: str | None, resume_from: Path | None,
                   want_reference: bool = False, files: ModelFiles | None = None) -> tuple[Any, Any, Any]:
    """(model to train, reference or None, tokenizer) for a run, from its checkpoint when resuming.

    ``config`` needs ``model``, ``lora_r``, ``lora_alpha``, ``lora_dropout`` and ``lora_targets``; ``files``
    are ``config.model``'s, where the run located them already (:attr:`muarl.train.run.Run.model`).
    ``want_reference`` (GRPO) asks for the frozen starting model in full fine-tuning; with LoRA the
    reference is always None (see :func:`reference_mode`).
    """
    start = files if files is not None else config.model
    if config.lora_r > 0:
        from peft import LoraConfig, PeftModel, get_peft_model

        base, tokenizer = load(start, device=device)
        if resume_from is not None:
            model = PeftModel.from_pretrained(base, resume_from / "adapter", is_trainable=True)
        else:
            targets = config.lora_targets if config.lora_targets == "all-linear" else config.lora_targets.split(",")
            model = get_peft_model(base, LoraConfig(r=config.lora_r, lora_alpha=config.lora_alpha,
                                                    lora_dropout=config.lora_dropout, target_modules=targets,
                                                    task_type="CAUSAL_LM"))
        return model, None, tokenizer
    if resume_from is not None:
        model, tokenizer = load(resume_from / "model", device=device)
        own_memory(model)
        reference = load(start, device=device)[0] if want_reference else None
    else:
        model, tokenizer = load(start, device=device)
        reference = copy.deepcopy(model) if want_reference else None
    if reference is not None:
        reference.eval().requires_grad_(False)
    return model, reference, tokenizer


def own_memory(model: Any) -> None:
    """Copy weights that still map the checkpoint's file (safetensors loads CPU tensors by ``mmap``) into
    the process's own memory.

    Otherwise the checkpoint a run resumed from keeps its disk space while the run lives: pruning it to make
    room for the next save (``--keep-checkpoints``) would free nothing. GPU tensors are copies already.
    """
    with torch.no_grad():
        for tensor in (*model.parameters(), *model.buffers()):
            if tensor.device.type == "cpu":
                tensor.data = tensor.data.clone()


@contextlib.contextmanager
def reference_mode(model: Any, reference: Any) -> Iterator[Any]:
    """The model to score reference log-probs with: the frozen copy, or the LoRA model with its adapter off."""
    if reference is not None:
        yield reference
    elif is_lora(model):
        with model.disable_adapter():
            yield model
    else:
        raise ValueError("no reference model: full fine-tuning needs the frozen copy")


def trainable_parameters(model: Any) -> list[torch.nn.Parameter]:
    """The parameters the optimizer updates, in a fixed order (its saved state is matched by position)."""
    return [p for p in model.parameters() if p.requires_grad]


def write_weights(model: Any, tokenizer: Any, directory: Path) -> None:
    """Save what a checkpoint needs: the adapter (LoRA) or the whole model with its tokenizer."""
    if is_lora(model):
        model.save_pretrained(directory / "adapter")
    else:
        model.save_pretrained(directory / "model")
        tokenizer.save_pretrained(directory / "model")


def save_final(out: Path, model: Any, tokenizer: Any, merge: bool = True) -> Path:
    """The run's result: ``out/model``, an ordinary HF checkpoint; with LoRA also ``out/adapter``.

    With LoRA and ``merge`` the adapter is folded into a copy of the base weights for ``out/model`` (what
    ``hf:out/model`` loads); without ``merge`` only the adapter is written and ``out/adapter`` is returned.
    A full disk raises :class:`~muarl.train.diskspace.OutOfSpace`: the last checkpoint is at the final
    step, so rerunning the command after freeing space writes the result without training again.
    """
    try:
        return _write_final(out, model, tokenizer, merge)
    except Exception as err:
        free = free_bytes(out)
        if not out_of_space(err, free):
            raise
        raise OutOfSpace(f"out of disk space writing the trained model in {out}: {size_text(free)} free there; "
                         "the last checkpoint holds it: free some space and rerun the command to write it "
                         f"({type(err).__name__}: {str(err).strip()[:160]})") from err


def _write_final(out: Path, model: Any, tokenizer: Any, merge: bool) -> Path:
    if not is_lora(model):
        model.save_pretrained(out / "model")
        tokenizer.save_pretrained(out / "model")
        return out / "model"
    model.save_pretrained(out / "adapter")
    tokenizer.save_pretrained(out / "adapter")
    if not merge:
        return out / "adapter"
    merged = copy.deepcopy(model).merge_and_unload()
    merged.save_pretrained(out / "model")
    tokenizer.save_pretrained(out / "model")
    return out / "model"
