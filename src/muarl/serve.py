"""A small OpenAI-compatible chat server over a Hugging Face causal LM.

``python -m muarl.serve --model smollm2|PATH --host 127.0.0.1 --port N`` gives ``GET /v1/models`` and
non-streaming ``POST /v1/chat/completions``, so :class:`~muarl.users.llm.LLMUser` or
:class:`~muarl.policies.openai.OpenAIPolicy` can run against a local checkpoint with no vLLM (a laptop,
CI, an air-gapped box). Concurrent requests are generated together, in one decode batch of muarl's
engine (:class:`~muarl.policies.batched_generator.BatchedGenerator`: requests join and leave it as they
come and end; one engine per sampling setting), so the users of a GRPO step's 64 conversations wait for
one batch, not for each other (``benchmarks/user_server.py``: 32 concurrent user turns against one at a
time). A greedy reply is the same whether it was generated alone or beside others; a sampled one with a
``seed`` draws from its own generator, so it is the same each time it is sent the same way (batched and
alone, a draw within float rounding of a token's boundary can differ). At most ``--max-batch`` requests generate at
once and ``--max-queue`` more wait; past that the server answers 503 at once. ``--one-at-a-time`` serves
them in turn with transformers' ``generate`` instead, as before. Generation runs in worker threads, so the
server still answers ``/v1/models`` while it generates.

Tool calls use the Hermes convention (``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``): when
the chat template does not render ``tools`` itself, they are described in the system message, and the
model's blocks are returned as OpenAI ``tool_calls``. ``--log-requests FILE`` appends every request body
as a JSON line, which lets a test check exactly what a client sent.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from muarl.chat import TOOLS_PROMPT

ROLES = {"system", "user", "assistant", "tool"}
TOOL_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


class BadRequest(ValueError):
    """A request the server refuses with HTTP 400; ``param`` names the offending field."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


@dataclass
class GenRequest:
    """A validated chat completion request."""

    messages: list[dict[str, Any]]
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 256
    seed: int | None = None
    stop: list[str] | None = None
    tools: list[dict[str, Any]] | None = None


def _number(body: dict[str, Any], key: str, default: float, lo: float, hi: float) -> float:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not lo <= value <= hi:
        raise BadRequest(f"'{key}' must be a number in [{lo}, {hi}], got {value!r}", key)
    return float(value)


def _content(msg: dict[str, Any], i: int) -> str:
    content = msg.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts: only text is supported
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise BadRequest(f"messages[{i}].content: only text parts are supported", f"messages[{i}].content")
            parts.append(part["text"])
        return "".join(parts)
    raise BadRequest(f"messages[{i}].content must be a string, a list of text parts or null",
                     f"messages[{i}].content")


def parse_request(body: Any, max_tokens_limit: int) -> GenRequest:
    """Validate a request body; every problem is a :class:`BadRequest` that says what is wrong."""
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    if body.get("stream"):
        raise BadRequest("streaming is not supported by muarl.serve", "stream")
    if body.get("n", 1) != 1:
        raise BadRequest("only n=1 is supported", "n")
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise BadRequest("'messages' must be a non-empty list", "messages")
    messages = []
    for i, msg in enumerate(raw):
        if not isinstance(msg, dict) or msg.get("role") not in ROLES:
            raise BadRequest(f"messages[{i}] must be an object with role in {sorted(ROLES)}", f"messages[{i}]")
        out: dict[str, Any] = {"role": msg["role"], "content": _content(msg, i)}
        calls = msg.get("tool_calls")
        if calls:
            if msg["role"] != "assistant" or not isinstance(calls, list):
                raise BadRequest(f"messages[{i}].tool_calls must be a list on an assistant message",
                                 f"messages[{i}].tool_calls")
            out["tool_calls"] = [_history_call(c, i) for c in calls]
        if msg["role"] == "tool" and msg.get("tool_call_id") is not None:
            out["tool_call_id"] = str(msg["tool_call_id"])
        messages.append(out)
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is None:
        max_tokens = min(256, max_tokens_limit)
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or not 1 <= max_tokens <= max_tokens_limit:
        raise BadRequest(f"'max_tokens' must be an integer in [1, {max_tokens_limit}], got {max_tokens!r}",
                         "max_tokens")
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise BadRequest(f"'seed' must be an integer, got {seed!r}", "seed")
    stop = body.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None and (not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop)):
        raise BadRequest("'stop' must be a string or a list of non-empty strings", "stop")
    tools = body.get("tools")
    if tools is not None and (not isinstance(tools, list)
                              or not all(isinstance(t, dict) and isinstance(t.get("function"), dict)
                                         and t["function"].get("name") for t in tools)):
        raise BadRequest("'tools' must be a list of {type: function, function: {name, ...}} objects", "tools")
    return GenRequest(
        messages=messages,
        temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
        top_p=_number(body, "top_p", 1.0, 1e-6, 1.0),
        max_tokens=max_tokens,
        seed=seed,
        stop=stop or None,
        tools=tools or None,
    )


def _history_call(call: Any, i: int) -> dict[str, Any]:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise BadRequest(f"messages[{i}].tool_calls: each call needs function.name", f"messages[{i}].tool_calls")
    args = function.get("arguments") or "{}"
    if isinstance(args, str):
        with contextlib.suppress(ValueError):  # a malformed call is shown back to the model as it wrote it
            args = json.loads(args)
    return {"type": "function", "function": {"name": function["name"], "arguments": args}}


def parse_tool_calls(text: str) -> tuple[str, list[dict[str, Any]]]:
    """Split generated text into (content, OpenAI tool_calls). A block whose JSON is broken but whose name
    can be read becomes a call with its raw argument text, as OpenAI does, so the client can report it."""
    calls = []
    for block in TOOL_BLOCK.findall(text):
        try:
            obj = json.loads(block)
            name, args = obj.get("name"), obj.get("arguments", {})
            arguments = args if isinstance(args, str) else json.dumps(args)
        except (ValueError, AttributeError):
            found = re.search(r'"name"\s*:\s*"([^"]+)"', block)
            name = found.group(1) if found else None
            raw = re.search(r'"arguments"\s*:\s*(.*?)\s*\}?\s*$', block, re.DOTALL)
            arguments = raw.group(1) if raw else block
        if not isinstance(name, str) or not name:
            continue
        calls.append({"id": f"call_{uuid.uuid4().hex[:12]}", "type": "function",
                      "function": {"name": name, "arguments": arguments}})
    content = TOOL_BLOCK.sub("", text).strip() if calls else text
    return content, calls


class Generator:
    """The model, its tokenizer and how to render and sample a chat with them."""

    def __init__(self, model: Any, tokenizer: Any, name: str):
        self.model = model
        self.tokenizer = tokenizer
        self.name = name
        template = tokenizer.chat_template or ""
        self.template_tools = "tools" in template
        self.template_calls = "tool_calls" in template
        self.context = int(getattr(model.config, "max_position_embeddings", 0) or 8192)
        configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        configured = configured if isinstance(configured, list) else [configured]
        self.eos = {i for i in [tokenizer.eos_token_id, *configured] if i is not None}

    def render(self, req: GenRequest) -> str:
        messages = [dict(m) for m in req.messages]
        if not self.template_calls:  # show the model its own earlier calls the way it writes them
            for m in messages:
                for call in m.pop("tool_calls", []):
                    block = json.dumps({"name": call["function"]["name"], "arguments": call["function"]["arguments"]})
                    m["content"] = (m["content"] + "\n" if m["content"] else "") + f"<tool_call>\n{block}\n</tool_call>"
        kwargs: dict[str, Any] = {}
        if req.tools and self.template_tools:
            kwargs["tools"] = req.tools
        elif req.tools:
            preamble = TOOLS_PROMPT.format(tools="\n".join(json.dumps(t) for t in req.tools))
            if messages[0]["role"] == "system":
                messages[0]["content"] = messages[0]["content"] + preamble
            else:
                messages.insert(0, {"role": "system", "content": preamble.lstrip()})
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kwargs)

    def prompt_ids(self, req: GenRequest) -> list[int]:
        """The request's prompt as token ids (a BadRequest when it and ``max_tokens`` overflow the context)."""
        ids = self.tokenizer(self.render(req), add_special_tokens=False).input_ids
        if len(ids) + req.max_tokens > self.context:
            raise BadRequest(f"prompt of {len(ids)} tokens + max_tokens {req.max_tokens} exceeds the "
                             f"context window of {self.context}", "messages")
        return list(ids)

    def generate(self, req: GenRequest) -> dict[str, Any]:
        """One completion with transformers' ``generate`` (``--one-at-a-time``; blocking: call from a worker
        thread), as an OpenAI ``chat.completion`` object."""
        import torch

        ids = torch.tensor([self.prompt_ids(req)])
        sample = req.temperature > 0
        kwargs: dict[str, Any] = {"max_new_tokens": req.max_tokens, "do_sample": sample,
                                  "pad_token_id": self.tokenizer.pad_token_id or self.tokenizer.eos_token_id}
        if sample:
            kwargs.update(temperature=req.temperature, top_p=req.top_p)
            if req.seed is not None:
                torch.manual_seed(req.seed)
        else:
            kwargs.update(temperature=None, top_p=None, top_k=None)
        if req.stop:
            kwargs.update(stop_strings=req.stop, tokenizer=self.tokenizer)
        device = next(self.model.parameters()).device
        with torch.no_grad():
            out = self.model.generate(ids.to(device), attention_mask=torch.ones_like(ids).to(device), **kwargs)
        return self.completion(req, int(ids.shape[1]), out[0, ids.shape[1]:].tolist())

    def completion(self, req: GenRequest, prompt_tokens: int, new: list[int]) -> dict[str, Any]:
        """The ``chat.completion`` object of the ``new`` tokens sampled after a prompt of ``prompt_tokens``:
        text up to the first stop string, Hermes tool-call blocks as OpenAI ``tool_calls``."""
        finish = "stop" if new and new[-1] in self.eos else "length"
        # keep special tokens other than end-of-turn: in some vocabularies (muarl's tiny model) <tool_call> is one
        text = self.tokenizer.decode([t for t in new if t not in self.eos], skip_special_tokens=False)
        for s in req.stop or []:
            if s in text:
                text, finish = text[: text.index(s)], "stop"
        content, calls = parse_tool_calls(text) if req.tools else (text, [])
        message: dict[str, Any] = {"role": "assistant", "content": content if (content or not calls) else None}
        if calls:
            message["tool_calls"] = calls
            finish = "tool_calls"
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex[:16]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.name,
            "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": len(new),
                      "total_tokens": prompt_tokens + len(new)},
        }


#: KV kept of finished requests for the next turns of their conversations (``--prefix-cache-mib``): SmolLM2-135M
#: keeps 45 KiB a token in float32, so 2 GiB holds about 46,000 tokens, the 64 conversations of a GRPO step
PREFIX_CACHE_MIB = 2048.0


#: seconds between returns of freed memory to the system while requests finish (``--trim-every``; see
#: :mod:`muarl.allocator`): 5 kept a GRPO step's user server at 2.7 GiB instead of 9.6, in the same time
TRIM_EVERY = 5.0


class Busy(RuntimeError):
    """More requests than the server generates and queues at once: answered 503 at once."""


class BatchedServing:
    """Concurrent requests generated together by muarl's engine, one :class:`BatchedGenerator` per sampling
    setting (a greedy request's and a sampled one's cannot share a decode step), created when first asked
    for and all on the same model. A request beyond ``max_batch`` generating and ``max_queue`` waiting is
    :class:`Busy`. Stop strings are applied to the text afterwards (the engine stops at end of turn or
    ``max_tokens``). A finished request's KV cache is kept (:class:`~muarl.prefix_store.PrefixStore`, up to
    ``prefix_cache_mib``), so a conversation's next turn prefills only the tokens it adds. As requests
    finish, freed memory is returned to the system at most every ``trim_every`` seconds and whenever the
    server falls idle (:func:`muarl.allocator.release_freed`, in a worker thread; 0: never)."""

    def __init__(self, generator: Generator, max_batch: int = 32, max_queue: int = 256,
                 prefix_cache_mib: float = PREFIX_CACHE_MIB, trim_every: float = 0.0):
        from muarl.prefix_store import PrefixStore

        self.generator, self.max_batch, self.max_queue = generator, max_batch, max_queue
        self.engines: dict[tuple[float, float], Any] = {}
        self.in_flight = 0
        self.store = PrefixStore(int(prefix_cache_mib * 2**20))
        self.trim_every = trim_every
        self.trimmed_at = time.monotonic()
        self.trimming: asyncio.Future | None = None

    def engine(self, req: GenRequest) -> Any:
        from muarl.policies.batched_generator import BatchedGenerator

        key = (req.temperature, req.top_p) if req.temperature > 0 else (0.0, 1.0)
        if key not in self.engines:
            self.engines[key] = BatchedGenerator(self.generator.model, self.generator.eos, key[0], key[1],
                                                 self.max_batch)
        return self.engines[key]

    async def complete(self, req: GenRequest) -> dict[str, Any]:
        import secrets

        import torch

        if self.in_flight >= self.max_batch + self.max_queue:
            raise Busy(f"the server is generating {self.max_batch} replies and has {self.max_queue} more waiting "
                       "(--max-batch, --max-queue): retry later")
        self.in_flight += 1
        try:
            ids = await asyncio.to_thread(self.generator.prompt_ids, req)
            engine = self.engine(req)
            seed = req.seed if req.seed is not None else secrets.randbits(62)
            seq, rest = self.store.lend(ids, torch.Generator(device=engine.device).manual_seed(seed))
            new, _, _ = await engine.generate(seq, rest, req.max_tokens)
            self.store.keep(seq)
            return self.generator.completion(req, len(ids), new)
        finally:
            self.in_flight -= 1
            self._maybe_trim()

    def _maybe_trim(self) -> None:
        from muarl.allocator import release_freed

        now = time.monotonic()
        if (self.trim_every <= 0 or (self.trimming is not None and not self.trimming.done())
                or (self.in_flight and now - self.trimmed_at < self.trim_every)):
            return
        self.trimmed_at = now
        self.trimming = asyncio.get_running_loop().run_in_executor(None, release_freed)


def _error(status: int, message: str, param: str | None = None, kind: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": None}},
                        status_code=status)


def build_app(generator: Generator, log_requests: Path | None = None, max_tokens_limit: int = 4096,
              batched: BatchedServing | None = None) -> Starlette:
    """The Starlette app; ``batched`` generates concurrent requests together, else ``generator`` does, one
    request at a time."""
    lock = asyncio.Lock()

    async def complete(req: GenRequest) -> dict[str, Any]:
        if batched is not None:
            return await batched.complete(req)
        async with lock:
            return await asyncio.to_thread(generator.generate, req)

    async def models(request: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [
            {"id": generator.name, "object": "model", "created": 0, "owned_by": "muarl"}]})

    async def chat(request: Request) -> JSONResponse:
        raw = await request.body()
        try:
            body = json.loads(raw)
        except ValueError as err:
            return _error(400, f"request body is not valid JSON: {err}")
        if log_requests is not None:
            with log_requests.open("a") as fh:
                fh.write(json.dumps(body) + "\n")
        try:
            result = await complete(parse_request(body, max_tokens_limit))
        except BadRequest as err:
            return _error(400, str(err), err.param)
        except Busy as err:
            return _error(503, str(err), kind="server_busy")
        except Exception as err:  # a server must answer, not die: the client sees a 500
            return _error(500, f"generation failed: {type(err).__name__}: {err}", kind="server_error")
        return JSONResponse(result)

    return Starlette(routes=[
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/chat/completions", chat, methods=["POST"]),
    ])


def wait_ready(proc: Any, timeout: float) -> str | None:
    """The URL on a server process's ``ready URL ...`` line (:func:`main` prints it once the socket accepts
    connections; read from ``proc.stdout``, a text pipe), waited for up to ``timeout`` seconds; None if the
    process exits or is not ready by then (the caller says why, with its log)."""
    import select

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if select.select([proc.stdout], [], [], 0.2)[0]:
            line = proc.stdout.readline()
            if line.startswith("ready "):
                return line.split()[1]
            if not line and proc.poll() is not None:
                return None
        elif proc.poll() is not None:
            return None
    return None


def stop_server(proc: Any, grace: float = 10.0) -> None:
    """Stop a server process started by a caller: SIGTERM, then SIGKILL if it is still there after
    ``grace`` seconds."""
    import subprocess

    proc.terminate()
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    from muarl.allocator import limit_arenas
    from muarl.models import load

    p = argparse.ArgumentParser(prog="python -m muarl.serve", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="'smollm2' or a Hugging Face checkpoint directory")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="0 picks a free port (printed on the ready line)")
    p.add_argument("--served-name", default=None, help="model id reported by /v1/models (default: --model)")
    p.add_argument("--device", default=None, help="cpu / cuda (default: cuda when available)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: torch's choice). 1 is much faster on a busy machine, where "
                        "spinning OpenMP threads of several processes starve each other")
    p.add_argument("--max-tokens-limit", type=int, default=4096)
    p.add_argument("--log-requests", type=Path, default=None, help="append each request body to this JSONL file")
    p.add_argument("--max-batch", type=int, default=32, help="requests generated together at most")
    p.add_argument("--max-queue", type=int, default=256, help="requests waiting beyond those; past it: HTTP 503")
    p.add_argument("--prefix-cache-mib", type=float, default=PREFIX_CACHE_MIB,
                   help="KV cache kept of finished requests, so a conversation's next turn prefills only what it "
                        f"adds (least recently used dropped first; 0: none; default {PREFIX_CACHE_MIB:g})")
    p.add_argument("--one-at-a-time", action="store_true",
                   help="one request at a time with transformers' generate (the server before batching)")
    p.add_argument("--trim-every", type=float, default=TRIM_EVERY,
                   help="seconds between returns of freed memory to the system while serving (muarl.allocator: "
                        "2 arenas, malloc_trim; without, a GRPO run's user server holds 3-4x the memory it uses). "
                        f"0: glibc's defaults. Default {TRIM_EVERY:g}")
    args = p.parse_args(argv)
    for name in ("max_batch", "max_tokens_limit"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.max_queue < 0 or args.prefix_cache_mib < 0 or args.trim_every < 0:
        p.error("--max-queue, --prefix-cache-mib and --trim-every must be 0 or more")
    if args.trim_every > 0 and not limit_arenas():
        print("muarl.serve: not glibc: --trim-every does nothing here", file=sys.stderr)
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    model, tokenizer = load(args.model, device=args.device)
    generator = Generator(model, tokenizer, args.served_name or args.model)
    batched = None if args.one_at_a_time else BatchedServing(generator, args.max_batch, args.max_queue,
                                                                   args.prefix_cache_mib, args.trim_every)
    app = build_app(generator, args.log_requests, args.max_tokens_limit, batched)

    class Server(uvicorn.Server):
        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets=sockets)
            if self.started:  # the socket is bound: clients may connect from now on
                port = self.servers[0].sockets[0].getsockname()[1] if self.servers else args.port
                print(f"ready http://{args.host}:{port}/v1 model={generator.name}", flush=True)

    config = uvicorn.Config(app, host=args.host, port=args.port, log_level="warning", lifespan="off")
    Server(config).run()


if __name__ == "__main__":
    sys.exit(main())
