"""ExpertPolicy: the reference agent, for SFT data (``muarl synth``) and as the baseline of every results table.

It plays each task with the domain's own teacher when the domain has one (``Domain.teacher``: a richer
script with the domain's wording and rules) and with the generic teacher otherwise
(:mod:`muarl.policies.teacher`), which needs only the task and the domain's declared tools, so
``--policy expert`` plays any domain. A task neither can play is an error naming the task, never a
conversation that cannot succeed.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

from muarl.policies.base import Policy
from muarl.policies.script import ANYTHING_ELSE, CONFIRM, TeacherSession
from muarl.policies.teacher import teacher_session

if TYPE_CHECKING:
    from muarl.domain import Domain
    from muarl.types import Task

__all__ = ["ANYTHING_ELSE", "CONFIRM", "ExpertPolicy"]  # the phrasing constants, where callers found them before


class ExpertPolicy(Policy):
    """The scripted reference agent. ``skip_confirmation`` writes without asking (the grader must flag it).

    ``slip_rate``: the chance that a teacher mistypes one value of an identity lookup, and (once more) of a
    proposal, then recovers (asks again and looks up again; proposes again and waits for a yes;
    :meth:`TeacherSession.slip`, :meth:`TeacherSession.confirm_write`), for a cold start that has seen
    what follows a failed lookup or a corrected proposal. Lookups slip in the domain teachers that call
    ``slip`` or ``identify`` (all three built-in ones do); proposals in every teacher that confirms through
    ``confirm_write``.
    """

    name = "expert"

    def __init__(self, skip_confirmation: bool = False, slip_rate: float = 0.0):
        if not 0 <= slip_rate <= 1:
            raise ValueError(f"slip_rate must be between 0 and 1 (got {slip_rate:g})")
        self.skip_confirmation = skip_confirmation
        self.slip_rate = slip_rate
        # the name results and comparisons are labelled with: the unsafe variant must not pass for the expert
        self.name = "expert-noconfirm" if skip_confirmation else "expert"

    def session(self, domain: Domain, task: Task, seed: int | None = None) -> TeacherSession:
        session = teacher_session(domain, task, self.skip_confirmation)
        session.slip_rate = self.slip_rate
        session.rng = random.Random(f"{task.id}:{seed}")
        return session
