"""Is run B better than run A? Per-metric differences with paired bootstrap confidence intervals.

Two evaluations of the same tasks are paired: task t contributes one value per run (its pass^1, TCR,
turns ...), and the difference of the means is the mean of the per-task differences. The uncertainty
comes from which tasks happen to be in the set, so the bootstrap resamples *task ids* with replacement
(the same ids for both runs, which keeps the pairing) and recomputes the mean difference; the 2.5th and
97.5th percentiles of those resamples are the 95% interval. An interval that excludes 0 is a difference
the task set supports; one that straddles 0 is not (whatever the point estimate says).

Several pairs of runs (one pair per training seed, say) pool into one estimate: the mean of every
(task, pair) difference. Those differences are not independent: one task's differences under three seeds
share the task (an easy task is easy under every seed), so treating 3 seeds x 50 tasks as 150 independent
pairs understates the uncertainty about the task set. :func:`cluster_bootstrap` therefore resamples
*tasks* and keeps each task's differences from every pair together (a cluster bootstrap); with one pair
it is the paired bootstrap above.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from muarl.evaluate import (
    FAULT_COLUMNS,
    RESULTS,
    RUN_CONFIG,
    TRAJECTORIES,
    EvalResult,
    result_from_trajectories,
)
from muarl.provenance import KEY as PROVENANCE
from muarl.provenance import compare as compare_provenance
from muarl.time_split import of_result as time_of

#: per-task values compared by default, besides pass^1 .. pass^k (k: the smallest of the runs' k) and the fault
#: rates by party (:data:`muarl.evaluate.FAULT_COLUMNS`), which come right after pass^k
DEFAULT_METRICS: tuple[str, ...] = ("truncation_rate", "accuracy", "tcr", "avg_turns", "violation_rate",
                                     "compliant_success", "transfer_rate", "user_slip_rate")


@dataclass
class MetricDiff:
    """One metric's comparison over the shared tasks (B minus A)."""

    metric: str
    a: float
    b: float
    diff: float
    low: float
    high: float
    #: distinct tasks (the bootstrap's clusters)
    tasks: int
    #: (task, pair of runs) differences; equal to ``tasks`` for one pair
    pairs: int

    @property
    def excludes_zero(self) -> bool:
        return self.low > 0 or self.high < 0


def load_run(path: str | Path, recompute: bool = False) -> EvalResult:
    """A run directory with results.json, a results.json file, or a directory holding only a
    trajectories.jsonl (an interrupted run: its metrics are computed from the trajectories).

    ``recompute``: compute the metrics from a run directory's trajectories even when it has a results.json,
    so that a run written by an older muarl is scored by today's rules (policy faults as failures) and has
    today's per-task fields; its recorded provenance is kept."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no such run: {path}")
    if recompute and path.is_dir() and (path / TRAJECTORIES).exists():
        return _from_trajectories(path)
    if path.is_dir() and not (path / RESULTS).exists():
        if (path / TRAJECTORIES).exists():
            return _from_trajectories(path)
        raise FileNotFoundError(f"{path} has neither {RESULTS} nor {TRAJECTORIES}: not an evaluation run")
    return EvalResult.load(path)


def _from_trajectories(run_dir: Path) -> EvalResult:
    """An interrupted run's result, under the domain its ``config.json`` recorded (``module:attr`` for a
    plug-in), so that it pairs with a finished run of the same command and finds its task families."""
    spec = provenance = None
    if (run_dir / RUN_CONFIG).exists():
        try:
            saved = json.loads((run_dir / RUN_CONFIG).read_text(encoding="utf-8"))
            spec, provenance = saved.get("domain"), saved.get(PROVENANCE)
        except (ValueError, AttributeError):
            spec = provenance = None
    domain = None
    if isinstance(spec, str):
        from muarl.domain import get_domain

        try:
            domain = get_domain(spec)
        except (KeyError, ImportError, ValueError, OSError):
            domain = None
    result = result_from_trajectories(run_dir / TRAJECTORIES, domain=domain)
    if isinstance(spec, str):
        result.config["domain"] = spec
    if isinstance(provenance, dict):
        result.provenance = provenance
    return result


def cluster_bootstrap(clusters: Sequence[Sequence[float]], samples: int = 10_000, seed: int = 0,
                      confidence: float = 0.95) -> tuple[float, float, float]:
    """(mean, low, high) of the differences in ``clusters`` (one list per task: its differences B - A,
    one per pair of runs that has the task), with the percentile interval of a bootstrap over clusters.

    The estimate is the mean of all differences. A resample draws as many clusters as there are, with
    replacement, and takes the mean of all the differences in the drawn clusters (a cluster with more
    pairs weighs more, as it does in the estimate). Seeded: the same inputs and seed give the same
    interval. Resampling whole clusters is what makes it honest when a task's differences agree across
    seeds: they move together, and the interval is as wide as the task set warrants, not narrowed as if
    each seed had brought new tasks."""
    if not clusters or any(len(c) == 0 for c in clusters):
        raise ValueError("a cluster bootstrap needs at least one cluster, and no empty one")
    if samples < 1 or not 0 < confidence < 1:
        raise ValueError("samples must be >= 1 and confidence in (0, 1)")
    sums = np.array([float(np.sum(np.asarray(c, dtype=np.float64))) for c in clusters])
    sizes = np.array([len(c) for c in clusters], dtype=np.float64)
    rng = np.random.default_rng(seed)
    means = np.empty(samples)
    chunk = max(1, 2_000_000 // len(sums))  # bounds memory for large task sets
    for start in range(0, samples, chunk):
        stop = min(samples, start + chunk)
        idx = rng.integers(0, len(sums), size=(stop - start, len(sums)))
        means[start:stop] = sums[idx].sum(axis=1) / sizes[idx].sum(axis=1)
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail])
    return float(sums.sum() / sizes.sum()), float(low), float(high)


def paired_bootstrap(a: Sequence[float], b: Sequence[float], samples: int = 10_000, seed: int = 0,
                     confidence: float = 0.95) -> tuple[float, float, float]:
    """(mean of b - a, low, high): the percentile interval of the mean paired difference; each pair is a
    cluster of its own (:func:`cluster_bootstrap`)."""
    if len(a) != len(b) or not a:
        raise ValueError("paired bootstrap needs two equally long, non-empty lists")
    return cluster_bootstrap([[y - x] for x, y in zip(a, b, strict=True)], samples, seed, confidence)


def available_metrics(run_a: EvalResult, run_b: EvalResult, *more: EvalResult) -> list[str]:
    """Per-task metrics all runs have: pass^1 .. pass^min(k), the fault rates by party and the defaults."""
    k = min(run.k for run in (run_a, run_b, *more))
    return [f"pass^{j}" for j in range(1, k + 1)] + list(FAULT_COLUMNS) + list(DEFAULT_METRICS)


def compare_runs(run_a: EvalResult, run_b: EvalResult, metrics: Sequence[str] | None = None,
                 samples: int = 10_000, seed: int = 0, confidence: float = 0.95) -> dict[str, Any]:
    """Compare two evaluations over the tasks they share; raises ValueError when they cannot be compared.

    ``provenance`` lists, one line per field, where the two runs were made by different code, data, users
    or policies (:func:`muarl.provenance.compare`): a warning, not an error, since comparing two
    policies is the point, but the reader should know which other differences the numbers carry."""
    report = compare_pairs([(run_a, run_b)], metrics, samples, seed, confidence)
    report["provenance"] = report["provenance"][0]
    return report


def compare_pairs(pairs: Sequence[tuple[EvalResult, EvalResult]], metrics: Sequence[str] | None = None,
                  samples: int = 10_000, seed: int = 0, confidence: float = 0.95) -> dict[str, Any]:
    """Pool several pairs of evaluations (A_i, B_i) of one domain, say a cold start and its RL model under
    each of three seeds, into one comparison: per metric the mean of every (task, pair) difference B_i - A_i
    over the tasks each pair shares, with a :func:`cluster_bootstrap` interval over tasks (a task's
    differences from every pair resampled together). With one pair it is the paired bootstrap.

    ``shared_tasks`` counts distinct tasks (the clusters), ``task_pairs`` the (task, pair) differences;
    each metric's ``tasks`` and ``pairs`` count those that have the metric. ``provenance`` holds one
    :func:`muarl.provenance.compare` per pair. Raises ValueError when the runs cannot be compared."""
    if not pairs:
        raise ValueError("nothing to compare: no pair of runs")
    domains = {run.config.get("domain") for pair in pairs for run in pair}
    if len(domains) > 1:
        shown = " vs ".join(str(d) for d in dict.fromkeys(run.config.get("domain") for p in pairs for run in p))
        raise ValueError(f"the runs evaluate different domains ({shown}); nothing to pair")
    shared: list[list[str]] = []
    rows: list[tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]] = []
    only_a = only_b = 0
    for i, (run_a, run_b) in enumerate(pairs):
        rows_a = {r["task_id"]: r for r in run_a.tasks}
        rows_b = {r["task_id"]: r for r in run_b.tasks}
        common = [t for t in rows_a if t in rows_b]
        if not common:
            which = f" in pair {i + 1}" if len(pairs) > 1 else ""
            raise ValueError(f"the runs{which} share no task (A has {len(rows_a)}, B has {len(rows_b)}: different "
                             "splits or task lists?)")
        shared.append(common)
        rows.append((rows_a, rows_b))
        only_a += len(rows_a) - len(common)
        only_b += len(rows_b) - len(common)
    known = available_metrics(*(run for pair in pairs for run in pair))
    wanted = list(metrics) if metrics else known
    unknown = [m for m in wanted if m not in known]
    if unknown:
        raise ValueError(f"unknown metric(s) {', '.join(unknown)}; these runs have: {', '.join(known)}")
    diffs = []
    for metric in wanted:
        clusters: dict[str, list[float]] = {}
        a_values: list[float] = []
        b_values: list[float] = []
        for (rows_a, rows_b), common in zip(rows, shared, strict=True):
            for t in common:
                a, b = rows_a[t].get(metric), rows_b[t].get(metric)
                if a is None or b is None:
                    continue  # pass^3 of a task without 3 trials; a metric a run written by older muarl lacks
                clusters.setdefault(t, []).append(b - a)
                a_values.append(a)
                b_values.append(b)
        if not clusters:
            continue  # e.g. pass^3 when no shared task has 3 trials in both runs
        mean, low, high = cluster_bootstrap(list(clusters.values()), samples, seed, confidence)
        diffs.append(MetricDiff(metric, _r(sum(a_values) / len(a_values)), _r(sum(b_values) / len(b_values)),
                                _r(mean), _r(low), _r(high), len(clusters), len(a_values)))
    return {
        "domain": next(iter(domains)),
        "pairs": len(pairs),
        "shared_tasks": len({t for common in shared for t in common}),
        "task_pairs": sum(map(len, shared)),
        "only_a": only_a,
        "only_b": only_b,
        "samples": samples,
        "seed": seed,
        "confidence": confidence,
        "metrics": [{**asdict(d), "excludes_zero": d.excludes_zero} for d in diffs],
        "provenance": [compare_provenance(a.provenance, b.provenance) for a, b in pairs],
        # where each run's episode time went (muarl.time_split), per pair: measured, so not bootstrapped
        "time": [{"a": time_of(a.timing), "b": time_of(b.timing)} for a, b in pairs],
    }


def _r(x: float) -> float:
    return round(x, 6)
