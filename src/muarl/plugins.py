"""Objects of one's own named ``module:attr`` on the command line: a domain, a policy or a simulated user.

Why one loader: ``--domain``, ``--policy``/``--teacher`` and ``--user`` all take ``module:attr``, and a
mistake in any of them (a misspelt module, a missing attribute, an object of the wrong type, a module
that raises while importing) must read the same way: one line naming the option and what is wrong, which
the command line prints as ``muarl: error: ...`` (exit 2), never a traceback. The attribute may be the
object itself or a zero-argument factory of it (a function, or a class whose constructor needs nothing).
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from types import ModuleType
from typing import Any, TypeVar

T = TypeVar("T")


class PluginError(ValueError):
    """A ``module:attr`` that cannot be loaded as the object asked for; the message is one line."""


def put_cwd_on_path() -> None:
    """Let ``module:attr`` name a module in the current directory, as ``python -m muarl`` does.

    The ``muarl`` console script's ``sys.path`` starts at the script's folder, not the current directory;
    appending (not prepending) it finds a plug-in there without letting a stray local file shadow an
    installed package.
    """
    here = os.getcwd()
    if here not in sys.path and "" not in sys.path:
        sys.path.append(here)


def import_here_too(module: str) -> ModuleType:
    """Import ``module``, also from the current directory when it is not on the path (library callers of
    :func:`load` outside the command line); the directory is on the path only for this import."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as err:
        here = os.getcwd()
        if err.name != module.split(".")[0] or here in sys.path or "" in sys.path:
            raise
    sys.path.insert(0, here)
    try:
        return importlib.import_module(module)
    finally:
        sys.path.remove(here)


def load(spec: str, expected: type[T], option: str, kind: str) -> T:
    """The ``expected`` object ``spec`` (``module:attr``) names, or a :class:`PluginError`.

    ``option`` names the command-line option in messages (``--policy``), ``kind`` the object in plural
    (``policies``) for the hint that lists what the module does define.
    """
    module, _, attr = spec.partition(":")
    if not module or not attr:
        raise PluginError(f"{option} {spec!r}: expected module:attribute, e.g. my_module:my_object")
    try:
        loaded = import_here_too(module)
    except ImportError as err:
        raise PluginError(f"{option} {spec!r}: cannot import module {module!r} ({err}); is its folder on "
                          "PYTHONPATH (or the current directory)?") from None
    except Exception as err:  # noqa: BLE001 - the plug-in's own bug, reported in one line
        raise PluginError(f"{option} {spec!r}: importing module {module!r} raised {_one_line(err)}") from None
    if not hasattr(loaded, attr):
        found = sorted(k for k, v in vars(loaded).items() if not k.startswith("_") and _provides(v, expected, module))
        raise PluginError(f"{option} {spec!r}: module {module!r} has no attribute {attr!r}"
                          + (f" (its {kind}: {', '.join(found)})" if found else ""))
    obj = getattr(loaded, attr)
    if isinstance(obj, expected):
        return obj
    if not callable(obj):
        raise PluginError(f"{option} {spec!r}: {module}.{attr} is {_a(type(obj).__name__)}, not "
                          f"{_a(expected.__name__)} (nor a function that returns one)")
    try:
        inspect.signature(obj).bind()
    except TypeError:
        raise PluginError(f"{option} {spec!r}: {module}.{attr} is not {_a(expected.__name__)} and cannot be called "
                          "without arguments (name the object, or a factory that needs none)") from None
    except ValueError:  # a builtin without a signature: let the call decide
        pass
    try:
        made = obj()
    except Exception as err:  # noqa: BLE001 - the plug-in's own bug, reported in one line
        raise PluginError(f"{option} {spec!r}: calling {module}.{attr}() raised {_one_line(err)}") from None
    if not isinstance(made, expected):
        raise PluginError(f"{option} {spec!r}: {module}.{attr}() returned {_a(type(made).__name__)}, not "
                          f"{_a(expected.__name__)}")
    return made


def _provides(value: Any, expected: type, module: str) -> bool:
    """Whether a module attribute is, or is a class (defined there) that makes, an ``expected`` (for the
    did-you-mean hint; classes the module merely imports are not its own)."""
    return isinstance(value, expected) or (isinstance(value, type) and issubclass(value, expected)
                                           and value.__module__ == module and not inspect.isabstract(value))


def _a(noun: str) -> str:
    return f"{'an' if noun[:1].lower() in 'aeio' else 'a'} {noun}"  # 'a UserSimulator'


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text}" if text else type(err).__name__
