"""Where a trained model's loss is on held-out conversations: identifier digits against everything else.

The expert plays ``--n`` tasks of a split against the scripted user; each conversation is tokenized
exactly as SFT tokenizes it, and the model's loss on every agent token is split into tokens that hold a
digit (order, user, item and payment ids, zips, amounts) and the rest. A model that learned the format
but cannot copy identifiers shows a low loss on the rest and a loss near or above chance on the digits,
which is what the README's demo status reports.

    python scripts/copy_diagnosis.py --model runs/demo/sft/model
"""

from __future__ import annotations

import argparse
import re
import tempfile
from pathlib import Path

import torch

from muarl.domain import get_domain
from muarl.factory import make_policy, make_user
from muarl.models import load
from muarl.synth import synthesize
from muarl.train.sft import load_examples


def token_losses(model_path: str, domain: str, split: str, n: int) -> dict[str, list[float]]:
    """Per-agent-token losses, grouped into "digits" and "other"."""
    model, tokenizer = load(model_path)
    model.eval()
    with tempfile.TemporaryDirectory() as tmp:
        synthesize([get_domain(domain)], make_policy("expert"), make_user("scripted"), Path(tmp), split=split,
                   progress=False)
        examples = load_examples([str(Path(tmp) / "sft.jsonl")], tokenizer)[:n]
    groups: dict[str, list[float]] = {"digits": [], "other": []}
    for example in examples:
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([example.ids])).logits[0].float()
        logp = torch.log_softmax(logits, -1)
        for i in range(1, len(example.ids)):
            if example.mask[i]:
                kind = "digits" if re.search(r"\d", tokenizer.decode([example.ids[i]])) else "other"
                groups[kind].append(-float(logp[i - 1, example.ids[i]]))
    return groups


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a checkpoint directory (or tiny / smollm2)")
    parser.add_argument("--domain", default="retail-lite")
    parser.add_argument("--split", default="test", help="the split whose tasks the expert plays (default test)")
    parser.add_argument("--n", type=int, default=40, help="conversations scored (default 40)")
    args = parser.parse_args()
    groups = token_losses(args.model, args.domain, args.split, args.n)
    total = sum(sum(v) for v in groups.values())
    print(f"{args.model} on {args.n} {args.domain} {args.split} conversations (nats per agent token)")
    print("| tokens | count | mean loss | share > 1 nat | share of all loss |")
    print("|---|---|---|---|---|")
    for kind, values in groups.items():
        v = torch.tensor(values or [0.0])
        print(f"| {kind} | {len(values)} | {v.mean():.3f} | {(v > 1).float().mean():.3f} | {v.sum() / total:.3f} |")


if __name__ == "__main__":
    main()
