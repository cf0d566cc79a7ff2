"""One OpenAI-compatible chat endpoint with our own retry policy, shared by the LLM user and the API policy.

The client's built-in retries are switched off so that every retry is ours: counted (a rollout that only
succeeded after four retries is worth knowing about), spaced by exponential backoff with jitter drawn from
a seeded RNG (reproducible test runs, no thundering herd against a shared server), and limited to the
failures that can heal by themselves (timeouts, dropped connections, HTTP 5xx, 429). Anything else (a 4xx,
a reply that is not a chat completion) fails at once with an :class:`EndpointError` that names the
endpoint and the cause, because retrying a bad request only delays the same error.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field
from typing import Any

import openai


class EndpointError(RuntimeError):
    """The endpoint gave no usable completion. ``retries`` is how many retries were spent before giving up."""

    def __init__(self, message: str, *, url: str, retries: int = 0, retryable: bool = False):
        super().__init__(message)
        self.url = url
        self.retries = retries
        self.retryable = retryable


@dataclass
class Completion:
    """The parts of a chat completion callers use: the first choice's message, why it ended, and cost."""

    message: Any
    finish_reason: str | None
    usage: dict[str, int] = field(default_factory=dict)
    retries: int = 0


def _describe(err: BaseException) -> str:
    if isinstance(err, openai.APITimeoutError):
        return "request timed out"
    if isinstance(err, openai.APIStatusError):
        body = str(getattr(err, "body", None) or err.message)[:300]
        return f"HTTP {err.status_code}: {body}"
    if isinstance(err, openai.APIConnectionError):
        cause = err.__cause__ or err.__context__
        return f"connection error ({cause or err})"
    if isinstance(err, (ValueError, openai.APIResponseValidationError)):
        return f"malformed reply, not a chat completion ({type(err).__name__}: {err})"[:400]
    return f"{type(err).__name__}: {err}"[:400]


def _retryable(err: BaseException) -> bool:
    """Timeouts, connection errors, 5xx and 429 can heal by themselves; nothing else is worth a retry."""
    if isinstance(err, openai.APIStatusError):
        return err.status_code == 429 or err.status_code >= 500
    return isinstance(err, (openai.APIConnectionError, openai.APITimeoutError))


def _retry_after(err: BaseException) -> float | None:
    response = getattr(err, "response", None)
    value = response.headers.get("retry-after") if response is not None else None
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


class ChatEndpoint:
    """``POST {base_url}/chat/completions`` with counted, jittered, exponential-backoff retries."""

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str = "EMPTY",
        timeout: float = 60.0,
        max_retries: int = 4,
        backoff: float = 1.0,
        max_backoff: float = 30.0,
    ):
        if max_retries < 0:
            raise ValueError("max_retries must be >= 0")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api_key = api_key
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self._clients: dict[int, tuple[asyncio.AbstractEventLoop, openai.AsyncOpenAI]] = {}

    def __repr__(self) -> str:
        return f"ChatEndpoint({self.base_url!r}, model={self.model!r})"

    def _client(self) -> openai.AsyncOpenAI:
        """One client per event loop: pooled connections belong to the loop that opened them, and callers
        (a GRPO step, tests, scripts) run one ``asyncio.run`` after another in one process. The HTTP client is
        passed in rather than made by openai, whose own schedules its closing on whatever loop runs when it is
        collected: a closed loop's connections then fail to close on the next step's loop, and the log fills
        with 'Task exception was never retrieved ... Event loop is closed'. Ours closes nothing on collection;
        its sockets close with them."""
        loop = asyncio.get_running_loop()
        entry = self._clients.get(id(loop))
        if entry is None or entry[0] is not loop:
            client = openai.AsyncOpenAI(base_url=self.base_url, api_key=self.api_key, timeout=self.timeout,
                                        max_retries=0, http_client=openai.DefaultAsyncHttpxClient())
            self._clients = {k: v for k, v in self._clients.items() if not v[0].is_closed()}
            self._clients[id(loop)] = (loop, client)
            return client
        return entry[1]

    def delay(self, attempt: int, rng: random.Random) -> float:
        """Seconds to wait before retry number ``attempt + 1``: base * 2^attempt, jittered by x0.5..1.5."""
        return min(self.max_backoff, self.backoff * (2**attempt)) * rng.uniform(0.5, 1.5)

    async def complete(self, rng: random.Random, **params: Any) -> Completion:
        """One chat completion (``params`` go to ``chat.completions.create``), retried as the module says."""
        where = f"{self.base_url} (model {self.model})"
        attempt = 0
        while True:
            try:
                response = await self._client().chat.completions.create(model=self.model, **params)
            except Exception as err:  # classified below, re-raised as EndpointError
                if not _retryable(err):
                    raise EndpointError(f"endpoint {where} failed: {_describe(err)}", url=self.base_url,
                                        retries=attempt) from err
                if attempt >= self.max_retries:
                    raise EndpointError(
                        f"endpoint {where} failed after {attempt} retries: {_describe(err)}",
                        url=self.base_url, retries=attempt, retryable=True,
                    ) from err
                wait = self.delay(attempt, rng)
                hinted = _retry_after(err)
                if hinted is not None:
                    wait = min(self.max_backoff, max(wait, hinted))
                await asyncio.sleep(wait)
                attempt += 1
                continue
            return self._unpack(response, where, attempt)

    def _unpack(self, response: Any, where: str, retries: int) -> Completion:
        choices = getattr(response, "choices", None)
        if not choices or getattr(choices[0], "message", None) is None:
            raise EndpointError(f"endpoint {where} returned a malformed completion (no choices/message): "
                                f"{str(response)[:300]!r}", url=self.base_url, retries=retries)
        usage = getattr(response, "usage", None)
        counts = {}
        if usage is not None:
            counts = {k: int(getattr(usage, k, 0) or 0)
                      for k in ("prompt_tokens", "completion_tokens", "total_tokens")}
        return Completion(choices[0].message, getattr(choices[0], "finish_reason", None), counts, retries)
