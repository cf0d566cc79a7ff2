"""The judge: DB match against gold, outputs, TCR and every kind of violation."""

import pytest

from muarl.gold import gold_score, gold_trajectory
from muarl.rewards import is_confirmation, score
from muarl.types import Action, Message, ToolCall, Trajectory


def _task(domain, family, min_writes=1):
    return next(t for t in domain.tasks("train") if t.family == family and len(t.gold_actions) >= min_writes)


def test_dropping_a_gold_write_scores_zero_with_a_diff_naming_the_record(retail):
    task = _task(retail, "multi_action", 2)
    assert gold_score(retail, task).reward.reward == 1.0
    for k, dropped in enumerate(task.gold_actions):
        traj = gold_score(retail, task, task.gold_actions[:k] + task.gold_actions[k + 1:])
        reward = traj.reward
        assert reward.reward == 0.0 and not reward.db_match
        key = dropped.arguments.get("order_id") or dropped.arguments.get("user_id")
        assert any(f'["{key}"]' in line for line in reward.diff), reward.diff
        assert 0.0 < reward.tcr < 1.0  # the other write's effect still counts


@pytest.mark.parametrize("family", ["cancel_order", "return_items", "exchange_items", "modify_items", "earbuds_blue",
                                    "modify_order_address", "modify_user_address", "change_of_mind"])
def test_perturbing_a_gold_argument_scores_zero(retail, family):
    orders = retail.database().tables["orders"]
    task = next(t for t in retail.tasks("train") if t.family == family and t.gold_actions and (
        family != "return_items"
        or len(orders[t.gold_actions[0].arguments["order_id"]]["items"]) > len(t.gold_actions[0].arguments["item_ids"])))
    action = task.gold_actions[0]
    args = dict(action.arguments)
    if "reason" in args:
        args["reason"] = "ordered by mistake" if args["reason"] == "no longer needed" else "no longer needed"
    elif "zip" in args:
        args["zip"] = "99999"
    elif family == "change_of_mind":
        args = task.scenario.intents[0].first_args  # what the user asked first, before changing their mind
    else:
        order = orders[args["order_id"]]
        others = [i["item_id"] for i in order["items"] if i["item_id"] not in args["item_ids"]]
        if "new_item_ids" in args:
            product = next(i["product_id"] for i in order["items"] if i["item_id"] == args["item_ids"][0])
            variants = retail.database().tables["products"][product]["variants"]
            args["new_item_ids"] = [next(v for v, r in variants.items() if r["available"]
                                         and v not in args["new_item_ids"] + args["item_ids"])]
        else:
            args["item_ids"] = sorted(args["item_ids"] + others[:1])
    traj = gold_score(retail, task, [Action(name=action.name, arguments=args)])
    assert traj.tool_log[-1].ok, traj.tool_log[-1].output
    assert traj.reward.reward == 0.0
    target = args.get("order_id") or args.get("user_id")
    assert any(f'["{target}"]' in line for line in traj.reward.diff)


def test_no_write_task_rewards_doing_nothing_and_punishes_a_write(retail):
    task = _task(retail, "out_of_policy", 0)
    assert task.gold_actions == []
    assert gold_score(retail, task).reward.reward == 1.0
    intent = task.scenario.intents[0]
    traj = gold_score(retail, task, [Action(name=intent.action, arguments=intent.args)])
    # the forbidden write either fails in the tool (nothing changes) or changes the DB and scores 0
    if traj.tool_log[-1].ok:
        assert traj.reward.reward == 0.0 and traj.reward.checks[0].name == "database unchanged"
    else:
        assert traj.reward.reward == 1.0


def test_required_outputs_are_switchable(retail):
    task = _task(retail, "info_request", 0)
    answer = task.required_outputs[0]
    traj = Trajectory(task_id=task.id, domain="retail",
                      messages=[Message(role="assistant", content="I cannot tell you that.")])
    r_eval = score(retail, task, traj, require_outputs=True)
    r_train = score(retail, task, traj, require_outputs=False)
    assert r_eval.reward == 0.0 and r_train.reward == 1.0 and not r_eval.outputs_ok
    traj.messages.append(Message(role="assistant", content=f"You paid ${float(answer):,.2f} in total."))
    assert score(retail, task, traj, require_outputs=True).reward == 1.0


def test_score_replays_the_tool_log_when_no_env_is_given(retail):
    task = _task(retail, "exchange_items")
    traj, env = gold_trajectory(retail, task)
    assert score(retail, task, traj).model_dump() == score(retail, task, traj, env=env).model_dump()


def _conversation(retail, task, turns):
    """Run a scripted conversation: ('agent', text), ('user', text), ('auth', None) or ('call', Action)."""
    env = retail.env(task)
    messages = []
    for i, (kind, value) in enumerate(turns):
        if kind in ("user", "agent"):
            messages.append(Message(role="user" if kind == "user" else "assistant", content=value))
        elif kind == "auth":
            known = task.scenario.known
            env.call("find_user_id_by_name_zip", {"first_name": known["first_name"], "last_name": known["last_name"],
                                                  "zip": known["zip"]})
        else:
            rec = env.call(value.name, value.arguments, call_id=f"c{i}")
            messages.append(Message(role="assistant", tool_calls=[ToolCall(id=f"c{i}", name=value.name,
                                                                           arguments=value.arguments)]))
            messages.append(Message(role="tool", content=rec.output, tool_call_id=f"c{i}"))
    traj = Trajectory(task_id=task.id, domain="retail", messages=messages, tool_log=env.log)
    return score(retail, task, traj, env=env)


def test_each_violation_kind(retail):
    task = _task(retail, "multi_action", 2)
    a, b = task.gold_actions
    ask = ("agent", "I will do that. Would you like me to proceed? (yes/no)")
    clean = _conversation(retail, task, [("auth", None), ask, ("user", "Yes, go ahead."), ("call", a),
                                         ask, ("user", "yes please"), ("call", b)])
    assert clean.reward == 1.0 and clean.violations == []

    unauth = _conversation(retail, task, [ask, ("user", "yes"), ("call", a), ask, ("user", "yes"), ("call", b)])
    assert unauth.reward == 1.0  # violations are reported, never folded into the outcome reward
    assert [v.kind for v in unauth.violations] == ["unauthenticated_write", "unauthenticated_write"]

    unconfirmed = _conversation(retail, task, [("auth", None), ("user", "I want to cancel an order."), ("call", a),
                                               ask, ("user", "Yes."), ("call", b)])
    assert [(v.kind, v.tool) for v in unconfirmed.violations] == [("unconfirmed_write", a.name)]

    one_yes_two_writes = _conversation(retail, task, [("auth", None), ask, ("user", "yes"), ("call", a), ("call", b)])
    assert [(v.kind, v.tool) for v in one_yes_two_writes.violations] == [("unconfirmed_write", b.name)]

    refused = _conversation(retail, task, [("auth", None), ask, ("user", "No, don't do that."), ("call", a)])
    assert [v.kind for v in refused.violations] == ["unconfirmed_write"]

    orders = retail.database().tables["orders"]
    stranger = next(o for o, r in orders.items() if r["status"] == "pending" and r["user_id"] != task.user_id)
    other = _conversation(retail, task, [("auth", None), ask, ("user", "yes"),
                                         ("call", Action(name="cancel_pending_order",
                                                         arguments={"order_id": stranger, "reason": "no longer needed"}))])
    kinds = [v.kind for v in other.violations]
    assert kinds == ["other_user_records"] and other.reward == 0.0
    assert orders[stranger]["user_id"] in other.violations[0].detail


@pytest.mark.parametrize(("required", "text", "ok"), [
    ("1234.50", "That comes to $1,234.50.", True),
    ("1234.50", "That comes to 1234.5 dollars.", True),
    ("1234", "Your total is 12345.", False),
    ("1234", "Your total is 1234.00", True),
    ("delayed", "Flight HAT001 is DELAYED today.", True),
    ("delayed", "It is not undelayed.", False),
])
def test_required_output_matching(required, text, ok):
    from muarl.rewards import _said

    assert _said(required, text) is ok


@pytest.mark.parametrize("text", ["No problem, go ahead.", "Yes", "yes, please do", "Sure, go ahead.", "I confirm.",
                                  "ok do it", "That's right", "Okay.", "Sure thing!", "Not a problem, proceed."])
def test_confirmations(text):
    assert is_confirmation(text)


@pytest.mark.parametrize("text", ["No", "no, wait", "Don't do that", "What are the options?", "Hold on, yes maybe",
                                  "I need to cancel my order", "", "Okay, I did that and the phone restarted fine.",
                                  "That's not correct.", "I'm not sure that's right.",
                                  "Yes, but actually I changed my mind: the blue one instead."])
def test_not_confirmations(text):
    assert not is_confirmation(text)
