"""Schema generation and argument validation of @tool, through a small domain of our own."""

from typing import Literal

import pytest

from muarl.domain import Domain
from muarl.domains.common import calculate
from muarl.tools import ToolError, make_tool, parse_docstring, tool


@tool
def lookup(db, key: str, limit: int = 3, scale: float = 1.0, verbose: bool = False,
           tags: list[str] | None = None, mode: Literal["fast", "exact"] = "fast") -> dict:
    """Look a record up.

    Longer explanation that stays in the description.

    Args:
        key: The record key,
            written on two lines.
        limit: How many results.
        scale: A factor.
        verbose: Say more.
        tags: Tags to match.
        mode: Matching mode.
    """
    if key not in db.items:
        raise ToolError(f"record {key} not found")
    return {"key": key, "count": db.items[key]["count"], "limit": limit}


@tool(write=True)
def bump(db, key: str, by: int) -> str:
    """Increase a counter.

    Args:
        key: The key.
        by: The amount; negative amounts are refused after the write started.
    """
    rec = db.items.edit(key)
    rec["count"] += by
    if by < 0:
        raise ToolError("negative amounts are not allowed")
    return "ok"


@tool(write=True)
def crash(db, key: str) -> str:
    """A buggy tool.

    Args:
        key: The key.
    """
    db.items.edit(key)["count"] = -1
    raise RuntimeError("boom")


@tool
def login_then_fail(db, key: str) -> str:
    """Authenticate, then fail.

    Args:
        key: The key.
    """
    db.authenticate(key)
    raise ToolError("wrong password")


@tool(actor="user")
def press_button(db) -> str:
    """A user-side tool."""
    return "pressed"


def _domain():
    return Domain(name="toy", description="", policy="", tools=[lookup, bump, crash, login_then_fail], user_tools=[press_button],
                  build_db=lambda seed, size: {"items": {f"k{i}": {"count": i} for i in range(size)}},
                  build_tasks=lambda d, seed, counts: [], db_size=3)


def test_schema_from_hints_and_docstring():
    spec = lookup.spec
    assert spec.name == "lookup" and spec.kind == "read" and spec.actor == "agent"
    assert spec.description == "Look a record up. Longer explanation that stays in the description."
    props = spec.parameters["properties"]
    assert props["key"] == {"type": "string", "description": "The record key, written on two lines."}
    assert props["limit"]["type"] == "integer" and props["limit"]["default"] == 3
    assert props["scale"]["type"] == "number"
    assert props["verbose"]["type"] == "boolean"
    assert props["mode"]["enum"] == ["fast", "exact"]
    assert {"type": "array", "items": {"type": "string"}} in props["tags"]["anyOf"]
    assert spec.parameters["required"] == ["key"]
    assert "db" not in props
    assert bump.spec.kind == "write" and press_button.spec.actor == "user"


def test_tool_definition_errors_are_caught_early():
    def no_doc(db, x: int) -> int:
        return x

    def no_hint(db, x) -> int:
        """Doc."""
        return x

    with pytest.raises(TypeError, match="docstring"):
        make_tool(no_doc)
    with pytest.raises(TypeError, match="type hint"):
        make_tool(no_hint)


def test_docstring_parser_handles_sections():
    summary, args = parse_docstring("""Do X.

    Args:
        a (int): First.
        b: Second
            continued.

    Returns:
        nothing: ignored
    """)
    assert summary == "Do X." and args == {"a": "First.", "b": "Second continued."}


@pytest.mark.parametrize(
    ("name", "arguments", "expected"),
    [
        ("lookup", {}, "missing required argument 'key'"),
        ("lookup", {"key": 5}, "'key': input should be a valid string (got int 5)"),
        ("lookup", {"key": "k1", "limit": "3"}, "'limit': input should be a valid integer"),
        ("lookup", {"key": "k1", "limit": 2.5}, "'limit': input should be a valid integer"),
        ("lookup", {"key": "k1", "verbose": "yes"}, "'verbose': input should be a valid boolean"),
        ("lookup", {"key": "k1", "tags": "a,b"}, "'tags'"),
        ("lookup", {"key": "k1", "tags": [1, 2]}, "'tags.0': input should be a valid string"),
        ("lookup", {"key": "k1", "mode": "slow"}, "'mode': input should be 'fast' or 'exact'"),
        ("lookup", {"key": "k1", "colour": "red"}, "unexpected argument 'colour'"),
        ("lookup", ["k1"], "arguments for lookup must be a JSON object, got list"),
        ("lookup", "k1", "must be a JSON object, got str"),
        ("lookup", {"key": "zz"}, "Error: record zz not found"),
        ("nosuch", {}, "Error: unknown tool 'nosuch'. Available tools: bump, crash, login_then_fail, lookup"),
        ("press_button", {}, "press_button is a tool of the user"),
        ("crash", {"key": "k1"}, "Error: tool crash failed internally: RuntimeError: boom"),
    ],
)
def test_every_argument_error_becomes_error_text(name, arguments, expected):
    env = _domain().env()
    record = env.call(name, arguments)
    assert not record.ok
    assert record.output.startswith("Error: ")
    assert expected in record.output
    assert env.log[-1] is record


def test_valid_calls_and_coercion_rules():
    env = _domain().env()
    assert env.call("lookup", {"key": "k2", "scale": 2}).ok  # an integer is a valid number
    assert env.call("lookup", {"key": "k2", "tags": ["a"], "mode": "exact"}).output == '{"key": "k2", "count": 2, "limit": 3}'
    assert env.call("press_button", {}, actor="user").output == "pressed"


def test_failed_write_leaves_no_partial_change():
    env = _domain().env()
    before = env.hash()
    assert not env.call("bump", {"key": "k1", "by": -1}).ok
    assert not env.call("crash", {"key": "k1"}).ok
    assert env.hash() == before and env.db.items["k1"]["count"] == 1
    ok = env.call("bump", {"key": "k1", "by": 5})
    assert ok.ok and ok.changed == [("items", "k1")] and env.db.items["k1"]["count"] == 6
    assert not env.call("bump", {"key": "k1", "by": -2}).ok  # rollback restores the earlier edit, not the base
    assert env.db.items["k1"]["count"] == 6


def test_a_failed_call_does_not_authenticate():
    env = _domain().env()
    assert not env.call("login_then_fail", {"key": "k1"}).ok
    assert env.db.authenticated is None


def test_calculate():
    env = _domain().env()
    assert calculate.run(env.db, {"expression": "(12.5 + 3) * 2"}).output == "31.0"
    for bad in ["__import__('os')", "2 ** 1000", "1/0", "x + 1", "1 +"]:
        out = calculate.run(env.db, {"expression": bad})
        assert not out.ok and out.output.startswith("Error: ")
