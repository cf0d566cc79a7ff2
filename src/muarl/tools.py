"""``@tool``: a typed, documented Python function becomes a tool a model can call.

The JSON schema comes from the type hints and the docstring's ``Args:`` section, so the schema the model
sees and the validation the call gets can never disagree. Validation is strict (a string is not an
integer) because a lenient validator would silently teach the policy that sloppy calls work.

A tool's first parameter is the rollout's :class:`~muarl.db.DBView`; it is injected, never shown to the
model. A tool signals a domain failure ("order is not pending") by raising :class:`ToolError`.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import re
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from muarl.db import DBView, to_json
from muarl.types import Actor, ToolSpec


class ToolError(Exception):
    """A domain-level refusal or failure; its message is shown to the agent as ``Error: <message>``."""


@dataclass(frozen=True)
class ToolOutcome:
    ok: bool
    output: str
    #: why it failed: "invalid_arguments" (the caller's fault) or "domain" (a refusal by the domain)
    error: str | None = None


@dataclass
class Tool:
    """A callable tool: the function, its argument model and the spec shown to models."""

    fn: Callable[..., Any]
    spec: ToolSpec
    args_model: type[BaseModel]
    terminal: bool = False
    #: a successful call authenticates a user (sets ``db.authenticated``): the generic teacher calls it
    #: first, with arguments named after the scenario's facts
    authenticates: bool = False

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def is_write(self) -> bool:
        return self.spec.kind == "write"

    def validate(self, arguments: Any) -> dict[str, Any]:
        """Validated keyword arguments, or :class:`ToolError` with every problem spelled out."""
        if not isinstance(arguments, Mapping):
            raise ToolError(
                f"arguments for {self.name} must be a JSON object, got {type(arguments).__name__}"
            )
        try:
            parsed = self.args_model.model_validate(dict(arguments))
        except ValidationError as err:
            raise ToolError(f"invalid arguments for {self.name}: {_explain(err)}") from None
        return {name: getattr(parsed, name) for name in type(parsed).model_fields}

    def run(self, db: DBView, arguments: Any) -> ToolOutcome:
        """Validate, execute and render the result; domain errors become ``Error: ...`` text."""
        try:
            kwargs = self.validate(arguments)
        except ToolError as err:
            return ToolOutcome(False, f"Error: {err}", "invalid_arguments")
        try:
            result = self.fn(db, **kwargs)
        except ToolError as err:
            return ToolOutcome(False, f"Error: {err}", "domain")
        return ToolOutcome(True, render(result))

    def __call__(self, db: DBView, **kwargs: Any) -> Any:
        return self.fn(db, **kwargs)


def render(result: Any) -> str:
    """Tool results as the agent sees them: strings verbatim, everything else as JSON."""
    if isinstance(result, str):
        return result
    return to_json(result, ensure_ascii=False)


def _explain(err: ValidationError) -> str:
    parts = []
    for e in err.errors():
        where = ".".join(str(p) for p in e["loc"]) or "arguments"
        if e["type"] == "missing":
            parts.append(f"missing required argument '{where}'")
        elif e["type"] == "extra_forbidden":
            parts.append(f"unexpected argument '{where}'")
        else:
            got = e.get("input")
            got_s = json.dumps(got)[:60] if _jsonable(got) else type(got).__name__
            parts.append(f"'{where}': {e['msg'].lower()} (got {type(got).__name__} {got_s})")
    return "; ".join(parts)


def _jsonable(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


_ARG_LINE = re.compile(r"^(\s*)\*{0,2}(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")
_SECTIONS = {"Returns", "Raises", "Example", "Examples", "Note", "Notes", "Yields"}


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """Summary and per-argument descriptions from a Google-style docstring."""
    summary: list[str] = []
    args: dict[str, str] = {}
    section, current, indent = "summary", None, None
    for line in inspect.cleandoc(doc or "").splitlines():
        stripped = line.strip()
        if stripped in {"Args:", "Arguments:", "Parameters:"}:
            section, current, indent = "args", None, None
        elif stripped.endswith(":") and stripped[:-1] in _SECTIONS:
            section = "other"
        elif section == "summary":
            summary.append(stripped)
        elif section == "args" and stripped:
            match = _ARG_LINE.match(line)
            if match and (indent is None or len(match.group(1)) <= indent):
                indent, current = len(match.group(1)), match.group(2)
                args[current] = match.group(3).strip()
            elif current:
                args[current] = f"{args[current]} {stripped}".strip()
    return " ".join(" ".join(summary).split()), args


def _clean_schema(schema: Any) -> Any:
    """Drop pydantic's titles so the schema reads like a hand-written OpenAI function schema."""
    if isinstance(schema, dict):
        return {k: _clean_schema(v) for k, v in schema.items() if k != "title"}
    if isinstance(schema, list):
        return [_clean_schema(v) for v in schema]
    return schema


def _inline_refs(schema: dict[str, Any]) -> dict[str, Any]:
    defs = schema.pop("$defs", {})

    def resolve(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                return resolve(defs[ref.split("/")[-1]])
            return {k: resolve(v) for k, v in node.items()}
        if isinstance(node, list):
            return [resolve(v) for v in node]
        return node

    return resolve(schema)


def make_tool(
    fn: Callable[..., Any],
    *,
    write: bool = False,
    actor: Actor = "agent",
    terminal: bool = False,
    name: str | None = None,
) -> Tool:
    """Build a :class:`Tool` from a function whose first parameter is the injected DB view."""
    sig = inspect.signature(fn)
    params = list(sig.parameters.values())
    if not params:
        raise TypeError(f"tool {fn.__name__} must take the DB view as its first parameter")
    hints = typing.get_type_hints(fn)
    summary, arg_docs = parse_docstring(fn.__doc__)
    if not summary:
        raise TypeError(f"tool {fn.__name__} needs a docstring: it is the description the model reads")
    fields: dict[str, Any] = {}
    for p in params[1:]:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise TypeError(f"tool {fn.__name__}: *args/**kwargs cannot be described to a model")
        if p.name not in hints:
            raise TypeError(f"tool {fn.__name__}: parameter {p.name!r} needs a type hint")
        default = ... if p.default is p.empty else p.default
        fields[p.name] = (hints[p.name], default)
    model = create_model(  # type: ignore[call-overload]
        f"{fn.__name__}_args", __config__=ConfigDict(strict=True, extra="forbid"), **fields
    )
    schema = _inline_refs(_clean_schema(model.model_json_schema()))
    schema.pop("additionalProperties", None)
    properties = schema.get("properties", {})
    for arg, text in arg_docs.items():
        if arg in properties and text:
            properties[arg]["description"] = text
    parameters = {"type": "object", "properties": properties, "required": schema.get("required", [])}
    spec = ToolSpec(
        name=name or fn.__name__,
        description=summary,
        parameters=parameters,
        kind="write" if write else "read",
        actor=actor,
    )
    return Tool(fn=fn, spec=spec, args_model=model, terminal=terminal)


def tool(
    fn: Callable[..., Any] | None = None,
    *,
    write: bool = False,
    actor: Actor = "agent",
    terminal: bool = False,
    name: str | None = None,
    authenticates: bool = False,
) -> Any:
    """Decorator form of :func:`make_tool`: ``@tool``, ``@tool(write=True)``, ``@tool(authenticates=True)``."""

    def wrap(f: Callable[..., Any]) -> Tool:
        return dataclasses.replace(make_tool(f, write=write, actor=actor, terminal=terminal, name=name),
                                   authenticates=authenticates)

    return wrap(fn) if fn is not None else wrap

