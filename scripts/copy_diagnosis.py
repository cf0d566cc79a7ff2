"""Where a trained model's loss is on held-out conversations: identifier digits against everything else.

The expert plays ``--n`` tasks of a split against the scripted user; each conversation is tokenized
exactly as SFT tokenizes it, and the model's loss on every agent token is split into tokens that hold a
digit (order, user, item and payment ids, zips, amounts) and the rest. A model that learned the format
but cannot copy identifiers shows a low loss on the rest and a loss near or above chance on the digits,
which is what the README's demo status reports.

``--args`` measures what decides an episode instead: for each tool-call argument (``first_name``,
``zip``, ``order_id``, ``item_ids`` ...), the share of values the model writes exactly right when fed the
conversation up to them (every token of the value its most likely next token). A call succeeds only if
all its values are right, so this is the number that has to approach 1 before the demo can succeed.

``--cut N`` scores conversations cut after the agent's N-th tool call, with a one-line system turn and
no tool schemas (about 200 tokens for N = 2), and ``--write-cut SRC DST`` writes a data set cut that way
for ``muarl sft``: the short-conversation probe of the README.

    python scripts/copy_diagnosis.py --model runs/demo/sft/model
    python scripts/copy_diagnosis.py --model runs/demo/sft/model --args
    python scripts/copy_diagnosis.py --write-cut runs/demo/synth/sft_used.jsonl runs/short.jsonl --cut 2
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
from pathlib import Path
from typing import Any

import torch

from muarl.domain import get_domain
from muarl.factory import make_policy, make_user
from muarl.models import load
from muarl.synth import map_records, prefix_record, synthesize
from muarl.train.sft import load_examples


def cut(record: dict, calls: int) -> dict:
    """A chat record cut after the agent's ``calls``-th tool call, with a one-line system turn and no tools
    (the probe of the README; the demo's ``sft-prefix`` stage keeps both: :func:`muarl.synth.prefix_record`)."""
    opening = prefix_record(record, calls)
    system = {"role": "system", "content": "Help the user with their order."}
    return {**opening, "tools": [], "messages": [system] + opening["messages"][1:]}


def write_cut(src: Path, dst: Path, calls: int) -> None:
    map_records(src, dst, lambda record: cut(record, calls))


def expert_conversations(folder: Path, domain: str, split: str, calls: int = 0) -> Path:
    """The expert's conversations with the scripted user on ``split``, as ``folder/sft.jsonl`` (cut after
    ``calls`` tool calls when nonzero, see :func:`cut`)."""
    synthesize([get_domain(domain)], make_policy("expert"), make_user("scripted"), folder, split=split, progress=False)
    data = folder / "sft.jsonl"
    if calls:
        write_cut(data, data, calls)
    return data


def token_losses(model_path: str, domain: str, split: str, n: int, calls: int = 0) -> dict[str, list[float]]:
    """Per-agent-token losses, grouped into "digits" and "other" (``calls``: cut conversations, see :func:`cut`);
    "right" holds, per digit token, 1.0 where it is the model's most likely next token."""
    model, tokenizer = load(model_path)
    model.eval()
    with tempfile.TemporaryDirectory() as tmp:
        examples = load_examples([str(expert_conversations(Path(tmp), domain, split, calls))], tokenizer)[:n]
    groups: dict[str, list[float]] = {"digits": [], "other": [], "right": []}
    for example in examples:
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([example.ids])).logits[0].float()
        logp = torch.log_softmax(logits, -1)
        for i in range(1, len(example.ids)):
            if example.mask[i]:
                kind = "digits" if re.search(r"\d", tokenizer.decode([example.ids[i]])) else "other"
                groups[kind].append(-float(logp[i - 1, example.ids[i]]))
                if kind == "digits":
                    groups["right"].append(float(int(logp[i - 1].argmax()) == example.ids[i]))
    return groups


def _values(arguments: Any) -> list[tuple[str, str]]:
    """(argument name, value as the template renders it) for every value of a call's arguments, lists flattened."""
    args = json.loads(arguments) if isinstance(arguments, str) else arguments
    return [(name, v if isinstance(v, str) else json.dumps(v)) for name, value in args.items()
            for v in (value if isinstance(value, list) else [value])]


def argument_copies(model: Any, tokenizer: Any, records: list[dict]) -> dict[str, list[bool]]:
    """Per argument name, one bool per value in ``records``' tool calls: did the model, fed the
    conversation up to that value, predict every one of its tokens as its most likely next token?"""
    out: dict[str, list[bool]] = {}
    for record in records:
        text = tokenizer.apply_chat_template(record["messages"], tools=record.get("tools") or None, tokenize=False)
        encoded = tokenizer(text, return_offsets_mapping=True, add_special_tokens=False)
        ids, spans = encoded["input_ids"], encoded["offset_mapping"]
        with torch.no_grad():
            predicted = model(input_ids=torch.tensor([ids])).logits[0].argmax(-1).tolist()
        at = 0
        for message in record["messages"]:
            for call in message.get("tool_calls") or []:
                at = text.index(f'"name": "{call["function"]["name"]}"', at)
                for name, value in _values(call["function"]["arguments"]):
                    start = text.index(value, at)
                    at = start + len(value)
                    tokens = [i for i, (a, b) in enumerate(spans) if a < at and b > start and i > 0]
                    out.setdefault(name, []).append(all(predicted[i - 1] == ids[i] for i in tokens))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="a checkpoint directory (or tiny / smollm2)")
    parser.add_argument("--domain", default="retail-lite")
    parser.add_argument("--split", default="test", help="the split whose tasks the expert plays (default test)")
    parser.add_argument("--n", type=int, default=40, help="conversations scored (default 40)")
    parser.add_argument("--cut", type=int, default=0, help="cut conversations after the agent's N-th tool call")
    parser.add_argument("--args", action="store_true", help="per tool-call argument: share of values copied exactly")
    parser.add_argument("--write-cut", nargs=2, metavar=("SRC", "DST"), help="write a cut copy of a data set, then exit")
    args = parser.parse_args()
    if args.write_cut:
        write_cut(Path(args.write_cut[0]), Path(args.write_cut[1]), args.cut or 2)
        return
    if not args.model:
        parser.error("--model is required")
    if args.args:
        model, tokenizer = load(args.model)
        with tempfile.TemporaryDirectory() as tmp:
            data = expert_conversations(Path(tmp), args.domain, args.split, args.cut)
            lines = data.read_text(encoding="utf-8").splitlines()[:args.n]
        copies = argument_copies(model, tokenizer, [json.loads(line) for line in lines])
        print(f"{args.model} on {len(lines)} {args.domain} {args.split} conversations: values written exactly right")
        print("| argument | values | exactly right |")
        print("|---|---|---|")
        for name, right in sorted(copies.items()):
            print(f"| {name} | {len(right)} | {sum(right) / len(right):.3f} |")
        return
    groups = token_losses(args.model, args.domain, args.split, args.n, args.cut)
    right = groups.pop("right")
    total = sum(sum(v) for v in groups.values())
    what = f"cut after {args.cut} tool calls" if args.cut else "whole"
    print(f"{args.model} on {args.n} {args.domain} {args.split} conversations, {what} (nats per agent token)")
    print("| tokens | count | mean loss | share > 1 nat | share of all loss |")
    print("|---|---|---|---|---|")
    for kind, values in groups.items():
        v = torch.tensor(values or [0.0])
        print(f"| {kind} | {len(values)} | {v.mean():.3f} | {(v > 1).float().mean():.3f} | {v.sum() / total:.3f} |")
    print(f"digit tokens that are the model's most likely next token: {sum(right) / max(len(right), 1):.3f}")


if __name__ == "__main__":
    main()
