"""Is run B better than run A? Per-metric differences with paired bootstrap confidence intervals.

Two evaluations of the same tasks are paired: task t contributes one value per run (its pass^1, TCR,
turns ...), and the difference of the means is the mean of the per-task differences. The uncertainty
comes from which tasks happen to be in the set, so the bootstrap resamples *task ids* with replacement
(the same ids for both runs, which keeps the pairing) and recomputes the mean difference; the 2.5th and
97.5th percentiles of those resamples are the 95% interval. An interval that excludes 0 is a difference
the task set supports; one that straddles 0 is not (whatever the point estimate says).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from muarl.evaluate import RESULTS, RUN_CONFIG, TRAJECTORIES, EvalResult, result_from_trajectories
from muarl.provenance import KEY as PROVENANCE
from muarl.provenance import compare as compare_provenance

#: per-task values compared by default, besides pass^1 .. pass^k (k: the smaller of the two runs' k)
DEFAULT_METRICS: tuple[str, ...] = ("accuracy", "tcr", "avg_turns", "violation_rate", "transfer_rate")


@dataclass
class MetricDiff:
    """One metric's comparison over the shared tasks (B minus A)."""

    metric: str
    a: float
    b: float
    diff: float
    low: float
    high: float
    tasks: int

    @property
    def excludes_zero(self) -> bool:
        return self.low > 0 or self.high < 0


def load_run(path: str | Path) -> EvalResult:
    """A run directory with results.json, a results.json file, or a directory holding only a
    trajectories.jsonl (an interrupted run: its metrics are computed from the trajectories)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no such run: {path}")
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


def paired_bootstrap(a: Sequence[float], b: Sequence[float], samples: int = 10_000, seed: int = 0,
                     confidence: float = 0.95) -> tuple[float, float, float]:
    """(mean of b - a, low, high): the percentile interval of the mean paired difference."""
    if len(a) != len(b) or not a:
        raise ValueError("paired bootstrap needs two equally long, non-empty lists")
    if samples < 1 or not 0 < confidence < 1:
        raise ValueError("samples must be >= 1 and confidence in (0, 1)")
    diffs = np.asarray(b, dtype=np.float64) - np.asarray(a, dtype=np.float64)
    rng = np.random.default_rng(seed)
    means = np.empty(samples)
    chunk = max(1, 2_000_000 // len(diffs))  # bounds memory for large task sets
    for start in range(0, samples, chunk):
        stop = min(samples, start + chunk)
        idx = rng.integers(0, len(diffs), size=(stop - start, len(diffs)))
        means[start:stop] = diffs[idx].mean(axis=1)
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail])
    return float(diffs.mean()), float(low), float(high)


def available_metrics(run_a: EvalResult, run_b: EvalResult) -> list[str]:
    """Per-task metrics both runs have: pass^1 .. pass^min(k) and the defaults."""
    k = min(run_a.k, run_b.k)
    return [f"pass^{j}" for j in range(1, k + 1)] + list(DEFAULT_METRICS)


def compare_runs(run_a: EvalResult, run_b: EvalResult, metrics: Sequence[str] | None = None,
                 samples: int = 10_000, seed: int = 0, confidence: float = 0.95) -> dict[str, Any]:
    """Compare two evaluations over the tasks they share; raises ValueError when they cannot be compared.

    ``provenance`` lists, one line per field, where the two runs were made by different code, data, users
    or policies (:func:`muarl.provenance.compare`): a warning, not an error, since comparing two
    policies is the point, but the reader should know which other differences the numbers carry."""
    dom_a, dom_b = run_a.config.get("domain"), run_b.config.get("domain")
    if dom_a != dom_b:
        raise ValueError(f"the runs evaluate different domains ({dom_a} vs {dom_b}); nothing to pair")
    rows_a = {r["task_id"]: r for r in run_a.tasks}
    rows_b = {r["task_id"]: r for r in run_b.tasks}
    shared = [t for t in rows_a if t in rows_b]
    if not shared:
        raise ValueError(f"the runs share no task (A has {len(rows_a)}, B has {len(rows_b)}: different splits "
                         "or task lists?)")
    known = available_metrics(run_a, run_b)
    wanted = list(metrics) if metrics else known
    unknown = [m for m in wanted if m not in known]
    if unknown:
        raise ValueError(f"unknown metric(s) {', '.join(unknown)}; these runs have: {', '.join(known)}")
    diffs = []
    for metric in wanted:
        pairs = [(rows_a[t][metric], rows_b[t][metric]) for t in shared
                 if rows_a[t].get(metric) is not None and rows_b[t].get(metric) is not None]
        if not pairs:
            continue  # e.g. pass^3 when no shared task has 3 trials in both runs
        a, b = [p[0] for p in pairs], [p[1] for p in pairs]
        mean, low, high = paired_bootstrap(a, b, samples, seed, confidence)
        diffs.append(MetricDiff(metric, _r(sum(a) / len(a)), _r(sum(b) / len(b)), _r(mean), _r(low), _r(high),
                                len(pairs)))
    return {
        "domain": dom_a,
        "shared_tasks": len(shared),
        "only_a": len(rows_a) - len(shared),
        "only_b": len(rows_b) - len(shared),
        "samples": samples,
        "seed": seed,
        "confidence": confidence,
        "metrics": [{**asdict(d), "excludes_zero": d.excludes_zero} for d in diffs],
        "provenance": compare_provenance(run_a.provenance, run_b.provenance),
    }


def _r(x: float) -> float:
    return round(x, 6)
