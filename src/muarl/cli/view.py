"""``muarl view RUN_DIR``: a run directory as one self-contained HTML report (:mod:`muarl.report.html`)."""

from __future__ import annotations

import argparse
from pathlib import Path

NAME = "view"
HELP = "write a self-contained HTML report of a run directory"
DESCRIPTION = ("Curves, evaluation tables, and every trajectory as agent / user / tools swimlanes with its reward "
               "breakdown and database diff against gold; for training runs the loss-mask overlay on tokens and "
               "groups side by side.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", type=Path, help="a directory written by muarl rollout / eval / synth / sft / grpo")
    p.add_argument("--out", type=Path, help="the HTML file to write (default: RUN_DIR/report.html)")
    p.add_argument("--open", action="store_true", help="open the report in the default web browser")
    p.add_argument("--tokenizer", help="checkpoint (or tiny / smollm2) to decode token ids with "
                                       "(default: RUN_DIR/model, then config.json's model)")
    p.add_argument("--max-trajectories", type=int, default=5000,
                   help="embed at most this many (the first and last halves); 0 = all (default 5000)")
    p.add_argument("--compress", choices=["auto", "always", "never"], default="auto",
                   help="gzip + base64 the embedded data (auto: when it exceeds 256 KiB)")


def run(args: argparse.Namespace) -> int:
    """Build the report, print its path, optionally open it in the default browser."""
    import webbrowser

    from rich.console import Console

    from muarl.report.html import build_report

    console = Console(stderr=True)
    with console.status(f"building the report of {args.run_dir}"):
        path = build_report(args.run_dir, args.out, tokenizer=args.tokenizer,
                            max_trajectories=args.max_trajectories, compress=args.compress)
    size = path.stat().st_size
    console.print(f"report: {size / 1024:.0f} KiB")
    print(path.resolve())
    if args.open:
        webbrowser.open(path.resolve().as_uri())
    return 0
