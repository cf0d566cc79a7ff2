"""The LLM user's server: concurrent user turns generated together against one at a time.

``python -m muarl.serve --model smollm2`` (SmolLM2-135M-Instruct, shipped in a PyPI package) is started once;
the same 32 user turns (an LLM user's requests: a system prompt with the user's scenario, the agent's
last words; greedy, up to ``--max-tokens`` tokens) are sent first one at a time, then all at once. Greedy
replies are the same either way (checked: the same texts and token counts), so both runs generate the same
tokens and the ratio of their wall times is the gain. The one-at-a-time server of before
(``--one-at-a-time``: transformers' ``generate`` behind a lock) is measured too, for reference, with the
same requests sent at once (which it serves in turn).

    python benchmarks/user_server.py                       # about 2 minutes on 2 cores
    python benchmarks/user_server.py --requests 16 --max-tokens 24

Last line: ``user server, 32 concurrent vs one at a time: N.NNx`` (the bar of issue 42: at least 5x).
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time
from typing import Any

from muarl.serve import wait_ready

SCENARIOS = ["cancel an order that has not shipped", "return a lamp bought last week", "change a shipping address",
             "ask why a card was charged twice", "swap a size M shirt for a size L", "update the email on file",
             "find out where a parcel is", "use a gift card for an exchange"]
AGENT_SAYS = ["Hello! How can I help you today?", "Could you tell me the email on your account?",
              "Thanks. Which order is this about?", "I can do that. Shall I go ahead? Please say yes to confirm."]


def bodies(count: int, max_tokens: int) -> list[dict[str, Any]]:
    """``count`` LLM-user requests: scenario and agent turn vary, greedy, as muarl's LLM user sends them."""
    out = []
    for n in range(count):
        scenario, said = SCENARIOS[n % len(SCENARIOS)], AGENT_SAYS[(n // len(SCENARIOS)) % len(AGENT_SAYS)]
        out.append({"model": "smollm2", "temperature": 0.0, "max_tokens": max_tokens, "messages": [
            {"role": "system", "content": f"You are a customer of an online shop. You want to {scenario}. Reply "
                                          "as the customer, in one or two sentences."},
            {"role": "user", "content": said}]})
    return out


def start(extra: list[str]) -> tuple[subprocess.Popen, str]:
    # no kept KV: the same prompts are sent twice, and the second round must be prefilled as the first was
    cmd = [sys.executable, "-m", "muarl.serve", "--model", "smollm2", "--port", "0", "--device", "cpu",
           "--prefix-cache-mib", "0", *extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    url = wait_ready(proc, 300)
    if url is not None:
        return proc, url
    proc.kill()
    raise SystemExit(f"{' '.join(cmd)} did not become ready")


async def send(url: str, requests: list[dict[str, Any]], together: bool) -> tuple[float, list[tuple[str, int]]]:
    """Wall seconds and (text, completion tokens) of each reply."""
    import httpx2

    async with httpx2.AsyncClient(timeout=1800) as client:
        async def one(body: dict[str, Any]) -> tuple[str, int]:
            reply = (await client.post(f"{url}/chat/completions", json=body)).json()
            return reply["choices"][0]["message"]["content"], reply["usage"]["completion_tokens"]

        began = time.perf_counter()
        if together:
            replies = list(await asyncio.gather(*map(one, requests)))
        else:
            replies = [await one(body) for body in requests]
        return time.perf_counter() - began, replies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--skip-old", action="store_true", help="leave out the one-at-a-time server of before")
    args = parser.parse_args()
    requests = bodies(args.requests, args.max_tokens)
    proc, url = start(["--max-batch", str(args.requests)])
    try:
        asyncio.run(send(url, requests[:2], together=False))  # warm-up: first-call costs out of both runs
        alone_s, alone = asyncio.run(send(url, requests, together=False))
        together_s, together = asyncio.run(send(url, requests, together=True))
    finally:
        proc.terminate()
        proc.wait()
    tokens = sum(n for _, n in alone)
    if alone != together:
        raise SystemExit("the replies generated together differ from those generated alone")
    print(f"batched server, one at a time: {alone_s:.1f} s ({tokens / alone_s:.1f} tokens/s)", flush=True)
    print(f"batched server, {args.requests} at once: {together_s:.1f} s ({tokens / together_s:.1f} tokens/s)",
          flush=True)
    if not args.skip_old:
        proc, url = start(["--one-at-a-time"])
        try:
            asyncio.run(send(url, requests[:2], together=False))
            old_s, old = asyncio.run(send(url, requests, together=True))
        finally:
            proc.terminate()
            proc.wait()
        print(f"one-at-a-time server (transformers' generate behind a lock), {args.requests} at once: {old_s:.1f} s "
              f"({sum(n for _, n in old) / old_s:.1f} tokens/s; {alone_s / old_s:.2f}x the batched server's "
              "one-at-a-time time)", flush=True)
    print(f"user server, {args.requests} concurrent vs one at a time: {alone_s / together_s:.2f}x")


if __name__ == "__main__":
    main()
