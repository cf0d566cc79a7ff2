"""The skipped tests of CI's pytest runs, counted by reason: ``python .ci/skipped.py NAME=JUNIT.xml ...``.

Read from each run's ``--junitxml`` report (the same for the main environment and the vLLM virtualenv,
whose pytest may differ). ``--none NAME``: a skip in run NAME is an error (exit 1): the vLLM virtualenv
exists to run tests/test_vllm.py, so a test skipped there did not run anywhere.
"""

from __future__ import annotations

import argparse
import ast
import os
import sys
import xml.etree.ElementTree as ET
from collections import Counter


def skips(path: str) -> Counter[str]:
    """Skipped test cases of one JUnit XML report, counted by reason (pytest's "reason" text). A module
    skipped as a whole is one entry whose text is ``repr((path, line, "Skipped: reason"))``."""
    counts: Counter[str] = Counter()
    for case in ET.parse(path).getroot().iter("testcase"):
        for skipped in case.iter("skipped"):
            reason = skipped.get("message") or ""
            if reason == "collection skipped":
                try:
                    where, _, text = ast.literal_eval(skipped.text or "")
                    reason = f"{text.removeprefix('Skipped: ')} (the whole module {os.path.relpath(where)})"
                except (ValueError, SyntaxError, TypeError):
                    reason = f"a whole module: {skipped.text}"
            counts[reason.strip() or "(no reason given)"] += 1
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("runs", nargs="+", metavar="NAME=JUNIT.xml")
    parser.add_argument("--none", action="append", default=[], metavar="NAME", help="a skip in this run fails")
    args = parser.parse_args(argv)
    bad = []
    print("ci: skipped tests by reason")
    for run in args.runs:
        name, _, path = run.partition("=")
        if not os.path.isfile(path):  # pytest stopped before writing it: its own output says why
            print(f"  {name}: no report at {path}")
            bad.append(name)
            continue
        counts = skips(path)
        print(f"  {name}: {sum(counts.values())} skipped")
        for reason, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
            print(f"    {n:4d}  {reason}")
        if counts and name in args.none:
            bad.append(name)
    for name in bad:
        print(f"ci: error: the {name} run skipped tests or wrote no report; every test must run there",
              file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
