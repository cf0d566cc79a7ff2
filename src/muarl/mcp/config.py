"""``--domain mcp:FILE.json``: an MCP server described in a small JSON file, so the command line can give
it what a bare ``mcp:COMMAND`` cannot (tasks, read-only tools, timeouts, a per-episode state folder).

Every key but ``server`` is optional::

    {
      "server": "python notes_server.py --state-dir {episode_dir}",   # a command line or an http(s) URL
      "name": "notes",                     # the domain's name in results (default: mcp:<server>)
      "base": "retail",                    # a muarl domain the server serves: its tasks and grading
      "tasks": "notes_tasks.json",         # a muarl tasks file (needed without a base)
      "read_only": ["list_notes"],         # tools that only read (unannotated tools count as writes)
      "call_timeout": 10,                  # seconds per tool call (default 30)
      "connect_timeout": 30,               # seconds for the server to start (default 60)
      "env": {"NOTES_HOME": "{episode_dir}"},   # extra environment of a command (values may use {episode_dir})
      "cwd": "{episode_dir}",              # working folder of a command
      "policy": "Help the user with their notes.",
      "episode_files": {"notes.db": "seed.db"},   # copied into every episode folder before the server starts
      "state": {"tool": "dump", "arguments": {}},  # how the state is read (muarl.mcp.state): rewards compare it
      "error_pattern": "^(Error|Database error):",  # a successful answer matching this is a failed call
      "shared_state": false                # true: a state path outside {episode_dir} is shared on purpose
    }

Relative paths (``tasks``, ``cwd``, the sources of ``episode_files``) are taken from the file's folder.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from muarl.mcp.client import EPISODE_DIR, ServerSpec, ServerUnavailable
from muarl.mcp.state import StateReader

KEYS = ("server", "name", "base", "tasks", "read_only", "call_timeout", "connect_timeout", "env", "cwd", "policy",
        "episode_files", "state", "error_pattern", "shared_state")


def _fail(path: Path, message: str) -> ValueError:
    return ValueError(f"--domain mcp:{path}: {message}")


def _seconds(path: Path, data: dict[str, Any], key: str) -> float | None:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise _fail(path, f'"{key}" must be a positive number of seconds, got {value!r}')
    return float(value)


def _spec(path: Path, data: dict[str, Any]) -> ServerSpec:
    server = data.get("server")
    if not isinstance(server, str) or not server.strip():
        raise _fail(path, '"server" (a command line or an http(s):// URL) is required')
    spec = ServerSpec.parse(server)
    env, cwd = data.get("env") or {}, data.get("cwd")
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise _fail(path, '"env" must be an object of strings')
    if cwd is not None and not isinstance(cwd, str):
        raise _fail(path, '"cwd" must be a folder path')
    if spec.url and (env or cwd):
        raise _fail(path, '"env" and "cwd" apply to a command the client starts, not to a URL')
    if cwd and EPISODE_DIR not in cwd:
        cwd = str(path.parent / cwd)
    files = data.get("episode_files") or {}
    if not isinstance(files, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in files.items()):
        raise _fail(path, '"episode_files" must be an object: {"name in the episode folder": "source path"}')
    if spec.url and files:
        raise _fail(path, '"episode_files" are copied into the episode folder of a command, not of a URL')
    sources = {name: path.parent / source for name, source in files.items()}
    for name, source in sources.items():
        if not source.exists():
            raise _fail(path, f'"episode_files": {name}: no such file {source}')
    if not spec.command:
        return spec
    try:
        return dataclasses.replace(spec, env=env, cwd=cwd, files={k: str(v) for k, v in sources.items()})
    except ValueError as err:
        raise _fail(path, f'"episode_files": {err}') from None


def load_config(path: Path) -> Any:
    """The :class:`~muarl.mcp.domain.MCPDomain` a config file describes; every problem names the file and key."""
    from muarl.mcp.domain import mcp_domain

    try:
        data = json.loads(path.read_text())
    except OSError as err:
        raise _fail(path, f"cannot read the config file ({err.strerror})") from None
    except ValueError as err:
        raise _fail(path, f"not valid JSON ({err})") from None
    if not isinstance(data, dict):
        raise _fail(path, "the config must be a JSON object")
    unknown = sorted(set(data) - set(KEYS))
    if unknown:
        raise _fail(path, f"unknown key(s) {', '.join(unknown)}; known: {', '.join(KEYS)}")
    read_only = data.get("read_only") or []
    if not isinstance(read_only, list) or not all(isinstance(n, str) for n in read_only):
        raise _fail(path, '"read_only" must be a list of tool names')
    tasks = data.get("tasks")
    if tasks is not None and not isinstance(tasks, str):
        raise _fail(path, '"tasks" must be the path of a muarl tasks file')
    if tasks is None and not data.get("base"):
        raise _fail(path, 'no "tasks" and no "base": an MCP domain needs tasks to play')
    task_file = path.parent / tasks if tasks else None
    if task_file is not None and not task_file.is_file():
        raise _fail(path, f'"tasks": no such file {task_file}')
    timeouts = {k: v for k in ("call_timeout", "connect_timeout") if (v := _seconds(path, data, k)) is not None}
    pattern = data.get("error_pattern")
    if pattern is not None and not isinstance(pattern, str):
        raise _fail(path, '"error_pattern" must be a regular expression (a string)')
    shared = data.get("shared_state", False)
    if not isinstance(shared, bool):
        raise _fail(path, '"shared_state" must be true or false')
    try:
        state = StateReader.parse(data["state"]) if data.get("state") is not None else None
    except ValueError as err:
        raise _fail(path, str(err)) from None
    spec = _spec(path, data)
    try:
        return mcp_domain(spec, base=data.get("base") or None, name=data.get("name"), tasks=task_file,
                          read_only=read_only, policy=data.get("policy"), state=state, error_pattern=pattern,
                          shared_state=shared, **timeouts)
    except ServerUnavailable:
        raise
    except ValueError as err:
        raise _fail(path, str(err)) from None
