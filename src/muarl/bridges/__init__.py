"""Bridges: other benchmarks' worlds as muarl domains, so every muarl command runs on them unchanged.

``get_domain("tau2:retail")`` (tau2-bench, extra ``tau2``) and ``get_domain("bfcl:base")`` (BFCL-V3
multi-turn, extra ``bfcl``) import the bridge module named by the prefix, which calls ``load(rest)``. The
benchmark packages are optional, so a missing one is reported with the command that installs it instead
of an ``ImportError`` from deep inside an import chain.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from pydantic import BaseModel, ConfigDict, create_model

#: BFCL's and ACEBench's function-doc types, as JSON Schema types
_TYPES = {"dict": "object", "float": "number", "tuple": "array", "list": "array", "int": "integer",
          "integer": "integer", "string": "string", "boolean": "boolean", "bool": "boolean", "array": "array"}

#: the default of an optional argument the caller left out; dropped before the bridged tool is called
UNSET: Any = type("Unset", (), {"__repr__": lambda self: "<unset>"})()


class MissingExtra(ImportError, ValueError):
    """An optional benchmark package is not installed. (A ValueError too, so the CLI prints it cleanly.)"""


def require(module: str, extra: str) -> ModuleType:
    """Import ``module`` or fail with the command that installs muarl's ``extra``."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise MissingExtra(
            f"the {extra} bridge needs the package that provides {module!r} ({err}); install it with "
            f"`bash scripts/install.sh --dev` (or see the '{extra}' extra in pyproject.toml)"
        ) from err


def loose_args(name: str, parameters: dict[str, Any]) -> type[BaseModel]:
    """An argument model that checks names only (missing required, unexpected) and never coerces values.

    A bridged benchmark calls its tools with the raw arguments; muarl must execute exactly the call the
    benchmark's own checker will replay, so types are left to the benchmark's code. Optional arguments
    default to :data:`UNSET` so that the benchmark's own defaults apply.
    """
    required = set(parameters.get("required", []))
    fields: dict[str, Any] = {p: (Any, ... if p in required else UNSET) for p in parameters.get("properties", {})}
    return create_model(f"{name}_args", __config__=ConfigDict(extra="forbid"), **fields)  # type: ignore[call-overload]


def given(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The arguments the caller actually passed (those left at :data:`UNSET` removed)."""
    return {k: v for k, v in kwargs.items() if v is not UNSET}


def json_schema(node: Any) -> Any:
    """A BFCL/ACEBench-style function doc ("dict", "float", "tuple", "any" types) as JSON Schema."""
    if isinstance(node, dict):
        out = {k: json_schema(v) for k, v in node.items() if k != "response"}
        kind = node.get("type")
        if kind == "any":
            out.pop("type")
        elif isinstance(kind, str):
            out["type"] = _TYPES.get(kind, kind)
        return out
    if isinstance(node, list):
        return [json_schema(v) for v in node]
    return node
