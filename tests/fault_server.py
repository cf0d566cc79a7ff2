"""A scripted OpenAI-compatible server for tests: each chat request gets the next scripted behaviour.

Run as ``python tests/fault_server.py --port 0``; it prints ``ready http://127.0.0.1:PORT`` once listening.
``POST /_script`` with ``{"actions": [...], "default": {...}}`` sets the queue (and clears the request log);
``GET /_requests`` returns every chat request body received since. An action is a dict:

* ``{"status": 500}`` - an OpenAI-style error with that HTTP status (``"retry_after"`` adds the header);
* ``{"sleep": 2.0, ...}`` - wait first, then do the rest of the action (a reply by default);
* ``{"malformed": true}`` - HTTP 200 whose body is not JSON;
* ``{"content": "hi", "tool_calls": [{"name": "f", "arguments": "{...}"}], "finish_reason": "stop"}`` - a
  normal completion (``arguments`` is sent verbatim, so it may be invalid JSON).

A real process over real HTTP, so the client's timeouts, connection handling and status parsing are the
ones exercised, not a mock of them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

STATE: dict[str, Any] = {"actions": [], "default": {"content": "OK"}, "requests": []}


def completion(action: dict[str, Any]) -> dict[str, Any]:
    calls = [{"id": c.get("id", f"call_{i}"), "type": "function",
              "function": {"name": c["name"], "arguments": c.get("arguments", "{}")}}
             for i, c in enumerate(action.get("tool_calls", []))]
    message: dict[str, Any] = {"role": "assistant", "content": action.get("content")}
    if calls:
        message["tool_calls"] = calls
    finish = action.get("finish_reason", "tool_calls" if calls else "stop")
    return {"id": "chatcmpl-fault", "object": "chat.completion", "created": int(time.time()), "model": "fault",
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}


async def chat(request: Request) -> Response:
    raw = await request.body()
    try:
        STATE["requests"].append(json.loads(raw))
    except ValueError:
        STATE["requests"].append({"_raw": raw.decode(errors="replace")})
    action = STATE["actions"].pop(0) if STATE["actions"] else STATE["default"]
    if action.get("sleep"):
        await asyncio.sleep(float(action["sleep"]))
    if action.get("status"):
        headers = {"retry-after": str(action["retry_after"])} if "retry_after" in action else None
        body = {"error": {"message": action.get("message", f"scripted HTTP {action['status']}"),
                          "type": "scripted", "param": None, "code": None}}
        return JSONResponse(body, status_code=int(action["status"]), headers=headers)
    if action.get("malformed"):
        return Response(b"{this is not json", media_type="application/json")
    return JSONResponse(completion(action))


async def script(request: Request) -> JSONResponse:
    body = await request.json()
    STATE["actions"] = list(body.get("actions", []))
    STATE["default"] = body.get("default", {"content": "OK"})
    STATE["requests"] = []
    return JSONResponse({"ok": True})


async def requests(request: Request) -> JSONResponse:
    return JSONResponse({"requests": STATE["requests"], "pending": len(STATE["actions"])})


async def models(request: Request) -> JSONResponse:
    return JSONResponse({"object": "list", "data": [{"id": "fault", "object": "model"}]})


app = Starlette(routes=[
    Route("/v1/chat/completions", chat, methods=["POST"]),
    Route("/v1/models", models, methods=["GET"]),
    Route("/_script", script, methods=["POST"]),
    Route("/_requests", requests, methods=["GET"]),
])


class Server(uvicorn.Server):
    async def startup(self, sockets: Any = None) -> None:
        await super().startup(sockets=sockets)
        if self.started:
            print(f"ready http://127.0.0.1:{self.servers[0].sockets[0].getsockname()[1]}", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    port = parser.parse_args().port
    Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")).run()
