"""Domain: the public way to describe a world an agent works in, and the registry of known domains.

A domain is data (a seeded database generator), tools for the agent and optionally for the user, a
written policy, and a seeded task generator. The built-in domains use nothing but this module, so a
domain of your own is a peer of ``retail``: build a :class:`Domain` and :func:`register` it.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from muarl.db import Database
from muarl.env import Env
from muarl.tools import Tool
from muarl.types import SPLITS, Reward, Task

if TYPE_CHECKING:
    from muarl.users.base import UserSimulator

#: (seed, size) -> tables. ``size`` scales the number of users; the generator picks the rest.
DBBuilder = Callable[[int, int], Mapping[str, Mapping[str, Any]]]
#: (domain, seed, counts per split) -> tasks with gold actions.
TaskBuilder = Callable[["Domain", int, Mapping[str, int]], list[Task]]
#: (table, record) -> id of the user who owns it, or None for shared records (products, flights ...).
OwnerFn = Callable[[str, Mapping[str, Any]], "str | None"]


@dataclass
class Domain:
    """Everything muarl needs to run, grade and train on one kind of conversation."""

    name: str
    description: str
    policy: str
    tools: list[Tool]
    build_db: DBBuilder
    build_tasks: TaskBuilder
    owner_of: OwnerFn = lambda table, record: None  # noqa: E731
    user_tools: list[Tool] = field(default_factory=list)
    db_seed: int = 0
    db_size: int = 200
    task_seed: int = 0
    task_counts: Mapping[str, int] = field(default_factory=lambda: {"train": 200, "dev": 40, "test": 80})
    tasks_file: Path | None = None
    # Extension points for worlds that are not a muarl Database (bridges to tau2-bench, BFCL ...); all
    # optional, the built-in domains use none of them.
    #: build one rollout's env (domain, task, context) instead of an Env over a view of database()
    make_env: Callable[[Domain, Task | None, dict[str, Any]], Env] | None = None
    #: grade an episode instead of the DB-match judge: (domain, task, trajectory, env or None,
    #: require_outputs) -> Reward, for benchmarks whose own checker is the reference
    scorer: Callable[..., Reward] | None = None
    #: the domain the agent sees in one episode of a task (say, only the tools that task involves)
    narrow: Callable[[Domain, Task], Domain] | None = None
    #: who plays the tasks when the scripted user is asked for (tasks whose user turns are data)
    scripted_user: UserSimulator | None = None
    #: the agent tools that are domain-independent helpers (a scratchpad, a calculator, a hand-off to a human),
    #: not the domain's own business: GRPO logs each one's agent calls per episode as ``calls_<name>`` (the
    #: paper's training dynamics), which core code cannot know by name. None by default
    general_tools: tuple[str, ...] = ()
    #: whether writes need an authenticated user (reported as a violation otherwise)
    requires_auth: bool = True
    #: the built-in domain this one is a narrowed view of (same world, fewer tools, shorter policy), so
    #: that its expert script applies; empty for a domain of its own
    base: str = ""
    #: how the scenario-driven scripted user words this domain's requests and checks proposals (a
    #: :class:`muarl.users.script.UserScript`); None: the generic wording, from the scenario's data alone
    user_script: Any = None
    #: the reference agent's richer script for this domain: (domain, task) -> PolicySession; None: the
    #: generic teacher, which needs only the task and the declared tools (see ``Tool.authenticates``).
    #: The unsafe ``expert-noconfirm`` calls it with ``skip_confirmation=True`` as well (a subclass of
    #: :class:`muarl.policies.script.TeacherSession` takes both)
    teacher: Callable[..., Any] | None = None
    #: what besides muarl's own code decides this domain's results (a benchmark package's version, its
    #: task set, a hash of the data files read), recorded in every results file (:mod:`muarl.provenance`)
    #: so that two numbers made from different data are told apart; a dict, or a zero-argument callable
    #: computing one when a result is written. None: nothing beyond muarl's commit (the built-in domains)
    provenance: Mapping[str, Any] | Callable[[], Mapping[str, Any]] | None = None

    def __post_init__(self) -> None:
        names = [t.name for t in self.tools]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"domain {self.name}: duplicate agent tools {sorted(dup)}")
        for t in self.user_tools:
            if t.spec.actor != "user":
                raise ValueError(f"domain {self.name}: user tool {t.name} must be declared with actor='user'")
        self._db: Database | None = None
        self._tasks: list[Task] | None = None

    # -- data ---------------------------------------------------------------------------------------
    def database(self) -> Database:
        """The default database, generated from ``db_seed`` once per process and shared by all envs."""
        if self._db is None:
            self._db = Database(self.build_db(self.db_seed, self.db_size))
        return self._db

    def with_database(self, seed: int | None = None, size: int | None = None) -> Domain:
        """The same domain over another generated database (say, a bigger one to draw 100k tasks from).

        Its tasks come from :meth:`generate_tasks`, never from the shipped file, which belongs to the
        default database.
        """
        return dataclasses.replace(self, db_seed=self.db_seed if seed is None else seed,
                                   db_size=self.db_size if size is None else size, tasks_file=None)

    def env(self, task: Task | None = None, **context: Any) -> Env:
        """A fresh rollout environment (cheap: no data is copied or parsed)."""
        if self.make_env is not None:
            return self.make_env(self, task, dict(context))
        return Env(self, task, context)

    def for_task(self, task: Task) -> Domain:
        """The domain as the agent sees it in an episode of ``task``: itself unless ``narrow`` says otherwise."""
        return self if self.narrow is None else self.narrow(self, task)

    @cached_property
    def agent_tools(self) -> dict[str, Tool]:
        return {t.name: t for t in self.tools}

    @cached_property
    def user_tool_map(self) -> dict[str, Tool]:
        return {t.name: t for t in self.user_tools}

    # -- tasks --------------------------------------------------------------------------------------
    def generate_tasks(self, seed: int | None = None, counts: Mapping[str, int] | None = None) -> list[Task]:
        """Generate tasks from a seed against the default database (any number, deterministic)."""
        seed = self.task_seed if seed is None else seed
        return self.build_tasks(self, seed, dict(counts or self.task_counts))

    def tasks(self, split: str | None = None) -> list[Task]:
        """The default task set: the ``tasks_file`` when one is set, else generated from the task seed.

        A ``tasks_file`` that does not exist is an error, not a quiet switch to generated tasks: results
        on other tasks than the ones named would read as results on those.
        """
        if self._tasks is None:
            if self.tasks_file is not None:
                if not Path(self.tasks_file).is_file():
                    raise FileNotFoundError(f"domain {self.name}: tasks file {self.tasks_file} does not exist "
                                            "(set tasks_file=None to generate tasks from task_seed)")
                self._tasks = load_tasks(self.tasks_file)
            else:
                self._tasks = self.generate_tasks()
        if split is None:
            return list(self._tasks)
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; choose from {', '.join(SPLITS)}")
        return [t for t in self._tasks if t.split == split]

    def task(self, task_id: str) -> Task:
        for t in self.tasks():
            if t.id == task_id:
                return t
        raise KeyError(f"domain {self.name} has no task {task_id!r}")


class TasksFileError(ValueError):
    """A tasks file that cannot be used as it is; the one-line message names the file and the task."""


def load_tasks(path: Path) -> list[Task]:
    """The tasks of a tasks file (``{"tasks": [...]}``, as :func:`save_tasks` writes), validated.

    Every task must list its ``gold_actions``, an explicit ``[]`` for a task that needs no write: a task
    that merely left them out would grade "change nothing" as a win, so doing nothing would score 1.0.
    A missing file is FileNotFoundError; bad JSON, a task that does not validate and ids used twice are
    :class:`TasksFileError`, naming the file and the task (its id, else its index).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"tasks file {path} does not exist")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as err:
        raise TasksFileError(f"tasks file {path}: not UTF-8 text ({err.reason} at byte {err.start})") from None
    except json.JSONDecodeError as err:
        raise TasksFileError(f"tasks file {path}: not valid JSON: {err.msg} at line {err.lineno} column "
                             f"{err.colno}") from None
    entries = data.get("tasks") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise TasksFileError(f'tasks file {path}: expected a JSON object with a "tasks" list')
    tasks: list[Task] = []
    seen: dict[str, int] = {}
    for index, entry in enumerate(entries):
        task = _validated_task(path, index, entry)
        if task.id in seen:
            raise TasksFileError(f"tasks file {path}: task {task.id!r} (index {index}) repeats the id of index "
                                 f"{seen[task.id]}")
        seen[task.id] = index
        tasks.append(task)
    return tasks


def _validated_task(path: Path, index: int, entry: Any) -> Task:
    from pydantic import ValidationError

    if not isinstance(entry, dict):
        raise TasksFileError(f"tasks file {path}: task at index {index} is not a JSON object")
    which = f"task {entry['id']!r} (index {index})" if isinstance(entry.get("id"), str) else f"task at index {index}"
    if "gold_actions" not in entry:
        raise TasksFileError(f"tasks file {path}: {which} has no gold_actions; list the writes that solve it, or "
                             "[] for a task that needs none (else doing nothing would score 1.0)")
    try:
        # strict: what the file says is what the task gets ("out_of_policy": "yes" is an error, not True),
        # so that the JSON Schema of tasks_schema() accepts exactly the tasks this accepts
        return Task.model_validate(entry, strict=True)
    except ValidationError as err:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'task'}: {e['msg']}" for e in err.errors()[:3])
        more = len(err.errors()) - 3
        raise TasksFileError(f"tasks file {path}: {which} is not a valid task: {problems}"
                             + (f" (and {more} more)" if more > 0 else "")) from None


def tasks_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a tasks file: the files :func:`load_tasks` accepts, but for the one
    check a schema cannot say (two tasks with one id). Shipped as ``muarl/schemas/tasks.schema.json``;
    docs/domains.md shows it and a test keeps it equal to the task models."""
    return json.loads((Path(__file__).parent / "schemas" / "tasks.schema.json").read_text(encoding="utf-8"))


def save_tasks(tasks: Iterable[Task], path: Path, **meta: Any) -> None:
    """Write tasks as :func:`load_tasks` reads them (every task with its ``gold_actions``, [] included)."""
    payload = {**meta, "tasks": [t.model_dump(mode="json") for t in tasks]}
    Path(path).write_text(json.dumps(payload, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


_REGISTRY: dict[str, Domain | Callable[[], Domain]] = {}
#: bridged domains loaded from a data directory named explicitly, by (name, directory)
_WITH_DATA: dict[tuple[str, str], Domain] = {}
#: the data directory named on the command line (``--data DIR``); see :func:`data_option`
_DATA_OPTION: Path | None = None
#: name prefixes served by muarl.bridges.<prefix> (tau2-bench and BFCL domains, optional extras; MCP servers)
_BRIDGES = ("tau2:", "bfcl:", "mcp:", "acebench:")
_BUILTINS = {"retail": "muarl.domains.retail", "airline": "muarl.domains.airline", "telecom": "muarl.domains.telecom",
             "retail-lite": "muarl.domains.retail_lite", "retail-lite-forgetful": "muarl.domains.retail_lite"}


def register(domain: Domain | Callable[[], Domain], name: str | None = None) -> None:
    """Make a domain available by name to the CLI and to configs (a factory is built on first use)."""
    key = name or getattr(domain, "name", None)
    if not key:
        raise ValueError("register a factory with an explicit name=")
    _REGISTRY[key] = domain


@contextmanager
def data_option(path: str | Path | None) -> Iterator[None]:
    """While it is open, :func:`get_domain` loads every domain from the data directory ``path`` (the
    command line's ``--data DIR``; None: none given).

    Process-wide rather than passed along, because a command reaches its domain again by name far from
    where the option was parsed (GRPO's trainer, an LLM user's tool list, ``muarl view``): every one of
    those must read the same data. Restored on exit, so one command's option never leaks into the next
    (tests call ``main()`` many times in one process).
    """
    global _DATA_OPTION
    before = _DATA_OPTION
    _DATA_OPTION = Path(path).expanduser() if path not in (None, "") else None
    try:
        yield
    finally:
        _DATA_OPTION = before


def _data_loader(name: str) -> Callable[..., Domain] | None:
    """The bridge's ``load(rest, data=...)`` when the bridge named by ``name``'s prefix reads a data
    directory (its ``load`` takes ``data``), else None."""
    if not name.startswith(_BRIDGES):
        return None
    load = importlib.import_module(f"muarl.bridges.{name.split(':', 1)[0]}").load
    return load if "data" in inspect.signature(load).parameters else None


def _domain_with_data(name: str, path: Path) -> Domain:
    key = (name, str(path))
    if key not in _WITH_DATA:
        load = _data_loader(name)
        if load is None:
            if not name.startswith(_BRIDGES):
                _lookup(name)  # an unknown name is the usual KeyError, not a complaint about --data
            raise ValueError(f"domain {name} reads no data directory, but --data {path} was given; --data names "
                             "the data of the bridges that read a benchmark's data from a directory "
                             "(docs/bridges.md)")
        _WITH_DATA[key] = load(name.split(":", 1)[1], data=path)
    return _WITH_DATA[key]


def get_domain(name: str, data: str | Path | None = None) -> Domain:
    """Look a domain up by name; built-ins are imported lazily, ``pkg.module:attr`` loads a user domain.

    A bridged name (``tau2:``, ``bfcl:``, ``mcp:``, ``acebench:``) wins over ``module:attr``. A bad
    ``module:attr`` (misspelt module or attribute, an object that is not a :class:`Domain` nor a
    zero-argument factory of one) is a one-line KeyError, which the command line prints, never a traceback.

    ``data`` (default: the command line's ``--data``, see :func:`data_option`) names the data directory
    of a bridge that reads one (ACEBench), over the bridge's environment variable; for any other domain
    it is a one-line ValueError rather than an option silently ignored.
    """
    data = data if data not in (None, "") else _DATA_OPTION
    if data is not None:
        return _domain_with_data(name, Path(data).expanduser())
    return _lookup(name)


def _lookup(name: str) -> Domain:
    """:func:`get_domain` without a data directory: the registry, built-ins, bridges, ``module:attr``."""
    if name not in _REGISTRY and name in _BUILTINS:
        importlib.import_module(_BUILTINS[name])
    if name not in _REGISTRY and name.startswith(_BRIDGES):  # optional extras, imported on first use
        bridge = importlib.import_module(f"muarl.bridges.{name.split(':', 1)[0]}")
        _REGISTRY[name] = bridge.load(name.split(":", 1)[1])
    if name not in _REGISTRY and ":" in name and not name.startswith(_BRIDGES):
        from muarl import plugins

        try:
            _REGISTRY[name] = plugins.load(name, Domain, "domain", "domains")
        except plugins.PluginError as err:
            raise KeyError(str(err)) from None
    entry = _REGISTRY.get(name)
    if entry is None:
        raise KeyError(f"unknown domain {name!r}; known: {', '.join(domain_names())} (or module:attribute)")
    if not isinstance(entry, Domain):
        entry = _REGISTRY[name] = entry()
    return entry


def domain_names() -> list[str]:
    return sorted(set(_BUILTINS) | set(_REGISTRY))
