"""Sharded training (``--fsdp``, torch FSDP2 over gloo on the CPU): two ranks take the steps one unsharded
process takes, and a sharded run's checkpoints resume exactly, on another number of ranks too.

Every run here goes through the command line (``python -m muarl`` for one process, ``accelerate launch
--module muarl`` for two), on the embedded tiny model and the coin domain of tests/train_fixtures.py,
whose groups disagree so that every update is real. Plain SGD (``--optimizer sgd``): a step is the
gradient times the learning rate, so runs compare within float32 summation noise (AdamW's first step
divides a near-zero gradient by itself; see ``train_fixtures.assert_same_step`` for the bound).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from train_fixtures import assert_same_step, write_sft_data

TESTS = Path(__file__).parent
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
       "OMP_NUM_THREADS": "1"}
GRPO = ["grpo", "--model", "tiny", "--domain", "train_fixtures:coin", "--tasks-per-step", "3", "--group-size", "4",
        "--max-new-tokens", "12", "--max-turns", "3", "--lr", "0.05", "--kl-beta", "0.1", "--micro-batch-size", "3",
        "--save-every", "1", "--keep-checkpoints", "0", "--report-to", "none", "--optimizer", "sgd", "--no-progress"]
SFT = ["sft", "--model", "tiny", "--epochs", "2", "--batch-size", "3", "--max-len", "8192", "--lr", "0.1",
       "--save-every", "1", "--keep-checkpoints", "0", "--report-to", "none", "--optimizer", "sgd", "--no-progress"]


def _command(ranks: int, args: list[str]) -> list[str]:
    if ranks == 1:
        return [sys.executable, "-m", "muarl", *args]
    # --multi_gpu on a machine without CUDA: accelerate starts the processes and they join over gloo
    return [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(ranks),
            "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--module", "muarl", *args]


def _muarl(ranks: int, *args: str) -> subprocess.CompletedProcess:
    done = subprocess.run(_command(ranks, list(args)), env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def _metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _weights(out: Path) -> dict:
    return load_file(out / "model" / "model.safetensors")


def _start(model: str = "tiny") -> dict:
    from muarl.models import load

    return load(model)[0].state_dict()


def _untied(directory: Path) -> str:
    """The tiny model with its output head untied from its embeddings (Qwen3-8B and up are untied), in
    ``directory``: the head starts as a copy of the embeddings, a parameter of its own, so a sharded run has
    embeddings and head as units of their own (``muarl.train.sharding.shard``)."""
    import torch

    from muarl.models import load

    model, tokenizer = load("tiny")
    model.config.tie_word_embeddings = False
    model.get_output_embeddings().weight = torch.nn.Parameter(model.get_input_embeddings().weight.detach().clone())
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return str(directory)


def _same_metrics(one: list[dict], two: list[dict], keys: tuple[str, ...]) -> None:
    """Step by step equal: counts exactly (the same episodes were sampled), float sums up to summation
    order. 1e-4 relative: weights that differ in their last float32 bits after a few steps move a token's
    log-prob by about 1e-6 (logits of a few units, 24-bit mantissas), and a KL summed from such log-prob
    differences by that relative to itself; a gradient that lost a rank's share differs by tens of
    percent. An absolute 1e-6 for a loss whose advantages cancel to about 0."""
    assert [m["step"] for m in one] == [m["step"] for m in two]
    for a, b in zip(one, two, strict=True):
        for key in keys:
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), (a["step"], key, a[key], b[key])


@pytest.mark.slow
@pytest.mark.parametrize("lora", [0, 4], ids=["full-untied", "lora"])
def test_two_sharded_ranks_take_the_steps_of_one_unsharded_process(tmp_path, lora):
    """SFT and GRPO (with its KL term, so the sharded reference is used) on two sharded ranks against one
    unsharded process: the same losses, gradient norms and weights; each rank wrote its own shard file; the
    rollout engine samples from the updated shards (mismatch_kl at float noise). Full fine-tuning runs on
    the tiny model untied (embeddings and head sharded as units of their own), LoRA on it tied (one root
    unit), as the other sharded tests do."""
    data = write_sft_data(tmp_path / "sft.jsonl")
    model = "tiny" if lora else _untied(tmp_path / "untied")
    extra = ["--lora-r", str(lora)] if lora else []
    for ranks, fsdp in ((1, []), (2, ["--fsdp"])):
        _muarl(ranks, *SFT, "--model", model, "--data", str(data), "--out", str(tmp_path / f"sft{ranks}"), *extra,
               *fsdp)
        _muarl(ranks, *GRPO, "--model", model, "--steps", "2", "--out", str(tmp_path / f"grpo{ranks}"), *extra,
               *fsdp)
    _same_metrics(_metrics(tmp_path / "sft1"), _metrics(tmp_path / "sft2"), ("loss", "grad_norm", "target_tokens"))
    grpo1, grpo2 = _metrics(tmp_path / "grpo1"), _metrics(tmp_path / "grpo2")
    _same_metrics(grpo1, grpo2, ("reward", "trained_sequences", "loss", "kl", "grad_norm", "entropy", "clip_fraction"))
    assert all(m["grad_norm"] > 0 and m["trained_sequences"] > 0 for m in grpo2)
    assert all(m["mismatch_kl"] < 1e-6 for m in grpo2)  # the engine's copy followed the shards
    start = _start(model)
    for run in ("sft", "grpo"):
        assert_same_step(start, _weights(tmp_path / f"{run}1"), _weights(tmp_path / f"{run}2"))
        shards = tmp_path / f"{run}2" / "checkpoints" / "step_1" / "shards"
        assert sorted(p.name for p in shards.glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    if lora:  # the adapter is what was trained and saved; OUT/model is the merge
        one = load_file(tmp_path / "grpo1" / "adapter" / "adapter_model.safetensors")
        two = load_file(tmp_path / "grpo2" / "adapter" / "adapter_model.safetensors")
        assert one.keys() == two.keys() and all(k.endswith(("lora_A.weight", "lora_B.weight")) for k in one)
    _exports_equal_the_run(tmp_path, start, lora)


def _exports_equal_the_run(tmp_path: Path, start: dict, lora: int) -> None:
    """``muarl export``, one process, no launcher: the two-rank run's last step equals the run's own result
    exactly and (full fine-tuning) its sharded step 1 equals the unsharded run's step-1 checkpoint, the
    model both held then; the export loads as ``hf:``. A LoRA run exports its adapter and the merge."""
    from muarl.models import load

    for step in (1, 2):
        _muarl(1, "export", str(tmp_path / "grpo2" / "checkpoints" / f"step_{step}"), "--out",
               str(tmp_path / f"export{step}"))
    if lora:
        adapter = "adapter/adapter_model.safetensors"
        last, run = load_file(tmp_path / "export2" / adapter), load_file(tmp_path / "grpo2" / adapter)
        assert last.keys() == run.keys() and all((last[k] == run[k]).all() for k in run)
        first = load_file(tmp_path / "export1" / adapter)  # a step of its own, not the last one again
        assert first.keys() == run.keys() and any((first[k] != run[k]).any() for k in run)
    else:
        held = load_file(tmp_path / "grpo1" / "checkpoints" / "step_1" / "model" / "model.safetensors")
        assert_same_step(start, held, load_file(tmp_path / "export1" / "model.safetensors"))
        last, run = load_file(tmp_path / "export2" / "model.safetensors"), _weights(tmp_path / "grpo2")
        assert last.keys() == run.keys() and all((last[k] == run[k]).all() for k in run)
    model, _ = load(tmp_path / "export1")
    assert sum(p.numel() for p in model.parameters()) > 0


@pytest.mark.slow
def test_a_killed_sharded_run_resumes_on_one_rank_as_if_never_stopped(tmp_path):
    """A two-rank GRPO run killed with SIGKILL once it has two checkpoints, whose newest checkpoint is then
    damaged (rank 1's shard file cut short): rerun on one rank, it sets the damaged one aside, resumes from
    the one before and ends with the metrics and weights of an uninterrupted two-rank run."""
    steps = ["--steps", "5"]
    _muarl(2, *GRPO, *steps, "--fsdp", "--out", str(tmp_path / "whole"))
    out = tmp_path / "killed"
    run = subprocess.Popen(_command(2, [*GRPO, *steps, "--fsdp", "--out", str(out)]), env=ENV,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while not (out / "checkpoints" / "step_2").exists() and run.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        # every process at once, as a lost machine would: the launcher and its workers (torchrun starts
        # each worker in a session of its own, so the launcher's process group does not hold them)
        subprocess.run(["pkill", "-KILL", "-f", str(out)], check=False)
    finally:
        run.wait()
    assert run.returncode == -signal.SIGKILL
    assert not (out / "model").exists()  # killed before the end
    newest = max((out / "checkpoints").glob("step_*"), key=lambda p: int(p.name.split("_")[1]))
    shard = newest / "shards" / "__1_0.distcp"
    shard.write_bytes(shard.read_bytes()[:100])
    resumed = _muarl(1, *GRPO, *steps, "--fsdp", "--out", str(out))
    warning = next((line for line in resumed.stderr.splitlines() if "is damaged" in line), resumed.stderr[-2000:])
    assert newest.name in warning and "shards/__1_0.distcp" in warning, warning
    _same_metrics(_metrics(tmp_path / "whole"), _metrics(out), ("reward", "trained_sequences", "loss", "kl", "grad_norm"))
    assert_same_step(_start(), _weights(tmp_path / "whole"), _weights(out))


@pytest.mark.slow
def test_a_one_rank_sharded_sft_checkpoint_resumes_on_two_ranks(tmp_path):
    """1 -> 2 ranks: SFT saved by one sharded process, its last two checkpoints and result removed (a run
    stopped after step 2 of 4), resumed by two ranks, ends as the uninterrupted one-rank run."""
    data = write_sft_data(tmp_path / "sft.jsonl")
    for name in ("whole", "cut"):
        _muarl(1, *SFT, "--fsdp", "--data", str(data), "--out", str(tmp_path / name))
    cut = tmp_path / "cut"
    for path in (cut / "checkpoints" / "step_3", cut / "checkpoints" / "step_4", cut / "model"):
        subprocess.run(["rm", "-r", str(path)], check=True)
    _muarl(2, *SFT, "--fsdp", "--data", str(data), "--out", str(cut))
    _same_metrics(_metrics(tmp_path / "whole"), _metrics(cut), ("loss", "grad_norm"))
    assert_same_step(_start(), _weights(tmp_path / "whole"), _weights(cut))


def test_sharding_options_that_cannot_apply_are_refused_in_one_line(tmp_path):
    """--fsdp-offload without --fsdp, pretrain with --fsdp, and resuming a sharded run unsharded."""
    data = write_sft_data(tmp_path / "sft.jsonl")
    cases = [
        (["sft", "--data", str(data), "--out", str(tmp_path / "a"), "--fsdp-offload"], "needs --fsdp"),
        (["pretrain", "--out", str(tmp_path / "b"), "--fsdp"], "options of sft and grpo"),
    ]
    for args, words in cases:
        done = subprocess.run(_command(1, args), env=ENV, capture_output=True, text=True, timeout=120)
        assert done.returncode == 2 and words in done.stderr, done.stderr[-2000:]
        assert done.stderr.count("\n") == 1 and done.stderr.startswith("muarl: error:")
    out = tmp_path / "sharded"
    _muarl(1, *SFT, "--fsdp", "--epochs", "1", "--data", str(data), "--out", str(out))
    done = subprocess.run(_command(1, [*SFT, "--epochs", "2", "--data", str(data), "--out", str(out)]), env=ENV,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "fsdp: True -> False" in done.stderr, done.stderr[-2000:]


def _two_nodes(args: list[str], cwds: tuple[Path, Path]) -> list[subprocess.CompletedProcess]:
    """One process per "node", two nodes on this machine: torchrun --nnodes 2 with a static rendezvous on
    127.0.0.1, each launcher from its own working directory."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    nodes = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node", "1",
                               "--node_rank", str(rank), "--master_addr", "127.0.0.1", "--master_port", str(port),
                               "-m", "muarl", *args], cwd=cwd, env=ENV, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
             for rank, cwd in enumerate(cwds)]
    done = []
    for node in nodes:
        out, err = node.communicate(timeout=300)
        done.append(subprocess.CompletedProcess(node.args, node.returncode, out, err))
    return done


@pytest.mark.slow
def test_a_two_node_launch_takes_the_one_process_step_and_needs_a_shared_out(tmp_path):
    """Two nodes of one process each (torchrun --nnodes 2 on 127.0.0.1), sharded: the GRPO steps of one
    unsharded process (metrics and weights). With --out relative and each node launched from its own
    directory, the second node cannot see the first's output directory: refused on both in one line that
    names rank 1, before anything is loaded."""
    steps = ["--steps", "2"]
    _muarl(1, *GRPO, *steps, "--out", str(tmp_path / "one"))
    done = _two_nodes([*GRPO, *steps, "--fsdp", "--out", str(tmp_path / "nodes")], (tmp_path, tmp_path))
    assert all(d.returncode == 0 for d in done), [d.stderr[-2000:] for d in done]
    _same_metrics(_metrics(tmp_path / "one"), _metrics(tmp_path / "nodes"),
                  ("reward", "trained_sequences", "loss", "kl", "grad_norm", "entropy"))
    assert_same_step(_start(), _weights(tmp_path / "one"), _weights(tmp_path / "nodes"))

    apart = (tmp_path / "node0", tmp_path / "node1")
    for cwd in apart:
        cwd.mkdir()
    done = _two_nodes([*GRPO, *steps, "--fsdp", "--out", "runs/x"], apart)
    assert all(d.returncode != 0 for d in done)
    for d in done:
        said = [line for line in d.stderr.splitlines() if "cannot see --out" in line]
        assert said and "rank 1 on" in said[0] and "rank 0" in said[0], d.stderr[-2000:]
    assert not list((apart[0] / "runs" / "x").glob("checkpoints/*"))
