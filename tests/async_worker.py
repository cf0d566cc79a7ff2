"""Run by tests/test_async_grpo.py under ``torchrun``: asynchronous GRPO (``--max-staleness 1``) on two
training processes, recording after every weight sync what each rank holds: its weights' digest (plain data
parallelism), or under ``--fsdp`` whether rank 0's rollout copy equals the whole sharded model."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

from muarl.train import orchestrator
from muarl.train.distributed import params_digest
from muarl.train.grpo import train_grpo
from muarl.train.grpo_config import preset

out, fsdp = Path(sys.argv[1]), sys.argv[2] == "fsdp"
rank = int(os.environ["RANK"])
unwrapped_sync = orchestrator.Streamed.sync


def recorded_sync(self: orchestrator.Streamed, model) -> float:
    """The source's own sync, then what this rank holds after it (a line per sync)."""
    seconds = unwrapped_sync(self, model)
    if fsdp:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        whole = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        record = {}
        if rank == 0:  # the copy rank 0's stream samples from, against the trainer's weights gathered
            copy = self.sampler.plain.state_dict()
            record = {"copy_equals_model": all(torch.equal(copy[k], v) for k, v in whole.items())}
        else:
            record = {"holds_copy": getattr(self.sampler, "plain", None) is not None}
    else:
        record = {"digest": params_digest(model)}
    with open(out / f"syncs_rank{rank}.jsonl", "a") as f:
        f.write(json.dumps(record) + "\n")
    return seconds


orchestrator.Streamed.sync = recorded_sync
out.mkdir(parents=True, exist_ok=True)
# a trainer slowed by 4 optimizer steps per batch, so the stream runs ahead and groups come in stale
train_grpo(preset("tiny", domain="train_fixtures:coin", out=str(out / "run"), steps=4, tasks_per_step=2,
                  group_size=4, max_new_tokens=12, max_turns=3, lr=1e-3, save_every=0, report_to="none",
                  max_staleness=1, num_iterations=4, fsdp=fsdp), progress=False)
