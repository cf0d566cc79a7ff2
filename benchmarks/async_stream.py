"""Episode production of asynchronous GRPO's rollout stream against the synchronous step's, without training.

Isolates the engine from the update (issue 31's follow-up: at 8 tasks x 8 episodes the asynchronous run
produced episodes about 1.8x slower than the synchronous rollouts). The same model (``tiny``, the shipped
base), domain (retail-lite), episode settings (the demo's GRPO recipe) and ``llm:`` user
(``benchmarks/latency_user.py``, mean ``--latency`` s) in one process:

- ``step``: what a synchronous step does: a fresh policy plays ``--tasks-per-step`` groups of
  ``--group-size`` at once and the step waits for all of them; ``--steps`` times;
- ``stream``: a :class:`~muarl.train.async_rollouts.RolloutStream` with staleness ``--staleness`` and a
  trainer that takes each step's groups and syncs at once (no update, same weights): so the stream plays
  as fast as it can, with (N + 1) steps' worth of groups started at the bound;
- ``grpoN``: a real ``train_grpo`` run (``benchmarks/async_grpo.py``'s) with ``--max-staleness N``;
  ``grpo1:fcfs`` serves the engine's batch first come first served instead of oldest group first,
  ``:noend`` lets the stream start groups past the run's last step (both: the stream before the fixes of
  research/async-throughput.md); decode passes are also timed inside and outside the updates;
- any run with ``:unfused``: the engine's attention with the rows' own part in separate passes (as before
  ``muarl.attention._own_part`` ran it in PyTorch's fused CPU kernel).

Per run: seconds per step's worth of episodes, and the engine's counters: decode steps, prefill passes,
rows per decode step (live and free slots), padded cells per decode step (rows x cache width) against
the real ones (columns holding a token), rebuilds, slot fills, and the seconds the model's worker thread
was busy (the rest is the event loop: users, tools, chat rendering, or nothing to do).

    python benchmarks/async_stream.py --runs step,stream --steps 3
    python benchmarks/async_stream.py --runs grpo0,grpo1:fcfs:noend,grpo1 --steps 3
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))

import muarl.attention as attention  # noqa: E402
from async_grpo import serve_user  # noqa: E402
from muarl.domain import get_domain  # noqa: E402
from muarl.experiments.recipe import GRPO  # noqa: E402
from muarl.factory import make_user  # noqa: E402
from muarl.models import load  # noqa: E402
from muarl.policies.batched_generator import BatchedGenerator  # noqa: E402
from muarl.rollout import RolloutEngine  # noqa: E402
from muarl.train.async_rollouts import RolloutStream  # noqa: E402
from muarl.train.groups import step_seed  # noqa: E402
from muarl.train.samplers import HFSampler  # noqa: E402


class Counters:
    """Engine work, summed over every engine instrumented while it is active."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.decodes = self.prefills = self.prefill_rows = 0
        self.slots = self.live = self.padded = self.real = self.trimmed = self.spans = 0
        self.busy_s = self.decode_s = self.prefill_s = self.compact_s = 0.0
        self.passes: list[tuple[float, float]] = []  # decode passes: (start, seconds)
        self.updates: list[tuple[float, float]] = []  # the trainer's updates: (start, end)

    def row(self) -> dict[str, float]:
        d = max(self.decodes, 1)
        return {"decode_steps": self.decodes, "prefill_passes": self.prefills,
                "rows_per_prefill": self.prefill_rows / max(self.prefills, 1),
                "slots_per_decode": self.slots / d, "live_per_decode": self.live / d,
                "padded_cells_per_decode": self.padded / d, "real_cells_per_decode": self.real / d,
                # rows x the width the batch would have trimmed of unused leading columns; live rows' spans
                # (first real column to the end: holes included); the rest of padded is left padding
                "trimmed_cells_per_decode": self.trimmed / d, "span_cells_per_decode": self.spans / d,
                "busy_s": self.busy_s, "decode_s": self.decode_s, "ms_per_decode": 1e3 * self.decode_s / d,
                "ms_per_prefill": 1e3 * self.prefill_s / max(self.prefills, 1), "compact_s": self.compact_s,
                "other_busy_s": self.busy_s - self.decode_s - self.prefill_s - self.compact_s}


COUNT = Counters()


def instrument() -> None:
    """Wrap the engine's passes to count their shape and time them (the worker thread's busy time)."""
    decode, prefill, locked = BatchedGenerator._decode_step, BatchedGenerator._prefill, BatchedGenerator._locked

    def _decode_step(self: BatchedGenerator) -> None:
        began = time.perf_counter()
        self._compact()
        COUNT.compact_s += time.perf_counter() - began
        if self.mask is not None and any(r is not None and r.finish is None for r in self.rows):
            COUNT.decodes += 1
            COUNT.slots += len(self.rows)
            COUNT.live += sum(r is not None for r in self.rows)
            COUNT.padded += self.mask.numel()
            COUNT.real += int(self.mask.sum())
            used = self.mask.any(dim=0)  # columns some row (live or a free slot's stale one) uses
            first = self.mask.float().argmax(dim=1)  # each row's first real column
            live = torch.tensor([r is not None for r in self.rows])
            COUNT.trimmed += self.mask.shape[0] * (self.mask.shape[1] - int(used.float().argmax()))
            COUNT.spans += int((self.mask.shape[1] - first[live]).sum()) if bool(live.any()) else 0
        began = time.perf_counter()
        decode(self)
        COUNT.decode_s += time.perf_counter() - began
        COUNT.passes.append((began, time.perf_counter() - began))

    def _prefill(self: BatchedGenerator, bucket: list) -> None:
        COUNT.prefills += 1
        COUNT.prefill_rows += len(bucket)
        began = time.perf_counter()
        prefill(self, bucket)
        COUNT.prefill_s += time.perf_counter() - began

    def _locked(self: BatchedGenerator, work: Any, *args: Any) -> None:
        began = time.perf_counter()
        try:
            locked(self, work, *args)
        finally:
            COUNT.busy_s += time.perf_counter() - began

    BatchedGenerator._decode_step, BatchedGenerator._prefill, BatchedGenerator._locked = _decode_step, _prefill, _locked


def per_token(tokens: int) -> dict[str, float]:
    """Work per agent token of the trajectories the trainer got (the engine also plays episodes the stream
    abandons when it stops: they count in the numerators, a few percent)."""
    sampled = COUNT.live + COUNT.prefill_rows  # tokens the engine sampled (abandoned episodes' included)
    return {"trained_tokens": tokens, "sampled_tokens": sampled, "busy_ms_per_token": 1e3 * COUNT.busy_s / sampled,
            "padded_cells_per_token": COUNT.padded / sampled, "real_cells_per_token": COUNT.real / sampled}


def setting(args: argparse.Namespace, url: str) -> tuple[Any, Any, Any, Any, Any, list]:
    config = dataclasses.replace(GRPO, model="tiny", domain="retail-lite", tasks_per_step=args.tasks_per_step,
                                 group_size=args.group_size, user=f"llm:{url}/v1#scripted", seed=args.seed)
    model, tokenizer = load("tiny")
    model.eval()
    domain = get_domain(config.domain)
    import random

    tasks = domain.tasks("train")
    order = random.Random(config.seed).sample(tasks, len(tasks))
    user = make_user(config.user, http_timeout=config.user_http_timeout, max_tokens=config.user_max_tokens)
    sampler = HFSampler(model, tokenizer, config.temperature, config.max_new_tokens)
    return config, model, domain, user, sampler, order


def run_steps(args: argparse.Namespace, url: str) -> dict[str, float]:
    config, model, domain, user, sampler, order = setting(args, url)
    episode = config.episode_config()
    COUNT.reset()
    began, tokens = time.perf_counter(), 0
    for step in range(args.steps):
        chosen = [order[(step * args.tasks_per_step + i) % len(order)] for i in range(args.tasks_per_step)]
        policy = sampler.policy(step_seed(config.seed, step))
        policy.engine.max_batch = args.max_batch
        engine = RolloutEngine(domain, policy, user, episode,
                               group_size=config.group_size, common_user_seed=True, seed=config.seed, progress=False)
        groups = asyncio.run(engine.run(chosen))
        tokens += sum(sum(t.loss_mask) for g in groups for t in g)
    wall = time.perf_counter() - began
    return {"step_s": wall / args.steps, "agent_tokens": tokens, **COUNT.row(), "wall_s": wall,
            **per_token(tokens)}


def run_stream(args: argparse.Namespace, url: str) -> dict[str, float]:
    config, model, domain, user, sampler, order = setting(args, url)
    stream = RolloutStream(sampler, domain, user, config.episode_config(), config.group_size, order, 0,
                           per_step=args.tasks_per_step, staleness=args.staleness,
                           group_seed=lambda position: step_seed(config.seed, position, 0),
                           policy_seed=step_seed(config.seed, 0))
    stream.policy.engine.max_batch = args.max_batch
    if stream.gate is not None:
        stream.gate.width = args.max_batch
    COUNT.reset()
    began = time.perf_counter()
    stream.start()
    dropped = tokens = 0
    try:
        for _ in range(args.steps):
            taken = stream.take(args.tasks_per_step, stream.version - args.staleness)
            dropped += taken.dropped
            tokens += sum(sum(t.loss_mask) for item in taken.groups for t in item.group)
            stream.sync(model)  # no update: the same weights, but the budget and version move on
    finally:
        stream.close()
    wall = time.perf_counter() - began
    engine = stream.policy.engine
    return {"step_s": wall / args.steps, "agent_tokens": tokens, "dropped": dropped, **COUNT.row(), "wall_s": wall,
            "rebuilds": engine.rebuilds, "slot_fills": engine.slot_fills, **per_token(tokens)}


class NoEnd:
    """``RolloutStream.end`` as before it existed: always None (the stream starts groups up to its bound)."""

    def __get__(self, obj: Any, owner: Any) -> None:
        return None

    def __set__(self, obj: Any, value: Any) -> None:
        pass


def run_grpo(args: argparse.Namespace, url: str, name: str) -> dict[str, float]:
    """A real GRPO run (async_grpo.py's), the engine counted; decode passes timed inside and outside updates.
    ``name``: grpoN[:fcfs][:noend] (--max-staleness N; the engine's queue first come first served; no end to
    the groups the stream starts)."""
    import tempfile

    import muarl.train.grpo as grpo

    staleness = int(name.split(":")[0][len("grpo"):] or 0)
    RolloutStream.oldest_first = ":fcfs" not in name
    if ":noend" in name:
        RolloutStream.end = NoEnd()

    update = grpo.update_on_rollouts

    def timed_update(*a: Any, **k: Any) -> Any:
        began = time.perf_counter()
        try:
            return update(*a, **k)
        finally:
            COUNT.updates.append((began, time.perf_counter()))

    grpo.update_on_rollouts = timed_update
    try:
        with tempfile.TemporaryDirectory() as tmp:
            config = dataclasses.replace(GRPO, model="tiny", domain="retail-lite", out=tmp, steps=args.steps,
                                         tasks_per_step=args.tasks_per_step, group_size=args.group_size,
                                         user=f"llm:{url}/v1#scripted", max_staleness=staleness, tis_cap=0.0,
                                         save_every=0, report_to="none", seed=args.seed, resume=False)
            COUNT.reset()
            began = time.perf_counter()
            metrics = grpo.train_grpo(config, progress=False)["metrics"]
            wall = time.perf_counter() - began
    finally:
        grpo.update_on_rollouts = update
        RolloutStream.oldest_first = True
        if isinstance(RolloutStream.__dict__.get("end"), NoEnd):
            del RolloutStream.end
    tokens = int(sum(m["response_tokens"] * args.tasks_per_step * args.group_size for m in metrics))
    inside = [d for t, d in COUNT.passes if any(a <= t < b for a, b in COUNT.updates)]
    outside = [d for t, d in COUNT.passes if not any(a <= t < b for a, b in COUNT.updates)]
    return {"step_s": wall / len(metrics), "wall_s": wall, "update_s": sum(b - a for a, b in COUNT.updates),
            "dropped": sum(m.get("dropped_groups", 0.0) for m in metrics),
            "trainer_idle_s": sum(m.get("trainer_idle_s", m["rollout_s"]) for m in metrics),
            "decodes_in_update": len(inside), "ms_per_decode_in_update": 1e3 * sum(inside) / max(len(inside), 1),
            "ms_per_decode_outside": 1e3 * sum(outside) / max(len(outside), 1), **COUNT.row(), **per_token(tokens),
            "updates_s": [round(b - a, 1) for a, b in COUNT.updates],
            "trained_sequences": [m["trained_sequences"] for m in metrics]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", default="step,stream", help="comma-separated, run in this order: step, stream, "
                        "grpoN[:fcfs][:noend] (a GRPO run with --max-staleness N, see run_grpo); "
                        "any with :unfused (the engine's own-part attention in separate passes)")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--tasks-per-step", type=int, default=GRPO.tasks_per_step)
    parser.add_argument("--group-size", type=int, default=GRPO.group_size)
    parser.add_argument("--staleness", type=int, default=1)
    parser.add_argument("--latency", type=float, default=1.0)
    parser.add_argument("--max-batch", type=int, default=64, help="the engine's decode batch limit (HFPolicy's 64)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0, help="torch.set_num_threads first (0: torch's default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    instrument()
    server, url = serve_user(args.latency)
    results = {}
    try:
        for name in args.runs.split(","):
            fused = attention._own_part
            if ":unfused" in name:  # the rows' own attention in separate passes, as before the fused kernel
                attention._own_part = lambda *args: None
            try:
                if name.startswith("grpo"):
                    results[name] = run_grpo(args, url, name.replace(":unfused", ""))
                else:
                    results[name] = (run_steps if name.startswith("step") else run_stream)(args, url)
            finally:
                attention._own_part = fused
            print(name, {k: round(v, 2) if isinstance(v, float) else v for k, v in results[name].items()},
                  flush=True)
    finally:
        server.kill()
    if "step" in results and "stream" in results:
        print(f"stream vs step, seconds per step's episodes: {results['step']['step_s'] / results['stream']['step_s']:.2f}x")


if __name__ == "__main__":
    main()
