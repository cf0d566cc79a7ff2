"""The walk a newcomer follows through one ``muarl grpo`` run's settings, measured (issue 58, item 2).

    python scripts/settings_walk.py            # a tiny retail run: 1 step, 1 task, a group of 2
    python scripts/settings_walk.py -- --domain retail-lite --max-turns 3   # other muarl grpo options

It runs ``muarl grpo`` in this process under a profiler (:func:`sys.setprofile`, every thread) and prints
what a reader would have to open to follow the run from its command line:

- **settings**: the muarl functions, in the order they are first entered, that take or return the command
  line, the parsed options, a config file's values or the run's config, from ``main()`` until
  :func:`muarl.train.run.open_run` has recorded the resolved settings; the files they are in, and how often
  the walk moves from one file to another;
- **where the run config is built**: the chain of muarl calls above each construction of the config (each
  ``__post_init__``: a preset merged with options, a derived default filled in), and the files on them;
- **models.py**: how often code outside ``muarl/models.py`` calls into it (an entry: the callee digs a model
  out of a spec again), in the run's setup (until its first step) and in the whole run, by function;
- **config handed to**: the files whose functions are given the whole run config as an argument.

The figures are counts, not timings: the same checkout gives the same numbers on any machine. Another
checkout's figures (the walk before train/settings.py): ``PYTHONPATH=CHECKOUT/src python scripts/settings_walk.py``.
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import threading
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

import muarl

ROOT = Path(muarl.__file__).resolve().parent
MODELS = str(ROOT / "models.py")
#: the run measured: as small as a GRPO run goes (one step of one group of two short episodes)
TINY = ["--preset", "tiny", "--model", "tiny", "--domain", "retail", "--steps", "1", "--tasks-per-step", "1",
        "--group-size", "2", "--max-new-tokens", "8", "--max-turns", "2", "--report-to", "none", "--no-progress"]
#: its config file: two settings the flags leave alone, one they override (``--max-turns 2`` wins)
CONFIG_FILE = "lr: 0.003\nkl_beta: 0.01\nmax_turns: 5\n"


def _short(code: CodeType) -> str | None:
    """``train/grpo.py`` for a code object of muarl's, None for anyone else's."""
    path = code.co_filename
    return path[len(str(ROOT)) + 1:] if path.startswith(str(ROOT)) else None


class Walk:
    """The profiler's tallies; one callback for every thread."""

    def __init__(self) -> None:
        try:
            from muarl.train.settings import Resolved, RunSettings
        except ImportError:  # a checkout from before train/settings.py (issue 58): the walk it replaced
            from muarl.train import RunSettings  # type: ignore[attr-defined,no-redef]

            Resolved = RunSettings  # type: ignore[misc,assignment]

        # the parsed options and the config (bare or resolved); not the parser, which declares options (a
        # parser-building function defines what may be set, not what a run is set to)
        self.settings_types: tuple[type, ...] = (argparse.Namespace, RunSettings, Resolved)
        self.config_type: tuple[type, ...] = (RunSettings, Resolved)
        self.phase = "settings"  # then "setup" (after open_run), then "steps" (from the first next_step)
        self.settings: list[str] = []  # "file:function" in first-entry order
        self.hops: list[str] = []  # the file of each settings function entered, when it differs from the last
        self.models: dict[str, collections.Counter[str]] = {p: collections.Counter()
                                                            for p in ("settings", "setup", "steps")}
        self.handed: set[str] = set()
        #: each chain of muarl calls (outermost first) that built or changed the run config, and how often
        self.built: collections.Counter[tuple[str, ...]] = collections.Counter()
        self._names: dict[CodeType, str | None] = {}
        self._importing = 0

    def _settings_value(self, value: Any) -> bool:
        return isinstance(value, self.settings_types)

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if event not in ("call", "return"):
            return
        code = frame.f_code
        if code not in self._names:
            self._names[code] = _short(code)
        name = self._names[code]
        if name is None:
            return
        if code.co_name == "<module>":  # an import: what it builds (the presets) is no step of the walk
            self._importing += 1 if event == "call" else -1
            return
        if self._importing or code.co_name.startswith("<"):  # ... nor is a comprehension
            return
        where = f"{name}:{code.co_name}"
        if event == "return":
            if self.phase == "settings" and name == "train/run.py" and code.co_name == "open_run":
                self.phase = "setup"
            if self.phase == "settings" and self._settings_value(arg):
                self._visit(name, where)
            return
        if name == "train/orchestrator.py" and code.co_name == "next_step" and self.phase == "setup":
            self.phase = "steps"
        args = [frame.f_locals.get(n) for n in code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]]
        if code.co_filename == MODELS and frame.f_back is not None and frame.f_back.f_code.co_filename != MODELS:
            # a spec (text or a path) is dug out again; a model object (is_lora, causal_lm) is only looked at
            kind = "spec" if args and isinstance(args[0], str | Path) else "object" if args else "no argument"
            self.models[self.phase][f"{code.co_name}({kind})"] += 1
        if any(isinstance(a, self.config_type) for a in args):
            self.handed.add(name)
        if self.phase == "settings" and code.co_name == "__post_init__" and isinstance(args[0], self.config_type):
            self.built[self._chain(frame.f_back)] += 1
        if self.phase == "settings" and (any(self._settings_value(a) for a in args)
                                         or name == "cli/config_file.py"):
            self._visit(name, where)

    def _chain(self, frame: FrameType | None) -> tuple[str, ...]:
        """The muarl functions on the stack above ``frame`` (itself included), outermost first."""
        chain = []
        while frame is not None:
            name = _short(frame.f_code)
            if name is not None and not frame.f_code.co_name.startswith("<"):
                chain.append(f"{name}:{frame.f_code.co_name}")
            frame = frame.f_back
        return tuple(reversed(chain))

    def _visit(self, name: str, where: str) -> None:
        if where not in self.settings:
            self.settings.append(where)
        if not self.hops or self.hops[-1] != name:
            self.hops.append(name)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("grpo", nargs=argparse.REMAINDER, help="-- then more muarl grpo options (after the tiny run's)")
    extra = [a for a in parser.parse_args().grpo if a != "--"]
    from muarl.cli import main as muarl_main

    walk = Walk()
    with tempfile.TemporaryDirectory(prefix="muarl-walk-") as scratch:
        # every layer of the settings takes part: the preset, a config file, flags, a derived default
        config = Path(scratch) / "config.yaml"
        config.write_text(CONFIG_FILE)
        out = str(Path(scratch) / "run")
        argv = ["grpo", *TINY, *extra, "--config", str(config), "--out", out]
        threading.setprofile(walk)
        sys.setprofile(walk)
        try:
            code = muarl_main(argv)
        finally:
            sys.setprofile(None)
            threading.setprofile(None)  # type: ignore[arg-type]
    if code:
        print(f"muarl grpo exited {code}", file=sys.stderr)
        return code
    files = list(dict.fromkeys(w.split(":")[0] for w in walk.settings))
    print(f"muarl grpo {' '.join(argv[1:-4])} --config FILE --out DIR  (FILE: {CONFIG_FILE!r})")
    print(f"\nsettings, from main() to open_run: {len(walk.settings)} functions in {len(files)} files, "
          f"{len(walk.hops) - 1} moves between files")
    for name in files:
        print(f"  {name}: " + ", ".join(w.split(":")[1] for w in walk.settings if w.startswith(name + ":")))
    print("  walk: " + " -> ".join(walk.hops))
    chains = list(walk.built)
    files_built = list(dict.fromkeys(w.split(":")[0] for chain in chains for w in chain))
    print(f"\nwhere the run config is built (each chain of calls that made one): {len(chains)} chains over "
          f"{len(files_built)} files")
    for chain in chains:
        print(f"  {walk.built[chain]}x " + " -> ".join(chain))
    for phase, label in (("settings", "settings"), ("setup", "setup (open_run to the first step)"),
                         ("steps", "the step")):
        counts = walk.models[phase]
        specs = sum(n for fn, n in counts.items() if fn.endswith("(spec)"))
        detail = ", ".join(f"{fn} {n}" for fn, n in counts.most_common())
        print(f"\nmodels.py entered from outside, {label}: {sum(counts.values())}, {specs} from a spec"
              + (f" ({detail})" if detail else ""))
    print(f"\nthe run config handed to {len(walk.handed)} files: {', '.join(sorted(walk.handed))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
