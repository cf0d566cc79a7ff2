"""Training the embedded models' byte-level BPE tokenizer from what an agent here reads and writes.

Run once to make the tokenizer shipped with the base (:data:`muarl.tiny_model.SHIPPED_TOKENIZER`), and by
``muarl init-model --vocab-size N`` for another size. Its own module, above the model builder: the corpus
plays the expert agent's conversations with the scripted user, so it needs the domains, a policy and the
episode loop, which building a model from the shipped tokenizer does not.
"""

from __future__ import annotations

import json
from typing import Any

from muarl.tiny_model import CHAT_TEMPLATE, SPECIAL_TOKENS

#: the built-in domains whose texts the tokenizer learns from
CORPUS_DOMAINS = ("retail", "airline", "telecom", "retail-lite")


def corpus() -> list[str]:
    """Text the tokenizer learns from: the built-in domains' policies, tool schemas, task texts and whole
    conversations of the expert agent with the scripted user (what an agent here actually reads and
    writes), each rendered the way the chat template renders it, so role names, tool names and JSON keys
    become single tokens and conversations stay short."""
    import asyncio

    from muarl.domain import get_domain
    from muarl.policies.expert import ExpertPolicy
    from muarl.rollout import RolloutEngine
    from muarl.users.scripted import ScriptedUser

    texts: list[str] = [CHAT_TEMPLATE]
    for name in CORPUS_DOMAINS:
        domain = get_domain(name)
        texts.append(domain.policy)
        texts += [json.dumps(t.spec.openai_schema()) for t in domain.tools + domain.user_tools]
        tasks = domain.tasks("train")
        texts += [t.instruction for t in tasks]
        engine = RolloutEngine(domain, ExpertPolicy(), ScriptedUser(), progress=False)
        for (trajectory,) in asyncio.run(engine.run(tasks)):
            for m in trajectory.messages[1:]:
                texts.append(f"<|im_start|>{m.role}\n{m.content}<|im_end|>")
                texts += [json.dumps({"name": c.name, "arguments": c.arguments}) for c in m.tool_calls]
    return texts


def train_tokenizer(vocab_size: int) -> Any:
    """A byte-level BPE tokenizer (any text encodes; nothing is ever unknown) with our chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   bos_token=None, unk_token=None)
    fast.chat_template = CHAT_TEMPLATE
    return fast
