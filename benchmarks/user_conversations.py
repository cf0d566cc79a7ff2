"""The LLM user's server over whole conversations: finished requests' KV kept (``muarl.prefix_store``) against
every turn prefilled afresh.

An LLM user sends its whole history each turn: muarl's user prompt with the task (about 350 SmolLM2 tokens),
then every message so far. ``N`` such conversations (the first ``N`` dev tasks of retail-lite-forgetful, the
agent's lines canned, greedy, all conversations at once, turn by turn as a GRPO step's users are) are played
by two servers in this process on one loaded model: muarl's batched server as shipped, and the same with
``--prefix-cache-mib 0``. The replies are checked equal, so both generate the same tokens and the ratio of
their wall times is the gain. Default: the model served with the embedded user's one thread.

    python benchmarks/user_conversations.py                   # about 2 minutes on 2 cores
    python benchmarks/user_conversations.py --model runs/user-sft/model --conversations 32

Last line: ``user server, N conversations of T turns, KV kept vs prefilled afresh: N.NNx``.
"""

from __future__ import annotations

import argparse
import asyncio
import time

import torch

from muarl.domain import get_domain
from muarl.models import load
from muarl.serve import BatchedServing, Generator, GenRequest
from muarl.users.llm import opening_messages

AGENT_SAYS = ["I'd be happy to help. Could you tell me your first name, last name and zip code?",
              "Thank you. I found your account. Which order is this about?",
              "I can do that for the order you named. Would you like me to proceed? (yes/no)",
              "Done. Is there anything else I can help you with?"]


async def play(server: BatchedServing, tasks: list, turns: int, max_tokens: int) -> list[list[str]]:
    """Every conversation's user lines, the conversations played at once, one turn at a time."""
    histories = [opening_messages(t) for t in tasks]
    said: list[list[str]] = [[] for _ in tasks]
    for turn in range(turns):
        replies = await asyncio.gather(*[server.complete(GenRequest(messages=h, temperature=0.0, max_tokens=max_tokens))
                                         for h in histories])
        for n, reply in enumerate(replies):
            text = reply["choices"][0]["message"]["content"]
            said[n].append(text)
            histories[n] += [{"role": "assistant", "content": text},
                             {"role": "user", "content": AGENT_SAYS[turn % len(AGENT_SAYS)]}]
    return said


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2", help="smollm2 or a checkpoint directory (a user model)")
    parser.add_argument("--conversations", type=int, default=16)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (the embedded user server's: 1)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, tokenizer = load(args.model, device="cpu")
    generator = Generator(model, tokenizer, "user")
    tasks = get_domain("retail-lite-forgetful").tasks("dev")[:args.conversations]
    asyncio.run(play(BatchedServing(generator, prefix_cache_mib=0), tasks[:2], 1, 4))  # warm-up
    seconds, said = {}, {}
    for name, mib in (("prefilled afresh", 0.0), ("KV kept", None)):
        server = BatchedServing(generator) if mib is None else BatchedServing(generator, prefix_cache_mib=mib)
        began = time.perf_counter()
        said[name] = asyncio.run(play(server, tasks, args.turns, args.max_tokens))
        seconds[name] = time.perf_counter() - began
        prefilled = sum(e.tokens_computed for e in server.engines.values())
        print(f"{name}: {seconds[name]:.1f} s, {prefilled} positions computed, {server.store.reused_tokens} prompt "
              "tokens served from kept KV", flush=True)
    if said["KV kept"] != said["prefilled afresh"]:
        raise SystemExit("the replies with KV kept differ from those prefilled afresh")
    print(f"user server, {args.conversations} conversations of {args.turns} turns, KV kept vs prefilled afresh: "
          f"{seconds['prefilled afresh'] / seconds['KV kept']:.2f}x")


if __name__ == "__main__":
    main()
