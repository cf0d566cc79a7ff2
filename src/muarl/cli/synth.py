"""``muarl synth``: cold-start data, a teacher's clean wins against the simulated user as an SFT data set."""

from __future__ import annotations

import argparse
import json

from muarl.cli import options

NAME = "synth"
HELP = "cold-start data: a teacher plays tasks; clean wins become an SFT data set"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--domain", nargs="+", default=["all"],
                   help="one or more domains (names or module:attr), or 'all' (built-ins)")
    options.split(p, default="train")
    options.policy(p, flag="--teacher")
    options.user(p)
    p.add_argument("--n", type=int, default=1, help="episodes per task (independent user seeds)")
    p.add_argument("--families", nargs="+", help="only these task families")
    p.add_argument("--exclude-families", nargs="+", help="leave these task families out (for RL to teach)")
    p.add_argument("--behaviours", nargs="+", help="only tasks whose simulated user shows one of these behaviours "
                   "(withholds_info, changes_mind, out_of_policy, asks_question, several_requests, acts_on_device, "
                   "no_email, trait:WORD)")
    p.add_argument("--exclude-behaviours", nargs="+",
                   help="leave out tasks whose user shows any of these behaviours (for RL to teach)")
    p.add_argument("--out", required=True, help="writes sft.jsonl, report.json and raw trajectories here")
    p.add_argument("--min-kept", type=float, default=0.5, metavar="FRACTION",
                   help="least share of episodes that must be clean wins; below it (or when the teacher or user "
                        "raised for a task) no data set is written and the command fails (default 0.5)")
    p.add_argument("--slip-rate", type=float, default=0.0, metavar="P",
                   help="expert teacher: chance that it mistypes its identity lookup (then asks again), and again "
                        "that it mistypes a proposal (then proposes again); the wrong message is kept with "
                        "\"weight\": 0, as context without loss (default 0; docs/base_model.md)")
    p.add_argument("--side", choices=("agent", "user"), default="agent",
                   help="whose lines the data set teaches: the agent's (the cold start), or the user's, to fine-tune "
                        "an LLM to play the customer (muarl.users.user_side; then `muarl sft` on it and "
                        "--user llm:MODEL_DIR; default agent)")
    options.concurrency(p)
    p.add_argument("--temperature", type=float, default=0.0, help="the teacher's sampling temperature (default 0)")
    options.seed(p)
    options.limits(p)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from rich.console import Console
    from rich.table import Table

    from muarl.domain import get_domain
    from muarl.factory import make_policy, make_user
    from muarl.rollout import EpisodeConfig
    from muarl.synth import synthesize

    options.check_positive(args, "n", "concurrency")
    config = EpisodeConfig(require_outputs=True, **options.limit_kwargs(args))
    names = options.BUILTIN if args.domain == ["all"] else args.domain
    domains = [get_domain(n) for n in names]
    teacher = make_policy(args.teacher, temperature=args.temperature, seed=args.seed)
    if args.slip_rate:
        from muarl.policies.expert import ExpertPolicy

        if not isinstance(teacher, ExpertPolicy):
            raise ValueError(f"--slip-rate makes the expert teacher slip; the teacher is {args.teacher!r}")
        teacher = ExpertPolicy(skip_confirmation=teacher.skip_confirmation, slip_rate=args.slip_rate)
    user = make_user(args.user, **options.user_limits(args))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    # what was used, as given (module:attr for a plug-in), so `muarl view OUT` finds the tasks again
    (out / "config.json").write_text(json.dumps({"command": "synth", "domains": names, "teacher": args.teacher,
                                                 "user": args.user, "split": args.split, "n": args.n,
                                                 "seed": args.seed, "min_kept": args.min_kept,
                                                 "slip_rate": args.slip_rate, "side": args.side}, indent=1) + "\n")
    report = synthesize(domains, teacher, user, out, split=args.split, n=args.n, families=args.families,
                        exclude=args.exclude_families, behaviours=args.behaviours,
                        exclude_behaviours=args.exclude_behaviours, seed=args.seed, concurrency=args.concurrency,
                        config=config, min_kept=args.min_kept, specs={"policy": args.teacher, "user": args.user},
                        side=args.side)
    table = Table(title=f"cold-start synthesis: {args.teacher} x {args.user} on {args.split}")
    for col in ("domain/family", "played", "kept"):
        table.add_column(col)
    for key in sorted(report.played):
        table.add_row(key, str(report.played[key]), str(report.kept[key]))
    console = Console()
    console.print(table)
    console.print(f"kept {sum(report.kept.values())} of {sum(report.played.values())}; rejected: "
                  f"{dict(report.rejected)}; data set: {Path(args.out) / 'sft.jsonl'}")
    shown = {k: v for k, v in sorted(report.kept_behaviours.items()) if not k.startswith("trait:")}
    console.print(f"kept episodes per user behaviour: {shown or 'none of them'}")
    return 0
