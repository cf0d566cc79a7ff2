"""Turn conversations into training tokens exactly the way an episode builds them.

SFT must teach the model the same token sequences it will later sample from and be trained on in RL, so
a conversation is tokenized with the same append-only builder as an episode: the opening prompt, then
for each assistant turn its rendered tokens up to and including the end-of-turn token (the only tokens
with loss), then the rendered delta of the messages that follow. An assistant turn can be kept out of the
loss (``untrained``: a data set's ``"weight": 0``, OpenAI's fine-tuning convention): it stays in the
context the later turns learn from, so a deliberate mistake can show what follows it without teaching it.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from muarl.chat import ChatFormat
from muarl.types import Message


@dataclass
class Example:
    """One training sequence: token ids and a mask that is 1 on the tokens the model should learn."""

    ids: list[int]
    mask: list[int]

    def __len__(self) -> int:
        return len(self.ids)


def tokenize_conversation(chat: ChatFormat, messages: list[Message], untrained: Collection[int] = ()) -> Example:
    """Tokens and loss mask of a conversation (system, user, then any mix of assistant/user/tool turns);
    the assistant messages at the indices in ``untrained`` get no loss."""
    first = next((i for i, m in enumerate(messages) if m.role == "assistant"), len(messages))
    if first == 0:
        raise ValueError("a conversation must open with at least one non-assistant message")
    if first == len(messages):
        raise ValueError("a conversation without an assistant turn has nothing to learn from")
    ids = chat.prompt_ids(messages[:first])
    mask = [0] * len(ids)
    history = list(messages[:first])
    i = first
    while i < len(messages):
        assistant = messages[i]
        before = chat.render(history, add_generation_prompt=True)
        after = chat.render(history + [assistant])
        if not after.startswith(before):
            raise ValueError("the chat template renders an assistant turn in a way that is not append-only")
        turn = after[len(before):]
        end = turn.rfind(chat.end_text)
        turn = turn[: end + len(chat.end_text)] if end >= 0 else turn
        sampled = chat.encode(turn)
        ids += sampled
        mask += [0 if i in untrained else 1] * len(sampled)
        history.append(assistant)
        j = i + 1
        while j < len(messages) and messages[j].role != "assistant":
            j += 1
        if i + 1 < j < len(messages):  # messages after the last assistant turn teach nothing: dropped
            delta, _ = chat.delta_ids(history, messages[i + 1:j])
            ids += delta
            mask += [0] * len(delta)
            history += messages[i + 1:j]
        i = j
    return Example(ids=ids, mask=mask)
