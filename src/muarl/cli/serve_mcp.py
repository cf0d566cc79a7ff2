"""``muarl serve-mcp``: a domain as an MCP server (stdio or streamable HTTP), one private database per
session."""

from __future__ import annotations

import argparse

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
                   help="private databases (and HTTP sessions) at once; at the limit new ones are refused")
    p.add_argument("--idle-timeout", type=float, default=600.0, metavar="SECONDS",
                   help="a session unused this long is closed and its database freed (default 600)")
    p.add_argument("--max-sessions-per-client", type=int, metavar="N",
                   help="sessions one client address may hold: handshake sessions, and apart from them issued "
                        "ids (default: an eighth of --max-sessions)")
    p.add_argument("--max-connections", type=int, metavar="N",
                   help="HTTP: open connections at once, a quarter of them per client address (default: 1024, "
                        "or half of ulimit -n when that is less)")
    p.add_argument("--header-timeout", type=float, default=10.0, metavar="SECONDS",
                   help="HTTP: a connection must send a request's head within this long (default 10)")
    p.add_argument("--body-timeout", type=float, default=30.0, metavar="SECONDS",
                   help="HTTP: ... and then its body within this long (default 30)")
    p.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                   help="HTTP: a further name clients reach the server by (Host check against DNS rebinding)")
    options.seed(p, help="serve the domain over a database generated from this seed", default=None)
    p.add_argument("--size", type=int, help="... with this many users")
    p.add_argument("--control-token-file", metavar="FILE",
                   help="the secret a controller presents (_meta muarl/control) for the muarl_* control tools "
                        "(default: $MUARL_MCP_CONTROL_TOKEN; neither: no control tools)")
    p.add_argument("--auth-token-file", metavar="FILE",
                   help="HTTP: every request must send this as 'Authorization: Bearer TOKEN' "
                        "(default: $MUARL_MCP_AUTH_TOKEN); required with a --host beyond loopback")


def run(args: argparse.Namespace) -> int:
    from muarl.domain import get_domain
    from muarl.mcp.exposure import check_exposure
    from muarl.mcp.server import check_http_limits, connection_limits, serve_http, serve_stdio
    from muarl.mcp.sessions import SessionEnvs
    from muarl.mcp.tokens import AUTH_ENV, CONTROL_ENV, read_token

    control = read_token(CONTROL_ENV, args.control_token_file, "--control-token-file")
    auth = read_token(AUTH_ENV, args.auth_token_file, "--auth-token-file")
    SessionEnvs.check_limits(args.max_sessions, args.idle_timeout, args.max_sessions_per_client)  # before the domain
    if args.transport == "http":
        check_exposure(args.host, auth)
        check_http_limits(args.header_timeout, args.body_timeout)
        connection_limits(args.max_connections)
    domain = get_domain(args.domain)  # unknown names fail here with the list of known domains
    if args.size is not None or args.seed is not None:
        domain = domain.with_database(seed=args.seed, size=args.size)
    if args.transport == "stdio":
        serve_stdio(domain, control_token=control, max_sessions=args.max_sessions, idle_timeout=args.idle_timeout)
    else:
        serve_http(domain, host=args.host, port=args.port, max_sessions=args.max_sessions,
                   idle_timeout=args.idle_timeout, control_token=control, auth_token=auth,
                   allowed_hosts=tuple(args.allowed_host), max_sessions_per_client=args.max_sessions_per_client,
                   max_connections=args.max_connections, header_timeout=args.header_timeout,
                   body_timeout=args.body_timeout)
    return 0
