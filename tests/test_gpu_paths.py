"""Issue 56: GPU paths a CPU can check. The forwards compute on the run's device, not the parameters'
(``--fsdp-offload`` keeps the parameters on the CPU while FSDP gathers them onto the GPU); the process group
waits longer than NCCL's 10 minutes; one embedded user server per node, on a device chosen for it."""

from __future__ import annotations

import contextlib
import copy
import json
import os
import random
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest
import torch

from muarl.algorithms import get_algorithm
from muarl.models import causal_lm, load
from muarl.train.distributed import Dist
from muarl.train.grpo_config import GRPOConfig

TESTS = Path(__file__).parent


class ReportsCuda(torch.nn.Parameter):
    """A parameter that says it is on the GPU while its data, and the forwards, are on the CPU: the
    parameters' device is not the one the forwards compute on, as under ``--fsdp-offload`` (there the
    other way round: the shards say CPU, the forwards run on the GPU). Code that reads the parameters'
    device sends tensors to CUDA, which this machine does not have, and fails."""

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return torch.device("cuda")


def _misplaced(model):
    """``model`` with its first parameter (the embeddings, tied to the head) a :class:`ReportsCuda`."""
    lm = causal_lm(model)
    embeddings, head = lm.get_input_embeddings(), lm.get_output_embeddings()
    tied = head.weight is embeddings.weight
    embeddings.weight = ReportsCuda(embeddings.weight.data)
    if tied:
        head.weight = embeddings.weight
    assert next(lm.parameters()).device.type == "cuda"
    return model


@dataclass
class Seq:
    token_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]


def _batch(vocab: int) -> list[tuple[Seq, float]]:
    rng = random.Random(0)
    seqs = []
    for n in (30, 22, 41):
        ids = [rng.randrange(vocab) for _ in range(n)]
        seqs.append(Seq(ids, [0] * 8 + [1] * (n - 8), [-1.0] * n))
    return list(zip(seqs, (1.0, -0.5, 0.5), strict=True))


def _recorder(monkeypatch, module, seen: list[str]) -> None:
    """Record the device every call of ``module``'s ``autocast`` is given."""
    from muarl.train.precision import autocast

    def recording(bf16, device):
        seen.append(torch.device(device).type)
        return autocast(bf16, device)

    monkeypatch.setattr(module, "autocast", recording)


def test_the_update_and_the_reference_compute_on_the_runs_device_not_the_parameters(monkeypatch):
    """A GRPO update (with the reference's log-probs, activation checkpointing by need and autocast) and an
    SFT step on a model whose parameters report another device than the run's put their inputs, autocast
    and checkpointing decision on the run's device (``Dist.device``), and compute what the plain model
    does."""
    from muarl.train import grpo_update, scoring
    from muarl.train.data import Example
    from muarl.train.grpo_update import policy_update
    from muarl.train.sft import accumulate_gradients

    plain = load("tiny")[0]
    vocab = causal_lm(plain).config.vocab_size
    batch = _batch(vocab)
    config = GRPOConfig(kl_beta=0.1, grad_clip=1e9, shared_prefix=False, micro_batch_size=2)

    def update(model, reference, dist):
        optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.0)
        stats, _, _ = policy_update(model, reference, optimizer, get_algorithm("grpo", kl_beta=0.1), batch, config,
                                    dist)
        return stats, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    expected_stats, expected_grads = update(copy.deepcopy(plain), copy.deepcopy(plain), None)
    seen: list[str] = []
    _recorder(monkeypatch, grpo_update, seen)
    _recorder(monkeypatch, scoring, seen)
    model, reference = _misplaced(copy.deepcopy(plain)), _misplaced(copy.deepcopy(plain))
    stats, grads = update(model, reference, Dist(device=torch.device("cpu")))
    assert seen == ["cpu", "cpu"], seen  # the update's, then the reference's
    assert stats["loss"] == pytest.approx(expected_stats["loss"], rel=1e-6)
    assert stats["kl"] == pytest.approx(expected_stats["kl"], rel=1e-6)
    assert grads.keys() == expected_grads.keys()
    for name, grad in grads.items():
        assert torch.allclose(grad, expected_grads[name], atol=1e-7), name

    examples = [Example(s.token_ids, s.loss_mask) for s, _ in batch]
    targets = sum(sum(e.mask[1:]) for e in examples)

    def sft_grads(model, dist):
        loss, _, _ = accumulate_gradients(model, examples, targets, 64, True, 0, contextlib.nullcontext(), dist)
        return loss, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    expected_loss, expected = sft_grads(copy.deepcopy(plain), None)
    loss, got = sft_grads(_misplaced(copy.deepcopy(plain)), Dist(device=torch.device("cpu")))
    assert loss == pytest.approx(expected_loss, rel=1e-6) and got.keys() == expected.keys()
    for name, grad in got.items():
        assert torch.allclose(grad, expected[name], atol=1e-7), name


def test_sft_autocasts_on_the_runs_device(monkeypatch, tmp_path):
    """``train_sft``'s autocast is made for the run's device (``setup``'s), not the parameters'."""
    from muarl.train import sft
    from train_fixtures import write_sft_data

    class Stop(Exception):
        pass

    seen: list[str] = []
    loaded = sft.load_trainable

    def misplaced_load(*args, **kwargs):
        model, reference, tokenizer = loaded(*args, **kwargs)
        return _misplaced(model), reference, tokenizer

    def recording(bf16, device):
        seen.append(torch.device(device).type)
        raise Stop

    monkeypatch.setattr(sft, "load_trainable", misplaced_load)
    monkeypatch.setattr(sft, "autocast", recording)
    data = write_sft_data(tmp_path / "sft.jsonl")
    with pytest.raises(Stop):
        sft.train_sft(sft.preset("tiny", data=[str(data)], out=str(tmp_path / "out"), device="cpu",
                                 report_to="none"), progress=False)
    assert seen == ["cpu"]


def test_the_group_timeout_is_two_hours_unless_the_environment_says(monkeypatch):
    """NCCL's default of 10 minutes is shorter than a step's rollouts on a real task: the group's default is
    two hours, ``MUARL_DIST_TIMEOUT`` seconds when set, a wrong value refused naming the variable."""
    from muarl.train.distributed import GROUP_TIMEOUT_ENV, group_timeout

    monkeypatch.delenv(GROUP_TIMEOUT_ENV, raising=False)
    assert group_timeout() == timedelta(hours=2)
    monkeypatch.setenv(GROUP_TIMEOUT_ENV, "90")
    assert group_timeout() == timedelta(seconds=90)
    for wrong in ("0", "-5", "soon"):
        monkeypatch.setenv(GROUP_TIMEOUT_ENV, wrong)
        with pytest.raises(ValueError, match=GROUP_TIMEOUT_ENV):
            group_timeout()


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                                                           "MASTER_ADDR", "MASTER_PORT", "MUARL_DIST_TIMEOUT")}
    return {**env, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
            "OMP_NUM_THREADS": "1", **extra}


@pytest.mark.slow
def test_the_process_group_waits_the_timeout_it_is_given(tmp_path):
    """A real group of two ranks (``torchrun``, gloo) joined by ``setup`` waits ``MUARL_DIST_TIMEOUT`` for a
    collective: rank 1 waiting at a barrier that rank 0 reaches late gives up after it (not after gloo's 30
    minutes or NCCL's 10), and the one-process group of a sharded run gets the two hours."""
    worker = str(TESTS / "group_timeout_worker.py")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", worker,
           str(tmp_path), "30"]
    done = subprocess.run(cmd, env=_env(MUARL_DIST_TIMEOUT="8"), capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["timeout"] for r in ranks] == [8.0, 8.0], ranks
    assert ranks[1]["outcome"] != "completed" and ranks[1]["waited"] < 25, ranks[1]
    alone = subprocess.run([sys.executable, worker, str(tmp_path / "alone"), "0"], env=_env(), capture_output=True,
                           text=True, timeout=120)
    assert alone.returncode == 0, alone.stderr[-3000:]
    assert json.loads((tmp_path / "alone" / "rank0.json").read_text())["timeout"] == 7200.0


def test_the_user_server_device_is_the_option_else_the_last_gpu(monkeypatch):
    """``MUARL_USER_DEVICE`` when set; else the node's last visible GPU; else the CPU. The server is started
    on it."""
    from muarl.users import embedded

    monkeypatch.delenv(embedded.DEVICE_ENV, raising=False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    assert embedded.server_device() == "cuda:7"
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert embedded.server_device() == "cuda:0"
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert embedded.server_device() == "cpu"
    monkeypatch.setenv(embedded.DEVICE_ENV, "cuda:3")
    assert embedded.server_device() == "cuda:3"
    command = embedded.server_command("llm", embedded.server_device())
    assert command[command.index("--device") + 1] == "cuda:3"


def _tiny_dir(path: Path) -> Path:
    model, tokenizer = load("tiny")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.mark.slow
def test_one_user_server_per_node_started_by_local_rank_0(tmp_path):
    """Two ranks of one node (``LOCAL_RANK`` 0 and 1 of a launch) entering ``user_server`` for the same
    ``llm:MODEL_DIR``: local rank 0 starts the one server, on ``MUARL_USER_DEVICE``; rank 1 starts none and
    plays against rank 0's (the same URL, which answers it)."""
    model = _tiny_dir(tmp_path / "user-model")
    launch = {"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
              "MASTER_PORT": str(20000 + os.getpid() % 20000), "MUARL_USER_DEVICE": "cpu"}
    worker = str(TESTS / "user_server_worker.py")
    procs = [subprocess.Popen([sys.executable, worker, f"llm:{model}", str(tmp_path / "run")],
                              env=_env(**launch, RANK=str(r), LOCAL_RANK=str(r)), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in (1, 0)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1][-2000:] for o in outs]
    ranks = {r: json.loads((tmp_path / "run" / f"worker{r}.json").read_text()) for r in (0, 1)}
    assert ranks[0]["started"] == [["cpu"]] and ranks[1]["started"] == [], ranks
    assert ranks[0]["endpoint"] == ranks[1]["endpoint"], ranks
    assert ranks[1]["models"] == ["user"], ranks
    assert not Path(ranks[0]["handoff"]).exists()  # removed with the server


def test_a_rank_that_is_not_local_rank_0_waits_for_the_nodes_server(monkeypatch, tmp_path):
    """Local rank 1 starts no server: it takes the endpoint local rank 0 left for this launch, refuses one
    left before it started (a killed launch's), and raises local rank 0's failure to start it."""
    from muarl.users import embedded

    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_PORT", str(40000 + os.getpid() % 20000))
    monkeypatch.setattr(embedded.subprocess, "Popen", lambda *a, **k: pytest.fail("local rank 1 started a server"))
    path = embedded._handoff("llm")
    try:
        embedded._leave(path, {"endpoint": "llm:http://127.0.0.1:9/v1#smollm2", "pid": os.getpid()})
        with embedded.user_server(["llm"], tmp_path) as endpoints:
            assert endpoints == ["llm:http://127.0.0.1:9/v1#smollm2"]
            assert embedded.resolve("llm") == endpoints[0]
        old = time.time() - 3600
        os.utime(path, (old, old))
        with pytest.raises(embedded.UserServerError, match="not ready within 1 s"):
            embedded._node_server("llm", timeout=1.0)
        embedded._leave(path, {"error": "--user llm: muarl's user server did not start"})
        with pytest.raises(embedded.UserServerError, match="did not start"), embedded.user_server(["llm"], tmp_path):
            pass
    finally:
        path.unlink(missing_ok=True)
