"""Run by tests/test_distributed.py under ``accelerate launch``: SFT then GRPO, each rank dumps its weights' hash."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from muarl.train.distributed import params_digest
from muarl.train.grpo import train_grpo
from muarl.train.grpo_config import preset as grpo_preset
from muarl.train.sft import preset as sft_preset
from muarl.train.sft import train_sft


def sft_config(out: Path, data: str):
    # fresh_ids: each process renames only its own share of the batch, and the target count is summed.
    # Plain SGD without clipping: the step is lr times the gradient, so one and two processes compare
    # within float32 summation noise (and a wrongly scaled gradient shows; clipping would hide its scale);
    # AdamW's first step divides each gradient by its own size, which turns noise on a near-zero gradient
    # into a full step of lr (see tests/test_distributed.py)
    return sft_preset("tiny", data=[data], out=str(out / "sft"), epochs=1, batch_size=6, max_len=8192,
                      fresh_ids=True, save_every=0, report_to="none", optimizer="sgd", lr=0.05, grad_clip=1e9)


def grpo_config(out: Path):
    return grpo_preset("tiny", domain="train_fixtures:coin", out=str(out / "grpo"), steps=2, tasks_per_step=2,
                       group_size=4, max_new_tokens=12, max_turns=3, lr=1e-2, save_every=0, report_to="none")


if __name__ == "__main__":
    out, data = Path(sys.argv[1]), sys.argv[2]
    sft = train_sft(sft_config(out, data), progress=False)
    grpo = train_grpo(grpo_config(out), progress=False)
    rank = os.environ.get("RANK", "0")
    (out / f"digest_rank{rank}.json").write_text(json.dumps(
        {"sft": params_digest(sft["model"]), "grpo": params_digest(grpo["model"]), "world": os.environ.get("WORLD_SIZE"),
         "grpo_rollouts": grpo["metrics"][-1]["trained_sequences"]}))
