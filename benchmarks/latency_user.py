"""An OpenAI-compatible endpoint that plays the scripted user with an API model's latency (loopback only).

For ``benchmarks/async_grpo.py``: in the method's own setting the user is an API model and an episode
mostly waits for its replies; this server makes that wait real without a model. A chat request from
muarl's ``llm:`` user carries the task's instruction in its system prompt and the agent's messages so
far; the server finds the task by its instruction, replays the scripted user (:mod:`muarl.users.scripted`,
seeded by the request's ``seed``) through those messages, and answers with the scripted user's last
reply (its stop as ``###STOP###`` and friends), after a latency drawn from a fixed long-tailed
distribution: lognormal, mean about 1 s, 1% above 5 s (like an API model's).

    python benchmarks/latency_user.py --domain retail-lite --port 0     # prints "ready http://127.0.0.1:PORT"
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import socket
import time
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from muarl.domain import get_domain
from muarl.users.llm import AGENT_GREETING, STOP_MARKERS
from muarl.users.scripted import ScriptedUser

#: the latency distribution: lognormal with sigma 0.8 and mu chosen for a mean of MEAN_S seconds
MEAN_S, SIGMA = 1.0, 0.8
MARKER = {signal: marker for marker, signal in STOP_MARKERS.items()}


def latency(rng: random.Random, mean: float = MEAN_S) -> float:
    """One reply's latency in seconds: lognormal(mu, SIGMA) with mean ``mean``."""
    return rng.lognormvariate(math.log(mean) - SIGMA ** 2 / 2, SIGMA)


class Replayer:
    """The scripted user's reply to a conversation, by replaying it from the start (a few microseconds)."""

    def __init__(self, domain: str):
        self.domain = get_domain(domain)
        self.user = ScriptedUser().for_domain(self.domain)
        self.tasks = {t.instruction.strip(): t for split in ("train", "dev", "test") for t in self.domain.tasks(split)}

    def task_of(self, system: str) -> Any:
        for instruction, task in self.tasks.items():
            if instruction in system:
                return task
        raise ValueError("no task of the domain has this system prompt's instruction")

    async def reply(self, messages: list[dict[str, Any]], seed: int) -> str:
        task = self.task_of(messages[0]["content"])
        session = self.user.session(task, seed)
        answer = await session.start()
        agent = [m["content"] for m in messages[1:] if m["role"] == "user"]
        if agent and agent[0] == AGENT_GREETING:
            agent = agent[1:]

        async def act(name: str, arguments: dict) -> str:
            return "Error: this user has no device tools here."

        for text in agent:
            answer = await session.reply(text, act)
        return answer.text if answer.stop is None else f"{answer.text}\n{MARKER[answer.stop]}"


def app(domain: str, mean: float, seed: int) -> Starlette:
    replayer = Replayer(domain)
    rng = random.Random(seed)

    async def chat(request: Request) -> Response:
        body = await request.json()
        await asyncio.sleep(latency(rng, mean))
        text = await replayer.reply(body["messages"], int(body.get("seed") or 0))
        return JSONResponse({
            "id": "chatcmpl-latency", "object": "chat.completion", "created": int(time.time()),
            "model": body.get("model", "scripted"),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}})

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": "scripted", "object": "model"}]})

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"]),
                             Route("/v1/models", models, methods=["GET"])])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--domain", default="retail-lite")
    parser.add_argument("--port", type=int, default=0, help="0: a free port")
    parser.add_argument("--mean", type=float, default=MEAN_S, help="mean latency in seconds (default 1)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    sock = socket.socket()
    sock.bind(("127.0.0.1", args.port))
    print(f"ready http://127.0.0.1:{sock.getsockname()[1]}", flush=True)
    config = uvicorn.Config(app(args.domain, args.mean, args.seed), log_level="warning")
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()
