"""ACEBench's agent category as muarl domains: ``acebench:multi_turn`` and ``acebench:multi_step``.

The data is ACEBench's English agent data from a directory the user names (``--data DIR`` where a
command has it, else ``$MUARL_ACEBENCH_DATA``, e.g. ``tests/data/acebench/data_en`` in a checkout, the
copy the tests read); the package ships none of it. The code that runs is evalscope's copy of ACEBench
(extra ``acebench``): its scenario classes execute every call on the item's ``initial_config``, privately
for each episode (:mod:`muarl.bridges.acebench_world`), and its checker judges the end state.

- **Tasks.** One per item. The agent sees the item's ``function`` list as tools; a multi-turn item's
  view also carries ACEBench's policy of its scenario (the phone or the airline) as the system prompt.
- **Users.** A multi-turn item's user is ACEBench's simulated user: ``task.instruction`` is ACEBench's
  user-simulator prompt around the item's persona (``question``), its end marker replaced by muarl's
  ``###STOP###``, so ``--user llm:URL#MODEL`` plays it as ACEBench does. ``--user scripted`` plays
  :class:`ACEBenchUser`, a stand-in derived from the item: a multi-step item's user says the request and
  stops; a multi-turn persona is said in the first person, questions are answered from it, and the user
  stops once the agent reports without asking anything. ``replay:`` users work as everywhere.
- **Reward.** 1 iff ACEBench's own ``check_agent_end_state`` accepts the episode's end state. The TCR is
  the process (milestone) score, with ACEBench's rule that a correct end state earns full process credit;
  the checks also carry muarl's strict end-state reading (see :mod:`muarl.bridges.acebench_world`).
- **Gold.** The milestone calls, reconciled with the end state where ACEBench's two answers disagree
  (:mod:`muarl.bridges.acebench_gold`).

:func:`acebench_judge` is ACEBench's whole pipeline on a muarl trajectory (its decoder and executor on
fresh instances, its checker and milestone accuracy), for measuring agreement with muarl's judgement.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from muarl.bridges import given, json_schema, loose_args
from muarl.bridges.acebench_data import (
    CATEGORIES,
    DataError,
    Item,
    data_files,
    data_source,
    load_items,
    message_text,
)
from muarl.bridges.acebench_evalscope import module
from muarl.bridges.acebench_gold import oracle
from muarl.bridges.acebench_world import World, acebench_verdict, milestone_score, strict_mismatches
from muarl.domain import Domain
from muarl.env import Env
from muarl.rewards import replay
from muarl.tools import Tool
from muarl.types import Action, Check, Reward, Scenario, Task, ToolSpec, Trajectory
from muarl.users.base import STOP, Act, UserReply, UserSession, UserSimulator

#: the key under which an env's :class:`World` sits in its view's context (what the tools reach)
WORLD = "_acebench_world"
#: ACEBench's function names read state when they start like this; every other function may write
READ_PREFIXES = ("get_", "view_", "search_", "check_", "find_")

POLICY = """You help a user by calling the functions you are given: ACEBench's simulated phone (messages, \
reminders, food delivery) or an airline's reservation system. Call functions through the tool interface \
and read each result before going on. When you need something from the user, or when the task is done, \
reply in plain text without calls; a text reply ends your turn."""
MULTI_STEP = """The user gives the whole task in one message and will not answer questions: use the known \
conditions to solve it, step by step, then reply with what you did."""


@dataclass
class Data:
    """One category's items from one data directory, read once per process."""

    category: str
    directory: Path
    items: dict[str, Item] = field(default_factory=dict)
    #: SHA-256 of the category's two data files as they were read (see :func:`provenance`)
    sha256: str = ""

    def load(self) -> Data:
        known = set(module("scenarios").CLASS_MODULE_MAPPING)
        self.items = {i.id: i for i in load_items(self.directory, self.category, known)}
        digest = hashlib.sha256()
        for path in data_files(self.directory, self.category):
            digest.update(path.relative_to(self.directory).as_posix().encode() + b"\0" + path.read_bytes())
        self.sha256 = digest.hexdigest()
        return self


_DATA: dict[str, Data] = {}


def category_data(category: str, directory: str | Path | None = None) -> Data:
    """The category's data from ``directory`` (a ``--data`` option; default ``$MUARL_ACEBENCH_DATA``),
    cached per process. A file missing or malformed in it is one line that also says which of the two named
    the directory."""
    path, source = data_source(directory)
    cached = _DATA.get(category)
    if cached is None or cached.directory != path:
        try:
            cached = Data(category, path).load()
        except DataError as err:
            raise DataError(f"{err} (the data directory {path} is from {source})") from None
        _DATA[category] = cached
    return cached


def provenance(data: Data) -> dict[str, Any]:
    """What an ACEBench result depends on besides muarl: evalscope's version (its scenario classes and
    checker run every call and grade it) and the data files read, by hash (ACEBench's data has no version
    of its own, and the directory may be any copy)."""
    from muarl.provenance import package_version

    return {"benchmark": "ACEBench agent", **package_version("evalscope"), "category": data.category,
            "data_sha256": data.sha256}


def item_of(task: Task) -> Item:
    """The ACEBench item a task was made from (its category's data as loaded for the domain)."""
    return _DATA[task.domain.split(":", 1)[1].split("/", 1)[0]].items[task.id]


# -- tasks -----------------------------------------------------------------------------------------------


def user_prompt(item: Item) -> str:
    """ACEBench's user-simulator prompt for the item's persona, ending with muarl's stop marker."""
    prompt = module("prompts").build_user_simulator_prompt(item.question, item.classes, "en")
    return prompt.replace("'finish conversation'", STOP)


def convert_item(item: Item) -> Task:
    calls, how = oracle(item)
    return Task(
        id=item.id, domain=f"acebench:{item.category}", split="test",
        family="travel" if "Travel" in item.classes else "phone", user_id="",
        scenario=Scenario(persona=item.question),
        instruction=user_prompt(item) if item.category == "multi_turn" else item.question,
        gold_actions=[Action(name=n, arguments=a) for n, a in calls],
        context={"acebench": {"category": item.category, "classes": item.classes,
                              "functions": [f["name"] for f in item.functions], "gold": how}},
    )


def scenario_policy(item: Item) -> str:
    """The agent's system prompt: muarl's calling convention, then ACEBench's rules of the scenario
    (multi-turn; without ACEBench's text-format section, which the tool interface replaces)."""
    if item.category == "multi_step":
        return f"{POLICY}\n\n{MULTI_STEP}"
    prompts = module("prompts")
    rules = [prompts.TRAVEL_PROMPT_EN if "Travel" in item.classes else "",
             prompts.BASE_PROMPT_EN if "BaseApi" in item.classes else ""]
    return "\n\n".join([POLICY] + [r.split("\n\nFunction Calls:")[0] for r in rules if r])


# -- env and tools ---------------------------------------------------------------------------------------


class ACEBenchEnv(Env):
    """An env whose tools run in the episode's own scenario instances."""

    def __init__(self, domain: Domain, task: Task | None, context: dict[str, Any], data: Data):
        super().__init__(domain, task, context)
        if task is None:
            raise ValueError("an ACEBench env needs a task (its item's initial configuration)")
        self.world = World(data.items[task.id])
        self.db.context[WORLD] = self.world


def _tool(doc: dict[str, Any]) -> Tool:
    name = doc["name"]
    params = json_schema(doc.get("parameters") or {"type": "dict", "properties": {}})

    def run(db: Any, **kwargs: Any) -> Any:
        return db.context[WORLD].call(name, given(kwargs))

    spec = ToolSpec(name=name, description=doc.get("description", ""),
                    parameters={"type": "object", "properties": params.get("properties", {}),
                                "required": params.get("required", [])},
                    kind="read" if name.startswith(READ_PREFIXES) else "write")
    return Tool(fn=run, spec=spec, args_model=loose_args(name, params))


# -- judging ---------------------------------------------------------------------------------------------


def agent_calls(trajectory: Trajectory) -> list[list[tuple[str, dict[str, Any]]]]:
    """The calls of each assistant message, in order: every emitted call, as ACEBench records them."""
    return [[(c.name, dict(c.arguments)) for c in m.tool_calls]
            for m in trajectory.messages if m.role == "assistant" and m.tool_calls]


def _errors(verdict: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for error in verdict.get("error", []):
        out += [str(e) for e in error] if isinstance(error, list) else [str(error)]
    return out or ([str(verdict.get("error_type"))] if not verdict.get("valid") else [])


def make_scorer(data: Data) -> Callable[..., Reward]:
    def scorer(domain: Domain, task: Task, trajectory: Trajectory, env: Env | None, require_outputs: bool) -> Reward:
        final = env if isinstance(env, ACEBenchEnv) else replay(domain, task, trajectory.tool_log)
        assert isinstance(final, ACEBenchEnv)
        item = data.items[task.id]
        state = final.world.state()
        verdict = acebench_verdict(state, item.ground_truth)
        valid = bool(verdict["valid"])
        process, matched, total = milestone_score([c for m in agent_calls(trajectory) for c in m], item.milestones)
        strict = strict_mismatches(state, item.ground_truth)
        errors = _errors(verdict)
        checks = [
            Check(name="acebench end state (check_agent_end_state)", passed=valid, detail="; ".join(errors)[:500]),
            Check(name="milestones reached, by value", passed=matched == total, detail=f"{matched}/{total}"),
            Check(name="end state exactly the ground truth (muarl, strict)", passed=not strict,
                  detail="; ".join(strict)[:500]),
        ]
        return Reward(reward=1.0 if valid else 0.0, db_match=valid, outputs_ok=True, outputs_required=require_outputs,
                      tcr=1.0 if valid else process, checks=checks, diff=[e[:500] for e in errors])
    return scorer


def acebench_judge(task: Task, trajectory: Trajectory) -> dict[str, Any]:
    """ACEBench's own verdict on a muarl trajectory, with no muarl code in the path that decides it.

    Each assistant message's calls become ACEBench's text (``[f(a=1), g()]``), which evalscope's
    rollout decodes and executes on fresh instances (its ``_execute``); the end state is graded by its
    ``check_agent_end_state`` and the texts by its ``milestone_accuracy``, combined as evalscope's
    adapter does (a correct end state earns full process accuracy).
    """
    item = item_of(task)
    scenarios, checker, rollout = module("scenarios"), module("checker"), module("rollout")
    instances = scenarios.load_scenario_instances(item.initial_config, item.classes, "en")
    process = [message_text(calls) for calls in agent_calls(trajectory)]
    for text in process:
        rollout._execute(text, instances, catch_decode_error=True)
    verdict = checker.check_agent_end_state(scenarios.snapshot_states(instances), item.ground_truth)
    valid = bool(verdict["valid"])
    accuracy = checker.milestone_accuracy(process, item.milestones)
    return {"acc": 1.0 if valid else 0.0, "process_acc": 1.0 if valid else accuracy, "valid": valid,
            "error": _errors(verdict), "process": process}


# -- the stand-in user -----------------------------------------------------------------------------------


_QUOTED = re.compile(r"\"[^\"]*\"|(?<![A-Za-z])'[^']*'(?![A-Za-z])")
_PERSON = [(re.compile(p), r) for p, r in (
    (r"\bYou are\b", "I am"), (r"\byou are\b", "I am"), (r"\bYour\b", "My"), (r"\byour\b", "my"),
    (r"\byourself\b", "myself"), (r"\bYou\b", "I"), (r"\byou\b", "I"),
)]
_META = re.compile(r"will not proactively|respond to the agent", re.IGNORECASE)
_DELETE = re.compile(r"\b(delet\w*|memory|inbox|capacity|full)\b", re.IGNORECASE)
_CONFIRM = re.compile(r"\b(confirm|proceed|shall i|should i|would you like|do you want|go ahead|is that|"
                      r"correct|ok\b|okay)\b", re.IGNORECASE)


def first_person(persona: str) -> str:
    """The persona as the user would say it ("You are Grace" -> "I am Grace"), quoted text untouched and
    the instructions about how to behave left out."""
    sentences = [s for s in re.split(r"(?<=[.!?'\"])\s+(?=[A-Z])", persona.strip()) if not _META.search(s)]
    text = " ".join(sentences)
    out, last = [], 0
    for quoted in _QUOTED.finditer(text):
        out += [_swap(text[last:quoted.start()]), quoted.group()]
        last = quoted.end()
    return "".join(out + [_swap(text[last:])]).strip()


def _swap(text: str) -> str:
    for pattern, replacement in _PERSON:
        text = pattern.sub(replacement, text)
    return text


class ACEBenchUser(UserSimulator):
    """The scripted stand-in for ACEBench's user (``--user scripted`` on ``acebench:*``)."""

    name = "acebench-data"

    def __init__(self, max_replies: int = 8):
        self.max_replies = max_replies

    def session(self, task: Task, seed: int) -> UserSession:
        info = task.context["acebench"]
        if info["category"] == "multi_step":
            return _Session(task.scenario.persona, [], 0)
        persona = task.scenario.persona
        rules = [s for s in re.split(r"(?<=[.!?])\s+", first_person(persona)) if _DELETE.search(s)]
        return _Session(first_person(persona), rules, self.max_replies)


class _Session(UserSession):
    def __init__(self, opening: str, delete_rules: list[str], max_replies: int):
        self.opening, self.delete_rules, self.left = opening, delete_rules, max_replies

    async def start(self) -> UserReply:
        return UserReply(self.opening)

    async def reply(self, agent_text: str, act: Act) -> UserReply:
        self.left -= 1
        if self.left < 0 or "?" not in agent_text:
            return UserReply(STOP, stop="stop")
        if _DELETE.search(agent_text) and self.delete_rules:
            return UserReply(" ".join(self.delete_rules))
        if _CONFIRM.search(agent_text):
            return UserReply("Yes, please go ahead.")
        return UserReply(f"I can only tell you what I know: {self.opening}")


# -- domains ---------------------------------------------------------------------------------------------


def load(name: str, data: str | Path | None = None) -> Domain:
    """``get_domain("acebench:<category>")`` lands here (``acebench:<category>/...`` names one item's view);
    ``data`` is the ``--data`` directory (default: ``$MUARL_ACEBENCH_DATA``). Taking ``data`` is what makes
    :func:`muarl.domain.get_domain` accept ``--data`` for these domains."""
    category = name.split("/", 1)[0]
    if category not in CATEGORIES:
        raise KeyError(f"unknown ACEBench category {category!r}; choose from "
                       f"{', '.join('acebench:' + c for c in CATEGORIES)}")
    loaded = category_data(category, data)
    tools = {doc["name"]: _tool(doc) for item in loaded.items.values() for doc in item.functions}
    tasks = [convert_item(item) for item in loaded.items.values()]
    views: dict[tuple[str, tuple[str, ...]], Domain] = {}

    def view(domain: Domain, task: Task) -> Domain:
        """The item's domain: its functions and its scenario's policy."""
        item = loaded.items[task.id]
        key = (scenario_policy(item), tuple(f["name"] for f in item.functions))
        if key not in views:
            label = "+".join(item.classes)
            views[key] = _domain(f"acebench:{category}/{label}", [tools[n] for n in key[1]], key[0])
        return views[key]

    def _domain(domain_name: str, agent_tools: list[Tool], policy: str) -> Domain:
        return Domain(
            name=domain_name, description=f"ACEBench agent {category} (evalscope's scenario classes and checker)",
            policy=policy, tools=agent_tools, build_db=lambda seed, size: {},
            build_tasks=lambda d, seed, counts: list(tasks), task_counts={"train": 0, "dev": 0, "test": len(tasks)},
            requires_auth=False, scorer=make_scorer(loaded), scripted_user=ACEBenchUser(), narrow=view,
            make_env=lambda d, task, context: ACEBenchEnv(d, task, context, loaded),
            provenance=lambda: provenance(loaded),
        )

    return _domain(f"acebench:{category}", list(tools.values()), POLICY)


__all__ = ["ACEBenchUser", "DataError", "World", "acebench_judge", "load"]
