"""The built-in ``telecom`` domain: dual control, where the agent fixes the account and the user the phone.

The agent's tools read and change customers' lines, plans and bills; the simulated user's tools act on
the phone they hold (``devices[context["phone_number"]]``). Many problems need both sides (roaming must be
on for the line *and* in the phone), and the reward compares the final state of both.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from muarl.domain import Domain, register
from muarl.domains.common import GENERAL_TOOLS

from .data import build_db
from .tasks import build_tasks
from .teacher import TelecomTeacher
from .tools import TOOLS
from .user_script import TelecomUserScript
from .user_tools import USER_TOOLS

_OWNED = {"customers", "lines", "bills", "devices"}


def owner_of(table: str, record: Mapping[str, Any]) -> str | None:
    """The customer a record belongs to; plans are shared and belong to nobody."""
    if table in _OWNED:
        return record.get("customer_id")
    return None


DOMAIN = Domain(
    name="telecom",
    description=(
        "Mobile carrier support with dual control: the agent manages lines, plans, bills, data refuels and "
        "roaming; the user follows troubleshooting steps on their own phone."
    ),
    policy=Path(__file__).with_name("policy.md").read_text(),
    tools=TOOLS,
    general_tools=GENERAL_TOOLS,
    user_tools=USER_TOOLS,
    build_db=build_db,
    build_tasks=build_tasks,
    owner_of=owner_of,
    db_size=200,
    task_counts={"train": 200, "dev": 40, "test": 80},
    tasks_file=Path(__file__).with_name("tasks.json"),
    user_script=TelecomUserScript(),
    teacher=TelecomTeacher,
)

register(DOMAIN)
