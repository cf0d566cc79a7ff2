"""Checkpoints that make a resumed run indistinguishable from one never interrupted.

``out/checkpoints/step_N/`` holds everything the next step depends on: the weights (the whole model as an
ordinary HF checkpoint, or only the LoRA adapter), the optimizer and scheduler states, every random
generator (Python, NumPy, torch CPU and CUDA; one file per process), the trainer's own position (the
step; the data order is a fixed function of the seed and the step) and the metrics so far.

A checkpoint is written into a hidden temporary directory and renamed into place, and a rename is
atomic: a run killed in the middle of a save leaves the previous checkpoint intact and a stray temporary
directory that the next start removes. A directory named ``step_N`` is therefore always complete.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from muarl.train.distributed import Dist

STEP_DIR = re.compile(r"^step_(\d+)$")


def checkpoints_dir(out: Path) -> Path:
    return Path(out) / "checkpoints"


def list_checkpoints(out: Path) -> list[tuple[int, Path]]:
    """Complete checkpoints of a run, oldest first, as (step, directory)."""
    root = checkpoints_dir(out)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := STEP_DIR.match(p.name))]
    return sorted(found)


def latest_checkpoint(out: Path) -> tuple[int, Path] | None:
    """The newest complete checkpoint, or None."""
    found = list_checkpoints(out)
    return found[-1] if found else None


def remove_partial(out: Path) -> None:
    """Delete temporary directories left by a save that was killed half-way."""
    root = checkpoints_dir(out)
    if root.is_dir():
        for p in root.iterdir():
            if p.name.startswith(".tmp-"):
                shutil.rmtree(p, ignore_errors=True)


def rng_state() -> dict[str, Any]:
    """Every random generator the training step may draw from."""
    state: dict[str, Any] = {"python": random.getstate(), "numpy": np.random.get_state(),
                             "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(out: Path, step: int, dist: Dist, write_weights: Callable[[Path], None],
                    state: dict[str, Any], keep: int = 0) -> Path | None:
    """Write ``out/checkpoints/step_{step}`` atomically; every rank calls this (each saves its RNG).

    ``write_weights(directory)`` saves the model (rank 0 only); ``state`` is the trainer state
    (optimizer, scheduler, step, metrics ...). ``keep`` > 0 deletes all but the newest ``keep``
    checkpoints afterwards. Returns the checkpoint directory on rank 0, None elsewhere.
    """
    root = checkpoints_dir(out)
    tmp = root / f".tmp-step_{step}"
    if dist.main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    dist.barrier()
    torch.save(rng_state(), tmp / f"rng_rank{dist.rank}.pt")
    if dist.main:
        write_weights(tmp)
        torch.save(state, tmp / "trainer_state.pt")
        metrics = state.get("metrics") or [None]
        summary = {"step": step, "world_size": dist.world, "last_metrics": metrics[-1]}
        (tmp / "state.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
    dist.barrier()
    if not dist.main:
        return None
    _fsync_tree(tmp)
    final = root / f"step_{step}"
    if final.exists():  # a fresh run (resume off) reaching a step an older run also saved
        old = root / f".tmp-old-step_{step}"
        shutil.rmtree(old, ignore_errors=True)
        final.rename(old)
        shutil.rmtree(old)
    tmp.rename(final)
    if keep > 0:
        for _, path in list_checkpoints(out)[:-keep]:
            shutil.rmtree(path, ignore_errors=True)
    return final


def load_trainer_state(path: Path, dist: Dist) -> dict[str, Any]:
    """The trainer state of a checkpoint, and this rank's random generators restored."""
    state = torch.load(path / "trainer_state.pt", map_location="cpu", weights_only=False)
    rng = path / f"rng_rank{dist.rank}.pt"
    if not rng.exists():
        saved = json.loads((path / "state.json").read_text()).get("world_size")
        raise ValueError(f"{path} was saved by {saved} process(es); resume it with the same number "
                         f"(this is rank {dist.rank} of {dist.world})")
    set_rng_state(torch.load(rng, weights_only=False))
    return state


def _fsync_tree(path: Path) -> None:
    """Flush the files of a directory to disk before it is renamed into place."""
    for p in path.rglob("*"):
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())
