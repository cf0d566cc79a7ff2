"""Core code is free of the built-in domains' names: what it needs to know of a domain's tools comes from the
domain (its tools' metadata, ``Domain.general_tools``), so a new domain, a bridged benchmark or an MCP
server is treated exactly as the built-in ones. ``muarl/domains/`` (the built-in domains themselves) and
``muarl/bridges/`` (adapters to benchmarks that share some tool names) are exempt.

Only code counts: the strings of a module outside its docstrings (a docstring may use a built-in domain
as its example).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from muarl.domain import get_domain

PACKAGE = Path(__file__).parents[1] / "src" / "muarl"
BUILT_IN = ("retail", "airline", "telecom", "retail-lite")
EXEMPT = ("domains", "bridges")
#: the core modules that may name a built-in domain, and why
NAMES_DOMAINS = {
    "domain.py": "the registry of the built-in domains (name -> module)",
    "tokenizer_training.py": "the embedded tokenizer is trained on the built-in domains' texts",
    "cli/options.py": "--domain's listed choices",
    "cli/serve_mcp.py": "--domain's help",
    "train/grpo_config.py": "the default --domain",
    "train/pretrain.py": "the default --domain (the shipped base is pretrained on retail-lite)",
}


def core_strings() -> dict[str, list[tuple[int, str]]]:
    """Each core module's string literals that are not docstrings, with their lines."""
    found: dict[str, list[tuple[int, str]]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(PACKAGE).as_posix()
        if name.split("/")[0] in EXEMPT:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                      if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
                      and node.body and isinstance(node.body[0], ast.Expr)
                      and isinstance(node.body[0].value, ast.Constant)}
        found[name] = [(node.lineno, node.value) for node in ast.walk(tree) if isinstance(node, ast.Constant)
                       and isinstance(node.value, str) and id(node) not in docstrings]
    return found


def built_in_tools() -> set[str]:
    return {t.name for name in BUILT_IN for t in get_domain(name).tools + get_domain(name).user_tools}


def named(text: str, names: set[str]) -> set[str]:
    """The ``names`` a string names: the whole string, or a word of it when the name is not an everyday word
    (one with an underscore, like ``transfer_to_human_agents``; ``think`` in "I think so" is no tool)."""
    words = set(re.findall(r"[A-Za-z_][\w-]*", text))
    return ({text.strip()} & names) | {w for w in words & names if "_" in w or "-" in w}


def test_core_modules_name_no_built_in_tool() -> None:
    tools = built_in_tools()
    assert {"think", "calculate", "transfer_to_human_agents", "cancel_pending_order"} <= tools
    found = [f"{module}:{line} names {sorted(hit)}" for module, strings in core_strings().items()
             for line, text in strings if (hit := named(text, tools))]
    assert not found, "core code names built-in tools (take them from the domain):\n" + "\n".join(found)


def test_only_the_listed_core_modules_name_a_built_in_domain() -> None:
    domains = set(BUILT_IN) | {"retail_lite"}
    naming = {module for module, strings in core_strings().items()
              if any(set(re.findall(r"[\w-]+", text)) & domains for _, text in strings)}
    assert naming - set(NAMES_DOMAINS) == set(), "core modules name a built-in domain"
    assert set(NAMES_DOMAINS) - naming == set(), "NAMES_DOMAINS lists modules that no longer name one"


@pytest.mark.parametrize("name", BUILT_IN)
def test_built_in_domains_mark_their_general_tools(name: str) -> None:
    """Each built-in domain declares its helpers; a narrowed one (retail-lite) keeps its base's, so its GRPO
    metrics keep the (zero) ``calls_`` columns they always had."""
    domain = get_domain(name)
    assert domain.general_tools == ("think", "calculate", "transfer_to_human_agents")
    assert set(domain.general_tools) <= {t.name for t in get_domain(domain.base or name).tools}


def test_grpo_counts_the_calls_of_the_domains_general_tools_only() -> None:
    """``calls_<name>`` for each general tool the domain declares, in its order; none for a domain that
    declares none (a new domain's own tools are not mistaken for helpers)."""
    from muarl.train.groups import rollout_metrics
    from muarl.types import Message, ToolRecord, Trajectory

    def episode(*calls: str) -> Trajectory:
        log = [ToolRecord(call_id=f"c{i}", name=c) for i, c in enumerate(calls)]
        return Trajectory(task_id="t", domain="d", messages=[Message(role="user", content="hi")],
                          tool_log=log)

    groups = [[episode("think", "think", "lookup"), episode("lookup")]]
    metrics = rollout_metrics(groups, ("think", "calculate"))
    assert [k for k in metrics if k.startswith("calls_")] == ["calls_think", "calls_calculate"]
    assert metrics["calls_think"] == 1.0 and metrics["calls_calculate"] == 0.0
    assert not [k for k in rollout_metrics(groups) if k.startswith("calls_")]
