"""Checkpoints that make a resumed run indistinguishable from one never interrupted.

``out/checkpoints/step_N/`` holds everything the next step depends on: the weights (the whole model as an
ordinary HF checkpoint, or only the LoRA adapter), the optimizer and scheduler states, every random
generator (Python, NumPy, torch CPU and CUDA; one file per process), the trainer's own position (the
step; the data order is a fixed function of the seed and the step) and the metrics so far.

A checkpoint is written into a hidden temporary directory and renamed into place, and a rename is
atomic: a run killed in the middle of a save leaves the previous checkpoint intact and a stray temporary
directory that the next start removes. A directory named ``step_N`` is therefore complete when written;
its ``manifest.json`` (sizes and SHA-256 of every file, written last, see :mod:`muarl.train.manifest`)
lets a resume prove it is still intact: :func:`choose_resume` skips a damaged newest checkpoint, naming the
file, for the newest intact one, and stops with the reason when there is none.

A save that fails (a full disk above all) removes its temporary directory and leaves every earlier
checkpoint as it was; a full disk is reported as such (:class:`~muarl.train.diskspace.OutOfSpace`, naming
the folder and the free bytes). With ``keep`` > 0 the checkpoints the save will make redundant are deleted
*before* it when the free space would not hold another checkpoint, so a run that keeps one checkpoint
needs room for one, not two.
"""

from __future__ import annotations

import json
import random
import re
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from muarl.files import fsync_dir
from muarl.train.diskspace import OutOfSpace, free_bytes, out_of_space, size_text, tree_size
from muarl.train.distributed import Dist
from muarl.train.manifest import STATE_KEY, check_checkpoint, file_digests, listed_files, write_manifest

STEP_DIR = re.compile(r"^step_(\d+)$")
#: where a damaged checkpoint is moved on resume (out of the ``step_N`` names that resume and pruning see)
DAMAGED_PREFIX = "damaged-"


class NoIntactCheckpoint(ValueError):
    """Every checkpoint of a run is damaged: resuming would start from wrong state, starting over is the
    user's call. A ValueError, so the command line reports it in one line (exit status 2)."""


@dataclass
class ResumeChoice:
    """The checkpoint to resume from (None when the run has none) and the newer ones found damaged."""

    found: tuple[int, Path] | None
    damaged: list[tuple[Path, str]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


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


def choose_resume(out: Path) -> ResumeChoice:
    """The newest checkpoint whose files match its manifest, and every newer one with what is wrong with it.

    Reads only (every process may call it at once). Raises :class:`NoIntactCheckpoint`, naming each
    checkpoint's problem, when the run has checkpoints and none is intact.
    """
    choice = ResumeChoice(None)
    found = list_checkpoints(out)
    for step, path in reversed(found):
        verdict = check_checkpoint(path)
        if verdict.problem is None:
            choice.found = (step, path)
            choice.warnings += [verdict.warning] if verdict.warning else []
            return choice
        choice.damaged.append((path, verdict.problem))
    if found:
        detail = "; ".join(f"{p.name}: {problem}" for p, problem in choice.damaged)
        raise NoIntactCheckpoint(f"no intact checkpoint under {checkpoints_dir(out)} to resume from ({detail}); "
                                 "restore one, or start over with --no-resume (deletes them)")
    return choice


def set_aside(choice: ResumeChoice) -> None:
    """Move the damaged checkpoints out of the way (``damaged-step_N``), saying which file of each is wrong.

    Renamed, not deleted: they stay for inspection, but neither a later resume nor pruning sees them (left
    as ``step_N`` a damaged newer checkpoint would count among the ones ``keep`` retains). Rank 0 only.
    """
    for warning in choice.warnings:
        say(f"muarl: warning: {warning}")
    resumed = f"resuming from {choice.found[1].name}" if choice.found else "starting over"
    for path, problem in choice.damaged:
        target = path.with_name(DAMAGED_PREFIX + path.name)
        n = 1
        while target.exists():
            n += 1
            target = path.with_name(f"{DAMAGED_PREFIX}{path.name}.{n}")
        path.rename(target)
        say(f"muarl: warning: checkpoint {path} is damaged: {problem}; moved it to {target.name}, {resumed}")


def say(line: str) -> None:
    """One line on stderr: checkpoint trouble must be seen even when logging is not configured."""
    print(line, file=sys.stderr, flush=True)


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
                    state: dict[str, Any], keep: int = 0,
                    write_shards: Callable[[Path], None] | None = None) -> Path | None:
    """Write ``out/checkpoints/step_{step}`` atomically, its manifest last; every rank calls this (each
    saves its RNG).

    ``write_weights(directory)`` saves the model (rank 0 only); ``write_shards(directory)``, a sharded run's
    weights and optimizer state, runs on every rank (each writes its own shard files); ``state`` is the
    trainer state (optimizer, scheduler, step, metrics ...). ``keep`` > 0 deletes all but the newest ``keep``
    checkpoints afterwards, or the redundant ones beforehand when the disk is short of room for this save.
    A failed save removes what it wrote; a full disk raises :class:`OutOfSpace`. Returns the checkpoint
    directory on rank 0, None elsewhere.
    """
    root = checkpoints_dir(out)
    tmp = root / f".tmp-step_{step}"
    if dist.main:
        shutil.rmtree(tmp, ignore_errors=True)
        _make_room(out, step, keep)
        _saving(out, step, tmp, lambda: tmp.mkdir(parents=True))
    dist.barrier()
    _saving(out, step, tmp, lambda: torch.save(rng_state(), tmp / f"rng_rank{dist.rank}.pt"))
    if write_shards is not None:
        _saving(out, step, tmp, lambda: write_shards(tmp))
    if dist.main:
        def write() -> None:
            write_weights(tmp)
            torch.save(state, tmp / "trainer_state.pt")
            metrics = state.get("metrics") or [None]
            summary = {"step": step, "world_size": dist.world, "last_metrics": metrics[-1], STATE_KEY: True}
            (tmp / "state.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")

        _saving(out, step, tmp, write)
    dist.barrier()
    # each rank hashes the files it wrote (its shards: no rank reads the whole checkpoint back), rank 0 the rest
    mine = [rel for rel in listed_files(tmp) if writer(rel) == dist.rank]
    digests = dist.gather(file_digests(tmp, mine))
    if not dist.main:
        return None
    every = {rel: entry for part in digests for rel, entry in part.items()}
    _saving(out, step, tmp, lambda: write_manifest(tmp, every))  # last: its presence means every file is complete
    final = root / f"step_{step}"
    if final.exists():  # a fresh run (resume off) reaching a step an older run also saved
        old = root / f".tmp-old-step_{step}"
        shutil.rmtree(old, ignore_errors=True)
        final.rename(old)
        shutil.rmtree(old)
    tmp.rename(final)
    fsync_dir(root)
    if keep > 0:
        for _, path in list_checkpoints(out)[:-keep]:
            shutil.rmtree(path, ignore_errors=True)
    return final


def writer(rel: str) -> int:
    """The rank that wrote a checkpoint file (its path relative to the checkpoint): its random state
    (``rng_rank{R}.pt``) and its shard files (``shards/__{R}_{N}.distcp``, torch.distributed.checkpoint's
    names) are rank R's; the rest (weights, trainer state, the shards' metadata) rank 0's."""
    name = rel.rsplit("/", 1)[-1]
    found = re.fullmatch(r"rng_rank(\d+)\.pt", name) or re.fullmatch(r"__(\d+)_\d+\.distcp", name)
    return int(found.group(1)) if found else 0


def _saving(out: Path, step: int, tmp: Path, write: Callable[[], None]) -> None:
    """Run one part of a save; on failure remove the partial save and, for a full disk, say so."""
    try:
        write()
    except Exception as err:
        free = free_bytes(tmp)  # before the partial save is removed: what the failing write saw
        shutil.rmtree(tmp, ignore_errors=True)
        if not out_of_space(err, free):
            raise
        previous = latest_checkpoint(out)
        kept = f"the previous checkpoint {previous[1].name} is intact" if previous else "no earlier checkpoint"
        set_aside_bytes = sum(tree_size(p) for p in checkpoints_dir(out).glob(DAMAGED_PREFIX + "*"))
        aside = (f"; set-aside damaged checkpoints ({DAMAGED_PREFIX}*) hold {size_text(set_aside_bytes)}"
                 if set_aside_bytes else "")
        raise OutOfSpace(f"out of disk space saving checkpoint step_{step} in {checkpoints_dir(out)}: "
                         f"{size_text(free)} free there when the write failed "
                         f"({size_text(free_bytes(tmp))} after removing the partial save); {kept}{aside}. "
                         "Free some space, or keep fewer checkpoints (--keep-checkpoints), and rerun to "
                         f"resume ({type(err).__name__}: {str(err).strip()[:160]})") from err


def _make_room(out: Path, step: int, keep: int) -> None:
    """Delete, before a save, the checkpoints it will make redundant, when the disk could not hold it besides.

    The size of the newest checkpoint estimates the new one. With room enough nothing happens here (the
    old ones are pruned after the save, so a kill during the save still leaves ``keep`` of them).
    """
    found = [(s, p) for s, p in list_checkpoints(out) if s != step]
    redundant = found[:len(found) - (keep - 1)] if keep > 0 else []
    if not redundant:
        return
    need, free = tree_size(found[-1][1]), free_bytes(checkpoints_dir(out))
    if free >= need + need // 10:
        return
    for _, path in redundant:
        say(f"muarl: pruning checkpoint {path.name} before saving step_{step} to make room (--keep-checkpoints "
            f"{keep}; {size_text(free)} free in {checkpoints_dir(out)}, the newest checkpoint takes "
            f"{size_text(need)})")
        shutil.rmtree(path, ignore_errors=True)


def load_trainer_state(path: Path, dist: Dist, any_world: bool = False) -> dict[str, Any]:
    """The trainer state of a checkpoint, and this rank's random generators restored.

    ``any_world``: a sharded run's checkpoint, which resumes on another number of ranks too. A rank the
    saving run did not have takes rank 0's generators: muarl draws its samples from generators seeded by
    (seed, step, task), so these only matter to code that draws from the global ones."""
    state = torch.load(path / "trainer_state.pt", map_location="cpu", weights_only=False)
    rng = path / f"rng_rank{dist.rank}.pt"
    if not rng.exists() and any_world:
        rng = path / "rng_rank0.pt"
    if not rng.exists():
        saved = json.loads((path / "state.json").read_text()).get("world_size")
        raise ValueError(f"{path} was saved by {saved} process(es); resume it with the same number "
                         f"(this is rank {dist.rank} of {dist.world})")
    set_rng_state(torch.load(rng, weights_only=False))
    return state
