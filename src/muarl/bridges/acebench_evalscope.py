"""evalscope's ACEBench modules, imported without running evalscope's package ``__init__``.

evalscope carries ACEBench's executable scenario classes (``evalscope.third_party.acebench.en``: BaseApi,
MessageApi, ReminderApi, FoodPlatform, Travel), its instantiation and state capture
(``evalscope.benchmarks.acebench.scenarios``), its prompts and its checker (``...acebench.checker``).
Those modules need the standard library only, but ``import evalscope`` runs the package ``__init__``,
which loads evalscope's whole evaluation framework (modelscope, nltk, jieba, ... dozens of packages that
muarl neither needs nor installs). So while the wanted modules load, the two parents whose ``__init__``
does that (``evalscope`` and ``evalscope.benchmarks``) stand in ``sys.modules`` as bare package shells
(their ``__path__`` and nothing else); then the shells are taken out again. The loaded modules stay
cached under their real names, so evalscope's own absolute imports of them (``scenarios`` imports the
scenario classes by name) find them, and a later real ``import evalscope`` still works.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import threading
import types
from typing import Any

from muarl.bridges import MissingExtra

BENCHMARK = "evalscope.benchmarks.acebench"
SCENARIOS = "evalscope.third_party.acebench.en"
_SHELLS = ("evalscope", "evalscope.benchmarks")
_lock = threading.Lock()


def _shells() -> list[str]:
    """Put package shells for the heavy parents in ``sys.modules``; returns the names it added."""
    spec = importlib.util.find_spec("evalscope")
    if spec is None or not spec.submodule_search_locations:
        raise MissingExtra("the acebench bridge needs the package evalscope, which is not installed; install it "
                           "with `bash scripts/install.sh --dev` (or see the 'acebench' extra in pyproject.toml)")
    root = list(spec.submodule_search_locations)[0]
    added = []
    for name, path in zip(_SHELLS, (root, f"{root}/benchmarks"), strict=True):
        if name not in sys.modules:
            shell = types.ModuleType(name)
            shell.__path__ = [path]
            sys.modules[name] = shell
            added.append(name)
    return added


def module(name: str) -> Any:
    """``evalscope.benchmarks.acebench.<name>`` (checker, scenarios, prompts, parser, rollout), or a full
    dotted evalscope module name; every English scenario class module is loaded alongside."""
    full = name if name.startswith("evalscope.") else f"{BENCHMARK}.{name}"
    if full in sys.modules:
        return sys.modules[full]
    with _lock:
        added = _shells()
        try:
            loaded = importlib.import_module(full)
            mapping = importlib.import_module(f"{BENCHMARK}.scenarios").CLASS_MODULE_MAPPING
            for scenario in mapping.values():
                importlib.import_module(f"{SCENARIOS}.{scenario}")
        except ImportError as err:
            raise MissingExtra(f"the acebench bridge could not import {full} from evalscope ({err}); install it "
                               "with `bash scripts/install.sh --dev` (or see the 'acebench' extra in "
                               "pyproject.toml)") from err
        finally:
            for shell in added:
                sys.modules.pop(shell, None)
    return loaded
