"""A user whose replies take a random time, different in every process (``--user jittery_user:user``):
muarl's scripted user behind the latency of a real one (an LLM over HTTP, a person), part of it awaited and
part of it blocking the event loop (as a slow synchronous call does). The text is the scripted user's, so
two runs differ only in when each reply arrives: what tests/test_reproducible_runs.py needs to show that a
synchronous run does not depend on timing.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

from muarl.users.base import UserReply, UserSession, UserSimulator
from muarl.users.scripted import ScriptedUser

_clock = random.SystemRandom()  # seeded by the OS: another timing in every run


async def _lag() -> None:
    await asyncio.sleep(_clock.random() * 0.05)
    time.sleep(_clock.random() * 0.01)


class JitteryUser(UserSimulator):
    name = "jittery"

    def __init__(self, inner: UserSimulator | None = None):
        self.inner = inner or ScriptedUser()

    def for_domain(self, domain: Any) -> JitteryUser:
        return JitteryUser(self.inner.for_domain(domain))

    def session(self, task: Any, seed: int) -> UserSession:
        return _JitterySession(self.inner.session(task, seed))


class _JitterySession(UserSession):
    def __init__(self, inner: UserSession):
        self.inner = inner

    async def start(self) -> UserReply:
        await _lag()
        return await self.inner.start()

    async def reply(self, agent_text: str, act: Any) -> UserReply:
        await _lag()
        return await self.inner.reply(agent_text, act)


user = JitteryUser()
