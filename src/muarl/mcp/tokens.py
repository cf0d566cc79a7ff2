"""The secrets of ``muarl serve-mcp``: where a server reads them, and which server a client sends them to.

A server reads its control and bearer tokens from a file or the environment, never from the command line
(``ps`` shows it to every user of the machine). A token shorter than :data:`MIN_TOKEN_CHARS` is refused
(a one-character token is guessed in a few requests), and so is a token file that group or others may
write (anyone who can write it chooses the server's secret).

A client takes its tokens from ``$MUARL_MCP_CONTROL_TOKEN`` / ``$MUARL_MCP_AUTH_TOKEN`` only for the one
server they belong to: the URL in ``$MUARL_MCP_URL``. Any other URL (``muarl mcp-tools URL``,
``mcp:NAME@URL``, a config file's ``"server"``) gets neither token, and the command says so once: a
third-party server must never receive the bearer that opens muarl's server, nor the control token that
grades it. URLs are the same when scheme, host, port (the scheme's default when left out) and path are;
the host is compared as written (``localhost`` is not ``127.0.0.1``).
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path
from urllib.parse import urlsplit

#: Environment variables: the control token of ``muarl serve-mcp``, the bearer token of its HTTP endpoint,
#: and the URL of the one server a client sends those two to.
CONTROL_ENV = "MUARL_MCP_CONTROL_TOKEN"
AUTH_ENV = "MUARL_MCP_AUTH_TOKEN"
URL_ENV = "MUARL_MCP_URL"
#: the shortest token a server accepts (``openssl rand -hex 32`` gives 64 characters)
MIN_TOKEN_CHARS = 32

_told: set[str] = set()  # URLs already told that the environment's tokens were not sent to them


def check_token(token: str, source: str) -> str:
    """``token`` if it is long enough to be a secret; else a ValueError naming where it came from."""
    if len(token) < MIN_TOKEN_CHARS:
        raise ValueError(f"{source}: the token has {len(token)} characters, fewer than {MIN_TOKEN_CHARS}: a short "
                         "token is guessed; make one with 'openssl rand -hex 32'")
    return token


def read_token(env_var: str, path: str | None, option: str) -> str | None:
    """A server's secret from the file ``path`` (given as ``option``) or else ``env_var``; None if neither."""
    if path is None:
        token = os.environ.get(env_var) or None
        return check_token(token, f"${env_var}") if token else None
    try:
        mode = Path(path).stat().st_mode
        token = Path(path).read_text().strip()
    except OSError as err:
        raise ValueError(f"{option} {path}: cannot read it ({err.strerror})") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):  # as ssh refuses a private key others can read
        raise ValueError(f"{option} {path}: group or others may read or write this file (mode "
                         f"{stat.S_IMODE(mode):04o}), so they could learn or choose the server's token; make it "
                         f"private with 'chmod 600 {path}'")
    if not token:
        raise ValueError(f"{option} {path}: the file is empty")
    return check_token(token, f"{option} {path}")


def same_server(url: str, other: str) -> bool:
    """Whether two URLs name the same endpoint (scheme, host, port and path; a trailing slash aside)."""
    a, b = urlsplit(url.strip()), urlsplit(other.strip())
    try:
        ports = [u.port or {"http": 80, "https": 443}.get(u.scheme.lower()) for u in (a, b)]
    except ValueError:  # a port that is no number names no server
        return False
    return (a.scheme.lower(), a.hostname, ports[0], a.path.rstrip("/")) == \
        (b.scheme.lower(), b.hostname, ports[1], b.path.rstrip("/"))


def tokens_for(url: str) -> tuple[str | None, str | None]:
    """(control token, bearer token) from the environment for ``url``: both when ``url`` is ``$MUARL_MCP_URL``,
    else neither (said once per URL on stderr when the environment has tokens that were held back)."""
    control, auth = os.environ.get(CONTROL_ENV) or None, os.environ.get(AUTH_ENV) or None
    if not (control or auth):
        return None, None
    bound = os.environ.get(URL_ENV) or ""
    if bound and same_server(url, bound):
        return control, auth
    if url not in _told:
        _told.add(url)
        held = " and ".join(f"${n}" for n, v in ((CONTROL_ENV, control), (AUTH_ENV, auth)) if v)
        print(f"muarl: not sending {held} to {url}: they go only to the server in ${URL_ENV} "
              f"({bound or 'not set'})", file=sys.stderr, flush=True)
    return None, None
