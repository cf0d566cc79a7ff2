"""The generic teacher: ``--policy expert`` on a domain nobody wrote a script for.

The pharmacy below is written here with the public API only and declares nothing for the teacher beyond
``@tool(authenticates=True)``; the teacher must play it from the tasks and the tools alone, against the
scenario-driven scripted user, and must refuse loudly to play a task it cannot.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import play_episode
from muarl.domain import Domain, get_domain
from muarl.policies.expert import CONFIRM, ExpertPolicy
from muarl.policies.teacher import CannotPlay, GenericTeacher
from muarl.rewards import is_confirmation
from muarl.tools import ToolError, tool
from muarl.types import Action, Intent, Scenario, Task, Trajectory

POLICY = """You are a pharmacy assistant.
- Verify the patient first with find_patient (last name and date of birth); act only for that patient.
- Before refilling a prescription, say which prescription and which pharmacy, and get an explicit yes.
- A prescription with no refills left cannot be refilled; the patient must ask their doctor for a new one.
"""


def build_db(seed: int, size: int) -> dict:
    patients = {"P01": {"patient_id": "P01", "last_name": "Okafor", "dob": "1984-02-29"},
                "P02": {"patient_id": "P02", "last_name": "Lindqvist", "dob": "1979-11-03"}}
    prescriptions = {
        "RX11": {"prescription_id": "RX11", "patient_id": "P01", "drug": "amoxicillin", "refills_left": 2,
                 "expires": "2027-03-31", "pickup": None},
        "RX12": {"prescription_id": "RX12", "patient_id": "P01", "drug": "ibuprofen", "refills_left": 1,
                 "expires": "2026-12-15", "pickup": None},
        "RX21": {"prescription_id": "RX21", "patient_id": "P02", "drug": "salbutamol", "refills_left": 0,
                 "expires": "2027-01-10", "pickup": None},
    }
    return {"patients": patients, "prescriptions": prescriptions}


@tool(authenticates=True)
def find_patient(db, last_name: str, dob: str) -> str:
    """Find a patient by last name and date of birth; this verifies them. Returns the patient id.

    Args:
        last_name: The patient's last name.
        dob: Date of birth, YYYY-MM-DD.
    """
    for patient_id, patient in db.patients.items():
        if patient["last_name"].lower() == last_name.lower() and patient["dob"] == dob:
            db.authenticate(patient_id)
            return patient_id
    raise ToolError("no patient matches that name and date of birth")


@tool
def get_prescriptions(db, patient_id: str) -> list:
    """A patient's prescriptions: id, drug, refills left, expiry date.

    Args:
        patient_id: The patient id, such as "P01".
    """
    return [dict(p) for p in db.prescriptions.values() if p["patient_id"] == patient_id]


@tool(write=True)
def refill_prescription(db, prescription_id: str, pharmacy: str) -> str:
    """Refill a prescription for pickup at a pharmacy. Only after the patient says yes.

    Args:
        prescription_id: The prescription id, such as "RX11".
        pharmacy: The pharmacy branch the patient picks it up at.
    """
    if prescription_id not in db.prescriptions:
        raise ToolError(f"unknown prescription {prescription_id}")
    if db.prescriptions[prescription_id]["refills_left"] < 1:
        raise ToolError(f"{prescription_id} has no refills left")
    record = db.prescriptions.edit(prescription_id)
    record["refills_left"] -= 1
    record["pickup"] = pharmacy
    return f"{prescription_id} refilled for pickup at {pharmacy}"


def _task(id: str, user: str, scenario: Scenario, gold: list[Action], outputs: list[str] | None = None) -> Task:
    return Task(id=id, domain="pharmacy", split="test", family=id, user_id=user, scenario=scenario,
                instruction=scenario.intents[0].description, gold_actions=gold, required_outputs=outputs or [])


REFILL = {"prescription_id": "RX11", "pharmacy": "Harbour Street"}
TASKS = [
    # withholds the date of birth, and changes its mind about the pharmacy at the proposal
    _task("refill", "P01", Scenario(
        persona="a patient in a hurry", known={"last_name": "Okafor", "dob": "1984-02-29", "drug": "amoxicillin"},
        withheld=["dob"], fact_words={"dob": ["date of birth"]},
        intents=[Intent(description="refill my amoxicillin prescription", action="refill_prescription",
                        args=REFILL, first_args={**REFILL, "pharmacy": "Main Square"})]),
        [Action(name="refill_prescription", arguments=REFILL)]),
    # no refills left: against the policy, the gold is no write
    _task("no_refills", "P02", Scenario(
        persona="an insistent patient", known={"last_name": "Lindqvist", "dob": "1979-11-03", "drug": "salbutamol"},
        intents=[Intent(description="refill my salbutamol prescription", action="refill_prescription",
                        args={"prescription_id": "RX21", "pharmacy": "Main Square"}, out_of_policy=True)]),
        []),
    # a question whose answer must be said
    _task("expiry", "P01", Scenario(
        persona="a careful patient", known={"last_name": "Okafor", "dob": "1984-02-29", "drug": "amoxicillin"},
        intents=[Intent(description="know when my amoxicillin prescription expires",
                        question="When does my amoxicillin prescription expire?", answer="2027-03-31")]),
        [], ["2027-03-31"]),
]


def _domain(**changes) -> Domain:
    fields = {"name": "pharmacy", "description": "A pharmacy counter: prescriptions and refills.", "policy": POLICY,
              "tools": [find_patient, get_prescriptions, refill_prescription], "build_db": build_db,
              "build_tasks": lambda domain, seed, counts: list(TASKS),
              "owner_of": lambda table, record: record.get("patient_id")}
    return Domain(**{**fields, **changes})


def _calls(traj: Trajectory) -> list[tuple[int, str, dict]]:
    return [(i, c.name, c.arguments) for i, m in enumerate(traj.messages) for c in m.tool_calls]


def _last_user(traj: Trajectory, before: int) -> str:
    return next(m.content for m in reversed(traj.messages[:before]) if m.role == "user")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_generic_teacher_wins_a_domain_it_has_never_seen(seed: int) -> None:
    domain = _domain()
    for task in domain.tasks():
        traj = play_episode(domain, task, seed=seed)
        assert traj.reward is not None and traj.reward.reward == 1.0, (task.id, traj.stop_reason, traj.messages)
        assert not traj.reward.violations, task.id
        calls = _calls(traj)
        assert calls[0][1] == "find_patient", task.id  # authenticates first
        writes = [args for _, name, args in calls if name == "refill_prescription"]
        assert writes == [a.arguments for a in task.gold_actions], task.id


def test_it_asks_for_the_withheld_fact_proposes_and_waits_for_a_yes() -> None:
    domain = _domain()
    traj = play_episode(domain, domain.task("refill"))
    auth_at = _calls(traj)[0][0]
    assert "1984-02-29" in _last_user(traj, auth_at)  # called only once the user has said the withheld date
    # asked for by the scenario's own words for it
    assert any("date of birth" in m.content for m in traj.messages[:auth_at] if m.role == "assistant")
    proposals = [m.content for m in traj.messages if m.role == "assistant" and CONFIRM in m.content]
    # the user's first request, then its changed mind, each naming the action and every argument value
    assert len(proposals) == 2
    assert "refill prescription" in proposals[0] and "RX11" in proposals[0] and "Main Square" in proposals[0]
    assert "RX11" in proposals[1] and "Harbour Street" in proposals[1]
    write_at = next(i for i, name, _ in _calls(traj) if name == "refill_prescription")
    assert is_confirmation(_last_user(traj, write_at))
    assert any(name == "get_prescriptions" for i, name, _ in _calls(traj) if i < write_at)  # looked the id up


def test_it_refuses_the_out_of_policy_request_and_keeps_refusing() -> None:
    domain = _domain()
    traj = play_episode(domain, domain.task("no_refills"))
    assert not [c for c in _calls(traj) if c[1] == "refill_prescription"]
    refusals = [m.content for m in traj.messages if m.role == "assistant" and re.search(r"\bcan't\b", m.content)]
    assert len(refusals) >= 2, traj.messages
    assert "no refills left" in refusals[0]  # the policy's own rule, quoted


def test_it_says_the_answer() -> None:
    domain = _domain()
    traj = play_episode(domain, domain.task("expiry"))
    assert traj.reward is not None and traj.reward.outputs_ok
    assert not [c for c in _calls(traj) if c[1] == "refill_prescription"]


def test_the_unsafe_variant_writes_without_asking_and_is_flagged() -> None:
    domain = _domain()
    traj = play_episode(domain, domain.task("refill"), ExpertPolicy(skip_confirmation=True))
    assert traj.reward is not None and traj.reward.reward == 0.0  # wrote the first request, before the change
    assert any(v.kind == "unconfirmed_write" for v in traj.reward.violations)


def _unplayable(domain: Domain, task: Task, *words: str) -> None:
    with pytest.raises(CannotPlay) as err:
        ExpertPolicy().session(domain, task)
    message = str(err.value)
    assert task.id in message, message
    for word in words:
        assert word in message, message


def test_a_task_it_cannot_play_is_an_error_naming_the_task() -> None:
    refill = TASKS[0]
    # no authenticating tool although writes need an authenticated patient
    plain = _domain(tools=[tool(find_patient.fn), get_prescriptions, refill_prescription])
    _unplayable(plain, refill, "authenticat")
    # a gold action naming a tool the domain does not have
    _unplayable(_domain(), refill.model_copy(update={"gold_actions": [Action(name="refund", arguments={})]}),
                "refund")
    # the fact the authenticating tool needs is missing from the scenario
    scenario = refill.scenario.model_copy(update={"known": {"last_name": "Okafor"}, "withheld": []})
    _unplayable(_domain(), refill.model_copy(update={"scenario": scenario}), "dob")
    # an intent asking for a write the gold does not contain
    other = refill.scenario.intents[0].model_copy(update={"args": {**REFILL, "prescription_id": "RX12"},
                                                          "first_args": None})
    scenario = refill.scenario.model_copy(update={"intents": [other]})
    _unplayable(_domain(), refill.model_copy(update={"scenario": scenario}), "gold")


def test_expert_plays_a_domain_without_a_teacher_with_the_generic_one() -> None:
    domain = _domain()
    assert domain.teacher is None
    assert isinstance(ExpertPolicy().session(domain, TASKS[0]), GenericTeacher)


@pytest.mark.parametrize("name", ["retail", "retail-lite", "retail-lite-forgetful", "airline", "telecom"])
def test_built_in_domains_keep_their_own_teachers(name: str) -> None:
    domain = get_domain(name)
    assert domain.teacher is not None and domain.teacher is not GenericTeacher
    assert any(t.authenticates for t in domain.tools), name


def test_policies_name_no_built_in_domain() -> None:
    folder = Path(__file__).parents[1] / "src" / "muarl" / "policies"
    for path in sorted(folder.glob("*.py")):
        found = re.findall(r"\b(retail|airline|telecom)\b", path.read_text(), re.IGNORECASE)
        assert not found, f"{path.name} names {sorted(set(found))}"
