"""retail-lite: the retail world narrowed to two jobs, the CPU demo's domain.

Same database, tools and simulated users as ``retail``, but only what cancelling a pending order and
returning delivered items need: six tools and a one-paragraph policy. The system turn is about 700
tokens with the embedded tokenizer instead of about 3,200, which is what lets a model trained from
random weights on two CPU cores learn whole conversations in minutes. A domain of your own can be
narrowed the same way: :func:`narrow`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from muarl.domain import Domain, get_domain, register
from muarl.taskgen import generate
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

TOOLS = ["find_user_id_by_email", "find_user_id_by_name_zip", "get_user_details", "get_order_details",
         "cancel_pending_order", "return_delivered_order_items"]
FAMILIES = ["cancel_order", "return_items"]


def narrow(base: Domain, name: str, policy: str, tools: list[str], families: list[str],
           counts: Mapping[str, int], description: str = "") -> Domain:
    """A view of ``base`` with fewer tools, its own policy and tasks from some of its families only."""
    from importlib import import_module

    family_table = import_module(f"muarl.domains.{base.name}.tasks").FAMILIES
    unknown = sorted(set(families) - set(family_table)) + sorted(set(tools) - set(base.agent_tools))
    if unknown:
        raise ValueError(f"{base.name} has no family or tool named {', '.join(unknown)}")
    chosen = {k: family_table[k] for k in families}

    def build_tasks(domain: Domain, seed: int, split_counts: Mapping[str, int]) -> list[Task]:
        users = list(domain.database().tables["users"])
        return generate(domain, seed, split_counts, chosen, users)

    return dataclasses.replace(
        base, name=name, description=description or f"{base.name} narrowed to {', '.join(families)}",
        policy=policy, tools=[base.agent_tools[t] for t in tools], build_tasks=build_tasks,
        task_counts=dict(counts), tasks_file=None, base=base.base or base.name)


def build() -> Domain:
    return narrow(get_domain("retail"), "retail-lite", POLICY, TOOLS, FAMILIES,
                  counts={"train": 400, "dev": 40, "test": 100},
                  description="Retail narrowed to cancelling and returning (six tools, short policy): the CPU demo.")


register(build, name="retail-lite")
