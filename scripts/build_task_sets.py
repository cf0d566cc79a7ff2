"""Regenerate the default task sets shipped inside the package (src/muarl/domains/*/tasks.json).

Run after changing a domain's data generator, tools or task families:
    python scripts/build_task_sets.py [retail airline telecom]
tests/test_tasks.py checks that every shipped set equals a fresh generation from its recorded seed.
"""

from __future__ import annotations

import sys

from muarl.domain import get_domain, save_tasks


def main(names: list[str]) -> None:
    for name in names or ["retail", "airline", "telecom"]:
        domain = get_domain(name)
        assert domain.tasks_file is not None, f"{name} ships no task file"
        tasks = domain.generate_tasks()
        save_tasks(tasks, domain.tasks_file, domain=name, seed=domain.task_seed, db_seed=domain.db_seed,
                   db_size=domain.db_size, counts=dict(domain.task_counts))
        print(f"{name}: wrote {len(tasks)} tasks to {domain.tasks_file}")


if __name__ == "__main__":
    main(sys.argv[1:])
