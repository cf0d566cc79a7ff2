"""The ablation's results from its evaluations: paired comparisons, the (trained with) x (evaluated with)
matrix with intervals, ``summary.json``, ``table.md``, ``changed.md``, ``plots/`` and ``report.html``.

Everything here is computed from the files the ablation wrote (the evaluations' trajectories, the GRPO runs'
metrics), so a rerun of a finished ablation rebuilds it. The page is :mod:`muarl.report.comparison`'s, the
same the demo opens on; its tables are made of :func:`muarl.experiments.comparison.metric_rows` rows, the demo's, plus the
matrix (one row per evaluation user, one column per model, each cell's success with its own interval).
Differences are paired over the same tasks, users and trials, with percentile intervals of a bootstrap over
tasks (:func:`muarl.compare.compare_runs`); a cell's interval is the same bootstrap of its own mean.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from muarl.ablation.layout import COLD_START, describe, eval_name, interactive, slug
from muarl.ablation.page import write_page, write_plots
from muarl.experiments.comparison import changed_conversations, metric_rows
from muarl.experiments.recipe import DemoConfig
from muarl.experiments.stages import held_out_tasks

#: (model, evaluation user, greedy): one evaluation
Key = tuple[str, str, bool]


def _entry(comparison: Mapping[str, Any], metric: str) -> dict[str, float] | None:
    found = next((m for m in comparison["metrics"] if m["metric"] == metric), None)
    return None if found is None else {"diff": found["diff"], "low": found["low"], "high": found["high"]}


def _cell(run: Any, metric: str = "pass^1") -> dict[str, float]:
    """A model's mean ``metric`` over the tasks with the percentile interval of a bootstrap over tasks."""
    from muarl.compare import cluster_bootstrap

    values = [[float(row[metric])] for row in run.tasks if row.get(metric) is not None]
    mean, low, high = cluster_bootstrap(values)
    return {"value": round(mean, 6), "low": round(low, 6), "high": round(high, 6)}


@dataclass
class Evaluations:
    """A split's evaluations (``runs``, by :data:`Key`), each model's success with its interval (``cells``)
    and the paired comparisons (``comparisons``, by (minus, plus, user, greedy)) of ``differences``: the
    method minus every other trained model, then every trained model minus the cold start."""

    models: list[str]
    differences: list[tuple[str, str]]
    greedy: tuple[bool, ...]
    runs: dict[Key, Any] = field(default_factory=dict)
    cells: dict[Key, dict[str, float]] = field(default_factory=dict)
    comparisons: dict[tuple[str, str, str, bool], dict[str, Any]] = field(default_factory=dict)


def compare_all(where: Path, config: DemoConfig, arms: Mapping[str, str], evaluated: Sequence[str]) -> Evaluations:
    """Load every evaluation and compare every difference with every user (``comparisons/``: muarl compare's
    reports, one file each)."""
    from muarl.compare import compare_runs, load_run

    method = next(iter(arms))
    found = Evaluations([COLD_START, *arms],
                        [(other, method) for other in list(arms)[1:]] + [(COLD_START, a) for a in arms],
                        (False, True) if config.greedy else (False,))
    found.runs = {(m, u, g): load_run(where / eval_name(m, u, g))
                  for m in found.models for u in evaluated for g in found.greedy}
    found.cells = {key: _cell(run) for key, run in found.runs.items()}
    folder = where / "comparisons"
    folder.mkdir(exist_ok=True)
    for a, b in found.differences:
        for u in evaluated:
            for g in found.greedy:
                report = compare_runs(found.runs[(a, u, g)], found.runs[(b, u, g)])
                found.comparisons[(a, b, u, g)] = report
                name = f"{b}-minus-{a}.{slug(u)}{'-greedy' if g else ''}.json"
                (folder / name).write_text(json.dumps(report, indent=1) + "\n")
    return found


def build_tables(ev: Evaluations, config: DemoConfig, arms: Mapping[str, str], evaluated: Sequence[str],
                 headline: str) -> list[dict[str, Any]]:
    """The page's tables: the matrix first (a row per evaluation user, the headline's first; each model's
    success with its interval; each difference's paired interval), then every metric per evaluation user."""
    short = short_labels(arms)
    columns = [{"label": f"{short[b]} - {short[a]}", "minus": a, "plus": b} for a, b in ev.differences]

    def matrix_row(u: str, g: bool) -> dict[str, Any]:
        return {"metric": f"evaluated with {describe(u)}" + (", T = 0" if g else ""),
                "short": f"eval: {u}" + (", T = 0" if g else ""),
                "values": {m: ev.cells[(m, u, g)] for m in ev.models},
                "differences": [_entry(ev.comparisons[(a, b, u, g)], "pass^1") for a, b in ev.differences]}

    matrix = {"title": f"success (pass^1) on held-out {config.eval_split} tasks: the model trained with a user "
                       f"(columns) evaluated with a user (rows), T = {config.grpo.temperature:g} unless marked",
              "differences": columns,
              "rows": [matrix_row(u, g) for u in sorted(evaluated, key=lambda u: u != headline) for g in ev.greedy],
              "note": "Each cell: success with the 95% interval of a bootstrap over tasks. Each difference: paired "
                      "over the same tasks, users and trials, 95% interval of a bootstrap over tasks (muarl compare)."}
    tables = [matrix]
    for u in evaluated:
        metrics = {m: ev.runs[(m, u, False)].metrics for m in ev.models}
        greedy = ({m: ev.runs[(m, u, True)].metrics for m in ev.models},
                  [ev.comparisons[(a, b, u, True)] for a, b in ev.differences]) if config.greedy else None
        tables.append({"title": f"held-out {config.eval_split} tasks evaluated with {describe(u)}: every metric",
                       "differences": columns,
                       "rows": metric_rows(metrics, config.eval_k, [(a, b, ev.comparisons[(a, b, u, False)])
                                                                    for a, b in ev.differences], greedy)})
    return tables


def write_results(out: Path, where: Path, config: DemoConfig, *, preset: str, seed: int, arms: dict[str, str],
                  evaluated: Sequence[str], models: dict[str, Path], grpo_runs: dict[str, Path],
                  shared: dict[str, dict[str, Any]], method_from: dict[str, Any] | None,
                  seconds: dict[str, float], arm_recipes: Mapping[str, Mapping[str, Any]] | None = None
                  ) -> dict[str, Any]:
    """Compare, tabulate, plot and write every result file of a split (``where``); return the summary.
    ``arm_recipes``: the GRPO settings an arm was given of its own (``--arm-recipe``), by training user."""
    recipes = {arm_id: dict((arm_recipes or {}).get(user, {})) for arm_id, user in arms.items()}
    method = next(iter(arms))
    label = {COLD_START: "cold start",
             **{a: f"RL, {u} user" + (" (the method)" if a == method and len(arms) > 1 else "")
                + (f" ({_recipe_words(recipes[a])})" if recipes[a] else "") for a, u in arms.items()}}
    headline = interactive(evaluated)
    ev = compare_all(where, config, arms, evaluated)
    tables = build_tables(ev, config, arms, evaluated, headline)
    keys = [(u, g, f"{u}{'-greedy' if g else ''}") for u in evaluated for g in ev.greedy]
    total = round(sum(seconds.values()), 1)
    summary = {
        "preset": preset, "seed": seed, "domain": config.domain, "split": config.eval_split, "k": config.eval_k,
        "eval_tasks": config.eval_tasks, "task_ids": [t.id for t in held_out_tasks(config)],
        "train_users": list(arms.values()), "eval_users": list(evaluated), "method": method,
        "models": {m: str(p) for m, p in models.items()},
        "matrix": {name: {m: ev.cells[(m, u, g)] for m in ev.models} for u, g, name in keys},
        "differences": {f"{b} - {a}": {name: {d["metric"]: [d["diff"], d["low"], d["high"]]
                                              for d in ev.comparisons[(a, b, u, g)]["metrics"]}
                                       for u, g, name in keys} for a, b in ev.differences},
        "metrics": {m: {name: ev.runs[(m, u, g)].metrics for u, g, name in keys} for m in ev.models},
        "arms_share": shared, "arm_recipes": recipes, "method_from": method_from, "seconds": seconds, "total_seconds": total,
        "provenance": _provenance(config, models, arms, evaluated),
    }
    (where / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    (where / "table.md").write_text(markdown(tables, label), encoding="utf-8")
    changed = []
    if len(arms) > 1:
        other = list(arms)[1]
        changed.append(changed_conversations(where, runs=(eval_name(other, headline), eval_name(method, headline)),
                                             labels=(label[other], label[method]),
                                             title=f"Held-out conversations with {describe(headline)} that "
                                                   f"differ between {label[other]} and {label[method]}"))
    plots = write_plots(out, where, config, arms, evaluated, ev.cells, grpo_runs)
    console = Console()
    _warn_unshared(shared, recipes, method, console)
    console.print(rich_table(tables[0], arms))
    try:
        page = write_page(out, where, config, summary, tables, label, arms, headline, plots, grpo_runs)
        console.print(f"report: {page}")
    except Exception as err:  # the page is a convenience: never lose a finished ablation over it
        console.print(f"[yellow]report not written: {err}")
    console.print(f"total {total:.0f} s; run directory {out} (summary.json, table.md, "
                  + ", ".join(p.name for p in changed) + (", " if changed else "") + "plots/, report.html"
                  + (f"; this split's in {where}" if where != out else "") + ")")
    return summary


def _recipe_words(recipe: Mapping[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in recipe.items())


def expected_differences(recipes: Mapping[str, Mapping[str, Any]], method: str, arm_id: str) -> list[str]:
    """The settings two arms were meant to differ in: the user, and what either's own recipe set."""
    return sorted({"user", *recipes.get(method, {}), *recipes.get(arm_id, {})})


def _warn_unshared(shared: Mapping[str, Mapping[str, Any]], recipes: Mapping[str, Mapping[str, Any]], method: str,
                   console: Console) -> None:
    """Say loudly when the records show arms that differ in more than their user and their own recipes (an
    arm's recipe may also change which episodes it plays: more steps, dynamic sampling's refills)."""
    for arm_id, found in shared.items():
        meant = expected_differences(recipes, method, arm_id)
        own = bool(recipes.get(method) or recipes.get(arm_id))
        if not set(found["settings"]) <= set(meant) or not found["same_cold_start"] or \
                (not own and not found["same_episodes"]):
            console.print(f"[bold red]warning: the method's arm and {arm_id} differ in more than their user"
                          f"{' and their own recipes' if own else ''}: {found}")


def _provenance(config: DemoConfig, models: Mapping[str, Path], arms: Mapping[str, str],
                evaluated: Sequence[str]) -> dict[str, Any]:
    from muarl.domain import get_domain
    from muarl.provenance import record

    found = record([get_domain(config.domain)], {}, {"name": "several", "train_users": list(arms.values()),
                                                     "eval_users": list(evaluated)})
    found["policy"] = {m: {"spec": f"hf:{p}", "model": str(p)} for m, p in models.items()}
    return found


def _cells(row: Mapping[str, Any], table: Mapping[str, Any], ids: Sequence[str]) -> list[str]:
    from muarl.report.comparison import format_difference, format_value

    cells = []
    for m in ids:
        value = row["values"].get(m)
        if isinstance(value, Mapping):
            cells.append(f"{format_value(value['value'])} [{format_value(value['low'])}, {format_value(value['high'])}]")
        else:
            cells.append(format_value(value))
    for entry in row["differences"]:
        change, interval = format_difference(entry)
        cells.append(f"{change} {interval}".strip())
    return cells


def markdown(tables: Sequence[Mapping[str, Any]], label: Mapping[str, str]) -> str:
    """``table.md``: every table of the page, as Markdown."""
    parts = []
    for table in tables:
        ids = list(table.get("arms", label))
        head = ["metric", *(label[m] for m in ids), *(f"{d['label']} [95% interval]" for d in table["differences"])]
        lines = [f"## {table['title']}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join([row["metric"], *_cells(row, table, ids)]) + " |" for row in table["rows"]]
        if table.get("note"):
            lines += ["", table["note"]]
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"


def short_labels(arms: Mapping[str, str]) -> dict[str, str]:
    """The models in two words (``arms``: arm id -> the training user), for the differences' headings and
    the console."""
    return {COLD_START: "cold start", **{a: f"RL {u}" for a, u in arms.items()}}


def rich_table(table: Mapping[str, Any], arms: Mapping[str, str]) -> Table:
    """A page table on the console, in short words (a row's ``short`` name where it has one): a terminal is
    narrower than a page."""
    short = short_labels(arms)
    ids = list(table.get("arms", short))
    t = Table(title=table["title"])
    for col in ["", *(short[m] for m in ids),
                *(f"{d['label']} [95%]" for d in table["differences"])]:
        t.add_column(col, justify="left" if not col else "right")
    for row in table["rows"]:
        t.add_row(row.get("short", row["metric"]), *_cells(row, table, ids))
    return t
