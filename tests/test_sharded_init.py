"""A sharded run's start-up and rollout copy (issue 39 items 1-2) on two ranks (gloo, the CPU): every rank
builds the model and the KL reference on meta and reads only its own rows of the checkpoint (loading the
checkpoint whole is refused there), and the engine's copy is gathered where it is needed: with servers only
rank 0 holds one and no rank all-gathers; muarl's engine's copy is released for the update and gathered
again at the sync. The checks themselves are in tests/sharded_init_worker.py. The memory this saves is
measured by benchmarks/fsdp_startup_memory.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from muarl.train.sharding import shard_rows

TESTS = Path(__file__).parent


def test_rows_follow_fsdp2_cut():
    """The rows each rank reads are the rows FSDP2 gives it (torch.chunk on dim 0), uneven counts included."""
    import torch

    for full in (1, 5, 7, 8, 151936):
        for world in (1, 2, 3, 4):
            chunks = torch.arange(full).chunk(world)
            for rank in range(world):
                start, end = shard_rows(full, rank, world)
                expected = chunks[rank].tolist() if rank < len(chunks) else []
                assert list(range(start, end)) == expected, (full, world, rank)


def test_copy_in_matches_fsdp2s_and_lends_a_whole_gradient_its_storage():
    """gloo_comms.copy_in lays gradients out as torch's ``_chunk_cat`` does (uneven rows padded with zeros,
    several gradients, a bfloat16 gradient into a float32 buffer) without its whole temporary; a single
    gradient already in the buffer's layout is not copied at all, the buffer takes its storage."""
    import torch

    from muarl.train.gloo_comms import copy_in

    torch.manual_seed(0)
    for shapes, dtype in (([(7, 4)], torch.float32), ([(2, 3), (7, 4), (9,)], torch.float32),
                          ([(1, 3), (5,)], torch.float32), ([(8, 5)], torch.bfloat16)):
        world = 3
        grads = [torch.randn(*shape).to(dtype) for shape in shapes]
        numel = sum(-(-shape[0] // world) * world * torch.Size(shape[1:]).numel() for shape in shapes)
        want, got = torch.full((numel,), 7.0), torch.full((numel,), 7.0)
        torch._chunk_cat(grads, 0, world, out=want.view(world, -1))
        copy_in(grads, got, world)
        assert torch.equal(got, want), (shapes, dtype)
    whole = torch.randn(6, 4)
    flat = torch.empty(24)
    copy_in([whole], flat, 3)
    assert flat.data_ptr() == whole.data_ptr() and torch.equal(flat, whole.reshape(-1))


@pytest.mark.slow
def test_two_ranks_start_without_a_whole_copy_and_gather_only_where_needed(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
           str(TESTS / "sharded_init_worker.py"), str(tmp_path)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    held = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert sum(h["held"] for h in held) == held[0]["total"]  # the two halves make the whole, once


@pytest.mark.slow
def test_gathers_fill_uneven_shards_in_any_dtype_and_untied_heads_are_units(tmp_path):
    """``gather_into`` on three ranks with rows that do not divide (one rank holding none), into float32 and
    bfloat16 copies, on every rank and on rank 0 alone; gloo's whole-buffer collectives are refused there.
    An untied model's embeddings and head are sharded as units of their own, a tied one's are not
    (tests/gather_worker.py)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "3",
           str(TESTS / "gather_worker.py")]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
