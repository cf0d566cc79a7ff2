"""Two processes on the CPU (gloo) through ``accelerate launch``: identical weights on every rank. (Two
processes against vLLM rollout servers need real servers: tests/test_vllm.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

from train_fixtures import assert_same_step, write_sft_data

TESTS = Path(__file__).parent


@pytest.mark.slow
def test_two_processes_keep_identical_weights_and_match_one_process(tmp_path):
    from dist_worker import sft_config
    from muarl.models import load
    from muarl.train.sft import train_sft

    data = write_sft_data(tmp_path / "sft.jsonl")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    # --multi_gpu on a machine without CUDA: accelerate starts the processes and they join over gloo
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
           str(TESTS / "dist_worker.py"), str(tmp_path / "run"), str(data)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    digests = [json.loads((tmp_path / "run" / f"digest_rank{r}.json").read_text()) for r in (0, 1)]
    assert digests[0]["world"] == digests[1]["world"] == "2"
    assert digests[0]["sft"] == digests[1]["sft"] and digests[0]["grpo"] == digests[1]["grpo"]
    # only rank 0 wrote: one line per step, and each step's rollout file holds both ranks' groups
    metrics = [json.loads(line) for line in (tmp_path / "run" / "grpo" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2] and all(m["trained_sequences"] == 8 for m in metrics)
    rollouts = (tmp_path / "run" / "grpo" / "rollouts" / "step_000002.jsonl").read_text().splitlines()
    assert sorted(json.loads(r)["metadata"]["group"] for r in rollouts) == [0] * 4 + [1] * 4
    # SFT split over two processes takes the same step as one process, up to float summation order
    single = train_sft(sft_config(tmp_path / "single", str(data)), progress=False)
    two = load_file(tmp_path / "run" / "sft" / "model" / "model.safetensors")
    one = {k: v for k, v in single["model"].state_dict().items() if k in two}
    start = load("tiny")[0].state_dict()
    assert one.keys() == two.keys()
    assert_same_step(start, one, two)
    two_lines = (tmp_path / "run" / "sft" / "metrics.jsonl").read_text().splitlines()
    one_lines = (tmp_path / "single" / "sft" / "metrics.jsonl").read_text().splitlines()
    assert len(two_lines) == len(one_lines) == 1
    assert json.loads(two_lines[0])["loss"] == pytest.approx(json.loads(one_lines[0])["loss"], rel=1e-5)


def test_offload_on_gpus_gets_a_cpu_backend_beside_nccl():
    """--fsdp-offload on GPUs clips gradients and gathers on CPU tensors: the group carries them over gloo
    beside NCCL (an NCCL-only group raises on them, pytorch#148532); without offload NCCL alone, on the CPU
    gloo alone."""
    from muarl.train.distributed import backend

    assert backend("cuda", offload=True) == "cpu:gloo,cuda:nccl"
    assert backend("cuda", offload=False) == "nccl"
    assert backend("cpu", offload=True) == backend("cpu") == "gloo"
