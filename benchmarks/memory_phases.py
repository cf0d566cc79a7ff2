"""Where a run's memory peaks: each process's resident memory sampled every 5 ms, the largest value kept per
phase, the phase named by wrapping muarl's functions (start-up, the rollout copy's gather, rollouts, the
reference's scoring, the update's backward, AdamW's step, the sync, saving). Any muarl command runs under
it, in one process or under torchrun; each process writes ``rank{RANK}.json`` (phase -> GiB, in the order
the phases began) into ``--into`` (default ``./memory-phases``), and rank 0 prints the table at the end.

    torchrun --standalone --nproc_per_node 4 benchmarks/memory_phases.py --into /tmp/phases -- \\
        grpo --model CHECKPOINT --domain retail-lite --fsdp --steps 1 ...

``benchmarks/fsdp_startup_memory.py`` gives the peak of the whole run; this says which phase makes it
(research/benchmarks.md, "Start-up and rollout copies of a sharded run").
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

PAGE = os.sysconf("SC_PAGE_SIZE")


class Phases:
    """The largest resident memory seen in each phase; phases nest (``update/backward``)."""

    def __init__(self) -> None:
        self.stack = ["run"]
        self.peaks: dict[str, float] = {}

    def sample(self) -> None:
        with open("/proc/self/statm") as statm:
            resident = int(statm.read().split()[1]) * PAGE / 2**30
        phase = "/".join(self.stack)
        self.peaks[phase] = max(self.peaks.get(phase, 0.0), resident)

    def watch(self, every_s: float = 0.005) -> None:
        def loop() -> None:
            while True:
                self.sample()
                time.sleep(every_s)
        threading.Thread(target=loop, daemon=True).start()

    def wrap(self, owner: Any, name: str, label: str) -> None:
        """Count the time inside ``owner.name`` as phase ``label``."""
        inner = getattr(owner, name)

        @functools.wraps(inner)
        def named(*args: Any, **kwargs: Any) -> Any:
            self.stack.append(label)
            self.sample()
            try:
                return inner(*args, **kwargs)
            finally:
                self.sample()
                self.stack.pop()

        setattr(owner, name, named)


def instrument(phases: Phases) -> None:
    import torch

    import muarl.train.grpo as grpo
    import muarl.train.grpo_update as update
    import muarl.train.orchestrator as orchestrator
    import muarl.train.samplers as samplers

    for owner, name, label in [
        (grpo, "load_sharded", "load"), (grpo, "open_rollouts", "open_rollouts"),
        (orchestrator.Lockstep, "next_step", "rollouts"), (samplers.CopySampler, "_gather", "gather"),
        (samplers.CopySampler, "release", "release"), (grpo, "update_on_rollouts", "update"),
        (update, "reference_logprobs", "reference"), (torch.Tensor, "backward", "backward"),
        (torch.optim.AdamW, "step", "optimizer_step"), (grpo, "save_step", "save"),
        (grpo, "save_result", "save_result"),
    ]:
        phases.wrap(owner, name, label)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--into", default="memory-phases", help="where each process writes rank{RANK}.json")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the muarl command and its options, after --")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("name the muarl command to run after --")
    phases = Phases()
    phases.watch()
    instrument(phases)
    from muarl.cli import main as muarl_main

    sys.argv = ["muarl", *command]
    try:
        code = muarl_main()
    finally:
        rank = int(os.environ.get("RANK", "0"))
        into = Path(args.into)
        into.mkdir(parents=True, exist_ok=True)
        (into / f"rank{rank}.json").write_text(json.dumps({k: round(v, 3) for k, v in phases.peaks.items()},
                                                          indent=1))
    if rank == 0:
        _print_table(into, int(os.environ.get("WORLD_SIZE", "1")))
    return code or 0


def _print_table(into: Path, world: int) -> None:
    time.sleep(1.0)  # the other ranks write theirs as they exit
    ranks = [json.loads(f.read_text()) for r in range(world) if (f := into / f"rank{r}.json").is_file()]
    names = list(dict.fromkeys(name for peaks in ranks for name in peaks))
    print(f"{'phase':40s} " + " ".join(f"rank {r:<3d}" for r in range(len(ranks))) + "  (peak resident GiB)")
    for name in names:
        print(f"{name:40s} " + " ".join(f"{peaks.get(name, 0.0):8.2f}" for peaks in ranks))


if __name__ == "__main__":
    sys.exit(main())
