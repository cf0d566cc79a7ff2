"""A full-weight sync into a vLLM server, in memory (``--vllm-weight-sync memory``: buckets broadcast over a
process group with the server's worker, :mod:`muarl.weight_sync.link`) against through a file
(``file``: safetensors written, then reloaded by the server), on the same server and weights, alternated.

A random-weight model of Qwen3-0.6B's widths with ``--layers`` layers (``fsdp_startup_memory.py``'s
checkpoint, tied as Qwen3-0.6B is) is saved once; a vLLM server (the CPU build, from
``scripts/install_vllm.sh``; ``--python`` names another environment's) is started on it with
:func:`~muarl.policies.vllm_server.server_command`'s flags; the trainer side (this process, which needs no
vLLM) loads the model, and each round perturbs it and syncs it by each way in turn; after each sync the
server's log-probs of a fixed text must equal the trainer's (else the benchmark stops: a fast wrong sync
measures nothing).

    python benchmarks/weight_sync.py                 # 4 layers (216M parameters, 0.87 GB in float32)
    python benchmarks/weight_sync.py --layers 8 --rounds 5

Last line: ``weight sync into a vLLM server, memory vs file: N.NNx (memory S s, B GB; file S s, B GB)``, the
median seconds per sync of each way and the bytes each moved (a file's: what was written and read back).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from fsdp_startup_memory import checkpoint  # noqa: E402  (a sibling script, not a package)


def _vllm_python() -> str:
    where = subprocess.run(["bash", "scripts/install_vllm.sh", "--where"], capture_output=True, text=True,
                           check=True, cwd=Path(__file__).resolve().parents[1]).stdout.strip()
    return str(Path(where) / "bin" / "python")


def launch(model: Path, python: str, log: Path) -> tuple[subprocess.Popen, str]:
    """A vLLM server on ``model`` started as muarl's tests start theirs; (process, URL) once healthy."""
    import httpx2

    from muarl.policies.vllm_server import server_command

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    argv, env = server_command(model, port=port, served_name="bench", python=python, cpu_build=not _has_cuda(python),
                               extra=["--max-model-len", "4096"])
    env = {**os.environ, **env, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"weight_sync: the vLLM server exited ({proc.returncode}); its log: {log}")
        try:
            if httpx2.get(f"{url}/health", timeout=2).status_code == 200:
                return proc, url
        except httpx2.HTTPError:
            pass
        time.sleep(1)
    os.killpg(proc.pid, 9)
    sys.exit(f"weight_sync: the vLLM server was not up after 600 s; its log: {log}")


def _has_cuda(python: str) -> bool:
    out = subprocess.run([python, "-c", "import torch; print(torch.cuda.is_available())"], capture_output=True,
                         text=True).stdout
    return "True" in out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3, help="syncs of each way (alternated)")
    parser.add_argument("--python", help="the vLLM environment's interpreter (default: scripts/install_vllm.sh's)")
    parser.add_argument("--dir", default=os.path.join(os.environ.get("TMPDIR", "/tmp"), "muarl-weight-sync"))
    args = parser.parse_args()

    import torch

    from muarl.models import load
    from muarl.policies.vllm_server import VLLMServerPolicy
    from muarl.weight_sync.servers import ServerSync

    root = Path(args.dir)
    model_dir = root / f"qwen3-{args.layers}l"
    count = checkpoint(model_dir, args.layers)
    print(f"model: {count / 1e6:.0f}M parameters, {model_dir}", flush=True)
    proc, url = launch(model_dir, args.python or _vllm_python(), root / "server.log")
    policies = {way: VLLMServerPolicy(url, "bench") for way in ("memory", "file")}
    syncs = {way: ServerSync([policy], lora=False, how=way, sync_dir=root / "sync") for way, policy in policies.items()}
    try:
        model, tokenizer = load(str(model_dir))
        ids = tokenizer("I would like to return the order I placed last week, please.")["input_ids"]
        seconds: dict[str, list[float]] = {"memory": [], "file": []}
        moved: dict[str, int] = {}
        for round_no in range(args.rounds):
            for way, policy in policies.items():
                torch.manual_seed(round_no)
                with torch.no_grad():
                    for p in model.parameters():
                        p.add_(1e-3 * torch.randn_like(p))
                began = time.perf_counter()
                syncs[way].push(model)
                seconds[way].append(time.perf_counter() - began)
                moved[way] = syncs[way].sync_bytes
                gap = _gap(policy, model, ids)
                print(f"round {round_no + 1} {way}: {seconds[way][-1]:.2f} s, {moved[way] / 1e9:.2f} GB, "
                      f"server vs trainer log-probs {gap:.1e}", flush=True)
                if gap > 1e-2:
                    sys.exit(f"weight_sync: after a {way} sync the server's log-probs are {gap:.2e} off the trainer's")
        memory, file = statistics.median(seconds["memory"]), statistics.median(seconds["file"])
        print(f"weight sync into a vLLM server, memory vs file: {file / memory:.2f}x (memory {memory:.2f} s, "
              f"{moved['memory'] / 1e9:.2f} GB; file {file:.2f} s, {moved['file'] / 1e9:.2f} GB)")
    finally:
        for way, policy in policies.items():
            syncs[way].close()
            policy.close()
        os.killpg(proc.pid, 15)
        proc.wait(timeout=60)


def _gap(policy, model, ids: list[int]) -> float:
    """Largest |server - trainer| teacher-forced log-prob over ``ids``."""
    import asyncio

    import torch

    out = asyncio.run(policy.engine.generate(ids, policy.engine.score_params()))
    served = torch.tensor([v for v in out.prompt_logprobs[1:]])
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, :-1].float()
    trainer = logits.log_softmax(-1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]
    return float((served - trainer).abs().max())


if __name__ == "__main__":
    main()
