"""Command-line options generated from config dataclasses, so each option is defined once: by its field.

A training option used to live in four places (the config field, an ``add_argument`` call, a list of names
copied into the config, and the demo's copy of the field), and they drifted. Here every field of a config
declares its help, and optionally ``choices`` and ``metavar``, in ``field(metadata=...)``;
:func:`add_config_options` turns the fields into options (``--name-with-dashes``; a bool is ``--x`` /
``--no-x``, ``X | None`` an optional value, a list ``nargs="+"``) and :func:`given` reads the values back.
Every option defaults to None, so one left out keeps the preset's value (:func:`muarl.train.settings.resolve`).
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from collections.abc import Collection, Mapping
from typing import Any


def flag_of(name: str) -> str:
    """The option a field gets unless its command renames it: ``kl_beta`` -> ``--kl-beta``."""
    return "--" + name.replace("_", "-")


def _kind(hint: Any) -> tuple[Any, bool]:
    """The type an option converts its value to, and whether it takes several (a list or tuple field)."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):  # X | None: the value is optional, its type is X's
        (inner,) = [a for a in typing.get_args(hint) if a is not type(None)]
        return _kind(inner)
    if origin in (list, tuple):
        return typing.get_args(hint)[0], True
    return hint, False


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, list | tuple):
        return " ".join(map(str, value)) or "none"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _default_note(name: str, presets: Mapping[str, Any]) -> str:
    """`` (default X)``, or each preset's value where they differ; nothing where no preset sets a value."""
    values = {preset: getattr(config, name) for preset, config in presets.items()}
    if all(v is None or v == "" for v in values.values()):
        return ""  # the help says what an unset value means
    shown = {preset: _shown(v) for preset, v in values.items()}
    if len(set(shown.values())) == 1:
        return f" (default {next(iter(shown.values()))})"
    return " (presets: " + ", ".join(f"{preset} {v}" for preset, v in shown.items()) + ")"


def add_config_options(parser: Any, cls: type, presets: Mapping[str, Any], *, only: Collection[str] | None = None,
                       flags: Mapping[str, str] | None = None, dest_prefix: str = "",
                       required: Collection[str] = ()) -> None:
    """Add an option for each field of the dataclass ``cls`` (those in ``only``, when given) to ``parser``
    (a parser or an argument group).

    ``presets`` are the configs a command starts from (their values are shown as the defaults); ``flags``
    renames a field's option (the demo's ``--grpo-steps``); ``dest_prefix`` keeps fields of nested configs
    apart in the namespace (``grpo.steps``); ``required`` fields must be given. A field without help in
    its metadata is a programming error: every config field is an option, documented where it is defined.
    """
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if only is not None and f.name not in only:
            continue
        meta = f.metadata
        if not meta.get("help"):
            raise TypeError(f"{cls.__name__}.{f.name} has no help in its field metadata: every config field is a "
                            "command-line option (field(metadata={'help': ...}))")
        kind, several = _kind(hints[f.name])
        options: dict[str, Any] = {"dest": dest_prefix + f.name, "default": None}
        if kind is bool:
            options["action"] = argparse.BooleanOptionalAction
        else:
            options["type"] = kind
            if several:
                options["nargs"] = "+"
            options.update({key: meta[key] for key in ("choices", "metavar") if key in meta})
            if "choices" not in meta:  # the field's name, not the dest's (grpo.steps)
                options.setdefault("metavar", f.name.upper())
        note = _default_note(f.name, presets)
        if f.name in required:
            options["required"], note = True, ""
        action = parser.add_argument((flags or {}).get(f.name) or flag_of(f.name), **options)
        # set after construction: BooleanOptionalAction appends its own "(default: None)" on some Pythons
        action.help = (meta["help"] + note).replace("%", "%%")


def given(args: argparse.Namespace, cls: type, dest_prefix: str = "") -> dict[str, Any]:
    """The fields of ``cls`` that ``args`` set (options left out are None and not included), converted to
    the field's type where argparse's differs (a tuple field gets a tuple)."""
    hints = typing.get_type_hints(cls)
    values = {}
    for f in dataclasses.fields(cls):
        value = getattr(args, dest_prefix + f.name, None)
        if value is not None:
            values[f.name] = tuple(value) if typing.get_origin(hints[f.name]) is tuple else value
    return values


def layers(args: argparse.Namespace, cls: type, dest_prefix: str = "") -> tuple[dict[str, Any], dict[str, Any]]:
    """(the config file's values, the flags') of the fields of ``cls``: the two layers a run's settings put
    over its preset (:func:`muarl.train.settings.resolve`).

    The file's values are the parser's defaults (:func:`muarl.cli.config_file.apply`), so ``args`` holds a
    flag's value where one was given and the file's elsewhere; a flag is a value that differs from the
    file's (one equal to it changes nothing whichever layer it is counted in)."""
    from muarl.cli.config_file import FILE_VALUES

    file_values = getattr(args, FILE_VALUES, None) or {}
    file = given(argparse.Namespace(**file_values), cls, dest_prefix)
    flags = {k: v for k, v in given(args, cls, dest_prefix).items() if k not in file or file[k] != v}
    return file, flags
