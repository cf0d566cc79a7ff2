"""``muarl demo``: MUA-RL on a CPU, from the shipped cold-start base to an agent RL made better.

Top to bottom, each stage in its own folder of the run directory:

1. ``model/``: the starting model. By default the shipped base (``hf:tiny``, trained by ``muarl
   pretrain`` on an unlimited stream of expert conversations: it copies identifiers; docs/base_model.md).
   With ``base="scratch"`` the older recipe instead: the embedded model from random weights, then
   ``synth/`` (the expert teacher against the scripted user; clean wins), ``sft-prefix/`` (optional, SFT
   on the conversations' openings) and ``sft/`` (SFT on whole conversations).
2. ``eval-sft/``: the cold start on held-out test tasks, ``k`` sampled trials each (T = 1);
   ``eval-sft-greedy/``: the same tasks and users, greedy (T = 0).
3. ``grpo/``: GRPO from it with the scripted user in every rollout.
4. ``eval-rl/``, ``eval-rl-greedy/``: the RL model on the same test tasks, same users, same trials.
5. ``summary.json``, ``comparison.json`` and ``comparison-greedy.json`` (paired bootstrap intervals, as
   ``muarl compare``), ``changed.md`` (held-out conversations that changed), ``plots/`` and ``report.html``.

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

import argparse
import json
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table


@dataclass(frozen=True)
class DemoConfig:
    """Every knob of the demo; :data:`PRESETS` holds the default run (timed in the README) and the smoke run.

    The defaults are the measured recipe of docs/research/rl-beats-cold-start.md: RL on users who behave
    otherwise than the cold start's (most forgot their email), 45 steps at lr 2e-4 with two updates per
    batch of rollouts, no KL term, run-on episodes out of the gradient.
    """

    domain: str = "retail-lite-forgetful"
    base: str = "shipped"  # shipped: start from the packaged cold-start base; scratch: random weights + synth + SFT
    # the embedded model (base="scratch")
    hidden_size: int = 64
    layers: int = 2
    heads: int = 4
    head_dim: int = 0  # 0: hidden_size / heads. 64 learns to copy ids far sooner (README, demo status)
    kv_heads: int = 0  # 0: heads / 2
    prompt: str = "full"  # the chat template's system turn: full, or compact (tool names only)
    # cold-start data: which families the teacher plays, how many of its conversations SFT uses
    sft_conversations: int = 400
    synth_families: tuple[str, ...] = ()
    # SFT, first on the conversations' openings (0: skip), then on whole conversations
    prefix_calls: int = 0  # openings cut after the agent's Nth tool call: copying ids is learned there first
    prefix_epochs: int = 20
    prefix_batch: int = 8
    sft_epochs: int = 2
    sft_lr: float = 3e-3
    sft_batch: int = 2  # small batches: a model this size learns per step, not per token
    fresh_ids: bool = False  # rename ids afresh every step (both SFT stages), so they must be copied, not recalled
    # GRPO
    grpo_steps: int = 45
    tasks_per_step: int = 8
    group_size: int = 8
    grpo_lr: float = 2e-4
    kl_beta: float = 0.0
    num_iterations: int = 2  # optimizer steps per batch of rollouts (GRPO's mu)
    dynamic_sampling: bool = False  # DAPO: refill the update with groups that have a learning signal
    mask_truncated: bool = True  # DAPO's overlong filtering: run-on episodes stay out of the gradient
    penalize_violations: bool = True
    # 0: a rule-breaking episode scores as a plain failure. Below 0 lowered violations but cut the success gain
    # (seed 2: -1 gave +0.035, -0.25 gave +0.075, 0 gave +0.185; docs/research/rl-beats-cold-start.md)
    violation_reward: float = 0.0
    max_new_tokens: int = 200
    max_turns: int = 16
    # evaluation
    eval_tasks: int = 50
    eval_k: int = 4
    temperature: float = 1.0
    # also evaluate greedily (T = 0), before and after RL, on the same tasks and users: two more evaluations
    greedy: bool = True


PRESETS: dict[str, DemoConfig] = {
    "default": DemoConfig(),
    # smoke: every stage of the default run, briefly (CI runs it)
    "smoke": DemoConfig(grpo_steps=2, tasks_per_step=2, group_size=4, max_new_tokens=48, max_turns=8, eval_tasks=4,
                        eval_k=2),
    # smoke-scratch: the from-random-weights recipe's stages (compact prompt, openings first, fresh ids), briefly
    "smoke-scratch": DemoConfig(base="scratch", prompt="compact", prefix_calls=2, prefix_epochs=1, fresh_ids=True,
                                sft_conversations=24, sft_epochs=1, sft_batch=8, grpo_steps=2, tasks_per_step=2,
                                group_size=4, max_new_tokens=48, max_turns=8, eval_tasks=4, eval_k=2),
}


def _done(folder: Path) -> bool:
    return (folder / "DONE").exists()


def _mark(folder: Path, **info: Any) -> None:
    (folder / "DONE").write_text(json.dumps(info) + "\n")


BASES = ("shipped", "scratch")


def build_model(out: Path, config: DemoConfig, seed: int) -> Path:
    """Stage 1: the shipped base, or (``base="scratch"``) the tiny model from random weights of ``seed``."""
    from muarl.models import base_path
    from muarl.tiny_model import build_shaped

    if config.base == "shipped":
        return base_path()
    folder = out / "model"
    if not _done(folder):
        if not (folder / "config.json").exists():  # the tokenizer is the cached tiny model's (trained once)
            build_shaped(folder, config.hidden_size, config.layers, config.heads, config.head_dim, config.kv_heads,
                         seed, config.prompt)
        _mark(folder)
    return folder


def synthesize_data(out: Path, config: DemoConfig, seed: int) -> Path:
    """Stage 2: expert x scripted user on training tasks; the clean wins as a chat data set."""
    from muarl.domain import get_domain
    from muarl.factory import make_policy, make_user
    from muarl.synth import synthesize

    folder = out / "synth"
    if not _done(folder):
        report = synthesize([get_domain(config.domain)], make_policy("expert"), make_user("scripted"), folder,
                            families=list(config.synth_families) or None, seed=seed, progress=False)
        lines = (folder / "sft.jsonl").read_text(encoding="utf-8").splitlines()
        (folder / "sft_used.jsonl").write_text("\n".join(lines[:config.sft_conversations]) + "\n", encoding="utf-8")
        _mark(folder, **report.as_dict())
    return folder / "sft_used.jsonl"


def opening_supervised(out: Path, config: DemoConfig, model: Path, data: Path, seed: int, progress: bool) -> Path:
    """Stage 3a (when ``prefix_calls``): SFT on the conversations' openings, where a model from random
    weights learns to copy ids many times sooner than from whole ones (:func:`muarl.synth.prefix_record`)."""
    from muarl.synth import write_prefixes
    from muarl.train.sft import SFTConfig, train_sft

    folder = out / "sft-prefix"
    if not config.prefix_calls:
        return model
    if not _done(folder):
        folder.mkdir(exist_ok=True)
        openings = folder / "openings.jsonl"
        write_prefixes(data, openings, config.prefix_calls)
        train_sft(SFTConfig(model=str(model), data=[str(openings)], out=str(folder), epochs=config.prefix_epochs,
                            lr=config.sft_lr, batch_size=config.prefix_batch, warmup_steps=2, max_len=0,
                            packing=False, seed=seed, save_every=100, fresh_ids=config.fresh_ids,
                            report_to="tensorboard"),
                  progress=progress)
        _mark(folder)
    return folder / "model"


def supervised(out: Path, config: DemoConfig, model: Path, data: Path, seed: int, progress: bool) -> Path:
    """Stage 3: SFT on the synthesized conversations."""
    from muarl.train.sft import SFTConfig, train_sft

    folder = out / "sft"
    if not _done(folder):
        train_sft(SFTConfig(model=str(model), data=[str(data)], out=str(folder), epochs=config.sft_epochs,
                            lr=config.sft_lr, batch_size=config.sft_batch, warmup_steps=2, max_len=0,
                            packing=False, seed=seed, save_every=100, fresh_ids=config.fresh_ids,
                            report_to="tensorboard"), progress=progress)
        _mark(folder)
    return folder / "model"


def reinforce(out: Path, config: DemoConfig, model: Path, seed: int, progress: bool) -> Path:
    """Stage 5: GRPO from the SFT model, the scripted user in every rollout."""
    from muarl.train.grpo import GRPOConfig, train_grpo

    folder = out / "grpo"
    if not _done(folder):
        train_grpo(GRPOConfig(model=str(model), domain=config.domain, out=str(folder), steps=config.grpo_steps,
                              tasks_per_step=config.tasks_per_step, group_size=config.group_size, lr=config.grpo_lr,
                              kl_beta=config.kl_beta, temperature=config.temperature,
                              max_new_tokens=config.max_new_tokens, max_turns=config.max_turns,
                              penalize_violations=config.penalize_violations,
                              violation_reward=config.violation_reward, seed=seed, save_every=2,
                              num_iterations=config.num_iterations, dynamic_sampling=config.dynamic_sampling,
                              mask_truncated=config.mask_truncated,
                              report_to="tensorboard"), progress=progress)
        _mark(folder)
    return folder / "model"


def evaluate_model(out: Path, name: str, config: DemoConfig, model: Path, seed: int, progress: bool,
                   temperature: float | None = None) -> dict[str, Any]:
    """Stages 4 and 6: ``k`` trials of the first ``eval_tasks`` test tasks (same users for both), sampled at
    the training temperature unless ``temperature`` is given (0: greedy)."""
    from muarl.domain import get_domain
    from muarl.evaluate import evaluate
    from muarl.models import load
    from muarl.policies.hf import HFPolicy
    from muarl.rollout import EpisodeConfig
    from muarl.users.scripted import ScriptedUser

    domain = get_domain(config.domain)
    temperature = config.temperature if temperature is None else temperature
    policy = HFPolicy(load(model), temperature=temperature, max_new_tokens=config.max_new_tokens, seed=seed)
    result = evaluate(domain, policy, ScriptedUser(), domain.tasks("test")[:config.eval_tasks], k=config.eval_k,
                      out_dir=out / name, config=EpisodeConfig(max_turns=config.max_turns), seed=seed,
                      progress=progress, meta={"model": str(model), "temperature": temperature})
    return result.metrics


def provenance(config: DemoConfig, cold_start: Path, rl_model: Path) -> dict[str, Any]:
    """What produced the demo's numbers (:func:`muarl.provenance.record`): muarl, the domain, the scripted
    user and both evaluated models, the cold start and the RL one, by checkpoint directory."""
    from muarl.domain import get_domain
    from muarl.provenance import record
    from muarl.users.scripted import ScriptedUser

    found = record([get_domain(config.domain)], {}, ScriptedUser(), user_spec="scripted")
    found["policy"] = {role: {"spec": f"hf:{model}", "model": str(model)}
                       for role, model in (("cold_start", cold_start), ("rl", rl_model))}
    return found


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


def changed_conversations(out: Path, shown: int = 3) -> Path:
    """``changed.md``: held-out episodes that changed outcome with RL, before and after, same task and same
    user seed (the same trial of the same task), the ones RL fixed first."""
    from muarl.types import Trajectory

    def episodes(name: str) -> dict[tuple[str, int], Trajectory]:
        lines = (out / name / "trajectories.jsonl").read_text(encoding="utf-8").splitlines()
        trajs = [Trajectory.model_validate_json(line) for line in lines if line.strip()]
        return {(t.task_id, t.user_seed): t for t in trajs}

    before, after = episodes("eval-sft"), episodes("eval-rl")
    pairs = []
    for key, a in before.items():  # the same task played with the same user seed: the same trial
        b = after.get(key)
        if b is None:
            continue
        ra, rb = (t.reward.reward if t.reward else 0.0 for t in (a, b))
        if ra != rb:
            pairs.append((rb - ra, a, b))
    pairs.sort(key=lambda p: -p[0])
    fixed = sum(p[0] > 0 for p in pairs)
    parts = [f"# Held-out conversations that changed with RL\n\n{fixed} episodes went from failure to success, "
             f"{len(pairs) - fixed} the other way (same task, same user seed, before and after).\n"]
    for gain, a, b in pairs[:shown]:
        parts.append(f"## {a.task_id}: {'fixed' if gain > 0 else 'broken'} by RL\n\n### cold start "
                     f"(reward {a.reward.reward if a.reward else 0:.0f})\n\n{_conversation(a)}\n\n### after RL "
                     f"(reward {b.reward.reward if b.reward else 0:.0f})\n\n{_conversation(b)}\n")
    path = out / "changed.md"
    path.write_text("\n".join(parts), encoding="utf-8")
    return path


#: the demo table's rows; "faults" is the fault rate by party, beside success because a policy fault counts
#: as a failure in pass^1 and a user or tool fault is left out of it
ROWS = (("success (pass^1)", "pass^1"), ("fault rate: policy / user / tool", "faults"), ("pass^k", None),
        ("TCR", "tcr"), ("avg turns", "avg_turns"), ("violation rate", "violation_rate"),
        ("malformed calls / episode", "malformed_calls"))
FAULT_KEYS = ("policy_fault_rate", "user_fault_rate", "tool_fault_rate")


def _value(metrics: dict[str, Any], key: str | None, k: int) -> float:
    return float(metrics.get(key or f"pass^{k}") or 0.0)


def table(before: dict[str, Any], after: dict[str, Any], k: int, comparison: dict[str, Any] | None = None,
          greedy: tuple[dict[str, Any], dict[str, Any], dict[str, Any] | None] | None = None,
          temperature: float = 1.0) -> Table:
    """Cold start vs after RL, metric by metric, with the paired 95% interval of the change where known;
    ``greedy`` (before, after, comparison at T = 0) adds the greedy success and faults right below the
    sampled ones, so the two read side by side."""
    title = "held-out test tasks: cold start vs after GRPO"
    t = Table(title=title + (f" (T = {temperature:g} unless marked T = 0)" if greedy else ""))
    for col in ("metric", "cold start", "after RL", "change", "95% interval"):
        t.add_column(col, justify="left" if col == "metric" else "right")

    def row(label: str, key: str | None, a_metrics: dict[str, Any], b_metrics: dict[str, Any],
            cmp: dict[str, Any] | None) -> None:
        if key == "faults":  # one row, three parties: the interval column stays for single metrics
            a, b = ([_value(m, f, k) for f in FAULT_KEYS] for m in (a_metrics, b_metrics))
            t.add_row(label, " / ".join(f"{x:.3f}" for x in a), " / ".join(f"{x:.3f}" for x in b),
                      " / ".join(f"{y - x:+.3f}" for x, y in zip(a, b, strict=True)), "")
            return
        m = {d["metric"]: d for d in (cmp or {}).get("metrics", [])}.get(key or f"pass^{k}")
        a, b = _value(a_metrics, key, k), _value(b_metrics, key, k)
        t.add_row(label.replace("pass^k", f"pass^{k}"), f"{a:.3f}", f"{b:.3f}", f"{b - a:+.3f}",
                  f"[{m['low']:+.3f}, {m['high']:+.3f}]" if m else "")

    for label, key in ROWS:
        row(label, key, before, after, comparison)
        if greedy and key == "faults":  # the greedy success and faults right below the sampled ones
            for g_label, g_key in ROWS[:2]:
                row(f"{g_label}, T = 0", g_key, *greedy)
    return t


def plot(out: Path) -> list[Path]:
    """``plots/``: SFT loss, GRPO reward and violation rate per step, SFT vs RL on the test tasks."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder = out / "plots"
    folder.mkdir(exist_ok=True)
    written = []

    def series(path: Path, key: str) -> tuple[list[int], list[float]]:
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
        rows = [r for r in rows if key in r]
        return [r["step"] for r in rows], [r[key] for r in rows]

    fig, ax = plt.subplots(figsize=(5, 3.2))
    if (out / "sft" / "metrics.jsonl").exists():
        ax.plot(*series(out / "sft" / "metrics.jsonl", "loss"))
        ax.set(title="SFT: loss on agent tokens", xlabel="optimizer step", ylabel="cross-entropy")
    else:  # the shipped base: its pretraining curve travels with it
        from muarl.models import base_path

        curve = base_path() / "curve.jsonl"
        ax.plot(*series(curve, "loss"), label="loss on agent tokens")
        ax.plot(*series(curve, "copy_accuracy"), label="held-out copy accuracy", marker="o", markersize=3)
        ax.set(title="cold-start base: muarl pretrain", xlabel="optimizer step")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(folder / "cold_start.png", dpi=110)
    written.append(folder / "cold_start.png")
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(5, 3.2))
    for key in ("reward", "violation_rate", "all_wrong_groups", "all_correct_groups"):
        ax.plot(*series(out / "grpo" / "metrics.jsonl", key), label=key, marker="o", markersize=3)
    ax.set(title="GRPO: training dynamics", xlabel="step", ylim=(-0.02, 1.02))
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(folder / "grpo_dynamics.png", dpi=110)
    written.append(folder / "grpo_dynamics.png")
    plt.close(fig)

    summary = json.loads((out / "summary.json").read_text())
    labels = ["pass^1", f"pass^{summary['k']}", "violation_rate"]
    fig, ax = plt.subplots(figsize=(5, 3.2))
    xs = range(len(labels))
    ax.bar([x - 0.2 for x in xs], [summary["sft"].get(k) or 0 for k in labels], width=0.4, label="SFT only")
    ax.bar([x + 0.2 for x in xs], [summary["rl"].get(k) or 0 for k in labels], width=0.4, label="after RL")
    ax.set_xticks(list(xs), labels)
    ax.set(title="held-out test tasks", ylim=(0, 1))
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(folder / "eval.png", dpi=110)
    written.append(folder / "eval.png")
    plt.close(fig)
    return written


STAGES = ("model", "synth", "sft-prefix", "sft", "eval-sft", "eval-sft-greedy", "grpo", "eval-rl", "eval-rl-greedy")


def run_demo(out: str | Path = "runs/demo", preset: str = "default", seed: int = 0, progress: bool = True,
             stop_after: str | None = None, **overrides: Any) -> dict[str, Any]:
    """Run (or resume) every stage; returns the summary written to ``out/summary.json``. ``stop_after``
    ends the run after that stage (say ``eval-sft``, to measure an SFT recipe without the GRPO stage);
    rerunning without it continues from there."""
    if stop_after is not None and stop_after not in STAGES:
        raise ValueError(f"unknown stage {stop_after!r}; choose from {', '.join(STAGES)}")
    if preset not in PRESETS:
        raise ValueError(f"unknown demo preset {preset!r}; choose from {', '.join(PRESETS)}")
    config = replace(PRESETS[preset], **{k: v for k, v in overrides.items() if v is not None})
    if config.base not in BASES:
        raise ValueError(f"unknown demo base {config.base!r}; choose from {', '.join(BASES)}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    recorded = out / "demo.json"
    settings = {"preset": preset, "seed": seed, **asdict(config)}
    settings["synth_families"] = list(config.synth_families)
    if recorded.exists():
        # a knob added after the run was recorded had its default value then (the greedy evaluations, say)
        defaults = {**asdict(DemoConfig()), "synth_families": []}
        then = {**defaults, **json.loads(recorded.read_text())}
        differ = sorted(key for key in settings if then.get(key) != settings[key])
        if differ:
            raise ValueError(f"{out} holds a demo run with other settings ({', '.join(differ)}); use another --out")
    recorded.write_text(json.dumps(settings, indent=1) + "\n")
    console = Console()
    clock: dict[str, float] = {}

    class Stopped(Exception):
        """``stop_after`` reached."""

    def stage(name: str, fn: Any, *args: Any) -> Any:
        console.rule(f"[bold]{name}")
        began = time.perf_counter()
        result = fn(*args)
        clock[name] = round(time.perf_counter() - began, 1)
        console.print(f"{name}: {clock[name]:.0f} s")
        if name == stop_after:
            raise Stopped
        return result

    try:
        model = stage("model", build_model, out, config, seed)
        sft_model = model
        if config.base == "scratch":
            data = stage("synth", synthesize_data, out, config, seed)
            if config.prefix_calls or stop_after == "sft-prefix":
                model = stage("sft-prefix", opening_supervised, out, config, model, data, seed, progress)
            sft_model = stage("sft", supervised, out, config, model, data, seed, progress)
        before = stage("eval-sft", evaluate_model, out, "eval-sft", config, sft_model, seed, progress)
        if config.greedy:
            before_greedy = stage("eval-sft-greedy", evaluate_model, out, "eval-sft-greedy", config, sft_model, seed,
                                  progress, 0.0)
        rl_model = stage("grpo", reinforce, out, config, sft_model, seed, progress)
        after = stage("eval-rl", evaluate_model, out, "eval-rl", config, rl_model, seed, progress)
        if config.greedy:
            after_greedy = stage("eval-rl-greedy", evaluate_model, out, "eval-rl-greedy", config, rl_model, seed,
                                 progress, 0.0)
    except Stopped:
        console.print(f"stopped after {stop_after} ({sum(clock.values()):.0f} s); rerun without --stop-after to go on")
        return {"preset": preset, "seed": seed, "stopped_after": stop_after, "seconds": clock}
    summary = {"preset": preset, "seed": seed, "domain": config.domain, "k": config.eval_k,
               "eval_tasks": config.eval_tasks, "sft": before, "rl": after, "seconds": clock,
               "total_seconds": round(sum(clock.values()), 1)}
    comparison = compare_evaluations(out)
    summary["comparison"] = {m["metric"]: [m["diff"], m["low"], m["high"]] for m in comparison["metrics"]}
    greedy = None
    if config.greedy:
        comparison_greedy = compare_evaluations(out, "-greedy")
        summary.update({"sft_greedy": before_greedy, "rl_greedy": after_greedy, "comparison_greedy": {
            m["metric"]: [m["diff"], m["low"], m["high"]] for m in comparison_greedy["metrics"]}})
        greedy = (before_greedy, after_greedy, comparison_greedy)
    summary["provenance"] = provenance(config, sft_model, rl_model)
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    changed = changed_conversations(out)
    plot(out)
    try:
        from muarl.report.html import build_report

        build_report(out / "grpo", out / "report.html")
    except Exception as err:  # the report is a convenience: never lose a finished demo over it
        console.print(f"[yellow]report not written: {err}")
    console.print(table(before, after, config.eval_k, comparison, greedy, config.temperature))
    console.print(f"total {summary['total_seconds']:.0f} s; run directory {out} (plots/, report.html, summary.json, "
                  f"{changed.name}: held-out conversations RL changed)")
    return summary


def add_commands(sub: Any) -> None:
    """Add ``demo`` to the ``muarl`` parser."""
    p = sub.add_parser("demo", help="the whole pipeline on the CPU: tiny model, synth, SFT, GRPO, held-out eval",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="default", choices=sorted(PRESETS),
                   help="default (about 15 minutes on 2 cores), smoke (every stage in under 2 minutes) or "
                        "smoke-scratch (the from-random-weights stages, briefly)")
    p.add_argument("--base", choices=BASES, help="shipped: start from the packaged cold-start base (default); "
                                                 "scratch: random weights, synth and SFT first")
    p.add_argument("--out", default="runs/demo", help="run directory (rerun the same command to resume)")
    p.add_argument("--seed", type=int, default=0, help="seeds the model init, data order, sampling and users")
    p.add_argument("--domain", help="the domain GRPO trains on and evaluation tests (default retail-lite-forgetful)")
    p.add_argument("--grpo-steps", type=int, help="override the preset's GRPO steps")
    p.add_argument("--grpo-lr", type=float, help="override the preset's GRPO learning rate")
    p.add_argument("--num-iterations", type=int, help="optimizer steps per batch of rollouts (GRPO's mu)")
    p.add_argument("--kl-beta", type=float, help="weight of the KL term to the cold start (0: off)")
    p.add_argument("--violation-reward", type=float,
                   help="training reward of an episode that broke a policy rule (default 0, as a plain failure; "
                        "below 0 lowered violations but also the success gain)")
    p.add_argument("--mask-truncated", action=argparse.BooleanOptionalAction, default=None,
                   help="leave episodes cut at the per-turn token limit out of the gradient (DAPO's overlong filtering)")
    p.add_argument("--eval-tasks", type=int, help="override how many test tasks are evaluated")
    p.add_argument("--greedy", action=argparse.BooleanOptionalAction, default=None,
                   help="also evaluate greedily (T = 0) before and after RL, same tasks and users (default on; "
                        "two more evaluations)")
    recipe = p.add_argument_group("with --base scratch: the model and SFT recipe (docs/research/; default: the "
                                  "preset's)")
    recipe.add_argument("--head-dim", type=int, help="attention head width (0: hidden size / heads)")
    recipe.add_argument("--kv-heads", type=int, help="key/value heads (0: heads / 2)")
    recipe.add_argument("--prompt", choices=["full", "compact"], help="the chat template's system turn")
    recipe.add_argument("--prefix-calls", type=int,
                        help="first train on openings cut after the agent's Nth tool call (0: skip that stage)")
    recipe.add_argument("--prefix-epochs", type=int, help="epochs of the openings stage")
    recipe.add_argument("--fresh-ids", action="store_true", default=None, help="rename ids afresh every SFT step")
    recipe.add_argument("--sft-epochs", type=int, help="epochs of whole-conversation SFT")
    recipe.add_argument("--sft-batch", type=int, help="conversations per SFT step")
    p.add_argument("--stop-after", choices=STAGES, help="end after this stage (rerun without it to go on)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")

    def run(args: Any) -> int:
        knobs = ("base", "domain", "grpo_steps", "grpo_lr", "num_iterations", "kl_beta", "violation_reward",
                 "mask_truncated", "eval_tasks", "greedy", "head_dim", "kv_heads", "prompt", "prefix_calls", "prefix_epochs",
                 "fresh_ids", "sft_epochs", "sft_batch")
        run_demo(args.out, args.preset, args.seed, progress=not args.quiet, stop_after=args.stop_after,
                 **{k: getattr(args, k) for k in knobs})
        return 0

    p.set_defaults(func=run)
