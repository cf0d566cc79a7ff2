"""``muarl chat``: play the user yourself against any policy in the terminal, tool calls shown as they
happen; the conversation is scored like an episode and can be saved."""

from __future__ import annotations

import argparse

from muarl.cli import options

NAME = "chat"
HELP = "play the user yourself against any policy; tool calls shown as they happen"


def add_arguments(p: argparse.ArgumentParser) -> None:
    options.domain(p)
    p.add_argument("--task", help="task id (default: the first task of --split)")
    options.split(p)
    options.policy(p)
    p.add_argument("--save", help="append the scored conversation to this JSONL file (a trajectory per line)")
    options.episode(p)


def run(args: argparse.Namespace) -> int:
    from muarl.domain import get_domain
    from muarl.human import run_chat

    options.check_positive(args, "max_turns", "max_new_tokens")
    domain = get_domain(args.domain)
    if args.task:
        task = domain.task(args.task)
    else:
        tasks = domain.tasks(args.split)
        if not tasks:
            raise ValueError(f"domain {domain.name} has no {args.split} tasks")
        task = tasks[0]
    policy = options.make_policy(args)
    run_chat(domain, task, policy, config=options.episode_config(args), save=args.save)
    return 0
