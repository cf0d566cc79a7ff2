"""Digests of a short synchronous GRPO run, kept in ``tests/lockstep_n0.json`` so that today's run at
``--max-staleness 0`` is checked against the code path that ran before the stream existed, not against
itself (issue 43, item 2).

What a digest holds: per step, one SHA-256 per episode of its token ids, loss mask and reward (exact: the
same tokens or not); of the final weights, each tensor's sum and L2 norm in float64, compared within
:func:`weight_bounds` (another CPU's float32 kernels round differently, so the weights' last bits may
differ; a bound relative to the sum itself does not hold: a tensor whose entries cancel has a sum near 0).

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


#: float32's relative spacing: storing a weight rounds it by at most this times its size
EPS32 = 2.0 ** -23
#: float64's unit roundoff: the digests' sums and norms are taken in float64
EPS64 = 2.0 ** -53
#: the share of the run's movement another machine's rounding may shift a digest by (see weight_bounds)
MOVED = 1e-3


def weight_bounds(out: Path) -> dict[str, tuple[float, float]]:
    """Per floating-point tensor of the run in ``out``: how far another machine's sum and norm may be from
    this machine's, derived from the tensor (its start ``w0``, the shipped base, and its final ``w``).

    Only the movement ``d = w - w0`` can differ between machines (every machine reads the same start
    file), so an error in ``d``'s elements moves the sum by at most ``sum|e|`` and the norm by at most
    ``||e||``, whatever the tensor's own sum is. Three terms, per statistic:

    - ``MOVED`` of the movement, ``1e-3 * sum|d|`` (norm: ``1e-3 * ||d||``): the kernels' float32 rounding
      reaches ``d`` through two AdamW steps, and AdamW's first step divides each gradient by its own size,
      so noise on a near-zero gradient can turn an element's step of +lr into -lr (docs/training.md); 1e-3
      allows that for 1 in 2000 elements. Seen: at most 4e-6 of the movement (the old bound, 1e-5 of each
      sum, missed by 1.54e-5 on another machine: at most 1.8e-5 of the movement for a layer's matrix, 1.1e-4
      for the embedding); a
      change to training (lr 1% higher, a step fewer, no weight decay, clip 0.5) moves some digest by 45
      to 130 times this bound, the last update alone skipped or 10% larger (the same episodes) by 127 and
      10 times (1% larger: 1.01 times, the edge of what it sees).
    - storing ``w`` in float32: one unit in the last place per element, ``EPS32 * sum|w|``
      (``EPS32 * ||w||``);
    - the float64 sum itself: ``n * EPS64 * sum|w|`` (``n * EPS64 * ||w||``), n the tensor's size.
    """
    import torch
    from safetensors.torch import load_file

    from muarl.models import resolve

    start = load_file(resolve("tiny") / "model.safetensors")
    bounds = {}
    for name, w in sorted(load_file(out / "model" / "model.safetensors").items()):
        if not torch.is_floating_point(w):
            continue
        w = w.double()
        d = w - start[name].double()
        n = w.numel()
        bounds[name] = (MOVED * d.abs().sum().item() + (EPS32 + n * EPS64) * w.abs().sum().item(),
                        MOVED * d.norm().item() + (EPS32 + n * EPS64) * w.norm().item())
    return bounds


def weight_mismatches(got: dict[str, Any], want: dict[str, Any],
                      bounds: dict[str, tuple[float, float]]) -> list[str]:
    """The digests of ``got["weights"]`` that are further from ``want["weights"]`` than ``bounds`` allow,
    each as one line (empty: the weights match)."""
    if got["weights"].keys() != want["weights"].keys():
        return [f"tensors differ: {sorted(got['weights'].keys() ^ want['weights'].keys())}"]
    out = []
    for name, stats in want["weights"].items():
        for what, g, w, bound in zip(("sum", "norm"), got["weights"][name], stats, bounds[name], strict=True):
            if not abs(g - w) <= bound:
                out.append(f"{name} {what}: {g!r} vs recorded {w!r}, off by {abs(g - w):.3g} "
                           f"> bound {bound:.3g}")
    return out


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
