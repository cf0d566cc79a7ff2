"""Pool several ``muarl demo`` runs (one per seed): each seed's change, and the pooled change over all seeds
with a 95% interval from a cluster bootstrap over tasks.

    python scripts/demo_seeds.py runs/demo-s0 runs/demo-s1 runs/demo-s2
    python scripts/demo_seeds.py --split dev runs/demo-s0 runs/demo-s1 runs/demo-s2

``--split`` picks which held-out split's evaluations to pool (``muarl demo --eval-split``: test's are in
the run directory, dev's in its ``dev/``), so the dev figures a recipe was chosen on and the test figures
it is reported with come from the same runs and never mix. Prints a markdown table (the README's demo
table) and the pooled intervals. The seeds evaluate the same held-out tasks, so a task's differences
under the three seeds are not independent (an easy task is easy under every seed): the interval resamples tasks and keeps each task's seeds together
(:func:`muarl.compare.compare_pairs`, as ``muarl compare A0 B0 A1 B1 ...`` does), rather than treating
3 seeds x 50 tasks as 150 independent pairs, which made it too narrow. Metrics are recomputed from each
evaluation's trajectories, so runs made by an older muarl are scored by today's rules (a policy fault
is a failure). Greedy (T = 0) columns appear for runs that have the greedy evaluations (``muarl demo``'s
default since they were added); ``-`` otherwise.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from muarl.compare import compare_pairs, load_run
from muarl.evaluate import FAULT_COLUMNS, EvalResult

METRICS = ("pass^1", *FAULT_COLUMNS, "violation_rate", "truncation_rate")


def _faults(run: EvalResult) -> str:
    """The fault rates by party, policy / user / tool."""
    return "/".join("-" if run.metrics.get(key) is None else f"{run.metrics[key]:.3f}" for key in FAULT_COLUMNS)


def _pooled(label: str, pairs: list[tuple[EvalResult, EvalResult]], samples: int, seed: int) -> dict[str, dict]:
    """Per metric of :data:`METRICS`, the pooled comparison of ``pairs``; printed one line each."""
    report = compare_pairs(pairs, METRICS, samples=samples, seed=seed)
    by = {m["metric"]: m for m in report["metrics"]}
    seeds = f"{len(pairs)} seed{'s' if len(pairs) > 1 else ''}"
    for metric in ("pass^1", "violation_rate", "truncation_rate"):
        m = by[metric]
        print(f"pooled {label} {metric}: {m['a']:.3f} -> {m['b']:.3f}, change {m['diff']:+.3f}, 95% interval "
              f"[{m['low']:+.3f}, {m['high']:+.3f}] over {m['tasks']} tasks x {seeds} ({m['pairs']} task pairs; "
              "cluster bootstrap over tasks)")
    faults = [by[key] for key in FAULT_COLUMNS if key in by]
    before, after = ("/".join(f"{m[side]:.3f}" for m in faults) for side in ("a", "b"))
    print(f"pooled {label} fault rate policy/user/tool: {before} -> {after}")
    return by


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="demo run directories (each with eval-sft/ and eval-rl/)")
    parser.add_argument("--samples", type=int, default=10_000, help="bootstrap resamples")
    parser.add_argument("--seed", type=int, default=0, help="the bootstrap's seed")
    parser.add_argument("--split", choices=["test", "dev"], default="test",
                        help="the evaluated split to pool (muarl demo --eval-split; dev's are in RUN/dev/)")
    args = parser.parse_args()
    print(f"held-out split: {args.split}")
    sampled: list[tuple[EvalResult, EvalResult]] = []
    greedy: list[tuple[EvalResult, EvalResult]] = []
    print("| seed | cold start pass^1 | after RL pass^1 | change | fault rate policy/user/tool, before -> after | "
          "greedy (T = 0) pass^1, before -> after | violation rate | truncation rate | minutes |")
    print("|---|---|---|---|---|---|---|---|---|")
    for directory in map(Path, args.runs):
        run = directory if args.split == "test" else directory / args.split
        before, after = (load_run(run / name, recompute=True) for name in ("eval-sft", "eval-rl"))
        sampled.append((before, after))
        shown_greedy = "-"
        if (run / "eval-sft-greedy").exists() and (run / "eval-rl-greedy").exists():
            g_before, g_after = (load_run(run / name, recompute=True) for name in ("eval-sft-greedy", "eval-rl-greedy"))
            greedy.append((g_before, g_after))
            shown_greedy = f"{g_before.metrics['pass^1']:.3f} -> {g_after.metrics['pass^1']:.3f}"
        summary = json.loads((run / "summary.json").read_text())
        if summary.get("split", "test") != args.split:  # runs made before the split: test's, in the directory
            raise SystemExit(f"{run} holds the {summary['split']} split's evaluations, not {args.split}'s")
        a, b = before.metrics["pass^1"], after.metrics["pass^1"]
        print(f"| {summary['seed']} | {a:.3f} | {b:.3f} | {b - a:+.3f} | {_faults(before)} -> {_faults(after)} | "
              f"{shown_greedy} | {before.metrics['violation_rate']:.3f} -> {after.metrics['violation_rate']:.3f} | "
              f"{before.metrics['truncation_rate']:.3f} -> {after.metrics['truncation_rate']:.3f} | {summary['total_seconds'] / 60:.1f} |")
    settings = Path(args.runs[0]) / "demo.json"
    recorded = json.loads(settings.read_text()) if settings.exists() else {}
    # GRPO's temperature, which the evaluations sample at (``temperature`` in runs recorded before DemoConfig
    # nested the GRPO config)
    temperature = recorded.get("grpo.temperature", recorded.get("temperature", 1.0))
    _pooled(f"sampled (T = {temperature:g})", sampled, args.samples, args.seed)
    if greedy:
        _pooled(f"greedy (T = 0, {len(greedy)} of {len(sampled)} seeds)", greedy, args.samples, args.seed)


if __name__ == "__main__":
    main()
