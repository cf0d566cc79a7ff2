"""Digests of a short synchronous GRPO run, kept in ``tests/lockstep_n0.json`` so that today's run at
``--max-staleness 0`` is checked against the code path that ran before the stream existed, not against
itself (issue 43, item 2).

What a digest holds: per step, one SHA-256 per episode of its token ids, loss mask and reward (exact: the
same tokens or not); of the final weights, each tensor's sum and L2 norm in float64 (compared with a
relative tolerance, since another CPU's kernels may round the last bits differently).

Remaking the fixture (only when a change is meant to alter the run, and say so in its commit)::

    PYTHONPATH=tests python tests/lockstep_digests.py OUT_DIR      # writes tests/lockstep_n0.json

The committed fixture was made at commit c81a824^ (before asynchronous GRPO: the trainer's own
synchronous loop, no stream, no orchestrator) from a worktree of that commit, with this file copied in.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

FIXTURE = Path(__file__).with_name("lockstep_n0.json")
#: the run recorded: the coin domain of tests/train_fixtures.py, where groups disagree and every update counts
SETTINGS = dict(domain="train_fixtures:coin", steps=2, tasks_per_step=2, group_size=4, max_new_tokens=12,
                max_turns=3, lr=1e-3, save_every=0, report_to="none")


def run_digests(out: Path) -> dict[str, Any]:
    """The digests of the run in ``out``: its rollouts and its final model."""
    import torch
    from safetensors.torch import load_file

    steps = {}
    for path in sorted((out / "rollouts").glob("step_*.jsonl")):
        episodes = [json.loads(line) for line in path.read_text().splitlines()]
        steps[str(int(path.stem.split("_")[1]))] = [
            hashlib.sha256(json.dumps([e["token_ids"], e["loss_mask"], e["reward"]["reward"]]).encode()).hexdigest()
            for e in episodes]
    weights = load_file(out / "model" / "model.safetensors")
    return {"rollouts": steps,
            "weights": {name: [t.double().sum().item(), t.double().norm().item()]
                        for name, t in sorted(weights.items()) if torch.is_floating_point(t)}}


def main(out: str) -> None:
    from muarl.train.grpo import train_grpo
    try:
        from muarl.train.grpo_config import preset
    except ImportError:  # before commit 96ba570 the presets lived in muarl.train.grpo
        from muarl.train.grpo import preset

    train_grpo(preset("tiny", out=out, **SETTINGS), progress=False)
    FIXTURE.write_text(json.dumps(run_digests(Path(out)), indent=1) + "\n")
    print(f"wrote {FIXTURE}")


if __name__ == "__main__":
    main(sys.argv[1])
