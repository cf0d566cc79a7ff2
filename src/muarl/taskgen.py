"""The shared machinery of seeded task generation: user splits, family sampling, gold verification.

A domain supplies *families*: functions that, given a random generator, the database and a user, draft
one task (scenario, instruction, gold actions computed by the domain's reference solver) or return None
when that user cannot host the family. This module turns families into a deterministic task set whose
splits never share a user, and replays every draft's gold actions so that no unsolvable task ships.
"""

from __future__ import annotations

import hashlib
import json
import random
import warnings
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from muarl.db import DBView
from muarl.types import SPLITS, Action, Scenario, Task

if TYPE_CHECKING:
    from muarl.domain import Domain

#: Fractions of users per split. Fixed per user id (not per seed), so extra training tasks generated
#: with another seed never borrow a test user.
SPLIT_FRACTIONS: Mapping[str, float] = {"train": 0.6, "dev": 0.1, "test": 0.3}


@dataclass
class Draft:
    """A family's proposal for one task, before it gets an id and a split."""

    scenario: Scenario
    instruction: str
    gold_actions: list[Action]
    required_outputs: list[str] = field(default_factory=list)
    context: dict[str, Any] = field(default_factory=dict)


Family = Callable[[random.Random, DBView, str], "Draft | None"]


class GenerationError(RuntimeError):
    pass


class FamilyShareWarning(UserWarning):
    """A family ran out of distinct tasks and got fewer than its weight asked for; the other families
    filled its place, so the task mix is not the one configured."""


class MissingFamilyWarning(UserWarning):
    """A split has no task of a family the train split has: whatever is measured on that split says
    nothing about that family, although a model is trained on it (so a family's failures there go unseen)."""


def user_split(user_id: str, fractions: Mapping[str, float] = SPLIT_FRACTIONS) -> str:
    """The split a user belongs to: a stable function of the id alone."""
    bucket = int.from_bytes(hashlib.sha256(user_id.encode()).digest()[:8], "big") / 2**64
    edge = 0.0
    for split in SPLITS:
        edge += fractions[split]
        if bucket < edge:
            return split
    return SPLITS[-1]


def generate(
    domain: Domain,
    seed: int,
    counts: Mapping[str, int],
    families: Mapping[str, tuple[float, Family]],
    users: Sequence[str],
    max_tries: int = 200,
) -> list[Task]:
    """Draft ``counts[split]`` verified tasks per split, cycling families by weight.

    Every draft's gold actions are replayed on a fresh env and must all succeed (a failure is a bug in
    the family and raises :class:`GenerationError`). A family that finds no new host is set aside; when
    all are, generation fails loudly instead of quietly shipping fewer tasks than asked. One that was set
    aside well below its weight's share is a :class:`FamilyShareWarning` naming it, asked against got.
    A split that got no task of a family the train split has (by the luck of the draw: a rare family in a
    small split) is one :class:`MissingFamilyWarning` for the whole task set, naming each split and family.
    """
    unknown = set(counts) - set(SPLITS)
    if unknown:
        raise ValueError(f"unknown split(s) {sorted(unknown)}; choose from {', '.join(SPLITS)}")
    pools: dict[str, list[str]] = {s: [] for s in SPLITS}
    for uid in sorted(users):
        pools[user_split(uid)].append(uid)
    names = sorted(families)
    weights = [families[n][0] for n in names]
    tasks: list[Task] = []
    short: list[str] = []  # families that ran out well below their share, reported once at the end
    for split in SPLITS:
        n = counts.get(split, 0)
        if n and not pools[split]:
            raise GenerationError(f"{domain.name}: no users fall in split {split!r}; grow the database")
        rng = random.Random(f"{domain.name}:{seed}:{split}")
        seen: set[str] = set()
        exhausted: set[str] = set()
        made = 0
        while made < n:
            live = [w if name not in exhausted else 0.0 for name, w in zip(names, weights, strict=True)]
            if not any(live):
                raise GenerationError(
                    f"{domain.name}: every family ran out of distinct tasks in split {split!r} after {made}; "
                    "grow the database (db_size) or ask for fewer tasks"
                )
            family = rng.choices(names, live)[0]
            draft = None
            for _ in range(max_tries):
                user = rng.choice(pools[split])
                # a fresh view per draft: a family that writes while exploring cannot leak into the next one
                candidate = families[family][1](rng, domain.database().view(), user)
                if candidate is None:
                    continue
                key = _signature(family, user, candidate)
                if key in seen:
                    continue
                draft = candidate
                break
            if draft is None:
                exhausted.add(family)
                continue
            seen.add(key)
            task = Task(
                id=f"{domain.name}-{split}-{seed}-{made:05d}",
                domain=domain.name,
                split=split,  # type: ignore[arg-type]
                family=family,
                user_id=user,
                scenario=draft.scenario,
                instruction=draft.instruction,
                gold_actions=draft.gold_actions,
                required_outputs=draft.required_outputs,
                context=draft.context,
            )
            verify_gold(domain, task)
            tasks.append(task)
            made += 1
        short += _short(split, n, dict(zip(names, weights, strict=True)), exhausted,
                        Counter(t.family for t in tasks if t.split == split))
    if short:
        warnings.warn(f"{domain.name}: task families ran out of distinct tasks below the share their weights "
                      f"asked, and the other families filled their place: {'; '.join(short)} "
                      "(grow the database with db_size, or lower their weights)", FamilyShareWarning, stacklevel=3)
    lacking = _lacking(tasks, counts, short)
    if lacking:
        warnings.warn(f"{domain.name}: split(s) without a task of a family the train split has, so they measure "
                      f"nothing of it: {'; '.join(lacking)} (ask for more tasks in those splits, or raise the "
                      "families' weights)", MissingFamilyWarning, stacklevel=3)
    return tasks


def _lacking(tasks: Sequence[Task], counts: Mapping[str, int], short: Sequence[str]) -> list[str]:
    """``split lacks a, b`` for each split asked for that has no task of a family the train split has.

    A family the share warning already named as run out in that split is left out: one warning per cause.
    """
    by_split: dict[str, set[str]] = {s: set() for s in SPLITS}
    for task in tasks:
        by_split[task.split].add(task.family)
    out = []
    for split in SPLITS:
        if split == "train" or not counts.get(split):
            continue
        missing = [f for f in sorted(by_split["train"] - by_split[split])
                   if not any(line.startswith(f"{f} in {split}:") for line in short)]
        if missing:
            out.append(f"{split} lacks {', '.join(missing)}")
    return out


#: a family that ran out is reported when it got less than this share of what its weight asked for
SHORT_OF_ASKED = 0.8


def _short(split: str, n: int, weights: Mapping[str, float], exhausted: set[str], got: Counter) -> list[str]:
    """``family in split: got G of about A asked`` for each family that ran out well below its share of ``n``.

    Why only those: a family that never ran out is short only by the luck of the draw, while one that
    ran out left its share to the others (say 387 of one family and 11 of another in 500 tasks), which
    changes what the task set measures without a word.
    """
    total = sum(weights.values())
    out = []
    for family in sorted(exhausted):
        asked = n * weights[family] / total if total else 0.0
        if got[family] < SHORT_OF_ASKED * asked:
            out.append(f"{family} in {split}: got {got[family]} of about {round(asked)} asked")
    return out


def verify_gold(domain: Domain, task: Task) -> None:
    """Raise if any gold action of ``task`` fails on a fresh env (a bug in the family, not the agent)."""
    env = domain.env(task)
    for action in task.gold_actions:
        record = env.run(action)
        if not record.ok:
            raise GenerationError(
                f"{task.id} ({task.family}): gold action {action.name}({json.dumps(action.arguments)}) "
                f"failed: {record.output}"
            )


def _signature(family: str, user: str, draft: Draft) -> str:
    """What makes a task instance distinct: who, what they want, and the expected outcome (not the persona)."""
    intents = [i.model_dump(exclude={"description"}) for i in draft.scenario.intents]
    payload = [family, user, [a.model_dump() for a in draft.gold_actions], draft.required_outputs, intents]
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()
