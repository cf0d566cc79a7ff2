"""BFCL-V3 multi-turn as muarl domains: ``bfcl:base``, ``bfcl:miss_func``, ``bfcl:miss_param``, ``bfcl:long_context``.

Each data entry is a task. Its user turns are the data's questions, played in order by :class:`BFCLUser`
(the next turn comes when the agent ends its turn with a message without tool calls), which is also what
the ``scripted`` user plays on these domains. The agent sees the functions of the entry's involved
classes (schemas from BFCL's function docs); in ``miss_func`` the held-out functions are left out until
their turn, where the user message lists them, as BFCL does for prompting models. Every call executes in
BFCL's own executor against real instances of BFCL's classes, private to the episode (keyed by a fresh
model name per episode). The episode is graded by BFCL's official ``multi_turn_checker`` (and, for the
two "miss" categories, its irrelevance checker) on the agent's calls grouped by turn and step, exactly
the input BFCL's evaluation builds from a model's outputs.

Two muarl extension points carry this: ``Domain.narrow`` (the tools of one entry) and ``Domain.scorer``
(BFCL's checker instead of muarl's DB comparison).
"""

from __future__ import annotations

import ast
import inspect
import itertools
import json
import os
import re
import tempfile
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from muarl.bridges import given, loose_args, require
from muarl.bridges import json_schema as _schema
from muarl.domain import Domain
from muarl.env import Env
from muarl.policies.base import AgentTurn, Policy, PolicySession
from muarl.tools import Tool, ToolError
from muarl.types import Action, Check, Message, Reward, Scenario, Task, ToolCall, ToolSpec, Trajectory
from muarl.users.base import STOP, Act, UserReply, UserSession, UserSimulator

CATEGORIES = ("base", "miss_func", "miss_param", "long_context")
#: the key under which an env's :class:`Episode` sits in its view's context (what the tools reach)
EPISODE = "_bfcl_episode"
_ids = itertools.count()

POLICY = """You help a user by calling functions of the applications you are given (a file system, \
messaging, trading, travel, a vehicle ...). Each user message is a request: make the function calls it \
needs, one or more per message, and read their results before going on. When the request is done, or \
when no function fits it or a needed value is missing, reply in plain text without calls: say what you \
did, or what is missing. Never invent values the user did not give. Your text reply ends your turn; the \
user then sends the next request."""


def _import_bfcl(module: str) -> Any:
    """Import a bfcl_eval module; its config creates result folders on import, so point it at a temp dir."""
    os.environ.setdefault("BFCL_PROJECT_ROOT", str(Path(tempfile.gettempdir()) / "muarl-bfcl"))
    return require(module, "bfcl")


@dataclass
class Data:
    """One BFCL category: entries, ground truth and function docs, read once per process."""

    category: str
    entries: dict[str, dict[str, Any]] = field(default_factory=dict)
    answers: dict[str, list[list[str]]] = field(default_factory=dict)

    @cached_property
    def root(self) -> Path:
        return Path(_import_bfcl("bfcl_eval").__file__).parent / "data"

    @cached_property
    def docs(self) -> dict[str, list[dict[str, Any]]]:
        """Function docs per class, from BFCL's own mapping of class to doc file."""
        mapping = _import_bfcl("bfcl_eval.constants.category_mapping").MULTI_TURN_FUNC_DOC_FILE_MAPPING
        return {cls: [json.loads(line) for line in (self.root / "multi_turn_func_doc" / name).read_text().splitlines()
                      if line.strip()] for cls, name in mapping.items()}

    def load(self) -> Data:
        name = f"BFCL_v3_multi_turn_{self.category}.json"
        for line in (self.root / name).read_text().splitlines():
            if line.strip():
                entry = json.loads(line)
                self.entries[entry["id"]] = entry
        for line in (self.root / "possible_answer" / name).read_text().splitlines():
            if line.strip():
                answer = json.loads(line)
                self.answers[answer["id"]] = answer["ground_truth"]
        return self


def _user_turns(entry: dict[str, Any], docs: dict[str, list[dict[str, Any]]]) -> list[str]:
    """The user's message per turn; a held-out-function turn lists the functions (BFCL's prompting text)."""
    prompts = _import_bfcl("bfcl_eval.constants.default_prompts")
    held = entry.get("missed_function", {})
    by_name = {d["name"]: d for cls in entry["involved_classes"] for d in docs[cls]}
    turns = []
    for i, messages in enumerate(entry["question"]):
        if str(i) in held:
            functions = [by_name[n] for n in held[str(i)]]
            turns.append(prompts.DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING.format(functions=functions))
        else:
            turns.append("\n".join(m["content"] for m in messages if m.get("role") == "user"))
    return turns


def convert_entry(entry: dict[str, Any], answer: list[list[str]], category: str,
                  docs: dict[str, list[dict[str, Any]]]) -> Task:
    turns = _user_turns(entry, docs)
    gold = [Action(name=name, arguments=args) for calls in answer for name, args in map(_parse_call, calls)
            if name is not None]
    return Task(
        id=entry["id"], domain=f"bfcl:{category}", split="test", family=category, user_id="",
        scenario=Scenario(persona="a user of BFCL's simulated applications"),
        instruction="Ask for these, one message per turn, in order:\n" + "\n".join(f"{i + 1}. {t}"
                                                                                 for i, t in enumerate(turns)),
        gold_actions=gold,
        context={"bfcl": {"turns": turns, "involved_classes": entry["involved_classes"],
                          "held_out": {k: list(v) for k, v in entry.get("missed_function", {}).items()}}},
    )


def _parse_call(text: str) -> tuple[str | None, dict[str, Any]]:
    """``f(a=1, b='x')`` as (name, keyword arguments); positional arguments are named from the signature."""
    node = ast.parse(text.strip(), mode="eval").body
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        return None, {}
    args = {k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg is not None}
    if node.args:
        params = _signature(node.func.id)
        for name, value in zip(params, node.args, strict=False):
            args[name] = ast.literal_eval(value)
    return node.func.id, args


def _signature(method: str) -> list[str]:
    """Parameter names of a BFCL class method (the ground truth sometimes passes arguments by position)."""
    utils = _import_bfcl("bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils")
    for cls_name, path in utils.CLASS_FILE_PATH_MAPPING.items():
        cls = getattr(_import_bfcl(path), cls_name)
        if hasattr(cls, method):
            return [p for p in inspect.signature(getattr(cls, method)).parameters if p != "self"]
    return []


def call_text(name: str, arguments: dict[str, Any]) -> str:
    """A call as the Python text BFCL's executor and checker evaluate."""
    return f"{name}({', '.join(f'{k}={v!r}' for k, v in arguments.items())})"


class Episode:
    """One episode's BFCL instances, living in BFCL's executor under a model name of their own."""

    def __init__(self, entry: dict[str, Any], category: str):
        self.entry = entry
        self.long_context = category == "long_context"
        self.model_name = f"muarl_episode_{os.getpid()}_{next(_ids)}"
        self.utils = _import_bfcl("bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils")

    def run(self, name: str, arguments: dict[str, Any]) -> str:
        results, _ = self.utils.execute_multi_turn_func_call(
            [call_text(name, arguments)], self.entry["initial_config"], self.entry["involved_classes"],
            self.model_name, self.entry["id"], long_context=self.long_context, is_evaL_run=False)
        return results[0]


def _forget(model_name: str) -> None:
    """Drop an episode's instances from BFCL's executor (it keeps them in its module globals)."""
    utils = _import_bfcl("bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils")
    for key in [k for k in vars(utils) if k.startswith(model_name)]:
        del vars(utils)[key]


class BFCLEnv(Env):
    """An env that runs every call in the episode's BFCL instances. Its domain knows all the functions of
    the entry's classes, held-out ones included: BFCL's executor runs whatever the model calls."""

    def __init__(self, domain: Domain, task: Task | None, context: dict[str, Any], data: Data):
        super().__init__(domain, task, context)
        if task is None:
            raise ValueError("a BFCL env needs a task (its entry's initial configuration)")
        self.episode = Episode(data.entries[task.id], data.category)
        self.db.context[EPISODE] = self.episode
        weakref.finalize(self, _forget, self.episode.model_name)


def _tool(doc: dict[str, Any]) -> Tool:
    name = doc["name"]
    params = _schema(doc.get("parameters", {"type": "dict", "properties": {}}))

    def run(db: Any, **kwargs: Any) -> str:
        output = db.context[EPISODE].run(name, given(kwargs))
        if output.startswith("Error during execution: "):
            raise ToolError(output.removeprefix("Error during execution: "))
        return output

    spec = ToolSpec(name=name, description=doc.get("description", ""),
                    parameters={"type": "object", "properties": params.get("properties", {}),
                                "required": params.get("required", [])})
    return Tool(fn=run, spec=spec, args_model=loose_args(name, params))


# -- the user whose turns are data ---------------------------------------------------------------------


class BFCLUser(UserSimulator):
    """Plays an entry's user turns in order; after the last one, the user stops."""

    name = "bfcl-data"

    def session(self, task: Task, seed: int) -> UserSession:
        return _TurnsSession(list(task.context["bfcl"]["turns"]))


class _TurnsSession(UserSession):
    def __init__(self, turns: list[str]):
        self.turns = turns
        self.next = 0

    def _reply(self) -> UserReply:
        if self.next >= len(self.turns):
            return UserReply(STOP, stop="stop", metadata={"turn": self.next})
        self.next += 1
        return UserReply(self.turns[self.next - 1], metadata={"turn": self.next - 1})

    async def start(self) -> UserReply:
        return self._reply()

    async def reply(self, agent_text: str, act: Act) -> UserReply:
        return self._reply()


# -- BFCL's official checker as the episode's judge ----------------------------------------------------


def decode_turns(trajectory: Trajectory, n_turns: int) -> list[list[list[str]]]:
    """The agent's calls per user turn and per step (one assistant message = one step), as call texts.

    Every call the agent emitted counts, including ones muarl refused (unknown function, missing
    argument): BFCL decodes and executes whatever the model wrote, and its checker judges the result.
    """
    turns: list[list[list[str]]] = []
    for message in trajectory.messages:
        if message.role == "user":
            turns.append([])
        elif message.role == "assistant" and message.tool_calls and turns:
            turns[-1].append([call_text(c.name, c.arguments) for c in message.tool_calls])
    return turns[:n_turns]


def bfcl_verdict(data: Data, task_id: str, trajectory: Trajectory) -> dict[str, Any]:
    """BFCL's verdict: ``{"valid": bool, "error_type": ..., "error_message": ...}``."""
    checker = _import_bfcl("bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker")
    entry, truth = data.entries[task_id], data.answers[task_id]
    turns = decode_turns(trajectory, len(entry["question"]))  # the data's turns, not the closing stop
    if len(turns) != len(truth):  # BFCL's runner: fewer turns than the ground truth fails the entry
        return {"valid": False, "error_type": "multi_turn:force_terminated",
                "error_message": f"{len(turns)} turns played, the ground truth has {len(truth)}"}
    name = f"muarl_check_{os.getpid()}_{next(_ids)}"
    try:
        verdict = checker.multi_turn_checker(turns, truth, entry, f"multi_turn_{data.category}", name)
        if verdict["valid"] and data.category in ("miss_func", "miss_param"):
            verdict = checker.multi_turn_irrelevance_checker(turns, truth)
    finally:
        _forget(name)
    return verdict


def _turn_of(message: str) -> int | None:
    found = re.search(r"turn (\d+)", message)
    return int(found.group(1)) if found else None


def make_scorer(data: Data) -> Callable[..., Reward]:
    def scorer(domain: Domain, task: Task, trajectory: Trajectory, env: Env | None, require_outputs: bool) -> Reward:
        verdict = bfcl_verdict(data, task.id, trajectory)
        valid = bool(verdict["valid"])
        n = len(data.answers[task.id])
        failed = None if valid else _turn_of(str(verdict.get("error_message", "")))
        passed = n if valid else (failed if failed is not None else 0)
        detail = "" if valid else f"{verdict.get('error_type')}: {verdict.get('error_message')}"
        return Reward(reward=1.0 if valid else 0.0, db_match=valid, outputs_ok=True, outputs_required=require_outputs,
                      tcr=passed / n if n else 1.0,
                      checks=[Check(name="bfcl multi_turn_checker", passed=valid, detail=detail[:500])],
                      diff=[] if valid else [detail[:500]])
    return scorer


# -- domains -------------------------------------------------------------------------------------------


def load(name: str) -> Domain:
    """``get_domain("bfcl:<category>")`` lands here (``bfcl:<category>/...`` names one entry's view)."""
    category = name.split("/", 1)[0]
    if category not in CATEGORIES:
        raise KeyError(f"unknown BFCL category {category!r}; choose from {', '.join('bfcl:' + c for c in CATEGORIES)}")
    data = category_data(category)
    tools = {doc["name"]: _tool(doc) for docs in data.docs.values() for doc in docs}
    classes_of = {doc["name"]: cls for cls, docs in data.docs.items() for doc in docs}
    tasks = [convert_entry(data.entries[i], data.answers[i], category, data.docs) for i in data.entries]
    views: dict[tuple[tuple[str, ...], tuple[str, ...]], Domain] = {}

    def view(domain: Domain, task: Task) -> Domain:
        """The entry's domain: its classes' functions, held-out ones hidden from the agent, not the env."""
        info = task.context["bfcl"]
        classes = tuple(info["involved_classes"])
        held = tuple(sorted(n for names in info["held_out"].values() for n in names))
        key = (classes, held)
        if key not in views:
            names = [n for n, cls in classes_of.items() if cls in classes]
            base = f"bfcl:{category}/{'+'.join(classes)}"
            runnable = _domain(base, [tools[n] for n in names], None)
            visible = [tools[n] for n in names if n not in held]
            views[key] = _domain(base + (f"-{'+'.join(held)}" if held else ""), visible, runnable)
        return views[key]

    def _domain(domain_name: str, agent_tools: list[Tool], runnable: Domain | None) -> Domain:
        return Domain(
            name=domain_name, description=f"BFCL-V3 multi-turn {category} (BFCL's classes, data and checker)",
            policy=POLICY, tools=agent_tools, build_db=lambda seed, size: {},
            build_tasks=lambda d, seed, counts: list(tasks), task_counts={"train": 0, "dev": 0, "test": len(tasks)},
            requires_auth=False, scorer=make_scorer(data), scripted_user=BFCLUser(), narrow=view,
            make_env=lambda d, task, context: BFCLEnv(runnable or d, task, context, data),
            provenance=lambda: provenance(category),
        )

    return _domain(f"bfcl:{category}", list(tools.values()), None)


def provenance(category: str) -> dict[str, Any]:
    """What a BFCL result depends on besides muarl: bfcl-eval's version, which carries the data, the
    executable classes and the checker alike, and the category played."""
    from muarl.provenance import package_version

    return {"benchmark": "BFCL-V3 multi-turn", **package_version("bfcl_eval"), "category": category}


# -- the ground truth as a policy (for checking the bridge end to end) ---------------------------------


class GroundTruthPolicy(Policy):
    """Emits each turn's ground-truth calls (one step), then ends the turn with a short text."""

    name = "bfcl-ground-truth"

    def session(self, domain: Domain, task: Task, seed: int | None = None) -> PolicySession:
        category = task.domain.split(":", 1)[1]
        return _TruthSession(category_data(category).answers[task.id])


class _TruthSession(PolicySession):
    def __init__(self, truth: list[list[str]]):
        self.truth = truth
        self.turn = -1
        self.called = False

    async def next(self, new_messages: list[Message]) -> AgentTurn:
        if any(m.role == "user" for m in new_messages):
            self.turn, self.called = self.turn + 1, False
        calls = self.truth[self.turn] if 0 <= self.turn < len(self.truth) else []
        if calls and not self.called:
            self.called = True
            parsed = [_parse_call(c) for c in calls]
            return AgentTurn(Message(role="assistant", tool_calls=[
                ToolCall(id=f"gt_{self.turn}_{i}", name=n, arguments=a) for i, (n, a) in enumerate(parsed) if n]))
        return AgentTurn(Message(role="assistant", content="Done."))


_DATA: dict[str, Data] = {}


def category_data(category: str) -> Data:
    """One category's entries, answers and function docs, read once per process."""
    if category not in _DATA:
        _DATA[category] = Data(category).load()
    return _DATA[category]
