"""The ``muarl`` command line: one module per command in this package, shared options in
:mod:`muarl.cli.options`, the training commands' options generated from their configs
(:mod:`muarl.cli.config_options`).

Each command module has ``NAME``, ``HELP``, ``add_arguments(parser)`` and ``run(args) -> exit code``, and
imports what it needs inside those functions, so that building one command's parser costs nothing for the
others: :func:`main` builds only the options of the command it was given (the training commands' import
torch, two seconds that ``muarl domains`` should not pay).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from types import ModuleType

from muarl.cli import config_file

#: the commands' modules, in the order ``muarl --help`` lists them
COMMANDS = ("domains", "gold", "rollout", "synth", "sft", "grpo", "init_model", "demo", "ablate", "pretrain", "eval",
            "compare", "chat", "view", "export", "serve_mcp", "mcp_tools")


def command_modules() -> list[ModuleType]:
    return [importlib.import_module(f"muarl.cli.{name}") for name in COMMANDS]


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole parser; with ``only``, every command is listed but only that one's options are added (a
    name that is no command: none, which is all ``muarl --help`` or an error message needs)."""
    from muarl.cli.options import data_dir

    parser = argparse.ArgumentParser(prog="muarl", description="Multi-turn RL for tool-using agents with a simulated "
                                     "user in every rollout (`muarl COMMAND --help`: a command's options).")
    sub = parser.add_subparsers(dest="command", required=True)
    for module in command_modules():
        p = sub.add_parser(module.NAME, help=module.HELP, description=getattr(module, "DESCRIPTION", None))
        p.set_defaults(func=module.run)
        if only is None or only == module.NAME:
            module.add_arguments(p)
            if any(action.dest == "domain" for action in p._actions):
                data_dir(p)  # every command that takes a domain, a new one too
            if module.NAME in config_file.TAKES_CONFIG:
                config_file.add_option(p)
                p.add_argument("--thinking", action="store_true",
                               help="render chats in thinking mode (Qwen3's enable_thinking; default off, the "
                                    "paper's setting); sets MUARL_THINKING=1 for this run and its processes")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from muarl.plugins import put_cwd_on_path

    put_cwd_on_path()  # module:attr from the current directory, for the console script as for python -m
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[0] if argv else ""
    parser = build_parser(only=command)
    path = config_file.config_path(argv) if command in config_file.TAKES_CONFIG else None
    if path is not None:  # before parsing: the file's options are the command's defaults, flags win
        try:
            config_file.apply(config_file.subparser(parser, command), path, command)
        except (FileNotFoundError, ValueError) as err:
            return _error(err, 2)
    args = parser.parse_args(argv)
    if getattr(args, "thinking", False):  # read by every chat format (muarl.chat), in this process and its children
        from muarl.chat import THINKING_ENV

        os.environ[THINKING_ENV] = "1"
    if command in config_file.TAKES_CONFIG:  # the commands that run something: their console is muarl's
        from muarl.models import quiet_weight_bars

        quiet_weight_bars()
    from muarl.domain import data_option
    from muarl.factory import SpecError
    from muarl.faults import RunFailed
    from muarl.users.embedded import specs_in, user_server

    try:
        with data_option(getattr(args, "data_dir", None)), user_server(specs_in(args), getattr(args, "out", None)):
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
