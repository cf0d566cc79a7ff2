"""The ablation's plots and ``report.html``: the comparison page of :mod:`muarl.report.comparison` (the one the
demo opens on), its tables first, then the plots, the conversations the method changed against the other
training user's RL, and links into the run viewer's pages of every GRPO run and evaluation."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from muarl.ablation.layout import COLD_START, describe, eval_name
from muarl.experiments.comparison import changed_summary
from muarl.experiments.recipe import DemoConfig

#: changed conversations shown on the page: this many the method fixed, then up to half as many it broke
REPORT_PAIRS = 6


def write_plots(out: Path, where: Path, config: DemoConfig, arms: Mapping[str, str], evaluated: Sequence[str],
           cells: Mapping[Any, Mapping[str, float]], grpo_runs: Mapping[str, Path]) -> list[dict[str, Any]]:
    """``plots/``: the cold start, each arm's GRPO dynamics and the matrix as bars with their intervals."""
    from muarl.experiments.comparison import plot_cold_start, plot_grpo, pyplot

    folder = (where / "plots").resolve()  # absolute: the page's relative paths start from its own folder
    folder.mkdir(exist_ok=True)
    plots = [{"path": plot_cold_start(out, folder), "caption": "the cold start every arm starts from"}]
    for a, user in arms.items():
        plots.append({"path": plot_grpo(grpo_runs[a], folder / f"grpo_{a}.png", f"GRPO with the {user} user"),
                      "caption": f"GRPO with the {user} user, per step (its reward is with that user)"})
    plt = pyplot()
    ids = [COLD_START, *arms]
    fig, ax = plt.subplots(figsize=(1.6 + 1.6 * len(evaluated), 3.4))
    width = 0.8 / len(ids)
    for n, m in enumerate(ids):
        values = [cells[(m, u, False)] for u in evaluated]
        xs = [i + (n - (len(ids) - 1) / 2) * width for i in range(len(evaluated))]
        heights = [v["value"] for v in values]
        ax.bar(xs, heights, width=width, label=m,
               yerr=[[h - v["low"] for h, v in zip(heights, values, strict=True)],
                     [v["high"] - h for h, v in zip(heights, values, strict=True)]], capsize=3)
    ax.set_xticks(range(len(evaluated)), [f"eval: {u}" for u in evaluated])
    ax.set(title=f"held-out {config.eval_split} tasks: pass^1 (95% interval)", ylim=(0, 1))
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(folder / "matrix.png", dpi=110)
    plt.close(fig)
    plots.append({"path": folder / "matrix.png",
                  "caption": "success of each model (trained with a user) with each evaluation user"})
    return plots


def write_page(out: Path, where: Path, config: DemoConfig, summary: Mapping[str, Any], tables: list[dict[str, Any]],
          label: Mapping[str, str], arms: Mapping[str, str], headline: str, plots: list[dict[str, Any]],
          grpo_runs: Mapping[str, Path]) -> Path:
    """``report.html``: the comparison page, opening on the matrix, with the viewer's pages of every GRPO
    run and evaluation written beside them (a reused demo run's in this run's folder) and linked."""
    from muarl.report.comparison import build_comparison_report, change_pair, href, paired_changes
    from muarl.report.html import build_report

    page = where / "report.html"
    method = next(iter(arms))
    viewers: dict[str, Path] = {}
    for a, run in grpo_runs.items():
        viewer = run / "report.html" if run.is_relative_to(out.resolve()) or run.is_relative_to(out) else \
            out / a / "report.html"
        viewers[a] = build_report(run, viewer, max_trajectories=5000)
    greedy_flags = (False, True) if config.greedy else (False,)
    for m in [COLD_START, *arms]:
        for u in summary["eval_users"]:
            for g in greedy_flags:
                viewers[eval_name(m, u, g)] = build_report(where / eval_name(m, u, g), max_trajectories=0)
    changed = None
    if len(arms) > 1:
        other = list(arms)[1]
        a_run, b_run = eval_name(other, headline), eval_name(method, headline)
        changes = paired_changes(where / a_run, where / b_run)
        fixed, broken = [c for c in changes if c.gain > 0], [c for c in changes if c.gain < 0]
        shown = fixed[:REPORT_PAIRS] + broken[:max(1, REPORT_PAIRS // 2)]
        changed = {"title": f"held-out conversations with {describe(headline)}: {label[other]} vs {label[method]}",
                   "summary": changed_summary(changes),
                   "pairs": [change_pair(c, (label[other], label[method]),
                                         (href(viewers[a_run], page, f"traj/{c.a_index}"),
                                          href(viewers[b_run], page, f"traj/{c.b_index}"))) for c in shown]}
    links = [{"label": f"GRPO with the {u} user: training curves", "href": href(viewers[a], page, "training"),
              "detail": "reward, groups, turns, ... per step"} for a, u in arms.items()]
    links += [{"label": f"{label[m]} evaluated with {describe(u)}{', T = 0' if g else ''}",
               "href": href(viewers[eval_name(m, u, g)], page, "trajectories"), "detail": eval_name(m, u, g)}
              for u in summary["eval_users"] for g in greedy_flags for m in [COLD_START, *arms]]
    links += [{"label": name, "href": href(where / name, page), "detail": what}
              for name, what in (("summary.json", "every figure and interval, the arms' records"),
                                 ("table.md", "the tables as Markdown"), ("changed.md", "changed conversations"))
              if (where / name).exists()]
    shared = summary["arms_share"]
    facts = {"domain": config.domain, "held-out tasks": f"{config.eval_tasks} of the {config.eval_split} split, "
             f"{config.eval_k} trials each", "seed": summary["seed"], "preset": summary["preset"],
             **{f"{label[method]} vs {label[a]}, from their records": (
                 f"settings differ in {', '.join(found['settings']) or 'nothing'}; same cold start: "
                 f"{'yes' if found['same_cold_start'] else 'NO'}; same tasks and user seeds at all "
                 f"{found['steps']} steps: {'yes' if found['same_episodes'] else 'NO'}") for a, found in shared.items()},
             **({"method's model from": summary["method_from"]["run"]} if summary["method_from"] else {}),
             "minutes": round(summary["total_seconds"] / 60, 1)}
    spec = {
        "title": "muarl ablate: RL with the user in the loop vs without",
        "subtitle": str(out.resolve().name) + ("" if where == out else f"/{where.name}"),
        "arms": [{"id": m, "label": label[m],
                  "detail": "the model every arm starts from" if m == COLD_START else
                  f"GRPO with the {arms[m]} user in every rollout "
                  f"({summary['arm_recipes'].get(m, {}).get('steps', config.grpo.steps)} steps)",
                  "href": href(viewers[eval_name(m, headline)], page, "trajectories")} for m in [COLD_START, *arms]],
        "tables": tables,
        "intro": "The same GRPO (steps, seeds, tasks, user seeds) from the same cold start, one model per training "
                 "user, every model evaluated on the same held-out tasks with every evaluation user.",
        "facts": facts, "plots": plots, "links": links, **({"changed": changed} if changed else {}),
    }
    return build_comparison_report(spec, page)
