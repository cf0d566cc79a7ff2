"""``muarl serve-mcp``: a domain as an MCP server (stdio or streamable HTTP), one private database per
session."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from muarl.cli import options

NAME = "serve-mcp"
HELP = "serve a domain as an MCP server (stdio or streamable HTTP), one private database per session"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("domain", help="a domain name (retail, airline, telecom) or module:attribute")
    p.add_argument("--transport", choices=["stdio", "http"], default="stdio",
                   help="stdio (default: one client, the process that started the server) or streamable HTTP")
    p.add_argument("--host", default="127.0.0.1",
                   help="HTTP: interface to listen on; beyond loopback a bearer token is required")
    p.add_argument("--port", type=int, default=8000, help="HTTP: port; the endpoint is http://HOST:PORT/mcp")
    p.add_argument("--max-sessions", type=int, default=4096,
                   help="HTTP: private databases kept at once (least recently used ones go first)")
    options.seed(p, help="serve the domain over a database generated from this seed", default=None)
    p.add_argument("--size", type=int, help="... with this many users")
    p.add_argument("--control-token-file", metavar="FILE",
                   help="the secret a controller presents (_meta muarl/control) for the muarl_* control tools "
                        "(default: $MUARL_MCP_CONTROL_TOKEN; neither: no control tools)")
    p.add_argument("--auth-token-file", metavar="FILE",
                   help="HTTP: every request must send this as 'Authorization: Bearer TOKEN' "
                        "(default: $MUARL_MCP_AUTH_TOKEN); required with a --host beyond loopback")


def _token(env_var: str, path: str | None, option: str) -> str | None:
    """A secret from a file (``option``) or the environment; never from the command line, where ``ps`` shows it."""
    if path is None:
        return os.environ.get(env_var) or None
    try:
        token = Path(path).read_text().strip()
    except OSError as err:
        raise ValueError(f"{option} {path}: cannot read it ({err.strerror})") from None
    if not token:
        raise ValueError(f"{option} {path}: the file is empty")
    return token


def run(args: argparse.Namespace) -> int:
    from muarl.domain import get_domain
    from muarl.mcp.client import AUTH_ENV, CONTROL_ENV
    from muarl.mcp.server import check_exposure, serve_http, serve_stdio

    control = _token(CONTROL_ENV, args.control_token_file, "--control-token-file")
    auth = _token(AUTH_ENV, args.auth_token_file, "--auth-token-file")
    if args.transport == "http":
        check_exposure(args.host, auth)  # before the domain loads
    domain = get_domain(args.domain)  # unknown names fail here with the list of known domains
    if args.size is not None or args.seed is not None:
        domain = domain.with_database(seed=args.seed, size=args.size)
    if args.transport == "stdio":
        serve_stdio(domain, control_token=control)
    else:
        serve_http(domain, host=args.host, port=args.port, max_sessions=args.max_sessions, control_token=control,
                   auth_token=auth)
    return 0
