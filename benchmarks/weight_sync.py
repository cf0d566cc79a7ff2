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

``--changes`` measures instead the full broadcast (``memory``) against the broadcast of what changed
(``changed``, :mod:`muarl.weight_sync.changes`) into a server running bf16, after real AdamW updates (an LM
loss on a fixed text) at each ``--lrs`` learning rate: per learning rate, the same updates (same seeds, from
the same checkpoint) are synced one way, then the other, and after every update the server's log-probs
under the changed sync must equal those under the full one (the same bf16 weights; else the benchmark
stops). ``--sweep`` adds syncs of every tensor with a set share of its values changed (its changes sent
even above the whole-tensor threshold), to find the share where sending changes stops paying.

    python benchmarks/weight_sync.py --changes --layers 28 --lrs 1e-6,1e-5 --updates 5 --repeats 2 --sweep

Its lines: ``lr L: changed vs full: N.NNx faster, bytes P% of full (changed S s, B GB, share C; full S s,
B GB)``, the medians over the updates after the first (a link's first sync is whole), and per way where
the seconds went: ``compared`` (the trainer's casts and comparisons), ``sent`` (the last byte broadcast)
and ``loaded`` (the slowest worker's receive and reload), from the sync's start.
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


def launch(model: Path, python: str, log: Path, dtype: str | None = None) -> tuple[subprocess.Popen, str]:
    """A vLLM server on ``model`` started as muarl's tests start theirs; (process, URL) once healthy."""
    import httpx2

    from muarl.policies.vllm_server import server_command

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    argv, env = server_command(model, port=port, served_name="bench", python=python, cpu_build=not _has_cuda(python),
                               dtype=dtype, extra=["--max-model-len", "4096"])
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
    parser.add_argument("--changes", action="store_true", help="full broadcast vs changed values, bf16 server")
    parser.add_argument("--lrs", default="1e-6,1e-5", help="with --changes: the AdamW learning rates ('': none)")
    parser.add_argument("--updates", type=int, default=3, help="with --changes: AdamW updates per way and lr")
    parser.add_argument("--repeats", type=int, default=1, help="with --changes: runs of each way per lr (ABBA...)")
    parser.add_argument("--sweep", action="store_true", help="with --changes: syncs at set changed shares")
    args = parser.parse_args()
    if args.changes:
        changes(args)
        return

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


def changes(args: argparse.Namespace) -> None:
    """Full broadcast against changed values into one bf16 server, after the same AdamW updates (the
    module's docstring). One server and one trainer at a time: two bf16 servers beside a float32 trainer
    and its AdamW state (11 GB at Qwen3-0.6B's shape) did not fit this 24 GB machine."""
    import gc

    import torch

    from muarl.allocator import release_freed
    from muarl.models import load
    from muarl.policies.vllm_server import VLLMServerPolicy
    from muarl.weight_sync.servers import ServerSync

    root = Path(args.dir)
    model_dir = root / f"qwen3-{args.layers}l"
    count = checkpoint(model_dir, args.layers)
    print(f"model: {count / 1e6:.0f}M parameters, {model_dir}; server dtype bfloat16", flush=True)
    proc, url = launch(model_dir, args.python or _vllm_python(), root / "server.log", dtype="bfloat16")
    policy = VLLMServerPolicy(url, "bench")
    try:
        _, tokenizer = load(str(model_dir))
        ids = tokenizer("I would like to return the order I placed last week, please.")["input_ids"]
        for k, lr in enumerate(float(x) for x in args.lrs.split(",") if x.strip()):
            seconds: dict[str, list[float]] = {way: [] for way in WAYS}
            moved: dict[str, list[int]] = {way: [] for way in WAYS}
            served: dict[str, list[torch.Tensor]] = {way: [] for way in WAYS}
            shares: list[float] = []
            split: dict[str, list[dict[str, float]]] = {way: [] for way in WAYS}  # the link's own seconds
            # the ways alternate, ABBA..., over the repeats and the learning rates: a machine's drift in load
            # falls on both
            order = [way for r in range(args.repeats) for way in (WAYS if (k + r) % 2 == 0 else WAYS[::-1])]
            for way in order:
                model, _ = load(str(model_dir))
                optimizer = torch.optim.AdamW(model.parameters(), lr=lr, foreach=False)  # no whole-model temporaries
                sync = ServerSync([policy], lora=False, how=way)
                try:
                    sync.push(model)  # the start: whole either way (untimed)
                    for update in range(args.updates):
                        torch.manual_seed(update)  # the same updates both ways
                        model(torch.tensor([ids]), labels=torch.tensor([ids])).loss.backward()
                        optimizer.step()
                        optimizer.zero_grad(set_to_none=True)
                        began = time.perf_counter()
                        sync.push(model)
                        seconds[way].append(time.perf_counter() - began)
                        moved[way].append(sync.sync_bytes)
                        split[way].append(_split(sync))
                        share = sync.changed_share
                        if share is not None:
                            shares.append(share)
                        served[way].append(_served(policy, ids))
                        print(f"lr {lr:g} update {update + 1} {way}: {seconds[way][-1]:.2f} s, "
                              f"{moved[way][-1] / 1e9:.3f} GB" + ("" if share is None else f", share {share:.4f}")
                              + "; " + ", ".join(f"{k} {v:.2f} s" for k, v in split[way][-1].items()), flush=True)
                    if way == "memory":
                        print(f"lr {lr:g}: server (bf16) vs trainer (float32) log-probs {_gap(policy, model, ids):.1e}")
                finally:
                    sync.close()
                del model, optimizer
                gc.collect()
                release_freed()  # glibc keeps the freed pages otherwise: a 4th phase was killed for memory
            for update, (full, changed) in enumerate(zip(served["memory"], served["changed"], strict=True)):
                if not torch.equal(full, changed):
                    sys.exit(f"weight_sync: after update {update + 1} at lr {lr:g} the server scores "
                             f"{float((full - changed).abs().max()):.2e} off under the changed sync")
            full_s, changed_s = statistics.median(seconds["memory"]), statistics.median(seconds["changed"])
            full_b, changed_b = statistics.median(moved["memory"]), statistics.median(moved["changed"])
            print(f"lr {lr:g}: changed vs full: {full_s / changed_s:.2f}x faster, bytes "
                  f"{100 * changed_b / full_b:.1f}% of full (changed {changed_s:.2f} s, {changed_b / 1e9:.3f} GB, "
                  f"share {statistics.median(shares):.4f}; full {full_s:.2f} s, {full_b / 1e9:.3f} GB); the "
                  "server's log-probs equal after every update", flush=True)
            for way in WAYS:
                print(f"lr {lr:g}: {way}: median " + ", ".join(
                    f"{k} {statistics.median(d[k] for d in split[way]):.2f} s" for k in split[way][0]), flush=True)
        if args.sweep:
            _sweep(policy, model_dir, args.updates)
    finally:
        policy.close()
        os.killpg(proc.pid, 15)
        proc.wait(timeout=60)


#: --changes's two ways: the full broadcast and the changed values
WAYS = ("memory", "changed")


def _sweep(policy, model_dir: Path, syncs: int) -> None:
    """Seconds per sync with a set share of every tensor's values changed, changes sent at every share (the
    whole-tensor threshold lifted), against the full broadcast of such changes: per share and way, a link of
    its own, an untimed whole sync, then ``syncs`` timed ones, each after a new change; the medians."""
    import torch

    from muarl.models import load
    from muarl.weight_sync.servers import ServerSync

    model, _ = load(str(model_dir))
    for k, share in enumerate((0.01, 0.05, 0.1, 0.2, 0.3)):
        times: dict[str, list[float]] = {way: [] for way in WAYS}
        found = 0.0
        for way in (WAYS if k % 2 == 0 else WAYS[::-1]):
            sync = ServerSync([policy], lora=False, how=way)
            try:
                sync.push(model)  # untimed: a link's first sync is whole
                if sync.link.sent is not None:
                    sync.link.sent.full_above = 1.0  # this sweep sends changes at any share
                for n in range(syncs):
                    torch.manual_seed(100 * k + n)  # the same changes both ways
                    with torch.no_grad():
                        for p in model.parameters():
                            flat = p.view(-1)
                            flat[torch.rand(flat.numel()) < share] *= 1.25
                    began = time.perf_counter()
                    sync.push(model)
                    times[way].append(time.perf_counter() - began)
                    found = sync.changed_share if sync.changed_share is not None else found
            finally:
                sync.close()
        changed, full = statistics.median(times["changed"]), statistics.median(times["memory"])
        print(f"sweep: share {found:.3f}: changed {changed:.2f} s, full {full:.2f} s ({full / changed:.2f}x; "
              f"medians of {syncs})", flush=True)


def _split(sync) -> dict[str, float]:
    """Where the last sync's seconds went: the trainer's comparison (changes only), the broadcast's end and
    the slowest worker's receive-and-reload, each from the link (:attr:`WeightLink.last_seconds`)."""
    link = sync.link
    seconds = dict(link.last_seconds)
    if link.sent is not None:
        seconds = {"compared": link.sent.seconds, **seconds}
    return seconds


def _served(policy, ids: list[int]):
    """The server's teacher-forced log-probs of ``ids``."""
    import asyncio

    import torch

    out = asyncio.run(policy.engine.generate(ids, policy.engine.score_params()))
    return torch.tensor([v for v in out.prompt_logprobs[1:]])


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
