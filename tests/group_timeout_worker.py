"""Run by tests/test_gpu_paths.py: ``muarl.train.distributed.setup`` joins the group (two ranks under
``torchrun``, gloo; or one process's group, as a sharded run makes), each rank writes the timeout its group
waits for a collective; with two, rank 1 waits at a barrier that rank 0 reaches only after SLEEP seconds
(or once rank 1 gave up), and writes whether it gave up first. Usage: OUT SLEEP."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch

from muarl.train.distributed import setup

if __name__ == "__main__":
    out, sleep = Path(sys.argv[1]), float(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    dist = setup("cpu", group=True)
    group = torch.distributed.distributed_c10d._get_default_group()
    timeout = group._get_backend(torch.device("cpu")).options._timeout.total_seconds()
    began, outcome = time.monotonic(), "completed"
    if dist.world > 1:
        try:
            if dist.rank == 0:  # late: until rank 1 gave up, or SLEEP seconds
                while time.monotonic() - began < sleep and not (out / "rank1.json").exists():
                    time.sleep(0.1)
            if not (out / "rank1.json").exists():
                torch.distributed.barrier()
        except Exception as err:  # the timeout, on rank 1; on rank 0 whatever a barrier with a gone peer says
            outcome = f"{type(err).__name__}: {err}"[:500]
    (out / f"rank{dist.rank}.json").write_text(json.dumps(
        {"timeout": timeout, "outcome": outcome, "waited": time.monotonic() - began}))
    sys.stdout.flush()
    os._exit(0)  # no destroy_process_group: a peer may be gone
