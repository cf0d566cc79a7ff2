"""Per-rank training state of a sharded run (``--fsdp``) against one unsharded process.

What each rank holds after one optimizer step, counted from the tensors themselves (a sharded parameter,
gradient or AdamW moment counts its local shard): parameters, gradients, optimizer state. One unsharded
process (what ``muarl sft`` / ``grpo`` run without ``--fsdp``) is the baseline; the sharded runs use
muarl's own sharding (:func:`muarl.train.sharding.shard`) on 1 and 2 ranks, full fine-tuning and LoRA
(rank 16, every linear layer). Models are random weights of real shapes (nothing is downloaded).

    python benchmarks/fsdp_memory.py                      # CPU, gloo: tiny and SmolLM2-135M's shape
    python benchmarks/fsdp_memory.py --device cuda --configs smollm2-size qwen3-0.6b   # GPUs, nccl

On the CPU two ranks share this machine's memory; the figures are what each rank holds, which is what
decides how large a model fits on each GPU. On CUDA the peak allocated memory of each rank is shown too.
The last line is the full fine-tuning ratio of the largest configuration.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).parent))
from grpo_step import sized_model  # noqa: E402  (a sibling script, not a package)
from muarl.train.distributed import Dist  # noqa: E402
from muarl.train.sharding import decoder, shard  # noqa: E402

LORA_RANK = 16


def local_bytes(tensor: torch.Tensor | None) -> int:
    """Bytes this rank holds of ``tensor`` (its shard when sharded)."""
    if tensor is None:
        return 0
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return local.numel() * local.element_size()


def training_state(model: Any, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Bytes of parameters, gradients and optimizer state this rank holds."""
    params = list(model.parameters())
    state = sum(local_bytes(v) for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)
                and v.dim() > 0)
    return {"params": sum(local_bytes(p) for p in params), "grads": sum(local_bytes(p.grad) for p in params),
            "optimizer": state}


def one_step(config: str, lora: bool, device: torch.device, dist: Dist | None) -> dict[str, int]:
    """Build the model, shard it (``dist``) or not, take one AdamW step on a short sequence, count."""
    torch.manual_seed(0)
    model = sized_model(config, str(device))
    if lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=LORA_RANK, lora_alpha=32, target_modules="all-linear",
                                                 task_type="CAUSAL_LM"))
    if dist is not None:
        shard(model, dist, bf16=device.type == "cuda")
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    lm = model.get_base_model() if lora else model
    ids = torch.randint(1, 1000, (1, 32), device=device)
    hidden = decoder(lm)(input_ids=ids).last_hidden_state
    lm.get_output_embeddings()(hidden[0]).float().logsumexp(-1).mean().backward()
    optimizer.step()
    counted = training_state(model, optimizer)
    if device.type == "cuda":
        counted["peak"] = torch.cuda.max_memory_allocated(device)
    return counted


def _worker(rank: int, world: int, port: int, config: str, lora: bool, device_type: str, out: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    device = torch.device(device_type, rank) if device_type == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    torch.distributed.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=rank, world_size=world)
    try:
        counted = one_step(config, lora, device, Dist(rank, world, device))
        out.put((rank, counted))
    finally:
        torch.distributed.destroy_process_group()


def sharded(config: str, lora: bool, world: int, device_type: str) -> list[dict[str, int]]:
    """Every rank's counts of a ``world``-rank sharded step, in rank order."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    context = mp.get_context("spawn")
    queue = context.Queue()
    mp.start_processes(_worker, args=(world, port, config, lora, device_type, queue), nprocs=world, join=True,
                       start_method="spawn")
    results = dict(queue.get() for _ in range(world))
    return [results[r] for r in range(world)]


def mib(n: int) -> str:
    return f"{n / 2 ** 20:,.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", nargs="+", default=["tiny", "smollm2-size"],
                        help="model shapes: tiny, smollm2-size, qwen3-0.6b (benchmarks/grpo_step.py)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--ranks", type=int, default=2, help="ranks of the sharded run (default 2)")
    args = parser.parse_args()
    if args.device == "cuda" and torch.cuda.device_count() < args.ranks:
        sys.exit(f"fsdp_memory: --device cuda needs {args.ranks} GPUs, this machine has {torch.cuda.device_count()}")
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    print(f"per-rank training state after one AdamW step (MiB; {args.device}, torch {torch.__version__})")
    print(f"{'config':<14}{'mode':<6}{'run':<14}{'params':>10}{'grads':>10}{'optim':>10}{'total':>10}{'vs 1':>7}"
          + (f"{'peak':>10}" if args.device == "cuda" else ""))
    ratio = None
    for config in args.configs:
        for lora in (False, True):
            mode = "lora" if lora else "full"
            base = one_step(config, lora, device, None)
            if device.type == "cuda":
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats(device)
            rows = [("unsharded", base)]
            for world in sorted({1, args.ranks}):
                ranks = sharded(config, lora, world, args.device)
                worst = max(ranks, key=lambda r: r["params"] + r["grads"] + r["optimizer"])
                rows.append((f"fsdp {world} rank{'s' if world > 1 else ''}", worst))
            total0 = sum(base[k] for k in ("params", "grads", "optimizer"))
            for name, counted in rows:
                total = sum(counted[k] for k in ("params", "grads", "optimizer"))
                print(f"{config:<14}{mode:<6}{name:<14}{mib(counted['params']):>10}{mib(counted['grads']):>10}"
                      f"{mib(counted['optimizer']):>10}{mib(total):>10}{total / total0:>6.2f}x"
                      + (f"{mib(counted['peak']):>10}" if "peak" in counted else ""))
                if not lora and name.startswith(f"fsdp {args.ranks} "):
                    ratio = total / total0
    print(f"per-rank training state, {args.ranks} ranks vs 1: {ratio:.2f}x")


if __name__ == "__main__":
    main()
