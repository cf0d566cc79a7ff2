"""Who can reach ``muarl serve-mcp --transport http``: the loopback rule, the bearer token, the Host check.

- **Loopback** is ``127.0.0.1``, ``::1`` and ``localhost``, spelled so, and nothing else. Every other
  host needs a bearer token, ``127.0.0.2`` and ``0:0:0:0:0:0:0:1`` included: a rule by spelling cannot be
  argued with, while "is it a loopback address" has answers that differ between the checker and the
  machine (other 127/8 addresses, IPv4-mapped forms, names that resolve elsewhere).
- **The Host/Origin check against DNS rebinding is on for every host.** A web page the server's user
  visits can make their browser send requests to a name that the page's DNS later points at the
  server's address; the Host header still carries that name, so only the names the server is reached by
  are let through: the loopback names, ``--host`` itself (the machine's names and addresses for a
  wildcard host such as ``0.0.0.0``), and each ``--allowed-host``. The SDK turns this check on only for
  the three loopback spellings and leaves every other host without it.
"""

from __future__ import annotations

import contextlib
import hmac
import ipaddress
import socket
from typing import Any

from muarl.mcp.tokens import AUTH_ENV

LOOPBACK = ("127.0.0.1", "::1", "localhost")
WILDCARD = ("0.0.0.0", "::", "")


def _bare(host: str) -> str:
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def is_loopback(host: str) -> bool:
    return _bare(host) in LOOPBACK


def check_exposure(host: str, auth_token: str | None) -> None:
    """Refuse to listen beyond loopback without a bearer token: anyone who reaches the port could use it."""
    if not auth_token and not is_loopback(host):
        raise ValueError(f"--host {host} is not loopback (127.0.0.1, ::1, localhost), so serve-mcp requires a "
                         f"bearer token: set {AUTH_ENV} or give --auth-token-file FILE (clients send "
                         "'Authorization: Bearer TOKEN')")


def _machine_names() -> set[str]:
    """The names and addresses a wildcard host is reached by, as far as this machine knows them."""
    names = {socket.gethostname(), socket.getfqdn()}
    for name in list(names):
        with contextlib.suppress(OSError):  # a name this machine cannot resolve adds no address
            names |= {str(info[4][0]) for info in socket.getaddrinfo(name, None)}
    return names


def _in_header(name: str) -> str:
    """A host as the Host header writes it (an IPv6 address in brackets)."""
    try:
        return f"[{name}]" if ipaddress.ip_address(name).version == 6 else name
    except ValueError:
        return name.lower()


def allowed_names(host: str, extra: tuple[str, ...] = ()) -> list[str]:
    """The Host header names a server on ``host`` answers (ports aside)."""
    names = set(LOOPBACK) | {_bare(h) for h in extra}
    names |= _machine_names() if _bare(host) in WILDCARD else {_bare(host)}
    return sorted({_in_header(n) for n in names if n})


def transport_security(host: str, extra: tuple[str, ...] = ()) -> Any:
    """The SDK's Host/Origin check, on, for the names of :func:`allowed_names`."""
    from mcp.server.transport_security import TransportSecuritySettings

    names = allowed_names(host, extra)
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=[h for n in names for h in (n, f"{n}:*")],
        allowed_origins=[o for n in names for s in ("http", "https") for o in (f"{s}://{n}", f"{s}://{n}:*")])


def require_bearer(app: Any, token: str) -> Any:
    """Wrap an ASGI app so that every HTTP request must carry ``Authorization: Bearer TOKEN``."""
    from starlette.responses import JSONResponse

    expected = f"Bearer {token}".encode()

    async def guarded(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            given = dict(scope.get("headers") or []).get(b"authorization", b"")
            if not hmac.compare_digest(given, expected):
                refusal = JSONResponse({"error": "unauthorized: send the server's token as 'Authorization: Bearer TOKEN'"},
                                       status_code=401, headers={"WWW-Authenticate": "Bearer"})
                await refusal(scope, receive, send)
                return
        await app(scope, receive, send)

    return guarded
