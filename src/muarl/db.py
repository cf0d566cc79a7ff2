"""Domain databases: one frozen shared base, and a cheap copy-on-write view per rollout.

A database is a dict of tables, each a dict from string key to a JSON-like record. The base is frozen
once (dicts become read-only mappings, lists become tuples) so that no rollout can ever write into data
another rollout sees. A :class:`DBView` keeps an overlay of the records its rollout edited; creating one
costs a few dict allocations and never copies or re-parses the data, which is what makes thousands of
rollouts per step affordable.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import Any

_DELETED = object()


def freeze(value: Any) -> Any:
    """A deep read-only copy: mappings become ``MappingProxyType``, lists become tuples."""
    if isinstance(value, Mapping):
        return MappingProxyType({k: freeze(v) for k, v in value.items()})
    if isinstance(value, list | tuple):
        return tuple(freeze(v) for v in value)
    return value


def thaw(value: Any) -> Any:
    """A deep mutable copy of a frozen (or plain) value: plain dicts and lists all the way down."""
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [thaw(v) for v in value]
    return value


def _json_default(value: Any) -> Any:
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


def to_json(value: Any, **kwargs: Any) -> str:
    """JSON text of a value that may contain frozen records."""
    return json.dumps(value, default=_json_default, **kwargs)


def _canonical(record: Any) -> str:
    return json.dumps(record, default=_json_default, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def record_hash(record: Any) -> str:
    """Canonical hash of one record: independent of key order, sensitive to every value."""
    return hashlib.sha256(_canonical(record).encode()).hexdigest()


_MOD = 2**256


def _entry_digest(table: str, key: str, record: Any) -> int:
    """One (table, key, record) entry as a 256-bit integer; a database hashes to the sum of its entries."""
    return int.from_bytes(hashlib.sha256(f"{table}\x00{key}\x00{_canonical(record)}".encode()).digest(), "big")


class Database:
    """The frozen, shared base data of a domain. Build it once per process; open views per rollout."""

    def __init__(self, tables: Mapping[str, Mapping[str, Any]]):
        for name, rows in tables.items():
            if not isinstance(rows, Mapping):
                raise TypeError(f"table {name!r} must be a mapping from key to record, got {type(rows).__name__}")
        self.tables: dict[str, Mapping[str, Any]] = {
            name: MappingProxyType({str(k): freeze(v) for k, v in rows.items()}) for name, rows in tables.items()
        }
        self._digests: dict[tuple[str, str], int] = {}
        self._sum: int | None = None

    def entry_digest(self, table: str, key: str) -> int:
        """Digest of a base entry, computed once and cached (base records never change)."""
        cached = self._digests.get((table, key))
        if cached is None:
            cached = self._digests[(table, key)] = _entry_digest(table, key, self.tables[table][key])
        return cached

    def digest_sum(self) -> int:
        """The sum of every base entry's digest (computed on first use, once per process)."""
        if self._sum is None:
            names = _entry_digest("", "", sorted(self.tables))  # an empty table still counts
            self._sum = (names + sum(self.entry_digest(t, k) for t, rows in self.tables.items() for k in rows)) % _MOD
        return self._sum

    def view(self, context: Mapping[str, Any] | None = None) -> DBView:
        """A fresh private copy-on-write view for one rollout."""
        return DBView(self, context)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return thaw(self.tables)


class TableView(Mapping[str, Any]):
    """One table as seen by one rollout: base records overlaid with this rollout's edits."""

    def __init__(self, view: DBView, name: str):
        self._view = view
        self.name = name
        self._base = view.base.tables[name]
        self._overlay: dict[str, Any] = view._overlay.setdefault(name, {})

    def __getitem__(self, key: str) -> Any:
        value = self._overlay.get(key, None)
        if value is None:
            return self._base[key]
        if value is _DELETED:
            raise KeyError(key)
        return value

    def __contains__(self, key: object) -> bool:
        value = self._overlay.get(key)  # type: ignore[call-overload]
        if value is None:
            return key in self._base
        return value is not _DELETED

    def __iter__(self) -> Iterator[str]:
        for key in self._base:
            if self._overlay.get(key) is not _DELETED:
                yield key
        for key, value in self._overlay.items():
            if key not in self._base and value is not _DELETED:
                yield key

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def edit(self, key: str) -> dict[str, Any]:
        """The record as a mutable dict owned by this rollout; changes to it are the rollout's writes."""
        value = self._overlay.get(key)
        if value is _DELETED or (value is None and key not in self._base):
            raise KeyError(key)
        self._view._touch(self.name, key)
        if value is None:
            value = self._overlay[key] = thaw(self._base[key])
        return value

    def insert(self, key: str, record: Mapping[str, Any]) -> dict[str, Any]:
        """Add a new record; fails if the key exists (tools should pick fresh ids)."""
        if key in self:
            raise KeyError(f"{self.name} already has {key!r}")
        self._view._touch(self.name, key)
        value = self._overlay[key] = thaw(record)
        return value

    def delete(self, key: str) -> None:
        if key not in self:
            raise KeyError(key)
        self._view._touch(self.name, key)
        self._overlay[key] = _DELETED


class DBView:
    """One rollout's private database plus its session facts (task context, who is authenticated).

    ``context`` carries task facts the tools may need but the agent does not pass as arguments, e.g. the
    phone a dual-control user holds. ``authenticated`` is set by a domain's authentication tools through
    :meth:`authenticate`; it is session state, not data, so it does not enter the hash.
    """

    def __init__(self, base: Database, context: Mapping[str, Any] | None = None):
        self.base = base
        self.context: dict[str, Any] = dict(context or {})
        self.authenticated: str | None = None
        self._overlay: dict[str, dict[str, Any]] = {}
        self._journal: dict[tuple[str, str], Any] | None = None

    # -- tables -------------------------------------------------------------------------------------
    def __getitem__(self, table: str) -> TableView:
        if table not in self.base.tables:
            raise KeyError(f"no table {table!r}; tables: {', '.join(self.base.tables)}")
        return TableView(self, table)

    def __getattr__(self, table: str) -> TableView:
        if table.startswith("_") or table not in self.base.tables:
            raise AttributeError(table)
        return TableView(self, table)

    def authenticate(self, user_id: str) -> None:
        self.authenticated = user_id

    # -- transactions: a tool that fails half-way leaves no partial write ---------------------------
    def _touch(self, table: str, key: str) -> None:
        if self._journal is not None and (table, key) not in self._journal:
            previous = self._overlay.get(table, {}).get(key)
            self._journal[(table, key)] = copy.deepcopy(previous) if isinstance(previous, dict) else previous

    def begin(self) -> None:
        self._journal = {}

    def commit(self) -> list[tuple[str, str]]:
        """End the transaction; returns the records it touched, in touch order."""
        touched = list(self._journal or {})
        self._journal = None
        return touched

    def rollback(self) -> None:
        for (table, key), previous in (self._journal or {}).items():
            if previous is None:
                self._overlay[table].pop(key, None)
            else:
                self._overlay[table][key] = previous
        self._journal = None

    # -- identity -----------------------------------------------------------------------------------
    def hash(self) -> str:
        """Canonical hash of the whole database: equal iff every table holds equal records.

        The hash is the sum (mod 2**256) of one SHA-256 digest per (table, key, record) entry, so it
        does not depend on any ordering, and a view computes it from the base's cached sum by swapping
        in only the entries it touched: O(edits), not O(database), which matters once per episode.
        """
        total = self.base.digest_sum()
        for table, rows in self._overlay.items():
            base_rows = self.base.tables[table]
            for key, value in rows.items():
                if key in base_rows:
                    total -= self.base.entry_digest(table, key)
                if value is not _DELETED:
                    total += _entry_digest(table, key, value)
        return f"{total % _MOD:064x}"

    def changed_keys(self) -> dict[str, set[str]]:
        """Records this view may differ from its base on (every record it touched)."""
        return {table: set(rows) for table, rows in self._overlay.items() if rows}

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return {table: {key: thaw(self[table][key]) for key in self[table]} for table in self.base.tables}


#: Stands for "no such key" in :func:`changes` and :func:`lookup`.
MISSING: Any = object()


def changes(old: Any, new: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], Any, Any]]:
    """The leaf-level changes from ``old`` to ``new`` as ``(path, old value, new value)``.

    Mappings are compared key by key and equal-length lists item by item; anything else that differs
    (including lists that grew or shrank) is one change. A missing key has the value :data:`MISSING`.
    """
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        for key in sorted(set(old) | set(new), key=str):
            yield from changes(old.get(key, MISSING), new.get(key, MISSING), (*path, key))
    elif isinstance(old, list | tuple) and isinstance(new, list | tuple) and len(old) == len(new):
        for i, (a, b) in enumerate(zip(old, new, strict=True)):
            yield from changes(a, b, (*path, i))
    elif old is MISSING or new is MISSING or record_hash(old) != record_hash(new):
        yield path, old, new


def lookup(value: Any, path: tuple[Any, ...]) -> Any:
    """The value at ``path`` inside ``value``, or :data:`MISSING`."""
    for step in path:
        try:
            value = value[step]
        except (KeyError, IndexError, TypeError):
            return MISSING
    return value


def _path_text(path: tuple[Any, ...]) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path)


def diff(expected: DBView, actual: DBView) -> list[str]:
    """Readable differences, one line per changed field: ``orders["#W1"].status: "pending" -> "cancelled"``.

    When both views share one base only the records either touched are compared, so this is cheap
    enough to run after every episode.
    """
    lines: list[str] = []
    shared = expected.base is actual.base
    for table in sorted(set(expected.base.tables) | set(actual.base.tables)):
        if shared:
            keys = expected.changed_keys().get(table, set()) | actual.changed_keys().get(table, set())
            old = {k: expected[table][k] for k in keys if k in expected[table]}
            new = {k: actual[table][k] for k in keys if k in actual[table]}
        else:
            old = dict(expected[table]) if table in expected.base.tables else {}
            new = dict(actual[table]) if table in actual.base.tables else {}
        for key in sorted(set(old) | set(new)):
            where = f"{table}[{json.dumps(key)}]"
            if key not in new:
                lines.append(f"{where}: missing (expected {to_json(old[key])})")
            elif key not in old:
                lines.append(f"{where}: unexpected record {to_json(new[key])}")
            else:
                for path, a, b in changes(old[key], new[key]):
                    if a is MISSING:
                        lines.append(f"{where}{_path_text(path)}: added {to_json(b)}")
                    elif b is MISSING:
                        lines.append(f"{where}{_path_text(path)}: removed (was {to_json(a)})")
                    else:
                        lines.append(f"{where}{_path_text(path)}: {to_json(a)} -> {to_json(b)}")
    return lines
