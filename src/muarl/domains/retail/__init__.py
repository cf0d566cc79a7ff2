"""The retail domain: an online store's users, orders and catalogue (the tau-bench retail setting)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from muarl.domain import Domain, register
from muarl.domains.common import GENERAL_TOOLS
from muarl.domains.retail.data import build_db
from muarl.domains.retail.tasks import build_tasks
from muarl.domains.retail.teacher import RetailTeacher
from muarl.domains.retail.tools import TOOLS
from muarl.domains.retail.user_script import RetailUserScript

_HERE = Path(__file__).parent


def owner_of(table: str, record: Mapping[str, Any]) -> str | None:
    """Users own themselves and their orders; the catalogue is shared."""
    return record.get("user_id") if table in ("users", "orders") else None


DOMAIN = Domain(
    name="retail",
    description="Online store: authenticate, then cancel or modify pending orders, return or exchange delivered items.",
    policy=(_HERE / "policy.md").read_text(),
    tools=TOOLS,
    general_tools=GENERAL_TOOLS,
    build_db=build_db,
    build_tasks=build_tasks,
    owner_of=owner_of,
    db_size=300,
    task_counts={"train": 240, "dev": 40, "test": 80},
    tasks_file=_HERE / "tasks.json",
    user_script=RetailUserScript(),
    teacher=RetailTeacher,
)
register(DOMAIN)
