import pytest
from pydantic import ValidationError

from muarl.domain import get_domain
from muarl.gold import gold_score
from muarl.types import Message, Reward, Task, ToolCall, ToolSpec, Trajectory


def test_every_type_round_trips_through_json():
    task = next(t for t in get_domain("retail").tasks("test") if len(t.gold_actions) >= 2)
    traj = gold_score(get_domain("retail"), task)
    for obj in [task, traj, traj.reward, traj.tool_log[0], traj.messages[-1],
                ToolCall(id="c", name="f", arguments={"x": [1, "ü"]}),
                ToolSpec(name="f", description="d", parameters={"type": "object", "properties": {}})]:
        again = type(obj).model_validate_json(obj.model_dump_json())
        assert again == obj


def test_malformed_data_names_the_bad_field():
    with pytest.raises(ValidationError, match="role"):
        Message.model_validate({"role": "narrator", "content": "x"})
    with pytest.raises(ValidationError, match="split"):
        Task.model_validate({"id": "t", "domain": "d", "split": "holdout", "family": "f", "user_id": "u",
                             "scenario": {"persona": "p"}, "instruction": ""})
    with pytest.raises(ValidationError, match="reward"):
        Reward.model_validate({"db_match": True})
    with pytest.raises(ValidationError, match="unexpected_field"):
        Trajectory.model_validate({"task_id": "t", "domain": "d", "unexpected_field": 1})


def test_openai_schema_shape():
    spec = get_domain("retail").agent_tools["cancel_pending_order"].spec
    schema = spec.openai_schema()
    assert schema["type"] == "function"
    assert schema["function"]["name"] == "cancel_pending_order"
    assert schema["function"]["parameters"]["required"] == ["order_id", "reason"]
