"""tau2-bench's retail, airline and telecom as muarl domains: ``tau2:retail``, ``tau2:airline``, ``tau2:telecom``.

Everything the agent and the user touch is tau2's own code: its tool schemas and policies, its toolkits
executing every call (through ``Environment.get_response``, as tau2's orchestrator does), telecom's user
tools and starting states, its task files and train/test splits. muarl adds what tau2 lacks for RL: an
episode costs no database parse (see :mod:`muarl.bridges.tau2_world`), the muarl episode loop and
rewards run unchanged, and the reward can be computed by both judges:

- muarl's: :func:`muarl.rewards.score`, the final database (agent and user side) equal to the gold
  actions replayed on a fresh env, compared by muarl's canonical hash of the mirrored state;
- tau2's: :func:`tau2_reward`, tau2's ``EnvironmentEvaluator`` (and, for the reward basis, its
  communicate and action evaluators) on the trajectory converted to tau2 messages, with tau2 building
  its environments from its own files (no muarl code in that path).

Tasks carry tau2's user-simulator guidelines and the scenario text as their instruction (the LLM user
plays that); tau2 tasks have no structured scenario, so the scripted user refuses them with a clear error.
tau2's ``communicate_info`` becomes the task's required outputs; its NL assertions need an LLM judge and
are kept in ``task.context["tau2"]`` but not checked.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from muarl.bridges import given, loose_args, require
from muarl.bridges.tau2_users import IDENTIFY, identified, owners, task_user
from muarl.bridges.tau2_world import Tau2World, tables_of
from muarl.domain import Domain
from muarl.env import Env
from muarl.tools import Tool, ToolError
from muarl.types import Action, Scenario, Task, ToolSpec, Trajectory

#: tau2 domain -> (environment module, constructor, family from the task id prefix)
DOMAINS: dict[str, tuple[str, str]] = {
    "retail": ("tau2.domains.retail.environment", "get_environment"),
    "airline": ("tau2.domains.airline.environment", "get_environment"),
    "telecom": ("tau2.domains.telecom.environment", "get_environment_manual_policy"),
}
#: the key under which an env's :class:`Tau2World` sits in its view's context (what the tools reach)
WORLD = "_tau2_world"
#: the task set of tau2's that the bridge plays (tau2's ``get_tasks(TASK_SET)``)
TASK_SET = "base"
#: tau2's domain-independent helper tools, the same as muarl's built-in domains offer (``Domain.general_tools``)
GENERAL_TOOLS = ("think", "calculate", "transfer_to_human_agents")


def _import_tau2(module: str) -> Any:
    """Import a tau2 module quietly: no network fetch of litellm's price list, no debug log flood."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    require("loguru", "tau2").logger.disable("tau2")
    return require(module, "tau2")


@dataclass
class Bridge:
    """One tau2 domain loaded once per process: the parsed databases every episode shares, tasks, tools."""

    name: str
    module: Any
    template: Any = field(repr=False)  # a tau2 Environment built once: its DBs are the shared parse

    @property
    def construct(self) -> Any:
        return getattr(self.module, DOMAINS[self.name][1])

    @cached_property
    def tau2_tasks(self) -> dict[str, Any]:
        return {t.id: t for t in self.module.get_tasks(TASK_SET)}

    @cached_property
    def tasks_sha256(self) -> str:
        """SHA-256 of the task set as tau2 parsed it, in id order: a task edited between two tau2 installs
        (or in a tau2 checkout) changes it even where the package version stays."""
        digest = hashlib.sha256()
        for task_id in sorted(self.tau2_tasks):
            digest.update(self.tau2_tasks[task_id].model_dump_json().encode() + b"\n")
        return digest.hexdigest()

    def world(self, task: Task | None) -> Tau2World:
        t2 = self.tau2_tasks.get(task.id) if task is not None else None
        user_db = self.template.user_tools.db if self.template.user_tools is not None else None
        return Tau2World(self.construct, self.template.tools.db, user_db,
                         t2.initial_state if t2 is not None else None)


class Tau2Env(Env):
    """A muarl env whose tools run in a private tau2 world; its view mirrors that world after every call."""

    def __init__(self, domain: Domain, task: Task | None, context: dict[str, Any], bridge: Bridge):
        super().__init__(domain, task, context)
        self.world = bridge.world(task)
        self.db.context[WORLD] = self.world
        self.world.sync(self.db)  # the task's starting state (telecom sets up the phone and the line)

    def call(self, name: str, arguments: Any = None, *, actor: Any = "agent", call_id: str | None = None) -> Any:
        record = super().call(name, arguments, actor=actor, call_id=call_id)
        if not record.ok:  # muarl rolled its view back; tau2 keeps whatever a failing tool already wrote
            self.world.sync(self.db)
        return record


def _tool(name: str, schema: dict[str, Any], kind: str, actor: str, identifies: bool = False) -> Tool:
    """A muarl tool that forwards the call, unchanged, to the episode's tau2 world.

    Arguments are checked for names only (missing, unexpected), never coerced or type-checked: tau2
    passes the raw arguments to its tools, and the call must do here exactly what tau2's evaluator will
    do when it replays it. Optional arguments the caller left out stay out, so tau2's defaults apply.
    A tool that ``identifies`` the customer (see :mod:`muarl.bridges.tau2_users`) authenticates the user
    its result names, as the built-in domains' lookups do.
    """
    function = schema["function"]
    params = function.get("parameters", {})
    model = loose_args(name, params)
    requestor = "user" if actor == "user" else "assistant"

    def run(db: Any, **kwargs: Any) -> str:
        world: Tau2World = db.context[WORLD]
        reply = world.call(name, requestor, given(kwargs), "")
        world.sync(db)
        if reply.error:
            raise ToolError(str(reply.content).removeprefix("Error: "))
        user = identified(reply.content or "") if identifies else None
        if user:
            db.authenticate(user)
        return reply.content or ""

    spec = ToolSpec(name=name, description=function.get("description", ""), parameters=_untitled(params),
                    kind="write" if kind == "write" else "read", actor=actor)  # type: ignore[arg-type]
    return Tool(fn=run, spec=spec, args_model=model, terminal=name == "transfer_to_human_agents",
                authenticates=identifies)


def _untitled(schema: Any) -> Any:
    """The schema without pydantic's ``title`` entries (noise in a prompt), like muarl's own tools."""
    if isinstance(schema, dict):
        return {k: _untitled(v) for k, v in schema.items() if not (k == "title" and isinstance(v, str))}
    if isinstance(schema, list):
        return [_untitled(v) for v in schema]
    return schema


def _tools(kit: Any, actor: str, identify: frozenset[str] = frozenset()) -> list[Tool]:
    if kit is None:
        return []
    from tau2.environment.toolkit import ToolType

    return [_tool(name, t.openai_schema, "write" if kit.tool_type(name) == ToolType.WRITE else "read", actor,
                  identifies=name in identify)
            for name, t in kit.get_tools().items()]


def user_instruction(t2: Any, with_tools: bool) -> str:
    """What tau2's LLM user is told: its global simulation guidelines, then the task's scenario.

    The layout is tau2's user-simulator system prompt; the guideline files are read from tau2's data
    directly because importing ``tau2.user`` pulls in litellm (about 20 s of imports).
    """
    from tau2.utils import DATA_DIR

    name = "simulation_guidelines_tools.md" if with_tools else "simulation_guidelines.md"
    guidelines = (DATA_DIR / "tau2" / "user_simulator" / name).read_text()
    return f"{guidelines}\n\n<scenario>\n{t2.user_scenario}\n</scenario>"


def convert_task(t2: Any, domain: str, split: str, with_tools: bool, user_id: str = "") -> Task:
    """A tau2 task as a muarl task (gold actions, required outputs, the LLM user's instruction, and the
    customer it is about, derived by :func:`muarl.bridges.tau2_users.task_user`)."""
    criteria = t2.evaluation_criteria
    actions = [Action(name=a.name, arguments=dict(a.arguments), actor="user" if a.requestor == "user" else "agent")
               for a in (criteria.actions or [])] if criteria is not None else []
    family = t2.id[1:].split("]", 1)[0] if t2.id.startswith("[") else domain.split(":", 1)[1]
    persona = t2.user_scenario.persona or f"a customer of the {domain.split(':', 1)[1]} service"
    return Task(
        id=t2.id, domain=domain, split=split, family=family, user_id=user_id,  # type: ignore[arg-type]
        scenario=Scenario(persona=persona),
        instruction=user_instruction(t2, with_tools),
        gold_actions=actions,
        required_outputs=list(criteria.communicate_info or []) if criteria is not None else [],
        context={"tau2": {
            "reward_basis": [str(b.value) for b in criteria.reward_basis] if criteria is not None else [],
            "nl_assertions_not_checked": list(criteria.nl_assertions or []) if criteria is not None else [],
        }},
    )


_LOADED: dict[str, Bridge] = {}


def bridge(name: str) -> Bridge:
    """The loaded tau2 domain ``name`` (retail, airline or telecom), parsed once per process."""
    if name not in DOMAINS:
        raise KeyError(f"unknown tau2 domain {name!r}; choose from {', '.join('tau2:' + d for d in DOMAINS)}")
    if name not in _LOADED:
        module = _import_tau2(DOMAINS[name][0])
        _LOADED[name] = Bridge(name, module, getattr(module, DOMAINS[name][1])())
    return _LOADED[name]


def load(name: str) -> Domain:
    """``get_domain("tau2:<name>")`` lands here."""
    b = bridge(name)
    env = b.template
    splits = b.module.get_tasks_split()
    split_of = {i: s for s in ("train", "test") for i in splits.get(s, [])}
    user_tools = _tools(env.user_tools, "user")
    user_db = env.user_tools.db if env.user_tools is not None else None
    tables = tables_of(env.tools.db, user_db)
    owner_of = owners(tables)
    tasks = [convert_task(t, f"tau2:{name}", split_of.get(t.id, "test"), bool(user_tools),
                          task_user(t, tables, owner_of)) for t in b.tau2_tasks.values()]
    counts = {s: sum(t.split == s for t in tasks) for s in ("train", "dev", "test")}

    def build_tasks(domain: Domain, seed: int, wanted: Any) -> list[Task]:
        return list(tasks)  # tau2's task set is fixed; there is nothing to generate

    return Domain(
        name=f"tau2:{name}",
        description=f"tau2-bench {name} (tau2's tools, policy, tasks and evaluator)",
        policy=env.get_policy(),
        tools=_tools(env.tools, "agent", frozenset(IDENTIFY[name])),
        general_tools=GENERAL_TOOLS,
        user_tools=user_tools,
        build_db=lambda seed, size: tables_of(env.tools.db, user_db),
        build_tasks=build_tasks,
        task_counts=counts,
        owner_of=owner_of,  # with the task's user and the identifying tools: muarl's policy checks
        make_env=lambda domain, task, context: Tau2Env(domain, task, context, b),
        provenance=lambda: provenance(b),
    )


def provenance(b: Bridge) -> dict[str, Any]:
    """What a tau2 result depends on besides muarl: tau2's package version (its tools, policies and
    evaluator), the task set played and a hash of its tasks."""
    from muarl.provenance import package_version

    return {"benchmark": "tau2-bench", **package_version("tau2"), "domain": b.name, "task_set": TASK_SET,
            "tasks": len(b.tau2_tasks), "tasks_sha256": b.tasks_sha256}


# -- tau2's own judge ------------------------------------------------------------------------------------


def tau2_messages(trajectory: Trajectory) -> list[Any]:
    """The trajectory as the tau2 message list its evaluators read.

    Tool calls come in execution order (the tool log), each followed by its result, so tau2's replay checks
    every result against the one the agent saw. Calls muarl rejected before they reached tau2 (unknown
    tool, missing or unexpected arguments) are left out: in tau2 they fail before any tool code runs, so
    they change nothing there either. The agent's texts follow (for the communicate check).
    """
    from tau2.data_model.message import AssistantMessage, ToolCall, ToolMessage, UserMessage

    out: list[Any] = []
    for rec in trajectory.tool_log:
        if rec.error in ("unknown_tool", "invalid_arguments"):
            continue
        requestor = "user" if rec.actor == "user" else "assistant"
        call = ToolCall(id=rec.call_id, name=rec.name, arguments=dict(rec.arguments), requestor=requestor)
        message = UserMessage if requestor == "user" else AssistantMessage
        out.append(message(role=requestor, tool_calls=[call]))
        out.append(ToolMessage(id=rec.call_id, role="tool", content=rec.output, requestor=requestor,
                               error=not rec.ok))
    out += [AssistantMessage(role="assistant", content=m.content)
            for m in trajectory.messages if m.role == "assistant" and m.content]
    return out


def tau2_reward(task: Task, trajectory: Trajectory) -> dict[str, Any]:
    """tau2's verdict on a muarl trajectory.

    ``env`` is ``EnvironmentEvaluator.calculate_reward`` (tau2 builds both environments from its own
    files, replays the gold actions and the trajectory, compares its DB hashes and runs the env
    assertions); ``db_match`` its DB check; ``reward`` combines env, communicate and action evaluators over
    the task's reward basis as tau2's ``evaluate_simulation`` does (NL assertions, which need an LLM
    judge, are not part of any basis of these task sets).
    """
    from tau2.data_model.tasks import RewardType
    from tau2.evaluator.evaluator_action import ActionEvaluator
    from tau2.evaluator.evaluator_communicate import CommunicateEvaluator
    from tau2.evaluator.evaluator_env import EnvironmentEvaluator

    name = task.domain.split(":", 1)[1]
    b = bridge(name)
    t2 = b.tau2_tasks[task.id]
    messages = tau2_messages(trajectory)
    env_info = EnvironmentEvaluator.calculate_reward(environment_constructor=b.construct, task=t2,
                                                     full_trajectory=messages)
    basis = set(t2.evaluation_criteria.reward_basis)
    reward = env_info.reward if basis & {RewardType.DB, RewardType.ENV_ASSERTION} else 1.0
    parts = {"env": env_info.reward}
    if RewardType.COMMUNICATE in basis:
        parts["communicate"] = CommunicateEvaluator.calculate_reward(task=t2, full_trajectory=messages).reward
        reward *= parts["communicate"]
    if RewardType.ACTION in basis:
        parts["action"] = ActionEvaluator.calculate_reward(task=t2, full_trajectory=messages).reward
        reward *= parts["action"]
    db_match = env_info.db_check.db_match if env_info.db_check is not None else None
    return {"env": env_info.reward, "db_match": db_match, "reward": reward, "parts": parts,
            "env_assertions": [bool(c.met) for c in env_info.env_assertions or []]}
