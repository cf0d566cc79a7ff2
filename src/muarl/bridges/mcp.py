"""``get_domain("mcp:...")``: a domain whose agent tools are an MCP server's (see :mod:`muarl.mcp.domain`).

- ``mcp:retail``: start ``muarl serve-mcp retail`` over stdio for each episode; tasks and grading from retail.
- ``mcp:retail@http://127.0.0.1:8000/mcp``: a running muarl server over streamable HTTP.
- ``mcp:FILE.json``: any MCP server, with the tasks, read-only tools and timeouts of a config file
  (:mod:`muarl.mcp.config`); a bare ``mcp:URL`` or ``mcp:COMMAND LINE`` has no tasks and is refused.
"""

from __future__ import annotations

from pathlib import Path

from muarl.domain import domain_names, get_domain
from muarl.mcp.client import ServerSpec
from muarl.mcp.config import load_config
from muarl.mcp.domain import MCPDomain, mcp_domain


def load(spec: str) -> MCPDomain:
    return parse_spec(spec)


def parse_spec(text: str) -> MCPDomain:
    """``--domain mcp:...``: ``mcp:retail`` (serve the built-in retail over stdio and use it),
    ``mcp:my_module:domain`` (a domain of one's own, the same way),
    ``mcp:retail@http://host:port/mcp`` (a running muarl server), ``mcp:FILE.json`` (any server, with the
    tasks, read-only tools and timeouts a config file gives, see :mod:`muarl.mcp.config`).

    A bare ``mcp:URL`` or ``mcp:COMMAND LINE`` has no tasks, so it is refused here: every command that
    takes ``--domain`` plays tasks (``muarl mcp-tools`` lists such a server's tools).
    """
    head, sep, rest = text.partition("@")
    if sep and head and " " not in head and rest:
        return mcp_domain(rest, base=head)
    if text in domain_names():
        return mcp_domain(ServerSpec.muarl(text), base=text)
    if ":" in text and "://" not in text and " " not in text and not text.endswith(".json"):
        get_domain(text)  # a domain of one's own (module:attr), served as the built-ins are; a bad one: KeyError
        return mcp_domain(ServerSpec.muarl(text), base=text)
    if text.endswith(".json") and " " not in text.strip():
        return load_config(Path(text))
    raise ValueError(f"--domain mcp:{text}: an MCP server without a base domain has no tasks to play; describe it in "
                     "a config file with \"server\" and \"tasks\" (--domain mcp:FILE.json, see docs/mcp.md), "
                     "or list its tools with 'muarl mcp-tools'")
