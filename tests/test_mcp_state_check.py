"""The state check of MCP domains graded by the server's state, and the spelling check (issue 60, items 1-3).

Real servers: ``mcp-server-sqlite`` from its own virtualenv (``scripts/install_mcp_sqlite.sh``) on one database
file for every session, and ``tests/mcp_session_store_server.py`` over HTTP, a purpose-built server that
stands in for a misbehaving one (no real server is known to reset its store every N sessions, serve each
session a snapshot, or make its store on first write on purpose; each is a way sessions can fail to have a
private state each). ``"shared_state": true`` lets the shared database file through the spelling check here:
it stands in for a spelling no check sees (a wrapper script, a server's own default), which the grader must
catch by behaviour. In every case a do-nothing agent (``noop``) never scores 1.0: each episode is a ``tool``
fault or a 0, so pass^1 is not 1.0 whether the faulted trials are left out or counted as failures.

- ``test_noop_never_scores_on_a_shared_database``: create-table gold with and without ``IF NOT EXISTS``,
  appending gold and idempotent gold on one shared SQLite file, three episodes each (appending: three rows,
  one gold replay an episode, no lagging copy on the server);
- ``test_noop_never_scores_on_a_misbehaving_session_store``: a store that resets every 3 sessions (the number
  a scored episode opened before: the episode's, the gold replay's and its lagging copy's), one served as a
  snapshot per session, one created lazily by the first write;
- ``test_a_correct_agent_on_a_snapshot_store_is_a_fault_not_a_zero``: the snapshot store's sessions do not see
  each other's writes though they share them; a correct agent's episode is a fault, and the gold actions are
  not replayed into the store;
- ``test_a_task_whose_gold_changes_nothing_is_refused``: the one case a private server cannot be told from a
  shared one by its readings (a gold that sets what is already there): ``muarl gold`` fails it, saying why;
- ``test_grading_never_writes_a_file_a_server_was_pointed_at``: the spellings the check used to miss are
  refused in one line before any server starts; the file's SHA-256 is unchanged;
- ``test_the_spelling_check_reads_the_whole_value``: the rules on the new spellings.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mcp_helpers import sqlite_server_path
from muarl.domain import get_domain, save_tasks
from muarl.evaluate import summarize
from muarl.mcp import mcp_domain
from muarl.mcp.state import shared_state_paths
from muarl.policies.base import AgentTurn, Policy, PolicySession
from muarl.rollout import run_episode
from muarl.types import Action, Intent, Message, Scenario, Task, ToolCall, Trajectory
from muarl.users.scripted import ScriptedUser

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
pytestmark = pytest.mark.slow  # real server processes

LOANS = "CREATE TABLE loans (id INTEGER PRIMARY KEY, book_id INTEGER NOT NULL, member TEXT NOT NULL)"
#: gold (one write each) and whether the seed already has the loans table
GOLDS = {
    "create table if not exists": ("create_table", LOANS.replace("TABLE", "TABLE IF NOT EXISTS"), False),
    "create table": ("create_table", LOANS, False),
    "append": ("write_query", "INSERT INTO loans (book_id, member) VALUES (2, 'ana')", True),
    "idempotent": ("write_query", "INSERT OR REPLACE INTO loans VALUES (1, 2, 'ana')", True),
}


@pytest.fixture(scope="module")
def sqlite_server() -> str:
    return sqlite_server_path()


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _seed(path: Path, loans: bool = True) -> str:
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE books (id INTEGER PRIMARY KEY, title TEXT NOT NULL, copies INTEGER NOT NULL)")
        db.execute("INSERT INTO books VALUES (1, 'Dune', 2), (2, 'Emma', 1)")
        if loans:
            db.execute(LOANS)
    db.close()
    return _sha(path)


def _task(task_id: str, tool: str, arguments: dict[str, Any]) -> Task:
    ask = "Please do what I need."
    return Task(id=task_id, domain="t", split="test", family=task_id, user_id="ana",
                scenario=Scenario(persona="a reader", intents=[Intent(description=ask, question=ask, answer="ok")]),
                instruction=ask, gold_actions=[Action(name=tool, arguments=arguments)])


def _noop() -> Policy:
    from muarl.factory import make_policy

    return make_policy("noop")


class _Calls(Policy):
    """Makes ``calls`` (tool, arguments) in its first turn, then says it is done: a correct agent."""

    name = "calls"

    def __init__(self, *calls: tuple[str, dict[str, Any]]):
        self.calls = calls

    def session(self, domain: Any, task: Task, seed: int | None = None) -> PolicySession:
        return _CallsSession(self.calls)


class _CallsSession(PolicySession):
    def __init__(self, calls: tuple[tuple[str, dict[str, Any]], ...]):
        self.calls, self.turn = calls, 0

    async def next(self, new_messages: list[Message]) -> AgentTurn:
        self.turn += 1
        if self.turn == 1:
            return AgentTurn(message=Message(role="assistant", tool_calls=[
                ToolCall(id=f"c{i}", name=n, arguments=a) for i, (n, a) in enumerate(self.calls)]))
        return AgentTurn(message=Message(role="assistant", content="Done."))


def _episodes(domain: Any, task: Task, policy: Policy, n: int) -> list[Trajectory]:
    return [asyncio.run(run_episode(domain, task, policy, ScriptedUser(), seed=i)) for i in range(n)]


def _never_one(trajs: list[Trajectory]) -> list[str]:
    """Assert that no episode scored 1.0 and that pass^1 is not 1.0 either way faults are counted; returns
    each episode's outcome (its fault's message, or "0")."""
    for t in trajs:
        assert t.reward is not None and t.reward.reward == 0.0, (t.reward, t.metadata.get("fault"))
        assert t.fault_kind in (None, "tool"), t.fault_kind
    for rule in ("exclude", "fail"):
        metrics, _, _ = summarize([trajs], {}, 1, sim_faults=rule)
        assert metrics["pass^1"] in (None, 0.0), (rule, metrics["pass^1"])
    return [t.metadata["fault"]["message"] if t.fault_kind else "0" for t in trajs]


@pytest.mark.parametrize("case", list(GOLDS))
def test_noop_never_scores_on_a_shared_database(case: str, tmp_path: Path, sqlite_server: str) -> None:
    """One SQLite file for every session; the gold writes it, the state probe reads the loans table. Before:
    create-table gold scored the do-nothing agent 1.0 (the probe failed before the replay, so the check
    returned early, and the replay made the table), and idempotent gold did from its second episode on
    (nothing left to move); appending gold wrote two rows an episode (the replay and its lagging copy)."""
    tool, sql, has_loans = GOLDS[case]
    shared = tmp_path / "shared.db"
    _seed(shared, loans=has_loans)
    task = _task(case.replace(" ", "-"), tool, {"query": sql})
    save_tasks([task], tmp_path / "tasks.json")
    config = tmp_path / "shared.json"
    config.write_text(json.dumps({
        "server": f"{sqlite_server} --db-path {shared}", "tasks": "tasks.json", "shared_state": True,
        "read_only": ["read_query", "list_tables", "describe_table"],
        "state": [{"tool": "read_query", "arguments": {"query": "SELECT * FROM loans ORDER BY id"}}],
        "error_pattern": "^(Error|Database error): "}))
    domain = get_domain(f"mcp:{config}")
    outcomes = _never_one(_episodes(domain, domain.tasks("test")[0], _noop(), 3))
    assert "shares one state" in outcomes[0], outcomes  # the replay moved the episode's state
    if case == "create table":  # the table exists from the second episode on: gold is refused, no one scores
        assert outcomes[1:] == ["0", "0"], outcomes
    elif case in ("create table if not exists", "idempotent"):  # gold's writes are in the store already
        assert all("changed nothing in a fresh session" in o for o in outcomes[1:]), outcomes
    else:
        assert all("shares one state" in o for o in outcomes), outcomes
        with sqlite3.connect(shared) as db:  # one gold replay per scored episode, none by a lagging copy
            assert db.execute("SELECT COUNT(*) FROM loans").fetchone()[0] == 3
        db.close()


@pytest.fixture
def store_server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """``tests/mcp_session_store_server.py`` in the mode the test asks for (``indirect``); yields the mode and
    the server's URL."""
    from mcp_helpers import free_port, stop, wait_listening

    port, log = free_port(), tmp_path / "server.log"
    with log.open("w") as err:
        proc = subprocess.Popen([sys.executable, str(HERE / "mcp_session_store_server.py"), str(port),
                                 *request.param.split()], stderr=err, text=True)
    try:
        wait_listening(proc, "127.0.0.1", port, log.read_text)
        yield request.param, f"http://127.0.0.1:{port}/mcp"
    finally:
        stop(proc)


NOTE = _task("note", "note_add", {"text": "milk"})


def _notes(url: str) -> Any:
    return mcp_domain(url, name="notes", tasks=[NOTE], read_only=["note_list"], state=[{"tool": "note_list"}])


@pytest.mark.parametrize("store_server", ["reset 3", "reset 2", "snapshot", "lazy"], indirect=True)
def test_noop_never_scores_on_a_misbehaving_session_store(store_server: tuple[str, str]) -> None:
    """An appending gold (a note) on a store whose sessions are not private. Before: ``reset 3`` scored the
    do-nothing agent 1.0 from its second episode on (the lagging gold copy's session emptied the store and
    wrote one note, which the episode's session then read as gold's), and ``lazy`` did so at once (the
    probe failed before the replay: no check)."""
    mode, url = store_server
    outcomes = _never_one(_episodes(_notes(url), NOTE, _noop(), 4))
    if mode == "snapshot":  # each session reads its snapshot: the episode never sees gold's note
        assert outcomes == ["0"] * 4, outcomes
    else:
        assert all(o != "0" for o in outcomes), outcomes


@pytest.mark.parametrize("store_server", ["snapshot"], indirect=True)
def test_a_correct_agent_on_a_snapshot_store_is_a_fault_not_a_zero(store_server: tuple[str, str]) -> None:
    """The agent adds the note. The gold replay's session starts from a snapshot with the agent's note in
    it (the store is shared) while the episode's session never sees another session's writes: a fault, and
    the gold note is not written. Before: no fault, the reward silently 0 (gold's reading had two notes)."""
    _, url = store_server
    (traj,) = _episodes(_notes(url), NOTE, _Calls(("note_add", {"text": "milk"})), 1)
    assert traj.reward is not None and traj.reward.reward == 0.0
    assert traj.fault_kind == "tool", traj.metadata
    assert "a fresh session" in traj.metadata["fault"]["message"], traj.metadata["fault"]
    assert "the gold actions were not replayed" in traj.metadata["fault"]["message"]
    from muarl.mcp.client import RemoteSession, ServerSpec

    probe = RemoteSession(ServerSpec(url=url))
    try:
        assert probe.call("note_list", {}).text == "milk\n"  # the agent's note only: gold wrote nothing
    finally:
        probe.close()


def test_a_task_whose_gold_changes_nothing_is_refused(tmp_path: Path, sqlite_server: str,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """The case no reading can tell from a shared store: on a server of its own per episode, a gold that
    sets what is already there. ``muarl gold`` fails the task and says why, and a do-nothing agent's episode
    is a tool fault, not 1.0. Before: the gold passed and the do-nothing agent scored 1.0."""
    from muarl.cli import main

    _seed(tmp_path / "seed.db")
    save_tasks([_task("same", "write_query", {"query": "UPDATE books SET copies = 2 WHERE id = 1"})],
               tmp_path / "tasks.json")
    config = tmp_path / "same.json"
    config.write_text(json.dumps({
        "server": f"{sqlite_server} --db-path {{episode_dir}}/library.db", "tasks": "tasks.json",
        "episode_files": {"library.db": "seed.db"}, "read_only": ["read_query", "list_tables", "describe_table"],
        "state": [{"tool": "read_query", "arguments": {"query": "SELECT * FROM books ORDER BY id"}}],
        "error_pattern": "^(Error|Database error): "}))
    assert main(["gold", f"mcp:{config}", "--split", "test", "--json"]) == 1
    (failure,) = json.loads(capsys.readouterr().out)["failures"]
    assert "changed nothing in a fresh session" in json.dumps(failure), failure
    domain = get_domain(f"mcp:{config}")
    (idle,) = _episodes(domain, domain.tasks("test")[0], _noop(), 1)
    assert idle.reward is not None and idle.reward.reward == 0.0 and idle.fault_kind == "tool", idle.reward


SPELLINGS = {  # the shared file's name, the server's arguments, other config keys
    "a comma before ..": ("x.db", "--db-path {{episode_dir}}/a,/../../x.db", {"episode_files": {"a,/keep": "seed"}}),
    "relative, not made yet": ("library", "--db-path library", {"cwd": "."}),
    "inside sh -c": ("x.db", None, {}),
    "abbreviated option": ("x.db", "--d {shared}", {}),
}


@pytest.mark.parametrize("spelling", list(SPELLINGS))
def test_grading_never_writes_a_file_a_server_was_pointed_at(spelling: str, tmp_path: Path, sqlite_server: str,
                                                             monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """Spellings that name one database for every episode and that the check used to let through. ``muarl
    eval`` with the do-nothing agent: exit 2 and one line before any server starts (so before any gold
    replay), and the file is as it was (SHA-256; the relative one never made). Before: accepted, and every
    scored episode replayed gold into the file (twice: the replay and its lagging copy)."""
    from muarl.cli import main

    episodes = tmp_path / "episodes"  # where episode folders are made, so that {episode_dir}/a,/../.. is here
    episodes.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(episodes))
    name, args, extra = SPELLINGS[spelling]
    shared = (episodes if "episode_dir" in (args or "") else tmp_path) / name
    (tmp_path / "seed").write_text("")
    server = (f"sh -c 'exec {sqlite_server} --db-path {shared}'" if args is None
              else f"{sqlite_server} {args.format(shared=shared)}")
    before = _seed(shared) if name.endswith(".db") else None
    save_tasks([_task("lend", "write_query", {"query": "INSERT INTO loans VALUES (1, 2, 'ana')"})],
               tmp_path / "tasks.json")
    config = tmp_path / "shared.json"
    config.write_text(json.dumps({
        "server": server, "tasks": "tasks.json", "read_only": ["read_query", "list_tables", "describe_table"],
        "state": [{"tool": "read_query", "arguments": {"query": "SELECT * FROM loans ORDER BY id"}}],
        "error_pattern": "^(Error|Database error): ", **extra}))
    monkeypatch.chdir(tmp_path)
    code = main(["eval", "--domain", f"mcp:{config}", "--policy", "noop", "--k", "2", "--out", str(tmp_path / "run")])
    if before is None:
        assert not shared.exists()
    else:
        assert _sha(shared) == before, "grading wrote the file"
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "would be one state for every episode" in err, err
    assert not (tmp_path / "run").exists() and not list(episodes.glob("muarl-mcp-*"))  # no server started


@pytest.mark.parametrize("command,env,cwd,found", [
    (["srv", "--db-path", "{episode_dir}/a,/../../x.db"], {}, None, ["--db-path {episode_dir}/a,/../../x.db"]),
    (["srv", "--db-path", "{episode_dir}/a;/../../x.db"], {}, None, ["--db-path {episode_dir}/a;/../../x.db"]),
    (["srv", "--db-path", "{episode_dir}/a /../../x.db"], {}, None, ["--db-path {episode_dir}/a /../../x.db"]),
    (["srv", "--db-path={episode_dir}/a:/../../x"], {}, None, ["--db-path={episode_dir}/a:/../../x"]),
    (["srv", "--db-path", "/srv/x.db,{episode_dir}/y.db"], {}, None, ["--db-path /srv/x.db,{episode_dir}/y.db"]),
    (["srv", "--db-path", "library"], {}, None, ["--db-path library"]),  # no such file yet: made in the cwd
    (["srv", "--db-path=library"], {"DB_PATH": "notes"}, None, ["--db-path=library", "DB_PATH=notes"]),
    (["sh", "-c", "exec srv --db-path /srv/x.db"], {}, None, ["--db-path /srv/x.db"]),
    (["srv", "--d", "/srv/x.db"], {"TARGET": "/srv/y.sqlite"}, None, ["--d /srv/x.db", "TARGET=/srv/y.sqlite"]),
    (["srv", "./not-yet"], {}, None, ["./not-yet"]),
    (["srv", "--db-path", "library.db"], {}, "{episode_dir}", []),  # started in its episode folder: its own
    (["srv", "--db-path", "../library.db"], {}, "{episode_dir}", ["--db-path ../library.db"]),
    (["srv", "--db-path", "{episode_dir}/my notes.db"], {}, None, []),
    (["srv", "--db-path", "{episode_dir}/x.db:ro"], {}, None, []),
    (["sh", "-c", "exec srv --db-path {episode_dir}/x.db"], {}, None, []),
    (["srv", "--db-path", "sqlite:///{episode_dir}/x.db"], {}, None, []),
    (["python", "./server.py", "--log-level", "info", "--storage", "memory"], {}, None, []),
    (["npx", "-y", "@modelcontextprotocol/server-filesystem", "{episode_dir}"], {}, None, []),
])
def test_the_spelling_check_reads_the_whole_value(command: list[str], env: dict[str, str], cwd: str | None,
                                                  found: list[str], tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Every path-like part of a value normalised, nothing cut at a separator before ``..`` is read; a relative
    path outside ``{episode_dir}`` counts whether or not it exists yet. Before: the first five and the
    relative, shell, abbreviated and variable spellings passed unflagged."""
    (tmp_path / "server.py").write_text("")
    monkeypatch.chdir(tmp_path)
    assert shared_state_paths(command, env, cwd) == found
