"""One episode's tau2 world: tau2's own Environment over a copy-on-write copy of a cached parsed database.

tau2 parses its JSON databases into pydantic models (0.5 to 1.5 s each for retail and airline) and its
tools mutate those models in place, so an episode needs a private copy. A deep copy costs as much as the
parse. Instead, every table of the cached parse (a dict of records) is handed to the episode as a
:class:`CowTable`: a shallow dict copy whose records are shared with the cache until a *write* tool reaches
one, which then gets its own deep copy. Read tools (tau2 types them) see the shared records. Small
non-dict parts (telecom's lists, the user's phone) are deep-copied, which costs microseconds.

The world is mirrored into the episode's muarl :class:`~muarl.db.DBView` after every call (only the
records the episode copied are compared), so muarl's hash, diff, TCR and violation checks run on the same
state tau2's tools produced. Mirror layout: a dict field becomes a table keyed by its keys, a list field a
table keyed by position, anything else a one-record table under the key ``"value"``; the user's
database (telecom's phone) gets the prefix ``user.``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import Any

from pydantic import BaseModel
from pydantic_core import to_jsonable_python

from muarl.db import DBView, thaw

#: the muarl table prefix of the user's (device) database
USER_PREFIX = "user."
_GONE = object()


class _Mode:
    """Shared by all tables of one episode: whether the running tool may write (copy on access)."""

    __slots__ = ("writable",)

    def __init__(self) -> None:
        self.writable = True


class CowTable(dict):
    """A table of pydantic records shared with the cached parse until a write tool reaches one.

    The dict storage always holds the current record objects, so pydantic's ``model_dump`` (which reads the
    storage directly) sees the episode's state. Python-level access by a write tool replaces a shared record
    by its deep copy first. ``fresh`` holds the keys this episode owns (copied, inserted or deleted).
    """

    def __init__(self, base: dict[str, Any], mode: _Mode):
        super().__init__(base)
        self.mode = mode
        self.fresh: set[str] = set()

    def __getitem__(self, key: str) -> Any:
        value = dict.__getitem__(self, key)
        if self.mode.writable and key not in self.fresh:
            value = value.model_copy(deep=True) if isinstance(value, BaseModel) else copy.deepcopy(value)
            dict.__setitem__(self, key, value)
            self.fresh.add(key)
        return value

    def get(self, key: str, default: Any = None) -> Any:
        return self[key] if key in self else default  # noqa: SIM401 (must go through __getitem__)

    def values(self) -> list[Any]:  # type: ignore[override]
        return [self[k] for k in self]

    def items(self) -> list[tuple[str, Any]]:  # type: ignore[override]
        return [(k, self[k]) for k in self]

    def __setitem__(self, key: str, value: Any) -> None:
        dict.__setitem__(self, key, value)
        self.fresh.add(key)

    def __delitem__(self, key: str) -> None:
        dict.__delitem__(self, key)
        self.fresh.add(key)

    def pop(self, key: str, *default: Any) -> Any:
        self.fresh.add(key)
        return dict.pop(self, key, *default)

    def setdefault(self, key: str, default: Any = None) -> Any:
        if key not in self:
            self[key] = default
        return self[key]

    def update(self, *args: Any, **kwargs: Any) -> None:
        for key, value in dict(*args, **kwargs).items():
            self[key] = value

    def popitem(self) -> tuple[str, Any]:
        raise NotImplementedError("CowTable.popitem: tau2 tools do not use it")

    def clear(self) -> None:
        raise NotImplementedError("CowTable.clear: tau2 tools do not use it")


def _is_table(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(v, BaseModel) for v in value.values())


def cow_copy(db: BaseModel, mode: _Mode) -> BaseModel:
    """An episode's copy of a parsed tau2 database: tables copy-on-write, everything else deep-copied."""
    fields = {}
    for name in type(db).model_fields:
        value = getattr(db, name)
        fields[name] = CowTable(value, mode) if _is_table(value) else copy.deepcopy(value)
    return type(db).model_construct(_fields_set=db.model_fields_set, **fields)


def _rows(value: Any) -> dict[str, Any]:
    """One database field as muarl records (JSON values), keyed as described in the module docstring."""
    if isinstance(value, dict):
        return {str(k): _json(v) for k, v in value.items()}
    if isinstance(value, list):
        return {str(i): _json(v) for i, v in enumerate(value)}
    return {"value": _json(value)}


def _json(value: Any) -> Any:
    """A record as JSON values (enums by value, dates as ISO text): what tau2's hash serializes too."""
    return to_jsonable_python(value)


def tables_of(db: BaseModel | None, user_db: BaseModel | None) -> dict[str, dict[str, Any]]:
    """The muarl tables of a tau2 agent database and (optional) user database."""
    tables: dict[str, dict[str, Any]] = {}
    for prefix, model in (("", db), (USER_PREFIX, user_db)):
        if model is not None:
            for name in type(model).model_fields:
                tables[prefix + name] = _rows(getattr(model, name))
    return tables


class Tau2World:
    """One episode's tau2 Environment, built by ``construct(db, user_db)`` over copy-on-write copies."""

    def __init__(self, construct: Callable[..., Any], db: BaseModel, user_db: BaseModel | None,
                 initial_state: Any = None):
        self.mode = _Mode()
        kwargs: dict[str, Any] = {"db": cow_copy(db, self.mode)}
        if user_db is not None:
            kwargs["user_db"] = cow_copy(user_db, self.mode)
        self.env = construct(**kwargs)
        if initial_state is not None:  # telecom: put the phone and the account in the task's starting state
            self.env.set_state(initialization_data=initial_state.initialization_data,
                               initialization_actions=initial_state.initialization_actions, message_history=[])

    def call(self, name: str, requestor: str, arguments: dict[str, Any], call_id: str) -> Any:
        """Run one tool exactly the way tau2's orchestrator and evaluator do; returns tau2's ToolMessage."""
        from tau2.data_model.message import ToolCall
        from tau2.environment.toolkit import ToolType

        kit = self.env.user_tools if requestor == "user" else self.env.tools
        read_only = kit is not None and kit.has_tool(name) and kit.tool_type(name) == ToolType.READ
        self.mode.writable = not read_only
        try:
            return self.env.get_response(ToolCall(id=call_id, name=name, arguments=arguments, requestor=requestor))
        finally:
            self.mode.writable = True

    def _parts(self) -> Iterator[tuple[str, BaseModel]]:
        yield "", self.env.tools.db
        if self.env.user_tools is not None:
            yield USER_PREFIX, self.env.user_tools.db

    def sync(self, view: DBView) -> None:
        """Make the muarl view equal to the tau2 state, touching only records that differ."""
        for prefix, model in self._parts():
            for name in type(model).model_fields:
                value = getattr(model, name)
                table = view[prefix + name]
                if isinstance(value, CowTable):
                    current = {k: (_json(dict.__getitem__(value, k)) if k in value else _GONE) for k in value.fresh}
                else:
                    current = dict(_rows(value))
                    current.update({k: _GONE for k in table if k not in current})
                for key, record in current.items():
                    _put(table, key, record)

    def hashes(self) -> tuple[str | None, str | None]:
        """tau2's own hashes of the agent and user databases (what its evaluator compares)."""
        return self.env.get_db_hash(), self.env.get_user_db_hash()


def _put(table: Any, key: str, record: Any) -> None:
    if record is _GONE:
        if key in table:
            table.delete(key)
    elif key not in table:
        table.insert(key, record)
    elif thaw(table[key]) != record:
        mine = table.edit(key)
        mine.clear()
        mine.update(record)
