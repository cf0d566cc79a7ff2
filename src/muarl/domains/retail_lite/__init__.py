"""retail-lite: the retail world narrowed to two jobs, the CPU demo's domain.

Same database, task families and simulated users as ``retail``, but only what cancelling a pending order
and returning delivered items need: five tools with one-line descriptions, a one-paragraph policy, and
tool results cut to the fields those jobs use. A conversation is about 1,400 tokens with the embedded
tokenizer instead of about 5,000 in ``retail``, which is what lets a model trained from random weights
on two CPU cores learn whole conversations in minutes. Narrow another domain with :func:`narrow`.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Mapping, Sequence
from importlib import import_module
from typing import Any

from muarl.domain import Domain, get_domain, register
from muarl.taskgen import Draft, Family, generate
from muarl.tools import Tool
from muarl.types import Task

POLICY = """\
# Retail support (lite)

You help one user with their orders. First authenticate the user: find their user id by email, or by
first name, last name and zip code. Help only with that user's own orders. Look the order up before
acting. A pending order can be cancelled (reason "no longer needed" or "ordered by mistake"); items of a
delivered order can be returned, refunded to the original payment method. Before any change, say
exactly what you will do and ask the user to confirm; act only after a clear yes. One tool call at a
time, never a tool call and a message together. Do not make up ids or amounts.
"""

#: tool -> (one-line description, fields of its result that are kept)
TOOLS: dict[str, tuple[str, Sequence[str] | None]] = {
    "find_user_id_by_email": ("Find a user id by email.", None),
    "find_user_id_by_name_zip": ("Find a user id by first name, last name and zip code.", None),
    "get_order_details": ("Get an order's status, items and payments.",
                          ("order_id", "user_id", "status", "items", "payment_history")),
    "cancel_pending_order": ("Cancel a pending order.", ("order_id", "status")),
    "return_delivered_order_items": ("Return items of a delivered order.", ("order_id", "status", "return_items")),
}
FAMILIES = ["cancel_order", "return_items"]


def _terse(schema: Mapping[str, Any]) -> dict[str, Any]:
    """A JSON schema without descriptions (the parameter names say enough for a narrowed tool)."""
    return {k: (_terse(v) if isinstance(v, Mapping) else v) for k, v in schema.items() if k != "description"}


def _keep(fn: Callable[..., Any], fields: Sequence[str]) -> Callable[..., Any]:
    def kept(*args: Any, **kwargs: Any) -> Any:
        out = fn(*args, **kwargs)
        return {k: out[k] for k in fields if k in out} if isinstance(out, Mapping) else out

    return kept


def narrow_tool(tool: Tool, description: str | None = None, fields: Sequence[str] | None = None) -> Tool:
    """The same tool with a short description, no parameter descriptions, and only ``fields`` of its result."""
    spec = tool.spec.model_copy(update={"description": description or tool.spec.description,
                                        "parameters": _terse(tool.spec.parameters)})
    return dataclasses.replace(tool, spec=spec, fn=_keep(tool.fn, fields) if fields else tool.fn)


def narrow(base: Domain, name: str, policy: str, tools: Mapping[str, tuple[str, Sequence[str] | None]],
           families: list[str], counts: Mapping[str, int], description: str = "",
           family_table: Mapping[str, tuple[float, Family]] | None = None,
           hosts: Callable[[Domain], Sequence[str]] | None = None) -> Domain:
    """A view of ``base``: fewer, terser tools, its own policy, and tasks from some of its families only.

    The database, the task families' generators and the grader are the base domain's, so gold actions,
    rewards and violations mean exactly what they mean there. ``family_table`` holds the base's families
    as :func:`muarl.taskgen.generate` takes them (name -> (weight, generator)); a built-in base's is
    found on its own (``muarl.domains.<base>.tasks.FAMILIES``). ``hosts`` gives the ids tasks are drawn
    for, from the database; by default the keys of its ``users`` table.
    """
    if family_table is None:
        module = f"muarl.domains.{(base.base or base.name).replace('-', '_')}.tasks"
        try:
            family_table = import_module(module).FAMILIES
        except ModuleNotFoundError:
            raise ValueError(f"{base.name} is not a built-in domain: pass its task families as family_table= "
                             "(name -> (weight, generator), as muarl.taskgen.generate takes them)") from None
    unknown = sorted(set(families) - set(family_table)) + sorted(set(tools) - set(base.agent_tools))
    if unknown:
        raise ValueError(f"{base.name} has no family or tool named {', '.join(unknown)}")
    chosen = {k: family_table[k] for k in families}

    def build_tasks(domain: Domain, seed: int, split_counts: Mapping[str, int]) -> list[Task]:
        users = list(hosts(domain) if hosts else domain.database().tables["users"])
        return generate(domain, seed, split_counts, chosen, users)

    return dataclasses.replace(
        base, name=name, description=description or f"{base.name} narrowed to {', '.join(families)}",
        policy=policy, tools=[narrow_tool(base.agent_tools[t], d, f) for t, (d, f) in tools.items()],
        build_tasks=build_tasks, task_counts=dict(counts), tasks_file=None, base=base.base or base.name)


def forgetful(family: Family, remember: float) -> Family:
    """``family`` played by a population of which only ``remember`` (a share) recall their account's email.

    The retail families give 70% of users their email; this drops it from more of them (the same draws
    otherwise: same orders, reasons, items), so the agent must find them by name and zip code. Used to
    give RL users who behave otherwise than the cold start's (``retail-lite-forgetful``).
    """
    from muarl.domains.retail.tasks import _who

    def draft(rng: random.Random, db: Any, user_id: str) -> Draft | None:
        made = family(rng, db, user_id)
        if made is None or "email" not in made.scenario.known or rng.random() < remember / 0.7:
            return made
        known = {k: v for k, v in made.scenario.known.items() if k != "email"}
        scenario = made.scenario.model_copy(update={
            "known": known, "withheld": [w for w in made.scenario.withheld if w != "email"]})
        instruction = made.instruction.replace(_who(made.scenario.known), _who(known))
        return dataclasses.replace(made, scenario=scenario, instruction=instruction)

    return draft


#: tasks per split. Dev has 100 (it had 40), so the demo's 50-task evaluation fits in it and a recipe is
#: chosen on dev without touching test. Each split draws from a random generator of its own
#: (:func:`muarl.taskgen.generate`), so growing dev left every train and test task as it was, and dev's first
#: 40 are the 40 it had.
COUNTS = {"train": 400, "dev": 100, "test": 100}


def build() -> Domain:
    return narrow(get_domain("retail"), "retail-lite", POLICY, TOOLS, FAMILIES,
                  counts=COUNTS,
                  description="Retail narrowed to cancelling and returning (five terse tools): the CPU demo.")


#: share of retail-lite-forgetful's users who remember their email (retail-lite: 70%)
FORGETFUL_REMEMBER = 0.25


def build_forgetful() -> Domain:
    from muarl.domains.retail.tasks import FAMILIES as RETAIL

    table = {name: (RETAIL[name][0], forgetful(RETAIL[name][1], FORGETFUL_REMEMBER)) for name in FAMILIES}
    return narrow(get_domain("retail"), "retail-lite-forgetful", POLICY, TOOLS, FAMILIES,
                  counts=COUNTS, family_table=table,
                  description="retail-lite with users who mostly forgot their email (25% remember, not 70%): "
                              "the CPU demo's RL and held-out tasks, where the cold start's habits fail.")


register(build, name="retail-lite")
register(build_forgetful, name="retail-lite-forgetful")
