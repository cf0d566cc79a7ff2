"""How a domain made from an MCP server reads the server's state, so that rewards compare states.

A third-party server keeps its world to itself: muarl sees only what its tools answer. Without help the
reward can compare only the log of successful write calls with gold's (two INSERTs of the same row in
another column order differ; a write the server rejected in plain text counts as done). A
:class:`StateReader` says how to read the state instead, as one or more probes whose results together
are the state:

- ``{"tool": "read_query", "arguments": {"query": "SELECT * FROM loans ORDER BY id"}}``: a read tool's
  result (a dump query, a listing); the tool must be a read, so that reading changes nothing;
- ``{"resource": "memo://insights"}``: an MCP resource's text;
- ``{"files": ["library.db", "notes/*.json"]}``: files in the episode folder (stdio servers), hashed
  canonically: an SQLite database by its schema and rows (opened read-only; page layout, free pages and
  the change counter do not count), a ``.json`` file by its parsed value, anything else by its bytes.

The state hash is a SHA-256 over the probes' results in order. :func:`shared_state_paths` finds a state
path that every episode's server command would share (``--db-path seed.db`` rather than
``--db-path {episode_dir}/seed.db``).
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import posixpath
import re
import shlex
import sqlite3
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from muarl.mcp.client import EPISODE_DIR

#: The first bytes of every SQLite 3 database file.
SQLITE_MAGIC = b"SQLite format 3\x00"


@dataclass(frozen=True)
class StateProbe:
    """One part of the state: a read tool's result, a resource's text, or files in the episode folder."""

    tool: str | None = None
    arguments: Mapping[str, Any] = field(default_factory=dict)
    resource: str | None = None
    files: tuple[str, ...] = ()

    def describe(self) -> str:
        if self.tool is not None:
            return f"{self.tool}({json.dumps(dict(self.arguments), sort_keys=True)})"
        if self.resource is not None:
            return f"resource {self.resource}"
        return f"files {', '.join(self.files)}"


@dataclass(frozen=True)
class StateReader:
    """The probes whose results, in order, are a server's state (see the module's docstring)."""

    probes: tuple[StateProbe, ...]

    @classmethod
    def parse(cls, value: Any, where: str = "state") -> StateReader:
        """From a config's ``"state"``: one probe object or a list of them; every problem is one line."""
        if isinstance(value, StateReader):
            return value
        items = value if isinstance(value, list) else [value]
        if not items:
            raise ValueError(f'"{where}" is an empty list: give at least one probe')
        return cls(tuple(_probe(item, f"{where}[{i}]" if isinstance(value, list) else where)
                         for i, item in enumerate(items)))

    @property
    def tools(self) -> list[str]:
        return [p.tool for p in self.probes if p.tool is not None]

    @property
    def needs_files(self) -> bool:
        return any(p.files for p in self.probes)

    def describe(self) -> str:
        return "; ".join(p.describe() for p in self.probes)


def _probe(item: Any, where: str) -> StateProbe:
    kinds = ("tool", "resource", "files")
    if not isinstance(item, Mapping) or sum(k in item for k in kinds) != 1:
        raise ValueError(f'"{where}" must be an object with exactly one of "tool", "resource" or "files"')
    unknown = sorted(set(item) - {*kinds, "arguments"})
    if unknown or ("arguments" in item and "tool" not in item):
        raise ValueError(f'"{where}": unknown key(s) {", ".join(unknown or ["arguments"])} '
                         '(a probe is {"tool": NAME, "arguments": {...}}, {"resource": URI} or {"files": [PATTERN, ...]})')
    if "tool" in item:
        if not isinstance(item["tool"], str) or not item["tool"]:
            raise ValueError(f'"{where}": "tool" must be a tool name')
        arguments = item.get("arguments", {})
        if not isinstance(arguments, Mapping):
            raise ValueError(f'"{where}": "arguments" must be an object')
        return StateProbe(tool=item["tool"], arguments=dict(arguments))
    if "resource" in item:
        if not isinstance(item["resource"], str) or not item["resource"]:
            raise ValueError(f'"{where}": "resource" must be a resource URI')
        return StateProbe(resource=item["resource"])
    files = item["files"]
    files = [files] if isinstance(files, str) else files
    if not isinstance(files, list) or not files or not all(isinstance(f, str) and f for f in files):
        raise ValueError(f'"{where}": "files" must be a list of file names or patterns in the episode folder')
    for pattern in files:
        parts = PurePosixPath(pattern).parts
        if PurePosixPath(pattern).is_absolute() or ".." in parts:
            raise ValueError(f'"{where}": "files" are inside the episode folder: {pattern!r} is not')
    return StateProbe(files=tuple(files))


# -- files, hashed canonically -------------------------------------------------------------------------------
def canonical_files(folder: str | Path, patterns: Iterable[str]) -> str:
    """The files of ``folder`` that match ``patterns`` (relative, ``*`` and ``**`` allowed), each in its
    canonical form, as one JSON text: equal texts for equal contents, whatever the bytes' layout."""
    root = Path(folder)
    everything = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
    out = []
    for pattern in patterns:
        names = [n for n in everything if fnmatch.fnmatchcase(n, pattern)]
        out.append([pattern, [[n, canonical_file(root / n)] for n in names]])
    return json.dumps(out, ensure_ascii=False)


def canonical_file(path: Path) -> Any:
    """An SQLite database as its schema and sorted rows, JSON by value, anything else as its SHA-256."""
    with path.open("rb") as fh:
        head = fh.read(len(SQLITE_MAGIC))
    if head == SQLITE_MAGIC:
        return _sqlite_dump(path)
    data = path.read_bytes()
    if path.suffix.lower() == ".json":
        try:
            return {"json": json.loads(data)}
        except ValueError:
            pass
    return {"sha256": hashlib.sha256(data).hexdigest()}


def _sqlite_dump(path: Path) -> dict[str, Any]:
    """Schema and rows of an SQLite file, read-only (``mode=ro``: the file is never written)."""
    uri = f"file:{path.as_posix()}?mode=ro"
    conn = sqlite3.connect(uri, uri=True)
    try:
        objects = sorted(conn.execute("SELECT type, name, tbl_name, COALESCE(sql, '') FROM sqlite_master"))
        tables = {}
        for kind, name, _, _ in objects:
            if kind == "table":
                rows = [json.dumps([_cell(v) for v in row]) for row in conn.execute(f"SELECT * FROM {_quoted(name)}")]
                tables[name] = sorted(rows)
        return {"sqlite": {"schema": [_schema_entry(conn, *o) for o in objects], "rows": tables}}
    finally:
        conn.close()


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _spaced(sql: Any) -> Any:
    """SQL text with its spacing made canonical (what a statement means does not depend on it)."""
    return " ".join(str(sql).split()) if sql is not None else None


def _schema_entry(conn: Any, kind: str, name: str, table: str, sql: str) -> list[Any]:
    """One schema object by what it means, not by how its statement was spelled: a table's columns (name,
    declared type, not-null, default, primary-key position) and foreign keys; an index's table, uniqueness and
    columns; a view's or trigger's statement with canonical spacing. Two databases whose CREATE statements
    differ only in spacing, case of types or quoting read the same."""
    if kind == "table":
        columns = [[col_name, str(col_type).upper(), bool(notnull), _spaced(default), pk]
                   for _, col_name, col_type, notnull, default, pk in conn.execute(f"PRAGMA table_info({_quoted(name)})")]
        keys = sorted([list(row[2:]) for row in conn.execute(f"PRAGMA foreign_key_list({_quoted(name)})")],
                      key=json.dumps)
        return [kind, name, {"columns": columns, "foreign_keys": keys}]
    if kind == "index":
        unique = next((bool(row[2]) for row in conn.execute(f"PRAGMA index_list({_quoted(table)})") if row[1] == name),
                      False)
        columns = [row[2] for row in conn.execute(f"PRAGMA index_info({_quoted(name)})")]
        return [kind, name, {"table": table, "unique": unique, "columns": columns}]
    return [kind, name, table, _spaced(sql)]


def _cell(value: Any) -> Any:
    return {"blob": value.hex()} if isinstance(value, bytes) else value


def state_digest(parts: Iterable[tuple[str, str]]) -> str:
    """The state hash of the probes' (description, text) results."""
    return "state:" + hashlib.sha256(json.dumps(list(parts), ensure_ascii=False).encode()).hexdigest()


# -- a state path every episode would share -------------------------------------------------------------------
#: option and variable names that say "where my state lives"
_STATE_NAME = re.compile(r"db|database|data|state|store|storage|path|dir|folder|file|home|root|memory|save", re.I)
#: names whose last word says "a path": their value is one even as a bare word (``--db-path library``)
_PATH_NAME = re.compile(r"(?:^|[-_])(?:path|dir|directory|folder|file|filename|db|database|sqlite|home|root"
                        r"|location)$", re.I)
#: variables that name where code is found, not state
_SEARCH_PATHS = {"PATH", "PYTHONPATH", "PYTHONHOME", "LD_LIBRARY_PATH", "LD_PRELOAD", "NODE_PATH", "CLASSPATH",
                 "VIRTUAL_ENV", "PYTHONPYCACHEPREFIX", "GEM_PATH", "PERL5LIB"}
#: file suffixes of state a server keeps
_STATE_SUFFIX = (".db", ".sqlite", ".sqlite3", ".duckdb", ".sqlitedb", ".jsonl")
#: where one value may hold several paths (``a.db:b.db``, ``x=y``, ``a,b``); each part is read as well
_SEPARATORS = re.compile(r"[\s,;:=|]+")
_LIST_SEPARATORS = re.compile(r"[,;:=|]+")
#: a scheme that names a place elsewhere than a file (``postgres://``, ``http://``): not a path
_NETWORK = re.compile(r"^[a-z][a-z0-9+.-]*://", re.I)
#: ``{episode_dir}`` in a value while it is read as a path (no real path holds a NUL)
_EPISODE = "/\0episode"


def _inside(path: str) -> bool:
    return path == _EPISODE or path.startswith(_EPISODE + "/")


def _resolved(part: str, cwd: str) -> str:
    """``part`` (``{episode_dir}`` already replaced) as an absolute, normalised path; ``~`` is outside."""
    if part.startswith("~"):
        return "/~" + part[1:]
    return posixpath.normpath(part if part.startswith("/") else f"{cwd}/{part}")


def _pathish(part: str) -> bool:
    return ("/" in part or part in (".", "..") or part.startswith("~") or part.lower().endswith(_STATE_SUFFIX))


def _outside(value: str, cwd: str, bare_is_path: bool = False) -> bool:
    """Whether ``value`` names a place outside ``{episode_dir}``. The whole value is read as one path from its
    first ``{episode_dir}`` on, with nothing cut at a separator before ``..`` is read
    (``{episode_dir}/a,/../../x.db`` is the folder every episode folder sits in), and so is every path-like
    part between separators (``/srv/x.db,{episode_dir}/y.db`` names ``/srv/x.db``). A relative part is read
    from ``cwd`` (``{episode_dir}`` itself when the server starts there), whether or not it exists yet.
    ``bare_is_path``: a value that is one bare word (``library``) is a path too (the option's name says so)."""
    if _NETWORK.match(value) and not re.match(r"(file|sqlite3?):", value, re.I):
        return False
    text = value.replace(EPISODE_DIR, _EPISODE)
    head, tail = (text[:text.index(_EPISODE)], text[text.index(_EPISODE):]) if _EPISODE in text else (text, "")
    if tail and not _inside(posixpath.normpath(tail)):
        return True
    # after {episode_dir} a blank is part of the name ("{episode_dir}/my notes.db"), a list separator is not
    parts = [p for p in [*_SEPARATORS.split(head), *_LIST_SEPARATORS.split(tail)] if p]
    # slashes alone before {episode_dir} are how a URL spells an absolute path (sqlite:///{episode_dir}/x.db)
    paths = [p for p in parts if (_pathish(p) or _EPISODE in p) and (p.strip("/") or not tail)]
    if not paths and bare_is_path and len(parts) == 1 and re.fullmatch(r"[\w.\-]+", parts[0]):
        paths = parts
    return any(not _inside(_resolved(p, cwd)) for p in paths)


def _words(value: str) -> list[str]:
    """A value with blanks in it as the shell would split it (``sh -c 'exec srv --db-path x.db'``)."""
    try:
        return shlex.split(value)
    except ValueError:
        return value.split()


def _scan(args: list[str], cwd: str, real: Path, found: list[str], depth: int = 0) -> None:
    """Add to ``found`` the arguments of ``args`` (a command's, without the program) that name state outside
    ``{episode_dir}``; a value with blanks (a shell's ``-c`` script) is scanned as a command line too."""
    i = 0
    while i < len(args):
        arg = args[i]
        if arg.startswith("-") and len(arg) > 1:
            name, eq, value = arg.partition("=")
            if not eq and i + 1 < len(args) and not args[i + 1].startswith("-"):
                value, i = args[i + 1], i + 1
                arg = f"{name} {value}"
            path_named = bool(_PATH_NAME.search(name.lstrip("-")))
            if value and not path_named and depth < 3 and len(_words(value)) > 1:
                _scan(_words(value), cwd, real, found, depth + 1)  # a command line (a shell's -c script)
            elif value and ((_STATE_NAME.search(name) and _outside(value, cwd, bare_is_path=path_named))
                            or (value.lower().endswith(_STATE_SUFFIX) and _outside(value, cwd))):
                found.append(arg)
        elif depth < 3 and len(_words(arg)) > 1:
            _scan(_words(arg), cwd, real, found, depth + 1)
        elif _outside(arg, cwd) and (arg.lower().endswith(_STATE_SUFFIX) or _EPISODE in arg.replace(EPISODE_DIR, _EPISODE)
                                     or _positional_place(arg, real)):
            found.append(arg)
        i += 1


def _positional_place(arg: str, cwd: Path) -> bool:
    """A bare argument that is a place: an existing folder spelled as a path (``./notes``, not ``notes``: a bare
    word may be a name, such as a domain's), or one spelled explicitly (``./notes``, ``/srv/notes``, ``~/n``)
    that does not exist yet (the server will make it). An existing file (a script) is code, not state."""
    spelled = "/" in arg or arg in (".", "..") or arg.startswith("~")
    if not spelled:
        return False
    where = Path(os.path.expanduser(arg)) if arg.startswith("~") else cwd / arg
    explicit = arg in (".", "..") or arg.startswith(("./", "../", "/", "~"))
    return where.is_dir() or (explicit and not where.exists())


def shared_state_paths(command: Iterable[str], env: Mapping[str, str], cwd: str | Path | None = None) -> list[str]:
    """Where a stdio server's command or environment names a state path outside ``{episode_dir}``: every
    episode's server (and every gold replay's) would open the same file. ``["--db-path seed.db"]``, say.

    A heuristic, by spelling: an option or variable whose name says state (``--db-path``, ``--data-dir``,
    ``NOTES_HOME``) with a path for its value (for a name ending in a path word, such as ``--db-path``, a bare
    word too: ``--db-path library`` is a file in the working folder), any option or variable whose value is a
    database file (``--d x.db``), a bare argument that is a database file or a place spelled as a path
    (``./notes``; a bare word such as ``retail`` is a name), and the same inside a shell's command string
    (``sh -c 'exec srv --db-path x.db'``). Every value is read whole and part by part (:func:`_outside`); a
    relative path counts whether or not it exists yet, read from the server's working folder (inside the
    episode folder when ``cwd`` is in ``{episode_dir}``). Anything inside ``{episode_dir}`` is per episode
    and never counts (``{episode_dir}/../x`` and ``{episode_dir}/a,/../../x`` are not inside).
    """
    real = Path(cwd) if cwd and EPISODE_DIR not in str(cwd) else Path.cwd()
    base = (str(cwd).replace(EPISODE_DIR, _EPISODE) if cwd and EPISODE_DIR in str(cwd)
            else str(real.absolute()))
    base = posixpath.normpath(base if base.startswith("/") else f"{Path.cwd().absolute()}/{base}")
    found: list[str] = []
    _scan(list(command)[1:], base, real, found)
    for key, value in env.items():
        if key.upper() in _SEARCH_PATHS:
            continue
        if ((_STATE_NAME.search(key) and _outside(value, base, bare_is_path=bool(_PATH_NAME.search(key))))
                or (value.lower().endswith(_STATE_SUFFIX) and _outside(value, base))):
            found.append(f"{key}={value}")
        elif len(_words(value)) > 1:
            inner: list[str] = []
            _scan(_words(value), base, real, inner, 1)
            found += [f"{key}: {hit}" for hit in inner]
    return found
