"""``muarl export``: any checkpoint of an sft or grpo run as an ordinary Hugging Face model (or adapter).

A sharded run's checkpoint (``--fsdp``) holds each rank's shards in torch.distributed.checkpoint's format,
which ``hf:`` and ``vllm:`` cannot read; only the run's last step is written whole (``out/model``). Here
the shards of any step, saved by any number of ranks, are read in one process without a process group
(DCP's ``no_dist``) into a model built from the run's own config, and written as a Hugging Face checkpoint
at the directory named (the model there, a LoRA run's adapter in its ``adapter/``). An unsharded
checkpoint already holds the weights (or adapter): it is loaded as a resumed run would load it and
written the same way. The checkpoint is verified against its manifest first, and
nothing in it is written.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from muarl.train.checkpoint import latest_checkpoint
from muarl.train.manifest import check_checkpoint
from muarl.train.sharding import SHARDS, plain_copy


def find_checkpoint(path: Path) -> tuple[Path, Path]:
    """(checkpoint directory, its run directory) for ``path``: a checkpoint (``RUN/checkpoints/step_N``) or a
    run directory (its newest checkpoint). One clear error for anything else, or a damaged checkpoint."""
    path = Path(path)
    if (path / "config.json").is_file() and (path / "checkpoints").is_dir():
        newest = latest_checkpoint(path)
        if newest is None:
            raise FileNotFoundError(f"{path} has no complete checkpoint to export")
        path = newest[1]
    run = path.parent.parent
    if not path.is_dir() or path.parent.name != "checkpoints" or not (run / "config.json").is_file():
        raise FileNotFoundError(f"{path} is not a checkpoint of a muarl run (RUN/checkpoints/step_N, with "
                                "RUN/config.json) nor a run directory")
    verdict = check_checkpoint(path)
    if verdict.problem is not None:
        raise ValueError(f"{path} is damaged ({verdict.problem}); export another step")
    return path, run


def _shard_keys(directory: Path) -> set[str]:
    """The model's parameter names the shards hold (a LoRA run saves its adapter only)."""
    from torch.distributed.checkpoint import FileSystemReader

    metadata = FileSystemReader(str(directory)).read_metadata()
    return {key.removeprefix("model.") for key in metadata.state_dict_metadata if key.startswith("model.")}


def load_checkpoint(checkpoint: Path, config: Any) -> tuple[Any, Any]:
    """(model, tokenizer) of one checkpoint, in float32 on the CPU, built from the run's ``config``."""
    import torch.distributed.checkpoint as dcp

    from muarl.models import tokenizer_dir
    from muarl.train.weights import load_trainable

    if not (checkpoint / SHARDS).is_dir():  # the weights (or adapter) as a resumed run reads them
        model, _, tokenizer = load_trainable(config, "cpu", checkpoint)
        return model, tokenizer
    from transformers import AutoTokenizer

    model = plain_copy(config)  # full fine-tuning: uninitialised, every weight read below; LoRA: base + adapter
    saved = _shard_keys(checkpoint / SHARDS)
    state = {name: tensor for name, tensor in model.state_dict().items() if name in saved}
    missing = saved - set(state)
    if missing:
        raise ValueError(f"{checkpoint} holds weights its run's model has not ({', '.join(sorted(missing)[:4])}"
                         f"{' ...' if len(missing) > 4 else ''}): was the run's --model changed since?")
    if not state:
        raise ValueError(f"{checkpoint}: its shards hold no weight of the run's model")
    if config.lora_r == 0:  # every weight must come from the shards (a tied pair: under either name)
        groups: dict[int, list[str]] = {}
        for name, tensor in model.state_dict().items():
            groups.setdefault(tensor.data_ptr(), []).append(name)
        unread = sorted(names[0] for names in groups.values() if not saved & set(names))
        if unread:
            raise ValueError(f"{checkpoint}: its shards lack weights of the run's model ({', '.join(unread[:4])})")
    dcp.load({"model": state}, checkpoint_id=str(checkpoint / SHARDS), no_dist=True)
    return model, AutoTokenizer.from_pretrained(str(tokenizer_dir(config.model)))


def export(path: Path, out: Path) -> Path:
    """Write the checkpoint at ``path`` (or a run directory's newest) as a Hugging Face checkpoint at ``out``
    itself, what ``hf:out`` and ``vllm serve out`` load: the model (a LoRA run's merged into its base) in
    ``out``, a LoRA run's adapter in ``out/adapter`` beside it (only that where the run said
    ``--no-merge-lora``). ``out`` must be new or empty; it is written whole or not at all (the files are
    written beside it and moved in). Returns what ``hf:`` should load."""
    from muarl.train.weights import save_final

    checkpoint, run = find_checkpoint(path)
    out = Path(out)
    if checkpoint.resolve() == out.resolve() or checkpoint.resolve() in out.resolve().parents:
        raise ValueError(f"--out {out} is inside the checkpoint being exported (nothing muarl reads is written): "
                         "choose a directory of its own")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"{out} already exists and is not an empty directory (an exported model?): choose "
                              "another --out or remove it")
    config = SimpleNamespace(**json.loads((run / "config.json").read_text()))
    model, tokenizer = load_checkpoint(checkpoint, config)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.export-", dir=out.parent))
    try:
        written = save_final(staging, model, tokenizer, getattr(config, "merge_lora", True))
        whole = staging / "model"  # the run's layout (OUT/model, OUT/adapter) folded into one directory
        if not whole.is_dir():  # an unmerged LoRA run: the adapter only
            whole.mkdir()
        if (staging / "adapter").is_dir():
            (staging / "adapter").rename(whole / "adapter")
        if out.exists():
            out.rmdir()  # empty, checked above
        whole.rename(out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out / "adapter" if written.name == "adapter" else out
