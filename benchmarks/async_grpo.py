"""Asynchronous against synchronous GRPO when the user is an API model: step time and idle shares.

The same short run twice in one process: the CPU demo's GRPO recipe (shipped base, retail-lite) for
``--steps`` steps, with an ``llm:`` user served by ``benchmarks/latency_user.py`` (the scripted user's
replies after a lognormal latency of mean about 1 s, like an API model's; loopback only, started here),
first synchronous (sample, then update), then with ``--max-staleness 1``. Printed per run: seconds per
step, the trainer's idle share (waiting for episodes) and the sampler's (nothing to play), staleness and
dropped groups; last line ``async vs sync step time: N.NNx`` (synchronous seconds per step over
asynchronous).

    python benchmarks/async_grpo.py                  # 8 steps of 8 tasks x 8 episodes, about 5 minutes
    python benchmarks/async_grpo.py --steps 4 --tasks-per-step 4
"""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from muarl.experiments.recipe import GRPO
from muarl.train.grpo import train_grpo


def serve_user(mean: float) -> tuple[subprocess.Popen, str]:
    """Start the latency user server; its process and URL."""
    server = subprocess.Popen([sys.executable, str(Path(__file__).parent / "latency_user.py"), "--mean", str(mean)],
                              stdout=subprocess.PIPE, text=True)
    line = server.stdout.readline() if server.stdout else ""
    if not line.startswith("ready "):
        server.kill()
        raise SystemExit(f"async_grpo: the latency user server did not start ({line!r})")
    return server, line.split()[1]


def run(url: str, out: Path, staleness: int, args: argparse.Namespace) -> dict[str, float]:
    """One GRPO run; its seconds per step and idle shares."""
    config = dataclasses.replace(GRPO, model="tiny", domain="retail-lite", out=str(out), steps=args.steps,
                                 tasks_per_step=args.tasks_per_step, group_size=args.group_size,
                                 user=f"llm:{url}/v1#scripted", max_staleness=staleness, tis_cap=0.0,
                                 save_every=0, report_to="none", seed=args.seed, resume=False)
    began = time.perf_counter()
    metrics = train_grpo(config, progress=False)["metrics"]
    wall = time.perf_counter() - began
    busy = sum(m["reference_s"] + m["update_s"] + m.get("sync_s", 0.0) for m in metrics)
    if staleness:
        trainer_idle = sum(m["trainer_idle_s"] for m in metrics)
        sampler_idle = sum(m["sampler_idle_s"] for m in metrics)
    else:  # in turn: the trainer waits through the rollouts, the sampler through the update
        trainer_idle = sum(m["rollout_s"] for m in metrics)
        sampler_idle = busy
    return {"step_s": wall / len(metrics), "trainer_idle": trainer_idle / wall, "sampler_idle": sampler_idle / wall,
            "staleness": sum(m.get("staleness_mean", 0.0) for m in metrics) / len(metrics),
            "dropped": sum(m.get("dropped_groups", 0.0) for m in metrics),
            "reward": sum(m["reward"] for m in metrics) / len(metrics)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--tasks-per-step", type=int, default=GRPO.tasks_per_step)
    parser.add_argument("--group-size", type=int, default=GRPO.group_size)
    parser.add_argument("--latency", type=float, default=1.0, help="mean seconds of a user reply (default 1)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    server, url = serve_user(args.latency)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            results = {name: run(url, Path(tmp) / name, n, args) for name, n in (("sync", 0), ("async N=1", 1))}
    finally:
        server.kill()
    print(f"GRPO, the demo's recipe, {args.steps} steps x {args.tasks_per_step} tasks x {args.group_size} episodes; "
          f"llm: user with {args.latency:g} s mean latency")
    print(f"{'run':<12}{'s/step':>9}{'trainer idle':>14}{'sampler idle':>14}{'staleness':>11}{'dropped':>9}{'reward':>8}")
    for name, r in results.items():
        print(f"{name:<12}{r['step_s']:>9.2f}{r['trainer_idle']:>14.0%}{r['sampler_idle']:>14.0%}"
              f"{r['staleness']:>11.2f}{r['dropped']:>9.0f}{r['reward']:>8.3f}")
    print(f"async vs sync step time: {results['sync']['step_s'] / results['async N=1']['step_s']:.2f}x")


if __name__ == "__main__":
    main()
