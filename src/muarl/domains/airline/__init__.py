"""The built-in airline domain: book, change and cancel flight reservations under a written policy.

Importing this package registers the domain; ``muarl.domain.get_domain("airline")`` does so lazily.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from muarl.domain import Domain, register
from muarl.domains.airline.data import build_db
from muarl.domains.airline.tasks import build_tasks
from muarl.domains.airline.teacher import AirlineTeacher
from muarl.domains.airline.tools import TOOLS
from muarl.domains.airline.user_script import AirlineUserScript
from muarl.domains.common import GENERAL_TOOLS

_HERE = Path(__file__).parent


def owner_of(table: str, record: Mapping[str, Any]) -> str | None:
    """Users and reservations belong to a user; flights and airports are shared."""
    if table in ("users", "reservations"):
        return record["user_id"]
    return None


DOMAIN = Domain(
    name="airline",
    description=(
        "Airline customer service: look up users and reservations, search flights, book, change (flights, "
        "cabin, baggage, passengers) and cancel reservations, and give compensation, all under a written policy."
    ),
    policy=(_HERE / "policy.md").read_text(),
    tools=TOOLS,
    general_tools=GENERAL_TOOLS,
    build_db=build_db,
    build_tasks=build_tasks,
    owner_of=owner_of,
    db_size=200,
    task_counts={"train": 200, "dev": 40, "test": 80},
    tasks_file=_HERE / "tasks.json",
    user_script=AirlineUserScript(),
    teacher=AirlineTeacher,
)

register(DOMAIN)

__all__ = ["DOMAIN", "build_db", "build_tasks", "owner_of"]
