"""The user-slip rates of finished evaluations, checked again with the current ``muarl.users.slips``.

Slips are found when an episode ends and stored in its trajectory; a run evaluated before a check changed
keeps the old verdicts. This reads each run directory's ``trajectories.jsonl`` and its ``config.json``
(the domain and split), finds the slips again, and prints the rates beside the stored ones ("-": a rate the
checks did not report when the run was evaluated). Nothing is written.

    python scripts/rescore_slips.py runs/ablate-llm-s0/eval/*/llm-runs-user-sft-model
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from muarl.domain import get_domain
from muarl.rollout import load_trajectories
from muarl.users.slips import SLIPS, episode_slips, slip_rates


def rescore(run: Path) -> tuple[dict[str, float | None], dict[str, float | None]]:
    """(stored rates, rates found again) over the run's trajectories that did not fault."""
    config = json.loads((run / "config.json").read_text())
    domain = get_domain(config["domain"])
    tasks = {t.id: t for split in ("train", "dev", "test") for t in domain.tasks(split)}
    trajs = [t for t in load_trajectories(run / "trajectories.jsonl").values() if not t.fault_kind]
    stored = slip_rates([t.metadata.get("user_slips") for t in trajs])
    again = slip_rates([episode_slips(domain, tasks[t.task_id], t) for t in trajs])
    return stored, again


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="evaluation run directories")
    args = parser.parse_args()
    keys = ["user_slip_rate", "user_candidate_slip_rate", "agent_caused_slip_rate", *(f"user_{kind}_rate" for kind in SLIPS)]
    for run in args.runs:
        stored, again = rescore(run)
        shown = ", ".join(f"{k.removeprefix('user_')[:-5]} {_fmt(stored.get(k))}->{_fmt(again.get(k))}" for k in keys
                          if again.get(k) is not None)
        print(f"{run}: {shown}")


if __name__ == "__main__":
    main()
