"""StaticUser (``--user static``): a task played as single-turn tool-use data plays it, without a dialogue.

MUA-RL's claim is that the simulated user *inside* the rollouts is what teaches an agent multi-turn tool use.
The ablation of that claim (``muarl ablate``) needs the same RL with the user taken out of the loop, which
is what single-turn tool-use RL data amounts to: the request arrives whole, with every fact it needs, and
nobody answers a question. This user is that, on any task with a structured :class:`~muarl.types.Scenario`:

- its **opening** states every fact of ``scenario.known`` (withheld ones too: nothing is kept back for the
  agent to ask about) and every intent, worded by the domain's own :class:`~muarl.users.script.UserScript`
  (``statements`` for the facts, ``request`` for the intents; an intent with ``first_args`` is stated as
  what the user finally wants, since there is no later turn to change its mind in);
- afterwards it says **yes** only to a proposal of a pending intent's action that matches what the user
  wants (the gold action; the script's own check), **no** to any other proposal, and to everything else a
  fixed "everything I know is in my first message": a question is never answered, so it adds nothing;
- it **stops** when the agent ends (says goodbye, transfers), when every intent is settled, when the agent refuses what it asked for (accepted at once: it does not insist),
  or after ``max_stale`` turns in a row that got it nowhere, as the scripted user does.

The one thing it does besides saying yes is act on its own **device** when the agent tells it to (dual-control
domains: a payment in the carrier app, a toggle), through the domain script's ``device_turn``, and report
what the device showed: a device's output cannot be stated in advance, and without it no agent could finish
those tasks with this user. Everything it says comes from the scenario and the domain's script; nothing here
names a domain.

It reuses the scripted user's conversation engine (:class:`~muarl.users.scripted.ScriptedSession`: its goals,
proposal checks, device steps and stopping), so the two users differ only in what is said when, which is
what the ablation measures.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from muarl.types import Task
from muarl.users.base import STOP, Act, UserReply
from muarl.users.phrases import NOT_TRANSFER, PROPOSAL, REFUSAL, TRANSFER, norm, says_value
from muarl.users.scripted import ScriptedSession, ScriptedUser, registered_domain

if TYPE_CHECKING:
    from muarl.domain import Domain

#: the agent ending the conversation: a goodbye, a wish for the rest of the day ("anything else?" is not an
#: end while an intent of the opening is pending: the answer is in the opening, and it gets "nothing to add")
ENDING = re.compile(r"\b(good ?bye|bye)\b|\bhave a (great|nice|good|wonderful|lovely) (day|one|trip|evening|flight)\b")
#: what it says to anything but a proposal: nothing new (paraphrases, chosen by the episode's seed)
NOTHING_TO_ADD = ("Everything I know is in my first message.", "I have told you all I know in my first message.",
                  "I have nothing to add to my first message.")


class StaticUser(ScriptedUser):
    """The non-interactive user; see the module docstring. Bound to a domain (:meth:`for_domain`) it words
    its opening with that domain's script; it plays the task's scenario itself, never a domain's stand-in
    user (a stand-in is another interactive user)."""

    name = "static"

    def session(self, task: Task, seed: int) -> StaticSession:
        return self.play(task, seed, self.domain if self.domain is not None else registered_domain(task.domain))

    def play(self, task: Task, seed: int, domain: Domain | None) -> StaticSession:
        if not task.scenario.intents:
            raise ValueError(f"the static user cannot play task {task.id!r} of {task.domain}: it has no structured "
                             "scenario (intents) to state")
        return StaticSession(task, seed, self.max_stale, self.max_replies, domain=domain)


class StaticSession(ScriptedSession):
    """One episode of the static user: the scripted session with nothing withheld, every mind already
    changed, and a reply that only confirms, declines, acts on the device or stops."""

    def __init__(self, task: Task, seed: int, max_stale: int = 6, max_replies: int = 40, *,
                 domain: Domain | None = None):
        super().__init__(task, seed, max_stale, max_replies, insist=0, domain=domain)
        self.withheld = set()
        for goal in self.goals:
            goal.changed_mind = goal.intent.first_args is not None  # the final wish, stated at once
            self.told.add(id(goal))

    def opening(self) -> str:
        """Every known fact, then every intent, in one message; a fact that an intent's wording already
        states verbatim is not said twice."""
        hello = self.rng.choice(["Hi.", "Hello.", "Hi there."])
        requests = [self.request(goal) for goal in self.goals]
        said = norm(" ".join(requests))
        facts = {key: str(value) for key, value in self.known.items() if not says_value(said, str(value))}
        return " ".join([hello, *self.script.statements(self, facts), *requests]).replace(",.", ",")

    async def start(self) -> UserReply:
        return UserReply(text=self.opening())

    def nothing_to_add(self) -> UserReply:
        return self.going_nowhere(self.rng.choice(NOTHING_TO_ADD))

    async def _respond(self, text: str, act: Act) -> UserReply:
        """This user's turn (``text``: the agent's words, normalised by the scripted session's ``reply``,
        which also turns an error of ours into a simulator fault and ends an overlong conversation)."""
        if not text.strip():
            return self.nothing_to_add()
        if TRANSFER.search(text) and not NOT_TRANSFER.search(text):
            return UserReply(text=f"Thank you. {STOP}", stop="transfer")
        self._settle_confirmed(text)
        confirmed = self._confirm(text)
        if confirmed is not None:
            return confirmed
        steps = await self.script.device_turn(self, text, act)
        if steps is not None:
            return steps
        if self.current is None:
            return await self._finish(act)
        settled = self._settle_refusal(text) or self._settle_answer(text)
        if settled:
            return self.stop("Alright, thank you.") if self.current is None else self.progress("Alright.")
        if ENDING.search(text):
            return self.stop("That's all, thank you.")
        return self.nothing_to_add()

    def _confirm(self, text: str) -> UserReply | None:
        """Yes to a proposal of a pending action that is what the user wants; no to any other proposal of
        one; None when ``text`` proposes none (a question, a report)."""
        if not PROPOSAL.search(text):
            return None
        about = [g for g in self.goals if g.status == "pending" and g.intent.action
                 and self.script.names_action(g.intent.action, text)]
        if not about:
            return None
        goal = about[0]
        verdict, _ = self.check_proposal(goal, text)
        if verdict != "ok":
            return self.going_nowhere("No.")
        goal.status = "confirmed"
        if not goal.intent.user_actions:
            goal.performed = []
        return self.progress(self.rng.choice(["Yes, please go ahead.", "Yes.", "Yes, please proceed."]))

    def _settle_refusal(self, text: str) -> bool:
        """The agent refuses the current intent: accepted at once (this user never insists)."""
        goal = self.current
        if goal is None or not REFUSAL.search(text):
            return False
        if not (goal.intent.out_of_policy or (goal.intent.action and goal.status == "pending")):
            return False
        goal.status = "done"
        return True

    def _settle_answer(self, text: str) -> bool:
        """The agent gives the current question's answer."""
        goal = self.current
        if goal is None or goal.intent.answer is None or not self.script.answered(goal, text):
            return False
        goal.status = "done"
        return True
