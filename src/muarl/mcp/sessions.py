"""The private databases of ``muarl serve-mcp``'s sessions: who may open one, how long it lives, what it keeps.

A session is a connection (``http:<Mcp-Session-Id>``, ``stdio``) or an id this server issued on request,
bound to the connection it was issued to. Every client shares one server, so the table is bounded in
ways that no client can turn against another:

- **Count.** At most ``max_sessions`` databases at once. At the limit a new one is refused
  (:class:`SessionRefused`, with the reason); no live session is ever evicted to make room, because an
  eviction silently wipes that session's database: anyone able to open sessions could reset another
  client's episode.
- **Time.** An issued id unused for ``idle_timeout`` seconds is dropped (its id is then unknown). A
  connection's own database lives as long as its connection, which the SDK closes after the same idle
  time (the server gives it the same ``max_sessions`` and ``idle_timeout``).
- **Per client address.** Issued ids are bounded per client address: at most ``per_client`` (default
  :func:`per_client_limit`, ``--max-sessions-per-client``) per address, whether issued on a connection or
  to a client without one, so one stranger asking for ``new`` ids can neither fill the table nor lock
  other clients out (the HTTP sessions of the handshake are bounded per address in the same way, by
  :class:`muarl.mcp.server.ClientSessions`). A client without a connection (an MCP 2026 client, one
  exchange per request) gets ids bound to the address it came from (another address gets "unknown
  session id"), and such clients hold at most half the table in all, except that an address holding
  none still gets its first (so a flood from a few addresses locks no newcomer out). At its bound a
  client's own least recently used id that has been idle :func:`own_idle` seconds makes room; otherwise
  the newcomer is refused, and no other client's session is ever dropped. An id is a bearer secret
  within its address: whoever holds it and reaches the server from there can use it.
- **Disconnect.** When a connection ends (DELETE, the SDK's idle expiry, the client gone), its database
  and the ids issued to it are freed at once (:meth:`SessionEnvs.watch` hooks the connection's
  teardown), so the count frees up and the memory with it.
- **Call log.** The server never reads a session's call log back, yet :meth:`Env.call` logs every call
  with its arguments (up to the 4 MiB of a request). Each session keeps only its last :data:`LOG_KEEP`
  calls, the oldest dropped, their arguments and outputs cut to :data:`LOG_CHARS` characters; the number
  of calls made is counted apart (``muarl_state`` reports both).
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from muarl.domain import Domain
from muarl.env import Env

SESSION_META = "muarl/session"
#: the ``_meta["muarl/session"]`` value that asks the server to issue a new session id
NEW_SESSION = "new"
#: the owner of ids issued to requests that belong to no connection (session-less clients), with their address
NO_CONNECTION = "no-connection"
#: defaults of ``muarl serve-mcp --max-sessions`` and ``--idle-timeout`` (seconds)
MAX_SESSIONS = 4096
IDLE_TIMEOUT = 600.0
#: each session's call log: the newest calls kept, and the characters kept of each one's arguments and output
LOG_KEEP = 32
LOG_CHARS = 1024


def per_client_limit(max_sessions: int) -> int:
    """The default of ``--max-sessions-per-client``: the issued ids, and apart from them the HTTP sessions,
    one client address may hold: an eighth of the table (at least 1)."""
    return max(1, max_sessions // 8)


def sessionless_limit(max_sessions: int) -> int:
    """Ids all session-less clients may hold together: half the table (at least 1), so that clients that
    connect always find room."""
    return max(1, max_sessions // 2)


def own_idle(idle_timeout: float) -> float:
    """How long a session-less client's own id must have been unused before its bound drops it for a new
    one: a tenth of the idle timeout, at most a minute."""
    return min(60.0, idle_timeout / 10)


def sessionless_owner(client: str | None) -> str:
    """The owner of an id issued without a connection: the client's address (``?`` when unknown)."""
    return f"{NO_CONNECTION}:{client or '?'}"


class SessionRefused(Exception):
    """A request names a session it may not use, or one cannot be opened; the message is what the client is told."""


@dataclass
class Session:
    env: Env
    owner: str | None  # the connection an issued id belongs to; None for a connection's own database
    address: str | None = None  # the client address an issued id was issued to (None: stdio, unbounded)
    used: float = field(default_factory=time.monotonic)
    calls: int = 0


def _cut(text: str) -> str:
    return text if len(text) <= LOG_CHARS else text[:LOG_CHARS] + f"... [{len(text) - LOG_CHARS} characters cut]"


def trim_log(env: Env) -> None:
    """Bound an env's call log: the last :data:`LOG_KEEP` records, each record's arguments and output cut to
    :data:`LOG_CHARS` characters. Only the newest record can be long (the older ones were cut when they were
    the newest); tracebacks were logged by :meth:`Env.call` already and are not kept."""
    del env.log[:-LOG_KEEP]
    env.tracebacks.clear()
    if env.log:
        record = env.log[-1]
        arguments = json.dumps(record.arguments, ensure_ascii=False, default=repr)
        if len(arguments) > LOG_CHARS:
            record.arguments = {"_truncated": _cut(arguments)}
        record.output = _cut(record.output)


class SessionEnvs:
    """The private env of each session, bounded by count, idle time and log size (see the module)."""

    def __init__(self, domain: Domain, max_sessions: int = MAX_SESSIONS, idle_timeout: float = IDLE_TIMEOUT,
                 per_client: int | None = None):
        self.check_limits(max_sessions, idle_timeout, per_client)
        self.domain, self.max_sessions, self.idle_timeout = domain, max_sessions, idle_timeout
        self.per_client = per_client if per_client is not None else per_client_limit(max_sessions)
        self._sessions: dict[str, Session] = {}
        self._controllers: set[str] = set()  # connections that have presented the control token
        self._watched: set[str] = set()  # connections whose teardown frees their sessions

    @staticmethod
    def check_limits(max_sessions: int, idle_timeout: float, per_client: int | None = None) -> None:
        """A ValueError, in one line, for limits that would serve no one (checked before a server starts)."""
        if max_sessions < 1:
            raise ValueError(f"--max-sessions {max_sessions}: give at least 1, or the server refuses every session")
        if per_client is not None and per_client < 1:
            raise ValueError(f"--max-sessions-per-client {per_client}: give at least 1, or the server refuses "
                             "every session")
        if not (0 < idle_timeout < float("inf")):
            raise ValueError(f"--idle-timeout {idle_timeout:g}: give a positive, finite number of seconds")

    # -- the table ----------------------------------------------------------------------------------------
    def _expired(self, session: Session, now: float) -> bool:
        """Issued ids expire when idle; a connection's own database ends with its connection."""
        return session.owner is not None and now - session.used > self.idle_timeout

    def _live(self, key: str) -> Session | None:
        session = self._sessions.get(key)
        if session is not None and self._expired(session, time.monotonic()):
            del self._sessions[key]
            return None
        return session

    def _open(self, key: str, owner: str | None, env: Env | None = None, address: str | None = None) -> Session:
        """A new session, or SessionRefused at the limit (after dropping the expired ones)."""
        now = time.monotonic()
        for old in [k for k, s in self._sessions.items() if self._expired(s, now)]:
            del self._sessions[old]
        if owner is not None and address is not None:
            self._make_room(owner, address, now)
        if len(self._sessions) >= self.max_sessions:
            raise SessionRefused(
                f"Error: this server already keeps {self.max_sessions} session{'s' * (self.max_sessions != 1)} "
                f"(--max-sessions), so it opens no more: a session is freed when its client ends it (HTTP DELETE) "
                f"or after {self.idle_timeout:g} s unused")
        session = self._sessions[key] = Session(env if env is not None else self.domain.env(), owner, address)
        return session

    def _make_room(self, owner: str, address: str, now: float) -> None:
        """Below the per-address bound (and, without a connection, the session-less one), or room made by
        dropping the address's own least recently used id idle for :func:`own_idle` seconds; else
        SessionRefused (no other address's session is touched)."""
        sessionless = owner.startswith(NO_CONNECTION)
        mine = sorted((s.used, k) for k, s in self._sessions.items() if s.owner is not None and s.address == address)
        everyone = sum(1 for s in self._sessions.values() if s.owner is not None and s.owner.startswith(NO_CONNECTION))
        per_client, total = self.per_client, sessionless_limit(self.max_sessions)
        if len(mine) < per_client and (not sessionless or everyone < total or not mine):
            return  # beyond the session-less half, an address that holds no id still gets its first
        if mine and now - mine[0][0] >= own_idle(self.idle_timeout):
            del self._sessions[mine[0][1]]  # the address's own oldest idle id: its own, never another's
            return
        which = (f"this address already holds {per_client}" if len(mine) >= per_client else
                 f"clients without a connection already hold {total}")
        bounds = (f"a client without a connection may hold at most {per_client}, all of them {total}"
                  if sessionless else f"a client address may hold at most {per_client}, --max-sessions-per-client")
        ending = "or connect with the initialize handshake" if sessionless else "or end a connection you no longer use"
        raise SessionRefused(f"Error: {which} session ids ({bounds}, of --max-sessions {self.max_sessions}), so no "
                             f"new one is issued: an id unused for {own_idle(self.idle_timeout):g} s makes room "
                             f"for its own client's next, {ending}")

    def get(self, key: str) -> Env:
        """The session's env (a connection's is opened on its first use); marks the session used."""
        session = self._live(key) or self._open(key, None)
        session.used = time.monotonic()
        return session.env

    def reset(self, key: str, context: dict[str, Any]) -> Env:
        """Start the session over on a fresh database with ``context`` (a ValueError if the domain rejects it)."""
        try:
            env = self.domain.env(**context)
        except Exception as err:  # noqa: BLE001 - whatever a domain's env makes of a bad context, the caller's fault
            raise ValueError(f"Error: muarl_reset: this context does not fit domain {self.domain.name} "
                             f"({type(err).__name__}: {err})") from None
        session = self._live(key)
        if session is None:
            session = self._open(key, None, env)
        session.env, session.used, session.calls = env, time.monotonic(), 0
        return env

    def called(self, key: str) -> None:
        """After a call in the session: count it and bound the log it left."""
        session = self._sessions.get(key)
        if session is not None:
            session.calls += 1
            trim_log(session.env)

    def calls(self, key: str) -> int:
        session = self._sessions.get(key)
        return session.calls if session is not None else 0

    def __len__(self) -> int:
        return len(self._sessions)

    # -- issued ids and connections -------------------------------------------------------------------------
    def issue(self, connection: str, address: str | None = None) -> str:
        """A new unguessable session id, bound to ``connection``, with a fresh database; counted against
        ``address``'s bound (None: unbounded, as for stdio's one client)."""
        key = secrets.token_urlsafe(24)
        self._open(key, connection, address=address)
        return key

    def resolve(self, connection: str | None, asked: str | None, client: str | None = None) -> tuple[str, str | None]:
        """(the env key of a request, the id to echo in the result's ``_meta`` or None). ``client``: the
        address of a request without a connection, which the ids issued to it are bound to."""
        if asked is None:
            if connection is None:
                raise SessionRefused(
                    "Error: this server keeps one database per MCP session, and this request has none: "
                    f"connect with the initialize handshake, or send _meta {{'{SESSION_META}': '{NEW_SESSION}'}} "
                    "to be issued a session id, then send that id with every request")
            return connection, None
        owner = connection or sessionless_owner(client)
        if asked == NEW_SESSION:
            issued = self.issue(owner, client if connection is not None else client or "?")
            return issued, issued
        session = self._live(asked) if isinstance(asked, str) else None
        if session is None or session.owner is None or session.owner != owner:
            raise SessionRefused(f"Error: unknown session id: ids are issued by this server (send "
                                 f"'{NEW_SESSION}') and are valid only on the connection (or, without one, from "
                                 "the address) that received them")
        return asked, asked

    def controller(self, connection: str | None, presented: bool) -> bool:
        """Whether a request may use the control tools: it presents the token, or its connection did before
        (so the SDK client's own re-listing of tools, which carries no ``_meta``, sees them too)."""
        if presented and connection is not None:
            self._controllers.add(connection)
        return presented or connection in self._controllers

    def watch(self, connection: str | None, sdk_connection: Any) -> None:
        """Free ``connection``'s sessions when it ends: ``sdk_connection`` is the SDK's object for it, whose
        ``exit_stack`` the SDK unwinds on DELETE, idle expiry and shutdown. Once per connection."""
        stack = getattr(sdk_connection, "exit_stack", None)
        if connection is None or connection in self._watched or stack is None:
            return
        self._watched.add(connection)
        stack.callback(self.drop_connection, connection)

    def drop_connection(self, connection: str) -> None:
        """Forget a connection: its own database, the ids issued to it, and its controller mark."""
        for key in [k for k, s in self._sessions.items() if k == connection or s.owner == connection]:
            del self._sessions[key]
        self._controllers.discard(connection)
        self._watched.discard(connection)
