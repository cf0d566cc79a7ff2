"""MCP both ways: serve a muarl domain to any MCP client, and train or evaluate against any MCP server."""

from muarl.mcp.client import CallOutcome, RemoteSession, ServerSpec
from muarl.mcp.domain import MCPDomain, MCPEnv, mcp_domain

__all__ = ["CallOutcome", "MCPDomain", "MCPEnv", "RemoteSession", "ServerSpec", "mcp_domain"]
