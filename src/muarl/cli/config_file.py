"""``--config FILE.yaml``: a run's options from a file that is kept, diffed and rerun.

The file's keys are the command's option names (``kl_beta`` or ``kl-beta``; a nested mapping for the
demo's prefixed options, ``grpo: {steps: 8}`` meaning ``--grpo-steps 8``), its values what the option
takes (a list for an option that takes several). It sets the command's defaults, so options given on the
command line win over it and options it leaves out keep their preset's value. Nothing here defines an
option: a key is checked against the options the command's parser already has (generated from the config
dataclasses for the training commands, :mod:`muarl.cli.config_options`), so a key that names none is one
error naming the nearest option, before anything runs.

A training run records its resolved settings as ``config.yaml`` in its run directory (every field of its
config, :mod:`muarl.train.run`), so ``muarl grpo --config runs/x/config.yaml`` reruns it (give another
``--out`` to keep the first).
"""

from __future__ import annotations

import argparse
import difflib
from pathlib import Path
from typing import Any

#: the commands that run something, and so take ``--config``
TAKES_CONFIG = ("sft", "grpo", "pretrain", "eval", "rollout", "synth", "demo", "ablate")

OPTION = "--config"


def add_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(OPTION, metavar="FILE.yaml",
                        help="options from a YAML file (keys: the option names, e.g. kl_beta: 0.04); options on "
                             "the command line win; a run directory's config.yaml reruns that run")


def config_path(argv: list[str]) -> str | None:
    """The ``--config`` value on a command line (the last one given), before it is parsed."""
    found = None
    for i, arg in enumerate(argv):
        if arg == OPTION and i + 1 < len(argv):
            found = argv[i + 1]
        elif arg.startswith(OPTION + "="):
            found = arg.split("=", 1)[1]
    return found


def _flatten(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flatten(value, name + "."))
        else:
            flat[name] = value
    return flat


def read(path: str) -> dict[str, Any]:
    """The file's options as a flat mapping (nested keys joined with dots); one clear error for a file that
    is missing or is not a YAML mapping."""
    import yaml

    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"--config {path}: no such file")
    try:
        loaded = yaml.safe_load(file.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        raise ValueError(f"--config {path}: not valid YAML ({' '.join(str(err).split())})") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ValueError(f"--config {path}: the file must be a mapping of option names to values, not a "
                         f"{type(loaded).__name__}")
    return _flatten(loaded)


def _names(action: argparse.Action) -> list[str]:
    """The keys that address ``action``: its dest and its option strings without the dashes, in both
    spellings (``kl_beta``, ``kl-beta``)."""
    names = {action.dest} | {s.lstrip("-") for s in action.option_strings if s.startswith("--")}
    return sorted(names | {n.replace("-", "_") for n in names} | {n.replace("_", "-") for n in names})


def _value(action: argparse.Action, key: str, value: Any, path: str) -> Any:
    """``value`` as the option would have parsed it, or one error naming the key."""
    def bad(why: str) -> ValueError:
        return ValueError(f"--config {path}: {key}: {why}")

    if value is None:
        return None
    if isinstance(action, argparse.BooleanOptionalAction) or action.nargs == 0:
        if not isinstance(value, bool):
            raise bad(f"expected true or false, got {value!r}")
        return value
    several = action.nargs in ("+", "*") or isinstance(action.nargs, int)
    if several and not isinstance(value, list):
        value = [value]
    if not several and isinstance(value, list | dict):
        raise bad(f"expected one value, got {value!r}")

    def one(item: Any) -> Any:
        if isinstance(item, list | dict):
            raise bad(f"expected a plain value, got {item!r}")
        if isinstance(item, bool):  # YAML reads yes/no/on/off as booleans too
            raise bad(f"expected a value, got {str(item).lower()} (quote it if it is text)")
        # an option parses text; a number the file already typed goes to int / float as it is
        raw = item if isinstance(item, str) or action.type in (int, float) else str(item)
        try:
            item = action.type(raw) if action.type is not None else raw
        except (TypeError, ValueError, argparse.ArgumentTypeError) as err:
            raise bad(f"{item!r} is not valid ({err})") from None
        if action.choices is not None and item not in action.choices:
            raise bad(f"{item!r} is not one of {', '.join(map(str, action.choices))}")
        return item

    return [one(v) for v in value] if several else one(value)


def apply(parser: argparse.ArgumentParser, path: str, command: str) -> None:
    """Set ``parser``'s defaults from the file at ``path``: options given on the command line still win.
    An option the file gives is no longer required on the command line."""
    by_name: dict[str, argparse.Action] = {}
    for action in parser._actions:
        if action.option_strings and action.dest not in ("help", "config"):
            for name in _names(action):
                by_name.setdefault(name, action)
    defaults: dict[str, Any] = {}
    for key, value in read(path).items():
        action = by_name.get(key)
        if action is None:
            near = difflib.get_close_matches(key, list(by_name), n=1, cutoff=0.6)
            hint = f" (did you mean {near[0]}?)" if near else f" (`muarl {command} --help` lists them)"
            raise ValueError(f"--config {path}: {key!r} is not an option of muarl {command}{hint}")
        defaults[action.dest] = _value(action, key, value, path)
        if value is not None:
            action.required = False
    parser.set_defaults(**defaults)


def subparser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser | None:
    """The parser of ``command`` under the ``muarl`` parser."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices.get(command)
    return None
