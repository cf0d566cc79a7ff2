"""Where a trained model's loss is on held-out conversations: identifier digits against everything else.

The expert plays ``--n`` tasks of a split against the scripted user; each conversation is tokenized
exactly as SFT tokenizes it, and the model's loss on every agent token is split into tokens that hold a
digit (order, user, item and payment ids, zips, amounts) and the rest. A model that learned the format
but cannot copy identifiers shows a low loss on the rest and a loss near or above chance on the digits,
which is what the README's demo status reports.

``--cut N`` scores conversations cut after the agent's N-th tool call, with a one-line system turn and
no tool schemas (about 200 tokens for N = 2), and ``--write-cut SRC DST`` writes a data set cut that way
for ``muarl sft``: the short-conversation probe of the README.

    python scripts/copy_diagnosis.py --model runs/demo/sft/model
    python scripts/copy_diagnosis.py --write-cut runs/demo/synth/sft_used.jsonl runs/short.jsonl --cut 2
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
from pathlib import Path

import torch

from muarl.domain import get_domain
from muarl.factory import make_policy, make_user
from muarl.models import load
from muarl.synth import synthesize
from muarl.train.sft import load_examples


def cut(record: dict, calls: int) -> dict:
    """A chat record cut after the agent's ``calls``-th tool call, with a one-line system turn and no tools."""
    messages = [{"role": "system", "content": "Help the user with their order."}]
    seen = 0
    for message in record["messages"][1:]:
        messages.append(message)
        seen += bool(message.get("tool_calls"))
        if seen == calls:
            break
    return {**record, "tools": [], "messages": messages}


def write_cut(src: Path, dst: Path, calls: int) -> None:
    lines = [json.dumps(cut(json.loads(line), calls)) for line in src.read_text(encoding="utf-8").splitlines() if line]
    dst.write_text("\n".join(lines) + "\n", encoding="utf-8")


def token_losses(model_path: str, domain: str, split: str, n: int, calls: int = 0) -> dict[str, list[float]]:
    """Per-agent-token losses, grouped into "digits" and "other" (``calls``: cut conversations, see :func:`cut`);
    "right" holds, per digit token, 1.0 where it is the model's most likely next token."""
    model, tokenizer = load(model_path)
    model.eval()
    with tempfile.TemporaryDirectory() as tmp:
        synthesize([get_domain(domain)], make_policy("expert"), make_user("scripted"), Path(tmp), split=split,
                   progress=False)
        data = Path(tmp) / "sft.jsonl"
        if calls:
            write_cut(data, data, calls)
        examples = load_examples([str(data)], tokenizer)[:n]
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="a checkpoint directory (or tiny / smollm2)")
    parser.add_argument("--domain", default="retail-lite")
    parser.add_argument("--split", default="test", help="the split whose tasks the expert plays (default test)")
    parser.add_argument("--n", type=int, default=40, help="conversations scored (default 40)")
    parser.add_argument("--cut", type=int, default=0, help="cut conversations after the agent's N-th tool call")
    parser.add_argument("--write-cut", nargs=2, metavar=("SRC", "DST"), help="write a cut copy of a data set, then exit")
    args = parser.parse_args()
    if args.write_cut:
        write_cut(Path(args.write_cut[0]), Path(args.write_cut[1]), args.cut or 2)
        return
    if not args.model:
        parser.error("--model is required")
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
