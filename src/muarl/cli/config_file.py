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

Every way a file can be wrong is one short line naming the file (:func:`read`, :func:`apply`): a key given
twice (in YAML, or in two spellings of one option), a value the option would not take from the command line
(``seed: 1.5`` as ``--seed 1.5``), bytes that are not UTF-8, and aliases that expand past
:data:`MAX_NODES` values (a "billion laughs" file), which are refused before anything is built from them.
"""

from __future__ import annotations

import argparse
import difflib
import reprlib
from pathlib import Path
from typing import Any

#: the commands that run something, and so take ``--config``
TAKES_CONFIG = ("sft", "grpo", "pretrain", "eval", "rollout", "synth", "demo", "ablate")

OPTION = "--config"
#: where the parsed options keep the file's own values (``{dest: value}``), so that a run's settings can
#: apply the file and the flags as two layers, the flags over the file (:func:`muarl.train.settings.resolve`)
FILE_VALUES = "config_file_values"

#: a file whose values, aliases expanded, number more than this is refused (a GRPO run's config.yaml: ~130)
MAX_NODES = 10_000
#: the longest error line this module writes, in characters (a value is shown cut short)
MAX_MESSAGE = 400

_shown = reprlib.Repr()
_shown.maxstring = _shown.maxother = 60
_shown.maxlist = _shown.maxdict = 6


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


def _error(path: str, text: str) -> ValueError:
    """One error line naming the file, cut to :data:`MAX_MESSAGE` characters."""
    message = f"{OPTION} {path}: {' '.join(text.split())}"
    return ValueError(message if len(message) <= MAX_MESSAGE else message[:MAX_MESSAGE - 3] + "...")


def _flatten(values: dict[str, Any], path: str, prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        for sub, item in (_flatten(value, path, name + ".") if isinstance(value, dict) else {name: value}).items():
            if sub in flat:  # ``grpo: {steps: 2}`` beside ``grpo.steps: 3``
                raise _error(path, f"{sub} is given twice")
            flat[sub] = item
    return flat


def _check_nodes(node: Any, path: str) -> None:
    """Before anything is built from the document: refuse a key given twice in one mapping (PyYAML keeps
    the last silently), and a document whose values, aliases expanded, number more than :data:`MAX_NODES`
    or that contains itself. Each distinct node is visited once, so a billion laughs costs its own size."""
    import yaml

    sizes: dict[int, int] = {}
    open_: set[int] = set()

    def size(n: Any) -> int:
        if id(n) in sizes:
            return sizes[id(n)]
        if id(n) in open_:
            raise _error(path, "an alias refers to the mapping or list that contains it")
        total = 1
        if isinstance(n, yaml.MappingNode):
            lines: dict[tuple[str, str], int] = {}
            for key, _ in n.value:  # ``<<: *base`` merges keys that this mapping may override: not a repeat
                if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                    line = key.start_mark.line + 1
                    if (key.tag, key.value) in lines:
                        raise _error(path, f"{_shown.repr(key.value)} is given twice (lines "
                                           f"{lines[key.tag, key.value]} and {line})")
                    lines[key.tag, key.value] = line
        if isinstance(n, yaml.SequenceNode | yaml.MappingNode):
            open_.add(id(n))
            children = n.value if isinstance(n, yaml.SequenceNode) else [c for pair in n.value for c in pair]
            for child in children:
                total += size(child)
                if total > MAX_NODES:
                    raise _error(path, f"its aliases expand to more than {MAX_NODES} values (nested aliases?); "
                                       "refused before reading them")
            open_.discard(id(n))
        sizes[id(n)] = total
        return total

    size(node)


def read(path: str) -> dict[str, Any]:
    """The file's options as a flat mapping (nested keys joined with dots); one clear error for a file that
    is missing, is not UTF-8, is not a YAML mapping, gives a key twice or expands past :data:`MAX_NODES`."""
    import yaml

    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"--config {path}: no such file")
    data = file.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[:err.start].count(b"\n") + 1
        raise _error(path, f"not UTF-8 text (byte 0x{data[err.start]:02x} on line {line}); save it as "
                           "UTF-8") from None
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is not None:
            _check_nodes(node, path)
        loaded = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as err:
        raise _error(path, f"not valid YAML ({err})") from None
    except RecursionError:
        raise _error(path, "nested too deeply") from None
    finally:
        loader.dispose()
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise _error(path, "the file must be a mapping of option names to values, not a "
                           f"{type(loaded).__name__}")
    return _flatten(loaded, path)


def _names(action: argparse.Action) -> list[str]:
    """The keys that address ``action``: its dest and its option strings without the dashes, in both
    spellings (``kl_beta``, ``kl-beta``)."""
    names = {action.dest} | {s.lstrip("-") for s in action.option_strings if s.startswith("--")}
    return sorted(names | {n.replace("-", "_") for n in names} | {n.replace("_", "-") for n in names})


def _value(action: argparse.Action, key: str, value: Any, path: str) -> Any:
    """``value`` as the option would have parsed it, or one error naming the key."""
    def bad(why: str) -> ValueError:
        return _error(path, f"{key}: {why}")

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
        raise bad(f"expected one value, got {_shown.repr(value)}")

    def one(item: Any) -> Any:
        if isinstance(item, list | dict):
            raise bad(f"expected a plain value, got {_shown.repr(item)}")
        if isinstance(item, bool):  # YAML reads yes/no/on/off as booleans too
            raise bad(f"expected a value, got {str(item).lower()} (quote it if it is text)")
        if action.type is int and isinstance(item, float) and not item.is_integer():  # int(1.5) would be 1
            raise bad(f"{item!r} is not a whole number ({action.option_strings[0]} takes one)")
        # an option parses text; a number the file already typed goes to int / float as it is
        raw = item if isinstance(item, str) or action.type in (int, float) else str(item)
        try:
            item = action.type(raw) if action.type is not None else raw
        except (TypeError, ValueError, argparse.ArgumentTypeError) as err:
            raise bad(f"{_shown.repr(item)} is not valid ({err})") from None
        if action.choices is not None and item not in action.choices:
            raise bad(f"{_shown.repr(item)} is not one of {', '.join(map(str, action.choices))}")
        return item

    return [one(v) for v in value] if several else one(value)


def apply(parser: argparse.ArgumentParser, path: str, command: str) -> None:
    """Set ``parser``'s defaults from the file at ``path``: options given on the command line still win.
    An option the file gives is no longer required on the command line. The file's values are also kept
    whole, under :data:`FILE_VALUES`, for the settings' layers (:func:`muarl.cli.config_options.layers`)."""
    by_name: dict[str, argparse.Action] = {}
    for action in parser._actions:
        if action.option_strings and action.dest not in ("help", "config"):
            for name in _names(action):
                by_name.setdefault(name, action)
    defaults: dict[str, Any] = {}
    given_as: dict[str, str] = {}
    for key, value in read(path).items():
        action = by_name.get(key)
        if action is None:
            near = difflib.get_close_matches(key, list(by_name), n=1, cutoff=0.6)
            hint = f" (did you mean {near[0]}?)" if near else f" (`muarl {command} --help` lists them)"
            raise _error(path, f"{_shown.repr(key)} is not an option of muarl {command}{hint}")
        if action.dest in given_as:  # ``kl_beta`` and ``kl-beta``: one option twice
            raise _error(path, f"{given_as[action.dest]} and {key} are the same option "
                               f"({action.option_strings[0]}); give it once")
        given_as[action.dest] = key
        defaults[action.dest] = _value(action, key, value, path)
        if value is not None:
            action.required = False
    parser.set_defaults(**defaults, **{FILE_VALUES: dict(defaults)})


def subparser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser | None:
    """The parser of ``command`` under the ``muarl`` parser."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices.get(command)
    return None
