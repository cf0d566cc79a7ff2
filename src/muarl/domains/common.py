"""Tools every customer-service domain offers: a calculator, a scratchpad and a hand-off to a human."""

from __future__ import annotations

import ast
import operator

from muarl.db import DBView
from muarl.tools import ToolError, tool

_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


def _eval(node: ast.AST) -> float:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_eval(node.left), _eval(node.right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_eval(node.operand))
    raise ToolError("only numbers, + - * / and parentheses are allowed")


@tool
def calculate(db: DBView, expression: str) -> str:
    """Calculate the result of an arithmetic expression.

    Args:
        expression: The expression, using numbers, + - * / and parentheses, e.g. "(12.5 + 3) * 2".
    """
    if len(expression) > 200:
        raise ToolError("expression too long (max 200 characters)")
    try:
        value = _eval(ast.parse(expression, mode="eval"))
    except SyntaxError:
        raise ToolError(f"cannot parse expression {expression!r}") from None
    except ZeroDivisionError:
        raise ToolError("division by zero") from None
    return str(round(value, 2))


@tool
def think(db: DBView, thought: str) -> str:
    """Write down a thought to reason about the request. It changes nothing and tells the user nothing.

    Args:
        thought: The thought.
    """
    return ""


@tool(terminal=True)
def transfer_to_human_agents(db: DBView, summary: str) -> str:
    """Transfer the user to a human agent. Only do this when the policy says so or the request is out of scope.

    Args:
        summary: A summary of the user's issue for the human agent.
    """
    return "Transfer successful"


COMMON_TOOLS = [calculate, think, transfer_to_human_agents]
#: their names, each built-in domain's ``Domain.general_tools`` (in the order GRPO logs their calls)
GENERAL_TOOLS = ("think", "calculate", "transfer_to_human_agents")
