"""retail-lite, the narrowed retail of the CPU demo: same world and grader, fewer and terser tools."""

from __future__ import annotations

import asyncio
import json

import pytest

from muarl.domain import get_domain
from muarl.domains.retail_lite import narrow
from muarl.factory import make_policy, make_user
from muarl.gold import gold_score
from muarl.rollout import RolloutEngine


def test_every_task_is_solvable_and_the_expert_solves_the_test_split() -> None:
    lite = get_domain("retail-lite")
    assert {t.family for t in lite.tasks()} == {"cancel_order", "return_items"}
    assert all(gold_score(lite, t).reward.reward == 1.0 for t in lite.tasks())
    tests = lite.tasks("test")[:30]
    engine = RolloutEngine(lite, make_policy("expert"), make_user("scripted"), progress=False)
    for (traj,) in asyncio.run(engine.run(tests)):
        assert traj.reward.reward == 1.0 and not traj.reward.violations, traj.task_id
        assert {r.name for r in traj.tool_log} <= set(lite.agent_tools)  # never a tool the domain lacks


def test_tools_are_terse_and_results_cut_to_the_kept_fields() -> None:
    retail, lite = get_domain("retail"), get_domain("retail-lite")
    assert len(lite.tools) == 5 and "get_user_details" not in lite.agent_tools
    for tool in lite.tools:
        params = tool.spec.parameters["properties"].values()
        assert all("description" not in p for p in params)
        assert any("description" in p for p in retail.agent_tools[tool.name].spec.parameters["properties"].values())
        assert tool.spec.parameters["required"] == retail.agent_tools[tool.name].spec.parameters["required"]
    order = next(iter(lite.database().tables["orders"]))
    full = json.loads(retail.env().call("get_order_details", {"order_id": order}).output)
    cut = json.loads(lite.env().call("get_order_details", {"order_id": order}).output)
    assert "address" in full and "address" not in cut and cut["items"] == full["items"]


def test_narrow_names_what_does_not_exist() -> None:
    with pytest.raises(ValueError, match="no_such_tool"):
        narrow(get_domain("retail"), "x", "policy", {"no_such_tool": ("d", None)}, ["cancel_order"], {"train": 1})


def test_a_domain_of_ones_own_narrows_with_its_family_table() -> None:
    """A base that is not a built-in (no muarl.domains.<name> module) is narrowed from the families it is
    given; without them the error says what to pass."""
    import dataclasses

    from muarl.domains.retail.tasks import FAMILIES

    shop = dataclasses.replace(get_domain("retail"), name="my-shop", tasks_file=None)
    tools = {"find_user_id_by_email": ("Find a user id by email.", None),
             "get_order_details": ("Get an order.", None), "cancel_pending_order": ("Cancel an order.", None)}
    with pytest.raises(ValueError, match="family_table"):
        narrow(shop, "my-shop-cancel", "policy", tools, ["cancel_order"], {"train": 4})
    hosts = sorted(shop.database().tables["users"])[::2]  # tasks for every other user only
    cancel = narrow(shop, "my-shop-cancel", "Cancel orders.", tools, ["cancel_order"], {"train": 6, "test": 3},
                    family_table={"cancel_order": FAMILIES["cancel_order"]}, hosts=lambda domain: hosts)
    tasks = cancel.tasks()
    assert len(tasks) == 9 and {t.family for t in tasks} == {"cancel_order"}
    assert all(gold_score(cancel, t).reward.reward == 1.0 for t in tasks)
    assert {t.user_id for t in tasks} <= set(hosts)


@pytest.mark.parametrize("name", ["retail-lite", "retail-lite-forgetful"])
def test_dev_split_grew_without_moving_a_train_or_test_task(name: str) -> None:
    """Dev grew from 40 to 100 tasks so the demo's recipe is chosen on dev (issue 34): the tasks earlier
    figures were measured on must be the same tasks, and dev's first 40 the 40 it had."""
    domain = get_domain(name)
    before = domain.generate_tasks(counts={**domain.task_counts, "dev": 40})
    now = domain.tasks()
    for split in ("train", "test"):
        assert [t.model_dump() for t in now if t.split == split] == [t.model_dump() for t in before if t.split == split]
    dev = [t.model_dump() for t in now if t.split == "dev"]
    assert len(dev) == domain.task_counts["dev"] > 40 and dev[:40] == [t.model_dump() for t in before if t.split == "dev"]
    assert not {t.user_id for t in now if t.split == "dev"} & {t.user_id for t in now if t.split != "dev"}
