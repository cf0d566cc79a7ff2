"""Does the embedded LLM user (SmolLM2-135M-Instruct) open the conversation as the customer?

The first message of each of the first N dev tasks of a domain, greedy, under muarl's LLM-user prompt
(``muarl.users.llm.SYSTEM_PROMPT``) and under a short one, generated together by muarl's engine in process.
An opening counts as the customer's when it names the matter (order, cancel, refund, ...) and does not speak
as the agent (the user slip ``as_agent``'s check, ``muarl.users.slips.AS_AGENT``). research/llm-user-pilot.md.

    python scripts/llm_user_openings.py --tasks 20      # about a minute on 2 cores
    python scripts/llm_user_openings.py --model runs/user-sft/model   # a user model of one's own
"""

from __future__ import annotations

import argparse
import asyncio
import re
from collections.abc import Callable
from typing import Any

import torch

from muarl.domain import get_domain
from muarl.models import load
from muarl.policies.batched_generator import BatchedGenerator, TokenSequence
from muarl.serve import Generator, GenRequest
from muarl.users.llm import AGENT_GREETING, opening_messages
from muarl.users.phrases import norm
from muarl.users.slips import AS_AGENT

SHORT = ("You are a customer chatting with an online shop's support agent. {instruction} "
         "Write only your next chat message as this customer, in one or two sentences.")
MATTER = re.compile(r"\b(order|cancel|return|exchange|refund|item|address|payment|email|account|ship|deliver|"
                    r"bought|purchase)")


def prompts() -> dict[str, Callable[[Any], list[dict[str, str]]]]:
    def short_prompt(task: Any) -> list[dict[str, str]]:
        return [{"role": "system", "content": SHORT.format(instruction=task.instruction.strip())},
                {"role": "user", "content": AGENT_GREETING}]

    return {"muarl's prompt": opening_messages, "short prompt": short_prompt}


async def openings(generator: Generator, messages: list[list[dict[str, str]]], max_tokens: int) -> list[str]:
    engine = BatchedGenerator(generator.model, generator.eos, 0.0, 1.0, 32)
    ids = [generator.prompt_ids(GenRequest(messages=m, temperature=0.0, max_tokens=max_tokens)) for m in messages]
    replies = await asyncio.gather(*[engine.generate(TokenSequence(generator=torch.Generator().manual_seed(0)),
                                                     prompt, max_tokens) for prompt in ids])
    return [generator.tokenizer.decode(tokens, skip_special_tokens=True).strip() for tokens, _, _ in replies]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--domain", default="retail-lite-forgetful")
    parser.add_argument("--tasks", type=int, default=20, help="the first N dev tasks")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--model", default="smollm2", help="the user model: smollm2 or a checkpoint directory "
                        "(say, `muarl synth --side user` then `muarl sft`)")
    args = parser.parse_args()
    tasks = get_domain(args.domain).tasks("dev")[:args.tasks]
    model, tokenizer = load(args.model, device="cpu")
    generator = Generator(model, tokenizer, "user")
    for name, make in prompts().items():
        said = asyncio.run(openings(generator, [make(t) for t in tasks], args.max_tokens))
        agent = [bool(AS_AGENT.search(norm(s))) for s in said]  # the user slip ``as_agent``'s own check
        customer = sum(bool(MATTER.search(norm(s))) and not a for s, a in zip(said, agent, strict=True))
        agent = sum(agent)
        print(f"{name}: {customer} of {len(said)} openings as the customer, {agent} speak as the agent")
        for text in said[:3]:
            print("   -", text[:150].replace("\n", " "))


if __name__ == "__main__":
    main()
