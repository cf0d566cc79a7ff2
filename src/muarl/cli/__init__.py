"""The ``muarl`` command line."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

from muarl.domain import data_option, domain_names, get_domain
from muarl.factory import POLICY_FORMS, USER_FORMS
from muarl.gold import gold_score
from muarl.types import SPLITS

BUILTIN = ["retail", "airline", "telecom"]
#: domains whose tasks muarl imports unchanged from another benchmark: a gold call of theirs that fails while
#: the task still reaches its gold database is that benchmark's data, reported as a warning, not a failure
IMPORTED_TASKS = ("tau2:", "bfcl:")
#: modules defining ``add_commands(subparsers)``: demo, training options, eval/compare/chat, view, MCP
COMMAND_MODULES = ("muarl.demo", "muarl.train.cli", "muarl.eval_cli", "muarl.report.cli", "muarl.mcp.cli")


def _domains_cmd(args: argparse.Namespace) -> int:
    rows = []
    for name in domain_names():
        d = get_domain(name)
        counts = {s: len(d.tasks(s)) for s in SPLITS}
        rows.append({"name": name, "agent_tools": len(d.tools), "user_tools": len(d.user_tools), **counts,
                     "description": d.description})
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    table = Table(title="muarl domains")
    for col in ("domain", "agent tools", "user tools", *SPLITS, "description"):
        table.add_column(col, justify="right" if col not in ("domain", "description") else "left")
    for r in rows:
        table.add_row(r["name"], str(r["agent_tools"]), str(r["user_tools"]),
                      *(str(r[s]) for s in SPLITS), r["description"])
    Console().print(table)
    return 0


def _gold_cmd(args: argparse.Namespace) -> int:
    names = BUILTIN if args.domain == "all" else [args.domain]
    splits = [args.split] if args.split else list(SPLITS)
    console = Console(stderr=args.json)
    summary, failures, warnings = [], [], []
    for name in names:
        domain = get_domain(name)
        imported = name.startswith(IMPORTED_TASKS)
        for split in splits:
            start = time.perf_counter()
            tasks = domain.tasks(split)
            passed = violations = 0
            for task in tasks:
                traj = gold_score(domain, task)
                assert traj.reward is not None
                errors = [f"{r.name}: {r.output}" for r in traj.tool_log if not r.ok]
                good = traj.reward.reward == 1.0 and (not errors or imported)
                passed += good
                violations += len(traj.reward.violations)
                if good and errors:
                    warnings.append({"task": task.id, "domain": name, "failed_actions": errors})
                if not good:
                    failures.append({"task": task.id, "family": task.family, "diff": traj.reward.diff,
                                     "failed_actions": errors,
                                     "checks": [c.name for c in traj.reward.checks if not c.passed]})
            summary.append({"domain": name, "split": split, "tasks": len(tasks), "passed": passed,
                            "violations": violations, "seconds": round(time.perf_counter() - start, 3)})
    ok = all(s["passed"] == s["tasks"] for s in summary)
    if args.json:
        print(json.dumps({"ok": ok, "summary": summary, "failures": failures, "warnings": warnings}, indent=1))
    else:
        table = Table(title="gold replay: every task's gold actions through a fresh env")
        for col in ("domain", "split", "tasks", "reward 1.0", "violations", "seconds"):
            table.add_column(col)
        for s in summary:
            style = "green" if s["passed"] == s["tasks"] else "red"
            table.add_row(s["domain"], s["split"], str(s["tasks"]), f"[{style}]{s['passed']}[/{style}]",
                          str(s["violations"]), str(s["seconds"]))
        console.print(table)
        for f in failures[:20]:
            console.print(f"[red]FAILED[/red] {f['task']} ({f['family']}): failed actions {f['failed_actions']}, "
                          f"failed checks {f['checks']}, diff {f['diff'][:5]}")
        if warnings:
            console.print(f"[yellow]warning: {len(warnings)} task(s) of {', '.join(sorted({w['domain'] for w in warnings}))} "
                          "have gold calls that fail (the benchmark's own data, imported as is); each still reaches "
                          f"its gold database. First: {warnings[0]['task']}: {warnings[0]['failed_actions'][0]}[/yellow]")
        console.print("[green]all gold trajectories score 1.0[/green]" if ok else
                      f"[red]{len(failures)} task(s) do not score 1.0[/red]")
    return 0 if ok else 1


def _rollout_cmd(args: argparse.Namespace) -> int:
    import asyncio
    from pathlib import Path

    from muarl.eval_cli import check_positive, limit_kwargs
    from muarl.factory import make_policy, make_user
    from muarl.faults import SIDES, require_unfaulted
    from muarl.provenance import record
    from muarl.rollout import EpisodeConfig, RolloutEngine

    check_positive(args, "n", "limit", "concurrency", "max_turns", "max_new_tokens")
    domain = get_domain(args.domain)
    tasks = domain.tasks(args.split)
    if args.limit:
        tasks = tasks[: args.limit]
    config = EpisodeConfig(max_turns=args.max_turns, end_on_malformed=args.end_on_malformed,
                           require_outputs=not args.no_required_outputs, **limit_kwargs(args))
    policy = make_policy(args.policy, temperature=args.temperature, max_new_tokens=args.max_new_tokens, seed=args.seed)
    user = make_user(args.user, http_timeout=args.user_http_timeout, max_tokens=args.user_max_tokens)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    engine = RolloutEngine(domain, policy, user, config, group_size=args.n, concurrency=args.concurrency,
                           common_user_seed=not args.independent_users, seed=args.seed,
                           out=out / "trajectories.jsonl")
    groups = asyncio.run(engine.run(tasks))
    trajs = [t for g in groups for t in g]
    # what was used, as given (module:attr for a plug-in), so `muarl view` finds the tasks again
    summary = {"domain": args.domain, "split": args.split, "policy": args.policy, "user": args.user,
               **_summary(trajs), "provenance": record([domain], policy, user, args.policy, args.user)}
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    console = Console()
    table = Table(title=f"rollout {args.domain}/{args.split}: {args.policy} x {args.user}, n={args.n}")
    columns = {"episodes": "episodes", "success": "success", **{f"{side}_fault_rate": f"{side} faults"
                                                                for side in SIDES},
               "tcr": "tcr", "violation_rate": "violation rate", "mean_turns": "mean turns",
               "malformed_calls": "malformed calls"}
    for label in columns.values():
        table.add_column(label)
    table.add_row(*(str(summary[k]) for k in columns))
    console.print(table)
    console.print(f"stop reasons: {summary['stop_reasons']}")
    if summary["faults"]:
        console.print(f"[yellow]faulted episodes by kind: {summary['faults']} (each trajectory's metadata.fault "
                      "says why)[/yellow]")
    console.print(f"trajectories: {out / 'trajectories.jsonl'}")
    require_unfaulted(trajs, f"rollout; the trajectories are in {out / 'trajectories.jsonl'}")
    return 0


def _summary(trajs: list) -> dict:
    from collections import Counter

    from muarl.faults import counts_against_policy, fault_counts, fault_rates

    # user and tool faults say nothing about the agent; a policy fault is the agent failing (reward 0)
    trials = [t for t in trajs if counts_against_policy(t)]
    n = max(len(trials), 1)
    scored = [(t.reward if t.reward is not None and not t.fault_kind else None) for t in trials]
    return {
        "episodes": len(trajs),
        "success": round(sum(r.reward for r in scored if r) / n, 4),
        **fault_rates(trajs),
        "tcr": round(sum(r.tcr for r in scored if r) / n, 4),
        "violation_rate": round(sum(bool(t.reward and t.reward.violations) for t in trials) / n, 4),
        "sim_faults": sum(t.sim_fault for t in trajs),
        "mean_turns": round(sum(t.turns for t in trials) / n, 2),
        "malformed_calls": sum(t.malformed_calls for t in trajs),
        "faults": fault_counts(trajs),
        "tool_errors": dict(Counter(r.error or "error" for t in trajs for r in t.tool_log if not r.ok)),
        "stop_reasons": dict(Counter(t.stop_reason for t in trajs).most_common()),
    }


def _synth_cmd(args: argparse.Namespace) -> int:
    from pathlib import Path

    from muarl.eval_cli import check_positive, limit_kwargs
    from muarl.factory import make_policy, make_user
    from muarl.rollout import EpisodeConfig
    from muarl.synth import synthesize

    check_positive(args, "n", "concurrency")
    config = EpisodeConfig(require_outputs=True, **limit_kwargs(args))
    names = BUILTIN if args.domain == ["all"] else args.domain
    domains = [get_domain(n) for n in names]
    teacher = make_policy(args.teacher, temperature=args.temperature, seed=args.seed)
    if args.slip_rate:
        from muarl.policies.expert import ExpertPolicy

        if not isinstance(teacher, ExpertPolicy):
            raise ValueError(f"--slip-rate makes the expert teacher slip; the teacher is {args.teacher!r}")
        teacher = ExpertPolicy(skip_confirmation=teacher.skip_confirmation, slip_rate=args.slip_rate)
    user = make_user(args.user, http_timeout=args.user_http_timeout, max_tokens=args.user_max_tokens)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    # what was used, as given (module:attr for a plug-in), so `muarl view OUT` finds the tasks again
    (out / "config.json").write_text(json.dumps({"command": "synth", "domains": names, "teacher": args.teacher,
                                                 "user": args.user, "split": args.split, "n": args.n,
                                                 "seed": args.seed, "min_kept": args.min_kept,
                                                 "slip_rate": args.slip_rate}, indent=1) + "\n")
    report = synthesize(domains, teacher, user, out, split=args.split, n=args.n, families=args.families,
                        exclude=args.exclude_families, behaviours=args.behaviours,
                        exclude_behaviours=args.exclude_behaviours, seed=args.seed, concurrency=args.concurrency,
                        config=config, min_kept=args.min_kept, specs={"policy": args.teacher, "user": args.user})
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


def _init_model_cmd(args: argparse.Namespace) -> int:
    from pathlib import Path

    from muarl.tiny_model import TinyConfig, build

    config = TinyConfig.shaped(args.hidden_size, args.layers, args.heads, args.head_dim, args.kv_heads, args.seed,
                               vocab_size=args.vocab_size)
    path = build(Path(args.out), config, prompt=args.prompt)
    print(f"built the embedded model at {path}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from muarl.eval_cli import add_limit_options

    parser = argparse.ArgumentParser(prog="muarl", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("domains", help="list domains with task counts per split")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=_domains_cmd)
    p = sub.add_parser("gold", help="replay every task's gold actions and check they all score 1.0")
    p.add_argument("domain", help="a domain name, 'all' for the built-in ones, or module:attribute of your own")
    p.add_argument("--split", choices=SPLITS, help="only this split (default: all)")
    p.add_argument("--json", action="store_true", help="print a JSON report instead of a table")
    p.set_defaults(func=_gold_cmd)
    p = sub.add_parser("rollout", help="run episodes of a policy against a simulated user and save them")
    p.add_argument("--domain", required=True, help="domain name (see `muarl domains`) or module:attr")
    p.add_argument("--split", choices=SPLITS, default="test")
    p.add_argument("--policy", default="expert", help=POLICY_FORMS)
    p.add_argument("--user", default="scripted", help=USER_FORMS)
    p.add_argument("--n", type=int, default=1, help="episodes per task (a GRPO group)")
    p.add_argument("--out", required=True, help="run directory; trajectories.jsonl is appended as episodes finish")
    p.add_argument("--limit", type=int, help="only the first N tasks of the split")
    p.add_argument("--concurrency", type=int, default=64, help="episodes in flight at once")
    p.add_argument("--max-turns", type=int, default=30, help="tool executions + user replies per episode")
    p.add_argument("--max-new-tokens", type=int, default=1024, help="per assistant message (token backends)")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--independent-users", action="store_true",
                   help="give each group member its own user seed (default: one seed per group)")
    p.add_argument("--end-on-malformed", action="store_true", help="end an episode on a malformed tool call")
    p.add_argument("--no-required-outputs", action="store_true", help="grade the DB only (training-style)")
    add_limit_options(p)
    p.set_defaults(func=_rollout_cmd)
    p = sub.add_parser("synth", help="cold-start data: a teacher plays tasks; clean wins become an SFT data set")
    p.add_argument("--domain", nargs="+", default=["all"],
                   help="one or more domains (names or module:attr), or 'all' (built-ins)")
    p.add_argument("--split", choices=SPLITS, default="train")
    p.add_argument("--teacher", default="expert", help="expert | hf:PATH | openai:URL#MODEL | module:attr")
    p.add_argument("--user", default="scripted", help="scripted | llm:URL#MODEL | module:attr")
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
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    add_limit_options(p)
    p.set_defaults(func=_synth_cmd)
    p = sub.add_parser("sft", help="supervised fine-tuning on a synthesized data set (loss on agent tokens only)")
    p.add_argument("--data", nargs="+", required=True, help="sft.jsonl file(s) written by `muarl synth`")
    p.add_argument("--model", default="tiny", help="checkpoint directory, or tiny / smollm2")
    p.add_argument("--preset", default="tiny", help="paper (lr 5e-6 cosine, 2 epochs, batch 128) or tiny")
    p.add_argument("--out", required=True, help="run directory: model/, metrics.jsonl, config.json")
    p.add_argument("--epochs", type=int)
    p.add_argument("--lr", type=float)
    p.add_argument("--batch-size", type=int, help="conversations per optimizer step")
    p.add_argument("--max-len", type=int, help="tokens per packed row")
    p.add_argument("--seed", type=int)
    # its command and training options: muarl.train.cli
    p = sub.add_parser("grpo", help="GRPO with the simulated user in every rollout")
    p.add_argument("--model", default="tiny", help="the starting checkpoint (normally the SFT output); also the KL reference")
    p.add_argument("--domain", default="retail", help="domain name (see `muarl domains`) or module:attr")
    p.add_argument("--user", default="scripted", help="scripted | llm:URL#MODEL | module:attr")
    p.add_argument("--preset", default="tiny", help="paper (group 8, 32 tasks/step, lr 1e-6 ...) or tiny")
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int)
    p.add_argument("--tasks-per-step", type=int)
    p.add_argument("--group-size", type=int)
    p.add_argument("--lr", type=float)
    p.add_argument("--algorithm", choices=["grpo", "dr_grpo"])
    p.add_argument("--dynamic-sampling", action="store_true", help="DAPO: leave all-equal groups out of the update and play more tasks instead (see --max-rollout-batches)")
    p.add_argument("--seed", type=int)
    # its command and training options: muarl.train.cli
    p = sub.add_parser("init-model", help="build the embedded tiny Qwen3 model and its BPE tokenizer")
    p.add_argument("--out", required=True, help="checkpoint directory to create")
    p.add_argument("--hidden-size", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=0,
                   help="width of each attention head (default hidden size / heads); 64 learns to copy ids much sooner")
    p.add_argument("--kv-heads", type=int, default=0, help="key/value heads (default heads / 2)")
    p.add_argument("--vocab-size", type=int, default=4096)
    p.add_argument("--prompt", choices=["full", "compact"], default="full",
                   help="system turn of the chat template: full (policy and tool schemas) or compact (tool names "
                        "only; half as many tokens, for a model trained on one domain from random weights)")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_init_model_cmd)
    # Commands defined in their own modules, each of which adds its subparsers (and, for train.cli, the
    # training options of sft / grpo).
    for module in COMMAND_MODULES:
        importlib.import_module(module).add_commands(sub)
    add_data_option(sub)
    return parser


def add_data_option(sub: argparse._SubParsersAction) -> None:
    """``--data DIR`` on every command that takes a domain (``--domain`` or a ``domain`` argument).

    Added here, after every module has added its commands, so that one definition serves them all and a
    new command that takes a domain gets it too. ``main`` opens :func:`muarl.domain.data_option` with it."""
    for parser in sub.choices.values():
        if any(action.dest == "domain" for action in parser._actions):
            parser.add_argument("--data", dest="data_dir", metavar="DIR",
                                help="the data directory of a bridge that reads one (acebench:...: ACEBench's "
                                     "data_en), over its environment variable; an error for any other domain")


def main(argv: Sequence[str] | None = None) -> int:
    from muarl.plugins import put_cwd_on_path

    put_cwd_on_path()  # module:attr from the current directory, for the console script as for python -m
    args = build_parser().parse_args(argv)
    from muarl.factory import SpecError
    from muarl.faults import RunFailed

    try:
        with data_option(getattr(args, "data_dir", None)):
            return args.func(args)
    except RunFailed as err:  # the run played, but measured nothing (or its data would be wrong): one line
        return _error(err, 1)
    except KeyError as err:  # unknown domain or task: a clear message, not a traceback
        return _error(err.args[0], 2)
    except (SpecError, FileNotFoundError, FileExistsError, ValueError) as err:
        return _error(err, 2)


def _error(message: object, code: int) -> int:
    """Say ``muarl: error: MESSAGE`` on stderr in one write (several ranks of one run share a stderr,
    unbuffered under ``accelerate launch``: print's two writes interleaved their lines), return ``code``."""
    sys.stderr.write(f"muarl: error: {message}\n")
    sys.stderr.flush()
    return code


if __name__ == "__main__":
    sys.exit(main())
