"""MCP domains graded by the server's state (issue 33, items 1 and 2), against a stateful third-party server.

The server is ``mcp-server-sqlite`` from PyPI, run from its own virtualenv (it needs the MCP SDK 1.x,
muarl has 2.x): ``scripts/install_mcp_sqlite.sh``, which ``bash scripts/install.sh --dev`` runs. It
answers a rejected statement with ordinary text (``Database error: ...``), not ``isError``.

- ``muarl gold`` scores a task 1.0 only when the server accepted its gold actions (a gold INSERT that
  breaks a constraint fails the task, and no agent can score on it);
- an agent's equivalent SQL (other column order) scores 1.0, a rejected write 0, nothing at all 0;
- every episode and every gold replay runs on its own copy of the seed database (two episodes insert the
  same primary key; gold replays after the agent's episode), and the seed file is unchanged (SHA-256);
- the state read as files (the database file, canonically: a delete and re-insert leaves other bytes) and
  as a resource;
- without a state reader the command says once that it grades by the call log;
- a state path that every episode's command shares (``--db-path seed.db``) is refused in one line before
  any server starts.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from mcp_helpers import sqlite_server_path
from muarl.domain import get_domain, save_tasks
from muarl.mcp import mcp_domain
from muarl.mcp.client import ServerSpec
from muarl.mcp.state import canonical_file, shared_state_paths
from muarl.policies.base import AgentTurn, Policy, PolicySession
from muarl.rewards import score
from muarl.rollout import run_episode
from muarl.types import Action, Intent, Message, Scenario, Task, ToolCall, Trajectory
from muarl.users.scripted import ScriptedUser

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
pytestmark = pytest.mark.slow  # real server processes


@pytest.fixture(scope="module")
def sqlite_server() -> str:
    return sqlite_server_path()


def _seed(path: Path) -> str:
    """A small library database; returns its SHA-256."""
    with sqlite3.connect(path) as db:
        db.executescript("""
            CREATE TABLE books (id INTEGER PRIMARY KEY, title TEXT NOT NULL, copies INTEGER NOT NULL CHECK (copies >= 0));
            CREATE TABLE loans (id INTEGER PRIMARY KEY, book_id INTEGER NOT NULL, member TEXT NOT NULL);
            INSERT INTO books VALUES (1, 'Dune', 2), (2, 'Emma', 1), (3, 'Ulysses', 0);
        """)
    db.close()
    return _sha(path)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


LEND = "INSERT INTO loans (id, book_id, member) VALUES (1, 2, 'ana')"
LEND_OTHER_ORDER = "INSERT INTO loans (member, id, book_id) VALUES ('ana', 1, 2)"
READD = "INSERT INTO books VALUES (1, 'Dune', 5)"  # id 1 exists: the server answers "Database error: UNIQUE ..."


def _task(task_id: str, sql: str) -> Task:
    ask = "Please lend me Emma."
    return Task(id=task_id, domain="library-sql", split="test", family=task_id, user_id="ana",
                scenario=Scenario(persona="a reader", known={"member": "ana"},
                                  intents=[Intent(description=ask, question=ask, answer="lent")]),
                instruction=ask, gold_actions=[Action(name="write_query", arguments={"query": sql})])


def _config(tmp_path: Path, server: str, db: str = "library.db", **extra: Any) -> Path:
    """A config for the server on a per-episode copy of seed.db (``db`` in the episode folder)."""
    save_tasks([_task("lend", LEND), _task("readd", READD)], tmp_path / "tasks.json")
    data = {"server": f"{server} --db-path {{episode_dir}}/{db}", "name": "library-sql",
            "tasks": "tasks.json", "episode_files": {db: "seed.db"},
            "read_only": ["read_query", "list_tables", "describe_table"],
            "state": [{"tool": "read_query", "arguments": {"query": "SELECT * FROM books ORDER BY id"}},
                      {"tool": "read_query", "arguments": {"query": "SELECT * FROM loans ORDER BY id"}}],
            "error_pattern": "^(Error|Database error): ", **extra}
    data = {k: v for k, v in data.items() if v is not None}
    path = tmp_path / "library.json"
    path.write_text(json.dumps(data))
    return path


def _play(env: Any, task: Task, *queries: str) -> tuple[list[Any], float]:
    records = [env.call("write_query", {"query": q}) for q in queries]
    traj = Trajectory(task_id=task.id, domain=env.domain.name, tool_log=env.log)
    return records, score(env.domain, task, traj, env=env, require_outputs=False).reward


def test_gold_scores_only_where_the_server_accepted_it(tmp_path: Path, sqlite_server: str,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """``muarl gold``: the lending task passes; the task whose gold INSERT the server rejected (in plain text)
    fails, naming the database's error. Before: both scored 1.0 (the rejection was a successful call)."""
    from muarl.cli import main

    seed = _seed(tmp_path / "seed.db")
    config = _config(tmp_path, sqlite_server)
    assert main(["gold", f"mcp:{config}", "--split", "test", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["summary"][0]["tasks"] == 2 and report["summary"][0]["passed"] == 1
    (failure,) = report["failures"]
    assert failure["task"] == "readd" and "UNIQUE constraint failed: books.id" in failure["failed_actions"][0]
    assert _sha(tmp_path / "seed.db") == seed  # every replay ran on a copy


def test_the_reward_compares_the_servers_state(tmp_path: Path, sqlite_server: str) -> None:
    """Equivalent SQL scores 1.0 and a rejected write 0 (before: 0 and, for a rejected gold write, 1.0);
    concurrent episodes and the gold replays each have their own copy; the seed file is unchanged."""
    seed = _seed(tmp_path / "seed.db")
    domain = get_domain(f"mcp:{_config(tmp_path, sqlite_server)}")
    lend, readd = (next(t for t in domain.tasks("test") if t.id == i) for i in ("lend", "readd"))
    same, other_order, rejected, nothing = (domain.env(lend) for _ in range(4))

    records, reward = _play(same, lend, LEND)
    assert records[0].ok and reward == 1.0  # the gold replay inserted loan 1 again: on its own copy
    records, reward = _play(other_order, lend, LEND_OTHER_ORDER)
    assert records[0].ok and reward == 1.0  # loan 1 again, concurrently: its own copy too; another statement
    records, reward = _play(rejected, lend, "INSERT INTO loans (id, book_id) VALUES (1, 2)")
    assert not records[0].ok and "Database error: NOT NULL constraint failed" in records[0].output
    assert reward == 0.0
    assert _play(nothing, lend)[1] == 0.0
    folders = {env.session.episode_dir for env in (same, other_order, rejected, nothing)}
    assert len(folders) == 4 and all(Path(f, "library.db").exists() for f in folders)  # type: ignore[arg-type]

    # a task whose gold the server rejects: nobody scores, neither doing nothing nor doing "the same"
    idle, copycat = domain.env(readd), domain.env(readd)
    assert _play(idle, readd)[1] == 0.0
    records, reward = _play(copycat, readd, READD)
    assert not records[0].ok and reward == 0.0
    for env in (same, other_order, rejected, nothing, idle, copycat):
        env.close()
    assert _sha(tmp_path / "seed.db") == seed


class _SQLPolicy(Policy):
    """Looks the book up, writes ``sql`` once the user has spoken, then says it is done."""

    name = "sql"

    def __init__(self, sql: str):
        self.sql = sql

    def session(self, domain: Any, task: Task, seed: int | None = None) -> PolicySession:
        return _SQLSession(self.sql)


class _SQLSession(PolicySession):
    def __init__(self, sql: str):
        self.sql, self.turn = sql, 0

    async def next(self, new_messages: list[Message]) -> AgentTurn:
        self.turn += 1
        calls = {1: [ToolCall(id="c1", name="read_query", arguments={"query": "SELECT id FROM books WHERE title = 'Emma'"})],
                 2: [ToolCall(id="c2", name="write_query", arguments={"query": self.sql})]}.get(self.turn)
        if calls:
            return AgentTurn(message=Message(role="assistant", tool_calls=calls))
        return AgentTurn(message=Message(role="assistant", content="Done: Emma is lent to you."))


def test_an_episode_with_the_simulated_user_is_graded_by_state(tmp_path: Path, sqlite_server: str) -> None:
    """The rollout loop (as ``muarl eval`` runs it) against the server: equivalent SQL passes, the env's
    server is its own, and the trajectory's tool log records the rejected write as failed."""
    _seed(tmp_path / "seed.db")
    domain = get_domain(f"mcp:{_config(tmp_path, sqlite_server)}")
    lend = next(t for t in domain.tasks("test") if t.id == "lend")
    for sql, want in ((LEND_OTHER_ORDER, 1.0), ("INSERT INTO loan (id) VALUES (1)", 0.0)):
        traj = asyncio.run(run_episode(domain, lend, _SQLPolicy(sql), ScriptedUser(), seed=0))
        assert traj.reward is not None and traj.reward.reward == want, (sql, traj.reward)
        write = next(r for r in traj.tool_log if r.name == "write_query")
        assert write.ok == (want == 1.0) and not traj.tool_fault


def test_state_as_files_hashed_canonically_and_as_a_resource(tmp_path: Path, sqlite_server: str) -> None:
    """``{"files": ["library.db"]}``: the database file by schema and rows, so a delete and re-insert (other
    bytes: the file's change counter) and a table dropped and made again in other spelling still equal gold; ``{"resource": ...}``: the server's memo."""
    seed = _seed(tmp_path / "seed.db")
    config = _config(tmp_path, sqlite_server, state=[{"files": ["library.db"]}, {"resource": "memo://insights"}])
    domain = get_domain(f"mcp:{config}")
    lend = next(t for t in domain.tasks("test") if t.id == "lend")
    roundabout, wrong, noted, rebuilt = (domain.env(lend) for _ in range(4))
    _, reward = _play(roundabout, lend, LEND, "DELETE FROM loans WHERE id = 1", LEND_OTHER_ORDER)
    assert reward == 1.0
    assert rebuilt.call("write_query", {"query": "DROP TABLE loans"}).ok
    assert rebuilt.call("create_table", {"query": 'CREATE TABLE "loans"(\n  id integer primary key,'
                                                  " book_id integer NOT NULL, member text not null)"}).ok
    assert _play(rebuilt, lend, LEND)[1] == 1.0  # the same table in other words: the agent is not failed for it
    folder = Path(roundabout.session.episode_dir)  # type: ignore[arg-type]
    assert _sha(folder / "library.db") != _sha(tmp_path / "seed.db")
    assert _play(wrong, lend, "INSERT INTO loans VALUES (1, 2, 'ben')")[1] == 0.0
    assert noted.call("append_insight", {"insight": "Emma is popular"}).ok
    _, reward = _play(noted, lend, LEND)
    assert reward == 0.0  # the memo is part of the state
    assert any("Emma is popular" in line for line in noted.diff(score_gold(domain, lend)))
    for env in (roundabout, wrong, noted, rebuilt):
        env.close()
    assert _sha(tmp_path / "seed.db") == seed


def score_gold(domain: Any, task: Task) -> Any:
    from muarl.rewards import gold_env

    gold, _ = gold_env(domain, task)
    gold.hash()
    return gold


def test_canonical_sqlite_reads_schema_and_rows_only(tmp_path: Path) -> None:
    a, b = tmp_path / "a.db", tmp_path / "b.db"
    _seed(a)
    _seed(b)
    with sqlite3.connect(b) as db:
        db.execute("INSERT INTO books VALUES (9, 'x', 1)")
    with sqlite3.connect(b) as db:
        db.execute("DELETE FROM books WHERE id = 9")
    assert _sha(a) != _sha(b) and canonical_file(a) == canonical_file(b)
    before = _sha(b)
    with sqlite3.connect(b) as db:
        db.execute("UPDATE books SET copies = 3 WHERE id = 1")
    assert canonical_file(a) != canonical_file(b)
    assert _sha(b) != before


def test_without_a_state_reader_the_command_says_it_grades_by_the_call_log(
        tmp_path: Path, sqlite_server: str, capsys: pytest.CaptureFixture[str]) -> None:
    from muarl.cli import main

    _seed(tmp_path / "seed.db")
    config = _config(tmp_path, sqlite_server, db="plain.db", state=None)  # a server no other test names
    assert main(["gold", f"mcp:{config}", "--split", "test", "--json"]) == 1
    from muarl.mcp.config import load_config

    assert load_config(config).state is None  # built a second time in the same process: not said again
    err = capsys.readouterr().err
    assert err.count("declares no state reader") == 1 and "log of successful write calls" in err


def test_a_state_path_every_episode_shares_is_refused_before_the_run(
        tmp_path: Path, sqlite_server: str, capsys: pytest.CaptureFixture[str]) -> None:
    """``--db-path seed.db`` literally: one line, exit 2, and no server started (it would have created the
    file). Before: accepted, every episode and gold replay wrote into the one file."""
    from muarl.cli import main

    save_tasks([_task("lend", LEND)], tmp_path / "tasks.json")
    shared = tmp_path / "shared.db"
    for server, env in ((f"{sqlite_server} --db-path {shared}", {}),
                        (f"{sqlite_server} --db-path={shared}", {}),
                        (sqlite_server, {"SQLITE_DB_PATH": str(shared)})):
        config = tmp_path / "shared.json"
        config.write_text(json.dumps({"server": server, "tasks": "tasks.json", "env": env}))
        assert main(["eval", "--domain", f"mcp:{config}", "--policy", "noop", "--out", str(tmp_path / "run")]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "would be one state for every episode" in err, err
        assert "{episode_dir}" in err and str(shared) in err
        assert not shared.exists() and not (tmp_path / "run").exists()
    with pytest.raises(ValueError, match="one state for every episode"):
        mcp_domain(f"{sqlite_server} --db-path {shared}", tasks=[_task("lend", LEND)])
    config.write_text(json.dumps({"server": f"{sqlite_server} --db-path {shared}", "tasks": "tasks.json",
                                  "shared_state": True}))
    assert get_domain(f"mcp:{config}").name.startswith("mcp:")  # shared on purpose: accepted


@pytest.mark.parametrize("command,env,found", [
    (["mcp-server-sqlite", "--db-path", "seed.db"], {}, ["--db-path seed.db"]),
    (["srv", "--data-dir=/srv/notes"], {}, ["--data-dir=/srv/notes"]),
    (["srv", "library.sqlite"], {}, ["library.sqlite"]),
    (["srv"], {"NOTES_HOME": "/srv/notes"}, ["NOTES_HOME=/srv/notes"]),
    (["mcp-server-sqlite", "--db-path", "{episode_dir}/seed.db"], {}, []),
    (["srv", "--state-dir", "{episode_dir}"], {"PLAIN_STATE": "{episode_dir}"}, []),
    (["python", "-m", "muarl", "serve-mcp", "retail", "--seed", "3"], {"PYTHONPATH": "/a/b"}, []),
    (["mcp-server-time", "--local-timezone", "America/New_York"], {}, []),
    (["python", "server.py", "--verbose"], {}, []),
    (["mcp-server-filesystem", "./notes"], {}, ["./notes"]),
    (["mcp-server-sqlite", "--db-path", "{episode_dir}/../x.db"], {}, ["--db-path {episode_dir}/../x.db"]),
    (["srv", "{episode_dir}/a/../../x.db"], {"NOTES_HOME": "{episode_dir}/a/../.."},
     ["{episode_dir}/a/../../x.db", "NOTES_HOME={episode_dir}/a/../.."]),
    (["srv", "--state-dir", "{episode_dir}/a/.."], {}, []),  # climbs back to the episode folder: still its own
    (["python", "-m", "muarl", "serve-mcp", "retail"], {}, []),  # a folder named retail is here too
])
def test_shared_state_paths_by_spelling(command: list[str], env: dict[str, str], found: list[str],
                                        tmp_path: Path) -> None:
    (tmp_path / "notes").mkdir()
    (tmp_path / "retail").mkdir()
    assert shared_state_paths(command, env, tmp_path) == found


def test_two_unknown_states_never_match(tmp_path: Path, sqlite_server: str) -> None:
    """A server that cannot start fails the agent's episode and the gold replay alike: both states are
    "unavailable", and they must not count as equal (before: the same text, so db_match and reward 1.0)."""
    import dataclasses

    from muarl.mcp import ServerSpec

    _seed(tmp_path / "seed.db")
    domain = get_domain(f"mcp:{_config(tmp_path, sqlite_server)}")
    dead = dataclasses.replace(domain, server=ServerSpec(command=(str(tmp_path / "no-such-server"),)))
    lend = next(t for t in dead.tasks("test") if t.id == "lend")
    env = dead.env(lend)
    records, reward = _play(env, lend, LEND)
    assert records[0].error == "tool_fault" and env.hash().startswith("unavailable: could not start")
    assert reward == 0.0


def test_canonical_sqlite_reads_the_schema_by_meaning_not_spelling(tmp_path: Path) -> None:
    """The same tables, keys and index written with other spacing, case and quoting read the same (an agent
    that recreates a table in its own words is not failed for it); another column type, key, default or
    index uniqueness does not."""
    def make(path: Path, ddl: list[str]) -> Path:
        with sqlite3.connect(path) as db:
            for statement in ddl:
                db.execute(statement)
            db.execute("INSERT INTO loans VALUES (1, 7, 'open')")
        return path

    plain = ["CREATE TABLE loans (id INTEGER PRIMARY KEY, book INTEGER NOT NULL REFERENCES books(id), "
             "state TEXT DEFAULT 'open')", "CREATE UNIQUE INDEX by_book ON loans (book)"]
    spelled = ['create   table "loans"(\n  id integer primary key,\n  book integer not null references books (id),'
               "\n  state text default 'open'\n)", 'create unique index "by_book" on loans(book)']
    a, b = make(tmp_path / "a.db", plain), make(tmp_path / "b.db", spelled)
    assert canonical_file(a) == canonical_file(b)
    for n, changed in enumerate((plain[0].replace("state TEXT", "state INTEGER"), plain[0].replace("NOT NULL ", ""),
                                 plain[0].replace("'open')", "'closed')"))):
        other = make(tmp_path / f"c{n}.db", [changed, plain[1]])
        assert canonical_file(other) != canonical_file(a), changed
    assert canonical_file(make(tmp_path / "d.db", [plain[0], "CREATE INDEX by_book ON loans (book)"])) != \
        canonical_file(a)


@pytest.mark.parametrize("spelling", ["sh -c 'exec {server} --db-path {shared}'", "{server} --d {shared}",
                                      "{server} --db-path {{episode_dir}}/../shared.db"])
def test_a_state_every_session_shares_is_caught_by_behaviour(tmp_path: Path, sqlite_server: str, spelling: str,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Spellings that put every episode and the gold replay on one database: a shell, an abbreviated option
    and ``{episode_dir}/../`` (the folder every episode folder is made in). The path check refuses all three
    (the first two since issue 60); ``shared_state`` lets them through here, standing in for a spelling no
    check sees. The grader reads the episode's state before and after the gold replay: the replay changed
    it, so a do-nothing agent's episode is a tool fault naming the shared state, never a reward of 1.0.
    Before, it scored 1.0 (the state read after gold wrote), or 0 without a fault for ``../`` (the file was
    not seeded there)."""
    from muarl.factory import make_policy

    episodes = tmp_path / "episodes"  # where the episode folders are made, so that ../shared.db is ours
    episodes.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(episodes))
    shared = (episodes if "episode_dir" in spelling else tmp_path) / "shared.db"
    _seed(shared)
    seed_sha = _seed(tmp_path / "seed.db")
    config = _config(tmp_path, sqlite_server)
    data = json.loads(config.read_text())
    data["server"] = spelling.format(server=sqlite_server, shared=shared)
    config.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="one state for every episode"):
        get_domain(f"mcp:{config}")
    config.write_text(json.dumps({**data, "shared_state": True}))
    domain = get_domain(f"mcp:{config}")
    task = next(t for t in domain.tasks("test") if t.id == "lend")
    idle = asyncio.run(run_episode(domain, task, make_policy("noop"), ScriptedUser(), seed=0))
    assert idle.reward is not None and idle.reward.reward == 0.0 and not idle.reward.db_match
    assert idle.fault_kind == "tool" and "shares one state" in idle.metadata["fault"]["message"], idle.metadata
    assert _sha(tmp_path / "seed.db") == seed_sha


@pytest.mark.parametrize("server", ["stdio, a fixed folder", "http, process-global"])
def test_a_server_whose_state_no_argument_names_is_caught_by_behaviour(tmp_path: Path, server: str) -> None:
    """Servers that keep their state where their own code says, so no spelling can see it: a stdio server
    writing ``./plain-state`` in the folder it starts in, and a URL server with one notes list in its
    process for every session. Every episode and the gold replay share it. A do-nothing agent's episode is a
    tool fault, not 1.0; so is the next one, whose server starts on the note the first gold replay left."""
    from mcp_helpers import free_port, stop, wait_listening
    from muarl.factory import make_policy

    ask = "Please note that I need milk."
    task = Task(id="note", domain="notes", split="test", family="note", user_id="u",
                scenario=Scenario(persona="a shopper", intents=[Intent(description=ask, question=ask, answer="ok")]),
                instruction=ask, gold_actions=[Action(name="note_add", arguments={"text": "milk"})])
    proc = None
    if server.startswith("stdio"):
        spec: ServerSpec | str = ServerSpec(command=(sys.executable, str(HERE / "mcp_plain_server.py")),
                                            cwd=str(tmp_path))
    else:
        port, log = free_port(), tmp_path / "server.log"
        with log.open("w") as err:
            proc = subprocess.Popen([sys.executable, str(HERE / "mcp_global_http_server.py"), str(port)],
                                    stderr=err, text=True)
        wait_listening(proc, "127.0.0.1", port, log.read_text)
        spec = f"http://127.0.0.1:{port}/mcp"
    try:
        domain = mcp_domain(spec, name="notes", tasks=[task], read_only=["note_list"], state=[{"tool": "note_list"}])
        for _ in range(2):
            idle = asyncio.run(run_episode(domain, task, make_policy("noop"), ScriptedUser(), seed=0))
            assert idle.reward is not None and idle.reward.reward == 0.0, idle.reward
            assert idle.fault_kind == "tool" and "shares one state" in idle.metadata["fault"]["message"], \
                idle.metadata
    finally:
        if proc is not None:
            stop(proc)
