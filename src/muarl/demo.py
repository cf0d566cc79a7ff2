"""``muarl demo``: MUA-RL on a CPU, from the shipped cold-start base to an agent RL made better.

Top to bottom, each stage in its own folder of the run directory:

1. ``model/``: the starting model. By default the shipped base (``hf:tiny``, trained by ``muarl
   pretrain`` on an unlimited stream of expert conversations: it copies identifiers; docs/base_model.md).
   With ``base="scratch"`` the older recipe instead: the embedded model from random weights, then
   ``synth/`` (the expert teacher against the scripted user; clean wins), ``sft-prefix/`` (optional, SFT
   on the conversations' openings) and ``sft/`` (SFT on whole conversations).
2. ``eval-sft/``: the cold start on held-out tasks of the evaluation split (``eval_split``), ``k``
   sampled trials each (T = 1); ``eval-sft-greedy/``: the same tasks and users, greedy (T = 0).
3. ``grpo/``: GRPO from it with the scripted user in every rollout (on the train split).
4. ``eval-rl/``, ``eval-rl-greedy/``: the RL model on the same held-out tasks, same users, same trials.
5. ``summary.json``, ``comparison.json`` and ``comparison-greedy.json`` (paired bootstrap intervals, as
   ``muarl compare``), ``changed.md`` (held-out conversations that changed), ``plots/`` and ``report.html``
   (:func:`report`: the table, the plots and the changed conversations, linked into the viewer's pages of
   ``grpo/`` and the evaluations).

The evaluation split is the protocol's lever: a recipe is chosen on ``dev`` and the ``test`` split is
scored once per reported figure. Both splits' evaluations share one run directory and so one trained
model: the test split's stages 2, 4 and 5 write to the directory itself (as before the split existed), the
dev split's to ``dev/`` inside it, and a rerun with the other ``eval_split`` only evaluates (the model,
SFT and GRPO stages are found done). Training never sees either split.

The domain is ``retail-lite-forgetful``: retail narrowed to cancelling and returning, with terse tools
(short enough conversations to learn on two cores), played by users of whom only a quarter remember
the email on their account, where the cold start saw 70%: its habit of asking for the email first fails
on most of them, and RL with the simulated user in the loop has something to teach. Evaluation samples at the training
temperature: the demo shows what RL changes in the policy the model actually is; the greedy evaluations
(``greedy=True``, the default) show the same for the model's most likely answers, which is how a model is
usually deployed and evaluated (``muarl eval``'s default). Every stage resumes:
rerunning the same command after an interruption continues where it stopped (finished stages are
skipped, training resumes from its last checkpoint, evaluation from its last finished episode).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.console import Console

from muarl.experiments.comparison import (
    changed_conversations,
    compare_evaluations,
    plot,
    report,
    table,
)
from muarl.experiments.recipe import (
    EVAL_ONLY,
    PRESETS,
    SHARED_STAGES,
    DemoConfig,
    check_base,
)
from muarl.experiments.stages import (
    Stages,
    Stopped,
    check_settings,
    cold_start,
    evaluate_model,
    held_out_tasks,
    provenance,
    reinforce,
    split_dir,
)

STAGES = ("model", "synth", "sft-prefix", "sft", "eval-sft", "eval-sft-greedy", "grpo", "eval-rl", "eval-rl-greedy")


def run_demo(out: str | Path = "runs/demo", preset: str = "default", seed: int = 0, progress: bool = True,
             stop_after: str | None = None, **overrides: Any) -> dict[str, Any]:
    """Run (or resume) every stage; returns the summary written to the split's ``summary.json``. ``overrides``
    change the preset's knobs (:meth:`DemoConfig.with_overrides`: ``greedy=False``, ``grpo={"lr": 1e-4}``,
    ``eval_split="dev"``). ``stop_after`` ends the run after that stage (say ``eval-sft``, to measure an SFT
    recipe without the GRPO stage); rerunning without it continues from there."""
    if stop_after is not None and stop_after not in STAGES:
        raise ValueError(f"unknown stage {stop_after!r}; choose from {', '.join(STAGES)}")
    if preset not in PRESETS:
        raise ValueError(f"unknown demo preset {preset!r}; choose from {', '.join(PRESETS)}")
    config = PRESETS[preset].with_overrides(**overrides)
    check_base(config.base)
    held_out_tasks(config)  # too few tasks in the split: say so now, not after the training
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    where = split_dir(out, config.eval_split)
    where.mkdir(exist_ok=True)
    settings = {"preset": preset, "seed": seed,
                **{k: v for k, v in config.settings().items() if k not in EVAL_ONLY}}
    check_settings(out / "demo.json", settings, DemoConfig().settings(), "a demo")
    console = Console()
    prefix = "" if where == out else f"{config.eval_split}/"
    stage = Stages(out, prefix, SHARED_STAGES, stop_after)

    try:
        sft_model = cold_start(out, config, seed, progress, stage)
        before = stage("eval-sft", evaluate_model, where, "eval-sft", config, sft_model, seed, progress)
        if config.greedy:
            before_greedy = stage("eval-sft-greedy", evaluate_model, where, "eval-sft-greedy", config, sft_model,
                                  seed, progress, 0.0)
        rl_model = stage("grpo", reinforce, out, config, sft_model, seed, progress)
        after = stage("eval-rl", evaluate_model, where, "eval-rl", config, rl_model, seed, progress)
        if config.greedy:
            after_greedy = stage("eval-rl-greedy", evaluate_model, where, "eval-rl-greedy", config, rl_model, seed,
                                 progress, 0.0)
    except Stopped:
        console.print(f"stopped after {stop_after}; rerun without --stop-after to go on")
        return {"preset": preset, "seed": seed, "stopped_after": stop_after, "seconds": stage.clock}
    seconds = stage.seconds()
    summary = {"preset": preset, "seed": seed, "domain": config.domain, "split": config.eval_split,
               "k": config.eval_k, "eval_tasks": config.eval_tasks,
               "task_ids": [t.id for t in held_out_tasks(config)], "sft": before, "rl": after,
               "seconds": seconds, "total_seconds": round(sum(seconds.values()), 1)}
    comparison = compare_evaluations(where)
    summary["comparison"] = {m["metric"]: [m["diff"], m["low"], m["high"]] for m in comparison["metrics"]}
    greedy = None
    if config.greedy:
        comparison_greedy = compare_evaluations(where, "-greedy")
        summary.update({"sft_greedy": before_greedy, "rl_greedy": after_greedy, "comparison_greedy": {
            m["metric"]: [m["diff"], m["low"], m["high"]] for m in comparison_greedy["metrics"]}})
        greedy = (before_greedy, after_greedy, comparison_greedy)
    summary["provenance"] = provenance(config, sft_model, rl_model)
    (where / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    changed = changed_conversations(where)
    plot(out, where)
    try:
        page = report(out, where)
    except Exception as err:  # the report is a convenience: never lose a finished demo over it
        page = None
        console.print(f"[yellow]report not written: {err}")
    console.print(table(before, after, config.eval_k, comparison, greedy, config.grpo.temperature, config.eval_split))
    console.print(f"total {summary['total_seconds']:.0f} s ({config.eval_split} split); run directory {out} "
                  f"(plots/, report.html, summary.json, {changed.name}: held-out conversations RL changed"
                  + (f"; this split's in {where}" if where != out else "") + ")")
    if page is not None:
        console.print(f"report: {page}")
    return summary
