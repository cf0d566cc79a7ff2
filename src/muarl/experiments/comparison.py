"""Comparing the models an experiment trained: paired intervals over the held-out tasks, the table, the
conversations RL changed, the plots and the report page (``muarl demo``'s; ``muarl ablate`` uses its rows,
plots and summaries)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.table import Table

from muarl.experiments.recipe import (
    GRPO,
)


def compare_evaluations(out: Path, suffix: str = "") -> dict[str, Any]:
    """``comparison.json``: after RL minus cold start per metric, paired over tasks with 95% bootstrap intervals
    (``suffix="-greedy"``: the greedy evaluations, ``comparison-greedy.json``)."""
    from muarl.compare import compare_runs, load_run

    comparison = compare_runs(load_run(out / f"eval-sft{suffix}"), load_run(out / f"eval-rl{suffix}"))
    (out / f"comparison{suffix}.json").write_text(json.dumps(comparison, indent=1) + "\n")
    return comparison


def _conversation(traj: Any) -> str:
    lines = []
    for m in traj.messages[1:]:
        calls = "; ".join(f"{c.name}({json.dumps(c.arguments)})" for c in m.tool_calls)
        text = (m.content or "").strip().replace("\n", " ")
        lines.append(f"- **{m.role}**: {text}" + (f" `{calls}`" if calls else ""))
    return "\n".join(lines)


def changed_summary(changes: list[Any]) -> str:
    """How many held-out episodes RL fixed and broke, as changed.md and the report say it."""
    fixed = sum(c.gain > 0 for c in changes)
    return (f"{fixed} episodes went from failure to success, {len(changes) - fixed} the other way (same task, "
            "same user seed, before and after).")


def changed_conversations(out: Path, shown: int = 3, runs: tuple[str, str] = ("eval-sft", "eval-rl"),
                          labels: tuple[str, str] = ("cold start", "after RL"),
                          title: str = "Held-out conversations that changed with RL") -> Path:
    """``changed.md`` in ``out``: held-out episodes of the evaluations ``runs`` (folders of
    ``out``: the cold start's and the RL model's) whose outcome differs, before and after, same task and
    same user seed (the same trial of the same task), the ones the second fixed first
    (:func:`muarl.report.comparison.paired_changes`); ``labels`` name the two sides."""
    from muarl.report.comparison import paired_changes

    changes = paired_changes(out / runs[0], out / runs[1])
    parts = [f"# {title}\n\n{changed_summary(changes)}\n"]
    for c in changes[:shown]:
        a, b = c.a, c.b
        parts.append(f"## {a.task_id}: {'fixed' if c.gain > 0 else 'broken'} ({labels[0]} -> {labels[1]})\n\n### {labels[0]} "
                     f"(reward {a.reward.reward if a.reward else 0:.0f})\n\n{_conversation(a)}\n\n### {labels[1]} "
                     f"(reward {b.reward.reward if b.reward else 0:.0f})\n\n{_conversation(b)}\n")
    path = out / "changed.md"
    path.write_text("\n".join(parts), encoding="utf-8")
    return path


#: the demo table's rows; "faults" is the fault rate by party, beside success because a policy fault counts
#: as a failure in pass^1 and a user or tool fault is left out of it
ROWS = (("success (pass^1)", "pass^1"), ("fault rate: policy / user / tool", "faults"), ("pass^k", None),
        ("truncation rate", "truncation_rate"), ("TCR", "tcr"), ("avg turns", "avg_turns"),
        ("violation rate", "violation_rate"), ("success within the policy (no violation)", "compliant_success"),
        ("malformed calls / episode", "malformed_calls"), ("user slips (muarl.users.slips)", "user_slip_rate"))
FAULT_KEYS = ("policy_fault_rate", "user_fault_rate", "tool_fault_rate")


def _value(metrics: dict[str, Any], key: str | None, k: int) -> float:
    return float(metrics.get(key or f"pass^{k}") or 0.0)


#: the arms of the demo's comparison: the cold start and the model after RL
ARMS = ("cold_start", "rl")


def metric_rows(arms: dict[str, dict[str, Any]], k: int,
                differences: list[tuple[str, str, dict[str, Any] | None]],
                greedy: tuple[dict[str, dict[str, Any]], list[dict[str, Any] | None]] | None = None
                ) -> list[dict[str, Any]]:
    """Rows of :data:`ROWS` as :func:`muarl.report.comparison.build_comparison_report` takes them: each arm's
    value (``arms``: arm id -> its evaluation's metrics) and one entry per difference (``(minus, plus,
    comparison)``: plus minus minus, with the paired 95% interval of ``comparison``, a :func:`muarl.compare.
    compare_runs` report, where it has the metric). ``greedy`` (the arms' metrics at T = 0 and the
    differences' comparisons at T = 0, in the same order) adds the greedy success and faults right below
    the sampled ones. The demo's table and the ablation's are made of these rows."""
    rows = []

    def row(label: str, key: str | None, metrics: dict[str, dict[str, Any]],
            cmps: list[dict[str, Any] | None]) -> dict[str, Any]:
        if key == "faults":  # one row, three parties: the interval column stays for single metrics
            parts = {arm: [_value(m, f, k) for f in FAULT_KEYS] for arm, m in metrics.items()}
            return {"metric": label, "values": {arm: " / ".join(f"{x:.3f}" for x in v) for arm, v in parts.items()},
                    "differences": [" / ".join(f"{y - x:+.3f}" for x, y in zip(parts[a], parts[b], strict=True))
                                    for a, b, _ in differences]}
        entries = []
        for (a, b, _), cmp in zip(differences, cmps, strict=True):
            m = {d["metric"]: d for d in (cmp or {}).get("metrics", [])}.get(key or f"pass^{k}")
            entries.append({"diff": _value(metrics[b], key, k) - _value(metrics[a], key, k),
                            **({"low": m["low"], "high": m["high"]} if m else {})})
        return {"metric": label.replace("pass^k", f"pass^{k}"),
                "values": {arm: _value(m, key, k) for arm, m in metrics.items()}, "differences": entries}

    for label, key in ROWS:
        rows.append(row(label, key, arms, [c for _, _, c in differences]))
        if greedy and key == "faults":  # the greedy success and faults right below the sampled ones
            rows.extend(row(f"{g_label}, T = 0", g_key, *greedy) for g_label, g_key in ROWS[:2])
    return rows


def table_rows(before: dict[str, Any], after: dict[str, Any], k: int, comparison: dict[str, Any] | None = None,
               greedy: tuple[dict[str, Any], dict[str, Any], dict[str, Any] | None] | None = None
               ) -> list[dict[str, Any]]:
    """The demo table's rows (:func:`metric_rows`): the cold start and after RL (:data:`ARMS`), one
    difference, after RL minus cold start; ``greedy`` is (before, after, comparison) at T = 0. The
    console's table and the report's are both made of these rows."""
    return metric_rows(dict(zip(ARMS, (before, after), strict=True)), k, [(*ARMS, comparison)],
                       (dict(zip(ARMS, greedy[:2], strict=True)), [greedy[2]]) if greedy else None)


def table_title(split: str, temperature: float, greedy: bool) -> str:
    """The demo table's title."""
    return (f"held-out {split} tasks: cold start vs after GRPO"
            + (f" (T = {temperature:g} unless marked T = 0)" if greedy else ""))


#: the console table's names for :data:`ROWS` (the report page keeps the long ones): short enough that a row
#: is one line at 80 columns; "faults" becomes one row per party
CONSOLE_NAMES = {"success (pass^1)": "pass^1", "success within the policy (no violation)": "compliant success",
                 "malformed calls / episode": "malformed/episode", "user slips (muarl.users.slips)": "user slips"}
PARTIES = ("policy", "user", "tool")


def table(before: dict[str, Any], after: dict[str, Any], k: int, comparison: dict[str, Any] | None = None,
          greedy: tuple[dict[str, Any], dict[str, Any], dict[str, Any] | None] | None = None,
          temperature: float = 1.0, split: str = "test") -> Table:
    """Cold start vs after RL, metric by metric, with the paired 95% interval of the change where known;
    ``greedy`` (before, after, comparison at T = 0) adds the greedy success and faults right below the
    sampled ones, so the two read side by side (:func:`table_rows`). Laid out for an 80-column terminal:
    short names (:data:`CONSOLE_NAMES`), a fault row per party, and the interval beside the change in one
    cell (``+0.145 [+0.055, +0.240]``), so that every row is one line."""
    from muarl.report.comparison import format_difference, format_value

    t = Table(title=table_title(split, temperature, greedy is not None))
    for col in ("metric", "cold start", "after RL", "change [95% interval]"):
        t.add_column(col, justify="left" if col == "metric" else "right")
    for row in table_rows(before, after, k, comparison, greedy):
        label, greedy_mark = row["metric"], ""
        if label.endswith(", T = 0"):
            label, greedy_mark = label.removesuffix(", T = 0"), ", T = 0"
        change, interval = format_difference(row["differences"][0])
        if label.startswith("fault rate:"):  # "a / b / c" per arm: one row per party
            values = [str(row["values"][arm]).split(" / ") for arm in ARMS]
            for i, party in enumerate(PARTIES):
                t.add_row(f"{party} faults{greedy_mark}", *(v[i] for v in values), change.split(" / ")[i])
            continue
        t.add_row(CONSOLE_NAMES.get(label, label) + greedy_mark, *(format_value(row["values"][arm]) for arm in ARMS),
                  f"{change} {interval}".strip())
    return t


def series(path: Path, key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of ``key`` in a ``metrics.jsonl``-like file (nothing when the file is missing)."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    rows = [r for r in rows if key in r]
    return [r["step"] for r in rows], [r[key] for r in rows]


def pyplot() -> Any:
    """matplotlib's pyplot on the file-only backend (no display on a server, nor needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_cold_start(out: Path, folder: Path) -> Path:
    """``cold_start.png``: the SFT loss of a cold start trained here, else the shipped base's pretraining
    curve, which travels with it."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5, 3.2))
    if (out / "sft" / "metrics.jsonl").exists():
        ax.plot(*series(out / "sft" / "metrics.jsonl", "loss"))
        ax.set(title="SFT: loss on agent tokens", xlabel="optimizer step", ylabel="cross-entropy")
    else:
        from muarl.models import base_path

        curve = base_path() / "curve.jsonl"
        ax.plot(*series(curve, "loss"), label="loss on agent tokens")
        ax.plot(*series(curve, "copy_accuracy"), label="held-out copy accuracy", marker="o", markersize=3)
        ax.set(title="cold-start base: muarl pretrain", xlabel="optimizer step")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(folder / "cold_start.png", dpi=110)
    plt.close(fig)
    return folder / "cold_start.png"


def plot_grpo(run: Path, path: Path, title: str = "GRPO: training dynamics") -> Path:
    """``path``: a GRPO run's reward, violation rate and groups all wrong / all correct, per step."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5, 3.2))
    for key in ("reward", "violation_rate", "all_wrong_groups", "all_correct_groups"):
        ax.plot(*series(run / "metrics.jsonl", key), label=key, marker="o", markersize=3)
    ax.set(title=title, xlabel="step", ylim=(-0.02, 1.02))
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot(out: Path, where: Path | None = None) -> list[Path]:
    """``plots/`` in ``where`` (a split's folder; default ``out``): SFT loss, GRPO reward and violation rate
    per step, SFT vs RL on the split's held-out tasks."""
    plt = pyplot()
    where = out if where is None else where
    folder = where / "plots"
    folder.mkdir(exist_ok=True)
    written = [plot_cold_start(out, folder)]

    written.append(plot_grpo(out / "grpo", folder / "grpo_dynamics.png"))

    summary = json.loads((where / "summary.json").read_text())
    labels = ["pass^1", f"pass^{summary['k']}", "violation_rate"]
    fig, ax = plt.subplots(figsize=(5, 3.2))
    xs = range(len(labels))
    ax.bar([x - 0.2 for x in xs], [summary["sft"].get(k) or 0 for k in labels], width=0.4, label="cold start")
    ax.bar([x + 0.2 for x in xs], [summary["rl"].get(k) or 0 for k in labels], width=0.4, label="after RL")
    ax.set_xticks(list(xs), labels)
    ax.set(title=f"held-out {summary.get('split', 'test')} tasks", ylim=(0, 1))
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(folder / "eval.png", dpi=110)
    written.append(folder / "eval.png")
    plt.close(fig)
    return written


#: held-out episodes the report shows side by side: this many that RL fixed, then up to half as many it broke
REPORT_PAIRS = 6
#: the evaluations the report links to, by folder: (label, arm, greedy)
EVALUATIONS = (("eval-sft", "cold start", False), ("eval-rl", "after RL", False),
               ("eval-sft-greedy", "cold start", True), ("eval-rl-greedy", "after RL", True))


def report(out: Path, where: Path | None = None) -> Path:
    """``report.html`` of a split (in ``where``, default ``out``): the comparison page
    (:func:`muarl.report.comparison.build_comparison_report`), opening on the cold start vs after RL table
    with its paired intervals, then the plots, the held-out conversations RL changed side by side and links
    into the run viewer's pages, which it writes beside the runs they show (``grpo/report.html``: training
    curves, rollouts, groups; ``eval-*/report.html``: every held-out episode). Made from the files the
    demo wrote (``summary.json``, ``comparison*.json``, ``plots/``, the evaluations' trajectories), so a rerun
    of a finished demo rebuilds it."""
    from muarl.report.comparison import build_comparison_report, change_pair, href, paired_changes
    from muarl.report.html import build_report

    where = out if where is None else where
    page = where / "report.html"
    summary = json.loads((where / "summary.json").read_text())
    settings = json.loads((out / "demo.json").read_text()) if (out / "demo.json").exists() else {}
    temperature = float(settings.get("grpo.temperature", GRPO.temperature))
    split, k = summary.get("split", "test"), summary["k"]

    def read(name: str) -> dict[str, Any] | None:
        return json.loads((where / name).read_text()) if (where / name).exists() else None

    comparison, comparison_greedy = read("comparison.json"), read("comparison-greedy.json")
    greedy = ((summary["sft_greedy"], summary["rl_greedy"], comparison_greedy) if "rl_greedy" in summary else None)
    viewers: dict[str, Path] = {}  # the viewer's page of each run, every episode in it (the links' numbers)
    for name in ("grpo", *(e[0] for e in EVALUATIONS)):
        run = out / name if name == "grpo" else where / name
        if run.exists():
            viewers[name] = build_report(run, max_trajectories=5000 if name == "grpo" else 0)

    changes = paired_changes(where / "eval-sft", where / "eval-rl")
    fixed = [c for c in changes if c.gain > 0]
    broken = [c for c in changes if c.gain < 0]
    shown = fixed[:REPORT_PAIRS] + broken[:max(1, REPORT_PAIRS // 2)]
    pairs = [change_pair(c, ("cold start", "after RL"),
                         (href(viewers["eval-sft"], page, f"traj/{c.a_index}"),
                          href(viewers["eval-rl"], page, f"traj/{c.b_index}")),
                         title=f"{c.a.task_id} (user seed {c.a.user_seed}): {'fixed' if c.gain > 0 else 'broken'} "
                               f"by RL, reward {c.a.reward.reward if c.a.reward else 0:g} to "
                               f"{c.b.reward.reward if c.b.reward else 0:g}")
             for c in shown]

    links = []
    if "grpo" in viewers:
        links += [{"label": "GRPO training curves", "href": href(viewers["grpo"], page, "training"),
                   "detail": "reward, groups all correct / all wrong, turns, KL, ... per step"},
                  {"label": "GRPO rollouts, groups side by side", "href": href(viewers["grpo"], page, "groups"),
                   "detail": "every training episode with its advantage"}]
    for name, label, is_greedy in EVALUATIONS:
        if name in viewers:
            links.append({"label": f"{label}: held-out episodes, {'greedy (T = 0)' if is_greedy else f'T = {temperature:g}'}",
                          "href": href(viewers[name], page, "trajectories"), "detail": f"{name}/"})
    links += [{"label": name, "href": href(where / name, page), "detail": what}
              for name, what in (("comparison.json", "the paired intervals, every metric"),
                                 ("comparison-greedy.json", "the same, greedy"),
                                 ("summary.json", "the figures and their provenance"),
                                 ("changed.md", "the first changed conversations as text"))
              if (where / name).exists()]

    note = ("Change: after RL minus cold start, on the same tasks, users and trials. Interval: paired "
            "bootstrap over tasks" + (f", {comparison['samples']} resamples" if comparison else "")
            + " (muarl compare).")
    seconds = summary.get("total_seconds")
    plots = [("cold_start.png", "the cold start: its training curve"),
             ("grpo_dynamics.png", "GRPO, per step: reward, violation rate, groups all wrong / all correct"),
             ("eval.png", f"held-out {split} tasks: success and violations before and after RL")]
    spec = {
        "title": "muarl demo: cold start vs after RL",
        "subtitle": str(out.resolve().name) + ("" if where == out else f"/{where.name}"),
        "arms": [{"id": ARMS[0], "label": "cold start", "detail": "the model GRPO starts from",
                  **({"href": href(viewers["eval-sft"], page, "trajectories")} if "eval-sft" in viewers else {})},
                 {"id": ARMS[1], "label": "after RL",
                  "detail": f"after GRPO with the scripted user in every rollout ({settings.get('grpo.steps', '?')} "
                            "steps)",
                  **({"href": href(viewers["eval-rl"], page, "trajectories")} if "eval-rl" in viewers else {})}],
        "tables": [{"title": table_title(split, temperature, greedy is not None),
                    "differences": [{"label": "change", "minus": ARMS[0], "plus": ARMS[1]}],
                    "rows": table_rows(summary["sft"], summary["rl"], k, comparison, greedy), "note": note}],
        "facts": {"domain": summary.get("domain"), "held-out tasks": f"{summary.get('eval_tasks')} of the {split} "
                  f"split, {k} trials each", "seed": summary.get("seed"), "preset": summary.get("preset"),
                  **({"minutes": round(seconds / 60, 1)} if seconds is not None else {})},
        # absolute: the page's relative paths start from its own folder, and ``where`` may itself be relative
        "plots": [{"path": (where / "plots" / name).resolve(), "caption": caption} for name, caption in plots
                  if (where / "plots" / name).exists()],
        "changed": {"title": "held-out conversations RL changed", "summary": changed_summary(changes)
                    + (f" Shown: {len(fixed[:REPORT_PAIRS])} fixed, {len(broken[:max(1, REPORT_PAIRS // 2)])} "
                       "broken; every episode is in the viewer." if changes else ""),
                    "pairs": pairs},
        "links": links,
    }
    return build_comparison_report(spec, page)


