"""Copy a ``muarl pretrain`` run's model into the package (``src/muarl/base/``), with its training curve.

    python scripts/ship_base.py runs/base

Writes the HF checkpoint files, ``curve.jsonl`` (the loss every 50 steps and every copy probe) and
``card.json`` (the run's config, steps, seconds and last probe), which docs/base_model.md describes.
A run that continued a shipped base (``--model`` a folder with its own ``card.json`` and ``curve.jsonl``)
ships as a later stage of it: the curve goes on from the earlier stages' last step, and the card keeps
the earlier card under ``continues``.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
         "chat_template.jinja")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", help="a finished muarl pretrain run directory")
    parser.add_argument("--to", default=str(Path(__file__).resolve().parents[1] / "src" / "muarl" / "base"))
    args = parser.parse_args()
    run, to = Path(args.run), Path(args.to)
    if not (run / "model" / "model.safetensors").exists():
        raise SystemExit(f"{run} has no finished model (run muarl pretrain to the end first)")
    config = json.loads((run / "config.json").read_text())
    earlier = Path(config.get("model") or "")
    card_before = json.loads((earlier / "card.json").read_text()) if (earlier / "card.json").is_file() else None
    curve_before = [json.loads(line) for line in (earlier / "curve.jsonl").read_text().splitlines()
                    if line.strip()] if card_before else []
    offset = card_before["steps"] if card_before else 0
    to.mkdir(parents=True, exist_ok=True)
    for name in FILES:
        if (run / "model" / name).exists():
            shutil.copyfile(run / "model" / name, to / name)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    curve = curve_before + [{"step": r["step"] + offset, **{k: r[k] for k in ("loss", "probe_loss", "copy_accuracy")
                                                             if k in r}}
                            for r in rows if r["step"] % 50 == 0 or "copy_accuracy" in r]
    (to / "curve.jsonl").write_text("".join(json.dumps(c) + "\n" for c in curve))
    probes = [r for r in rows if "copy_accuracy" in r]
    card = {"config": config, "steps": offset + len(rows),
            "conversations": rows[-1]["conversations"] + (card_before["conversations"] if card_before else 0),
            "last_probe": probes[-1] if probes else None}
    if card_before:
        card["continues"] = card_before
    (to / "card.json").write_text(json.dumps(card, indent=1) + "\n")
    print(f"shipped {run / 'model'} -> {to} ({sum(f.stat().st_size for f in to.iterdir()) / 1e6:.1f} MB)")


if __name__ == "__main__":
    main()
