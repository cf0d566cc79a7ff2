"""Time limits for the parties of an episode: a coroutine under a deadline, a sync call in a thread.

Why: a user that never answers, a policy backend that stalls or a tool that hangs must cost its episode
(a fault, see :mod:`muarl.faults`), never the run. Both helpers raise :class:`LimitExceeded` when their
limit is hit; ``None`` (or 0) means no limit.

What cannot be stopped: a coroutine is cancelled at its deadline, so one that swallows the cancellation
keeps running; a sync call runs in a daemon thread, and Python cannot kill a thread, so a hung sync tool
is *abandoned*: its episode is faulted and moves on while the thread lingers until it returns (or the
process exits: daemon threads never hold the process open).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

#: how long a threaded call is waited for with the event loop blocked, as the inline call it replaces
#: would have: calls shorter than this keep their old timing exactly (so concurrent episodes interleave as
#: before), longer ones are awaited without blocking the other episodes
INLINE_GRACE_S = 1.0


class LimitExceeded(Exception):
    """A time limit was hit (not a TimeoutError, so a party's own timeouts are never mistaken for it)."""

    def __init__(self, seconds: float, abandoned: bool = False):
        super().__init__(f"no answer within {seconds:g} s")
        self.seconds, self.abandoned = seconds, abandoned


async def bounded(make: Callable[[], Awaitable[T]], seconds: float | None) -> T:
    """Await ``make()``, cancelling it after ``seconds`` (``LimitExceeded``); ``None`` or 0: no limit.

    The deadline is a timer on the current task (no extra task), so a turn that finishes in time runs
    exactly as it would unlimited.
    """
    if not seconds:
        return await make()
    if hasattr(asyncio, "timeout"):  # Python 3.11+
        scope = asyncio.timeout(seconds)
        try:
            async with scope:
                return await make()
        except TimeoutError:
            if scope.expired():
                raise LimitExceeded(seconds) from None
            raise  # the party's own TimeoutError: an ordinary exception
    task = asyncio.ensure_future(make())  # Python 3.10
    try:
        done, _ = await asyncio.wait({task}, timeout=seconds)
    except asyncio.CancelledError:
        task.cancel()
        raise
    if not done:
        task.cancel()
        raise LimitExceeded(seconds)
    return task.result()


async def call_in_thread(fn: Callable[[], T], seconds: float | None, grace: float = INLINE_GRACE_S) -> T:
    """Run the sync ``fn`` in a daemon thread and return its result; ``LimitExceeded`` after ``seconds``.

    The first ``grace`` seconds are waited for with the event loop blocked, as for an inline call; after
    that the wait yields to the other episodes. At the limit the thread is abandoned (it cannot be
    killed). With no limit ``fn`` simply runs inline.
    """
    if not seconds:
        return fn()
    future: concurrent.futures.Future[T] = concurrent.futures.Future()

    def work() -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            result = fn()
        except BaseException as err:  # handed to the caller, who decides
            future.set_exception(err)
        else:
            future.set_result(result)

    threading.Thread(target=work, name="muarl-sync-call", daemon=True).start()
    first = min(grace, seconds)
    concurrent.futures.wait([future], timeout=first)
    if not future.done() and seconds > first:
        waiting = asyncio.wrap_future(future)
        done, _ = await asyncio.wait({waiting}, timeout=seconds - first)
        if not done:
            waiting.cancel()  # detaches the wait; the thread itself runs on
    if not future.done():
        raise LimitExceeded(seconds, abandoned=True)
    return future.result()
