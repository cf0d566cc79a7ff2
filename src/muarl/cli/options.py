"""Option groups several commands share, each defined once (``--seed`` was written ten times, and
``rollout`` retyped eval's episode options); the training commands' own options come from their configs
(:mod:`muarl.cli.config_options`). Also the checks and conversions those options need."""

from __future__ import annotations

import argparse
from typing import Any

from muarl.factory import POLICY_FORMS, USER_FORMS
from muarl.types import SPLITS

#: the domains ``all`` stands for (``muarl gold all``, ``muarl synth --domain all``)
BUILTIN = ["retail", "airline", "telecom"]


def seed(p: argparse.ArgumentParser, help: str = "user seeds and model sampling derive from it",
         default: int | None = 0) -> None:
    """``--seed N``; ``default=None`` where leaving it out means something else (serve-mcp's own database)."""
    p.add_argument("--seed", type=int, default=default,
                   help=help + (f" (default {default})" if default is not None else ""))


def domain(p: argparse.ArgumentParser) -> None:
    """``--domain D`` of a command that plays one domain's tasks."""
    p.add_argument("--domain", required=True, help="domain name (see `muarl domains`) or module:attr")


def split(p: argparse.ArgumentParser, default: str | None = "test", help: str | None = None) -> None:
    p.add_argument("--split", choices=SPLITS, default=default, help=help or f"the tasks' split (default {default})")


def policy(p: argparse.ArgumentParser, flag: str = "--policy", default: str = "expert") -> None:
    """The agent: ``--policy`` (eval, rollout, chat) or ``--teacher`` (synth)."""
    p.add_argument(flag, default=default, help=f"{POLICY_FORMS} (default {default})")


def user(p: argparse.ArgumentParser) -> None:
    p.add_argument("--user", default="scripted", help=f"{USER_FORMS} (default scripted)")


def matchup(p: argparse.ArgumentParser) -> None:
    """Which episodes a command plays (eval, rollout): ``--domain``, ``--split``, ``--policy``, ``--user``."""
    domain(p)
    split(p)
    policy(p)
    user(p)


def concurrency(p: argparse.ArgumentParser) -> None:
    p.add_argument("--concurrency", type=int, default=64, help="episodes in flight at once (default 64)")


def episode(p: argparse.ArgumentParser, temperature: float = 0.0) -> None:
    """How each episode is played and graded (eval, rollout, chat): read back by :func:`episode_config`."""
    p.add_argument("--max-turns", type=int, default=30, help="tool executions + user replies per episode (default 30)")
    p.add_argument("--max-new-tokens", type=int, default=1024,
                   help="per assistant message (token backends; default 1024)")
    p.add_argument("--temperature", type=float, default=temperature,
                   help=f"sampling temperature of model backends (default {temperature:g}"
                        + ("; 0: greedy, as the paper validates)" if temperature == 0 else ")"))
    seed(p)
    p.add_argument("--end-on-malformed", action="store_true", help="end an episode on a malformed tool call")
    p.add_argument("--no-required-outputs", action="store_true",
                   help="grade the database only (default: required outputs must be said, as in evaluation)")


def limits(p: argparse.ArgumentParser) -> None:
    """``--user-timeout``, ``--agent-timeout``, ``--tool-timeout``, ``--user-http-timeout`` and
    ``--user-max-tokens`` (eval, rollout, synth; grpo has them as config fields): the fields of
    :class:`~muarl.rollout.EpisodeLimits`, where they are defined once. A party that hits its limit faults
    its episode instead of hanging the run; a user message that hits its token cap ends there. The LLM
    user's two are None when left out: its own defaults apply."""
    from muarl.cli.config_options import add_config_options
    from muarl.rollout import EpisodeLimits

    add_config_options(p, EpisodeLimits, {"default": EpisodeLimits()})


def training(p: argparse.ArgumentParser, cls: type, presets: dict[str, Any], required: tuple[str, ...]) -> None:
    """The options of a training command (sft, grpo, pretrain): one per field of its config ``cls``, the
    fields every run shares (:class:`~muarl.train.settings.RunSettings`) in a group of their own, and
    ``--no-progress``."""
    from dataclasses import fields

    from muarl.cli.config_options import add_config_options
    from muarl.train.settings import RunSettings

    shared = [f.name for f in fields(RunSettings)]
    add_config_options(p, cls, presets, only=[f.name for f in fields(cls) if f.name not in shared],
                       required=required)
    group = p.add_argument_group("run settings (sft, grpo and pretrain)")
    add_config_options(group, cls, presets, only=shared)
    group.add_argument("--no-progress", action="store_true", help="no progress display")


def data_dir(p: argparse.ArgumentParser) -> None:
    """``--data DIR`` of every command that takes a domain; ``muarl.cli.main`` opens
    :func:`muarl.domain.data_option` with it."""
    p.add_argument("--data", dest="data_dir", metavar="DIR",
                   help="the data directory of a bridge that reads one (acebench:...: ACEBench's data_en), over "
                        "its environment variable; an error for any other domain")


def limit_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The time limits given on the command line, as :class:`~muarl.rollout.EpisodeConfig` fields (0: none)."""
    given = {name: getattr(args, name, None) for name in ("user_timeout", "agent_timeout", "tool_timeout")}
    return {name: value or None for name, value in given.items() if value is not None}


def episode_config(args: argparse.Namespace) -> Any:
    """The :class:`~muarl.rollout.EpisodeConfig` of the :func:`episode` options (and :func:`limits`, where
    the command has them)."""
    from muarl.rollout import EpisodeConfig

    return EpisodeConfig(max_turns=args.max_turns, end_on_malformed=args.end_on_malformed,
                         require_outputs=not args.no_required_outputs, **limit_kwargs(args))


def chosen_tasks(args: argparse.Namespace, domain: Any) -> list[Any]:
    """The tasks of ``--split``, or of ``--tasks ID ...`` where the command has it (any split, in the order
    given), cut to the first ``--limit``."""
    tasks = domain.tasks(args.split)
    wanted = getattr(args, "tasks", None)
    if wanted:
        by_id = {t.id: t for t in domain.tasks()}
        missing = [t for t in wanted if t not in by_id]
        if missing:
            raise ValueError(f"domain {domain.name} has no task(s) {', '.join(missing)} "
                             f"(e.g. {', '.join(t.id for t in tasks[:3])})")
        tasks = [by_id[t] for t in dict.fromkeys(wanted)]
    if args.limit:
        tasks = tasks[: args.limit]
    return tasks


def matchup_of(args: argparse.Namespace) -> tuple[Any, list[Any], Any, Any]:
    """The domain, tasks (:func:`chosen_tasks`), policy and user the :func:`matchup` options name."""
    from muarl.domain import get_domain
    from muarl.factory import make_user

    domain = get_domain(args.domain)
    tasks = chosen_tasks(args, domain)
    return domain, tasks, make_policy(args), make_user(args.user, **user_limits(args))


def make_policy(args: argparse.Namespace) -> Any:
    """The policy of ``--policy`` with the :func:`episode` options' sampling (eval, rollout, chat)."""
    from muarl.factory import make_policy, reproducible_user

    return make_policy(args.policy, temperature=args.temperature, max_new_tokens=args.max_new_tokens,
                       seed=args.seed, deterministic=reproducible_user(getattr(args, "user", None)))


def check_positive(args: argparse.Namespace, *names: str) -> None:
    """Refuse a count below 1 in one line naming the option (before it reaches code with other names)."""
    for name in names:
        value = getattr(args, name)
        if value is not None and value < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1 (got {value})")


def user_limits(args: argparse.Namespace) -> dict[str, Any]:
    """The LLM user's limits, as :func:`muarl.factory.make_user` keywords."""
    return {"http_timeout": args.user_http_timeout, "max_tokens": args.user_max_tokens}


def preset(p: argparse.ArgumentParser, presets: dict[str, Any], default: str, help: str) -> None:
    """``--preset NAME`` of a training command: the config its options override."""
    p.add_argument("--preset", default=default, help=f"{help} (default {default}; choose from {', '.join(presets)})")


def main_process() -> bool:
    """Whether this is rank 0 (or the only process): the one that reports a training run's result."""
    import os

    return os.environ.get("RANK", "0") == "0"
