"""``--rollout-engine vllm`` (an engine inside the training process) in a run of several training processes
(issue 56, item 3): refused in one line on every rank before any weights load, naming what to use instead
(vLLM servers, ``--rollout-engine vllm-server:URL#MODEL``). Checked with a real two-process torchrun on the
CPU (gloo), in the main environment (no vLLM: the refusal comes before the check that vLLM is installed)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from muarl.train.grpo_config import GRPOConfig
from muarl.train.samplers import check_in_process_engine

REFUSAL = "muarl: error: --rollout-engine vllm runs a vLLM engine inside the training process"


def test_the_check_refuses_an_in_process_engine_in_several_processes_only():
    check_in_process_engine(GRPOConfig(rollout_engine="vllm"), world=1)
    check_in_process_engine(GRPOConfig(), world=2)
    check_in_process_engine(GRPOConfig(rollout_engine="vllm-server:http://127.0.0.1:8000/v1#tiny"), world=2)
    with pytest.raises(ValueError, match="run of 2 training processes .* --rollout-engine vllm-server:URL#MODEL"):
        check_in_process_engine(GRPOConfig(rollout_engine="vllm"), world=2)


@pytest.mark.slow
def test_torchrun_with_an_in_process_engine_is_refused_on_every_rank_before_loading(tmp_path):
    """Two processes with ``--max-staleness 1``, where rank 0 alone would sample: rank 1 refuses too."""
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "muarl",
           "grpo", "--preset", "tiny", "--steps", "1", "--rollout-engine", "vllm", "--max-staleness", "1",
           "--out", str(out), "--no-progress"]
    done = subprocess.run(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode != 0
    refusals = [line for line in done.stderr.splitlines() if line.startswith(REFUSAL)]
    assert len(refusals) == 2, done.stderr[-3000:]  # one line from each rank
    assert all("--rollout-engine vllm-server:URL#MODEL" in line for line in refusals), refusals
    ranks = done.stderr.split("torch/distributed/elastic")[0]  # what the ranks wrote, before torchrun's report
    assert "Traceback" not in ranks and "Loading weights" not in done.stderr, ranks
    assert not out.exists()
