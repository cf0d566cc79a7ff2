"""The data that flows through muarl: messages, tool calls, tasks, trajectories and rewards.

Everything here is a pydantic model so that one schema serves synthesis, SFT, RL and evaluation,
every object round-trips through JSON exactly (``Model.model_validate_json(m.model_dump_json())``),
and a malformed file fails with a message that names the bad field instead of a KeyError later.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Role = Literal["system", "user", "assistant", "tool"]
Actor = Literal["agent", "user"]
Split = Literal["train", "dev", "test"]
SPLITS: tuple[Split, ...] = ("train", "dev", "test")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ToolCall(_Model):
    """One function call requested by the agent (or by the user, for user tools)."""

    id: str
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class Message(_Model):
    """One chat message. ``tool_calls`` only on assistant messages, ``tool_call_id`` only on tool ones."""

    role: Role
    content: str = ""
    tool_calls: list[ToolCall] = Field(default_factory=list)
    tool_call_id: str | None = None
    name: str | None = None


class ToolSpec(_Model):
    """What a model is shown about a tool, plus the two facts the grader needs (read/write, who calls it)."""

    name: str
    description: str
    parameters: dict[str, Any]
    kind: Literal["read", "write"] = "read"
    actor: Actor = "agent"

    def openai_schema(self) -> dict[str, Any]:
        """The OpenAI / Hugging Face chat-template ``tools`` entry for this tool."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


class Action(_Model):
    """A gold action: a tool call the reference solver says must happen for the task to succeed."""

    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    actor: Actor = "agent"


class Intent(_Model):
    """One thing the simulated user wants out of the conversation.

    ``action``/``args`` say what the user will accept, in the domain's own terms; a scripted user checks a
    proposed action against them before confirming. ``first_args`` is what the user asks for before
    changing their mind. ``out_of_policy`` marks a request the agent must refuse (the user insists anyway).
    ``question``/``answer`` describe an information request whose answer the agent must say.
    ``say`` is the request in the user's own words (the first request, with ``first_args``) and
    ``change_say`` what it says when it changes its mind; both may name facts of ``Scenario.known`` as
    ``{key}`` placeholders. Without them the generic scripted user words the intent from ``description``.
    """

    description: str
    action: str | None = None
    args: dict[str, Any] = Field(default_factory=dict)
    first_args: dict[str, Any] | None = None
    preferences: dict[str, Any] = Field(default_factory=dict)
    out_of_policy: bool = False
    question: str | None = None
    answer: str | None = None
    user_actions: list[Action] = Field(default_factory=list)
    say: str | None = None
    change_say: str | None = None


class Scenario(_Model):
    """The structured side of a task, playable by a scripted user.

    ``known`` holds every fact the user can state (name, zip, email, order ids ...); keys listed in
    ``withheld`` are only revealed when the agent asks for them. ``fact_words`` lists how an agent may
    name a fact when it asks for it (``{"card_number": ["library card"]}``), besides the key in words.
    """

    persona: str
    known: dict[str, str] = Field(default_factory=dict)
    withheld: list[str] = Field(default_factory=list)
    intents: list[Intent] = Field(default_factory=list)
    traits: list[str] = Field(default_factory=list)
    fact_words: dict[str, list[str]] = Field(default_factory=dict)


class Task(_Model):
    """One training or evaluation problem: what the user wants and what the grader expects."""

    id: str
    domain: str
    split: Split
    family: str
    user_id: str
    scenario: Scenario
    instruction: str
    gold_actions: list[Action] = Field(default_factory=list)
    required_outputs: list[str] = Field(default_factory=list)
    context: dict[str, Any] = Field(default_factory=dict)


class ToolRecord(_Model):
    """One executed tool call as the environment saw it (the audit trail the grader reads).

    ``changed`` lists the ``[table, key]`` records the call wrote; ``owners`` the users owning them;
    ``authenticated`` is who the agent had authenticated when the call ran.
    """

    call_id: str
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    actor: Actor = "agent"
    kind: Literal["read", "write", "unknown"] = "read"
    ok: bool = True
    output: str = ""
    #: ``tool_fault``: the tool's server failed (crashed, hung, did not start); the call may not have run
    error: Literal["unknown_tool", "invalid_arguments", "domain", "internal", "tool_fault"] | None = None
    changed: list[tuple[str, str]] = Field(default_factory=list)
    owners: list[str] = Field(default_factory=list)
    authenticated: str | None = None
    terminal: bool = False


class Violation(_Model):
    """A policy breach. Reported beside the reward, never folded into it (the paper's reward is outcome only)."""

    kind: Literal["unauthenticated_write", "unconfirmed_write", "other_user_records"]
    call_id: str
    tool: str
    detail: str


class Check(_Model):
    """One verification criterion of a task; TCR is the fraction of these that pass."""

    name: str
    passed: bool
    detail: str = ""


class Reward(_Model):
    """The outcome of one episode."""

    reward: float
    db_match: bool
    outputs_ok: bool
    outputs_required: bool
    tcr: float
    checks: list[Check] = Field(default_factory=list)
    violations: list[Violation] = Field(default_factory=list)
    diff: list[str] = Field(default_factory=list)


#: the stop reasons of an episode cut off rather than ended by the user, the agent or a fault
#: (:mod:`muarl.rollout`): a turn at its token limit, the context full, the turn limit reached
TRUNCATED_STOPS = ("turn_token_limit", "context_limit", "max_turns")


class Trajectory(_Model):
    """One episode, complete enough to rescore, replay, view or train on.

    ``messages`` is the agent's view of the conversation; ``tool_log`` holds every tool execution by the
    agent or the user, in order, so the final database can be rebuilt by replaying it on a fresh copy.
    For token backends ``token_ids`` is the whole conversation exactly as the model saw it (append-only:
    rendered system / user / tool tokens plus the sampled assistant tokens, never re-rendered),
    ``loss_mask`` is 1 on exactly the sampled tokens and ``logprobs`` their sampling log-probabilities
    (0.0 elsewhere). ``turns`` counts tool executions plus user replies, as the paper's turn limit does.
    """

    task_id: str
    domain: str
    messages: list[Message] = Field(default_factory=list)
    tool_log: list[ToolRecord] = Field(default_factory=list)
    stop_reason: str = ""
    user_seed: int | None = None
    sim_fault: bool = False
    turns: int = 0
    malformed_calls: int = 0
    token_ids: list[int] = Field(default_factory=list)
    loss_mask: list[int] = Field(default_factory=list)
    logprobs: list[float] = Field(default_factory=list)
    reward: Reward | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)

    @property
    def truncated(self) -> bool:
        """Whether the episode was cut off rather than ended (:data:`TRUNCATED_STOPS`): at the per-turn token
        limit (the agent still talking), the context limit or the turn limit. RL can turn clean failures
        into such babble, which pass^1 cannot see: the truncation rate is reported beside it."""
        return self.stop_reason in TRUNCATED_STOPS

    @property
    def tool_fault(self) -> bool:
        """Whether a tool server failed during the episode: its reward says nothing about the agent, so
        training can mask it like a simulator fault (derived from the tool log, so it cannot disagree)."""
        return any(r.error == "tool_fault" for r in self.tool_log)

    @property
    def fault_kind(self) -> str | None:
        """What spoiled the episode, if anything the agent did not do (see :mod:`muarl.faults`): the kind
        recorded in ``metadata["fault"]`` (user, user_timeout, policy, policy_timeout, tool, tool_timeout),
        else "user" for a simulator fault and "tool" for a tool-server fault; None for a clean episode.
        Evaluation leaves user and tool faults out of the success metrics, and GRPO out of the gradient and
        their group's baseline; a policy fault counts as the agent's failure (reward 0) in both."""
        recorded = self.metadata.get("fault")
        if isinstance(recorded, dict) and recorded.get("kind"):
            return str(recorded["kind"])
        if self.sim_fault:
            return "user"
        return "tool" if self.tool_fault else None
