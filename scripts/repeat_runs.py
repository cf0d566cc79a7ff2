"""Run one synchronous ``muarl grpo`` command several times beside a CPU hog and compare the runs.

    python scripts/repeat_runs.py --runs 5 -- --model tiny --domain retail --preset tiny --steps 6 \
        --tasks-per-step 2 --group-size 2

Every run gets its own ``--out`` (under ``--root``, default a temporary folder) and the same arguments
otherwise; they run side by side (``--parallel``, default all at once) with a process spinning on one core
beside them, so what can differ between them is timing alone (issue 60). Compared: every step's metrics
(the measured ones, :func:`muarl.time_split.is_timing`, left out), every step's episodes (tokens, sampled
log-probs, rewards, advantages) and the SHA-256 of the final weights. Exit status 0 when all runs agree.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from muarl.train.run import computed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--parallel", type=int, default=0, help="runs at a time (default: all)")
    parser.add_argument("--root", help="where the runs go (default: a temporary folder, removed after)")
    parser.add_argument("grpo", nargs=argparse.REMAINDER, help="-- then muarl grpo's arguments, without --out")
    args = parser.parse_args()
    grpo = [a for a in args.grpo if a != "--"]
    if "--out" in grpo:
        parser.error("leave --out out: every run gets its own")
    with tempfile.TemporaryDirectory(prefix="muarl-repeat-") as scratch:
        root = Path(args.root or scratch)
        hog = subprocess.Popen([sys.executable, "-c", "while 1: pass"])
        began = time.monotonic()
        try:
            outs = [root / f"run{i}" for i in range(args.runs)]
            width = args.parallel or args.runs
            for start in range(0, args.runs, width):
                procs = [subprocess.Popen([sys.executable, "-m", "muarl", "grpo", *grpo, "--out", str(out),
                                           "--no-progress", "--report-to", "none"],
                                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                         for out in outs[start:start + width]]
                for proc in procs:
                    _, err = proc.communicate()
                    if proc.returncode:
                        print(err[-3000:], file=sys.stderr)
                        return 1
        finally:
            hog.kill()
            hog.wait()
        first, *others = [computed(out) for out in outs]
        same = [other == first for other in others]
        print(f"{args.runs} runs of `muarl grpo {' '.join(grpo)}` beside a CPU hog in "
              f"{time.monotonic() - began:.0f} s: {len(first['metrics'])} steps, final weights {first['weights'][:16]}")
        for i, other in enumerate(others, 1):
            for key in ("metrics", "episodes", "weights"):
                print(f"run {i} vs run 0, {key}: {'same' if other[key] == first[key] else 'DIFFERENT'}")
        print("identical" if all(same) else "runs differ")
        return 0 if all(same) else 1


if __name__ == "__main__":
    sys.exit(main())
