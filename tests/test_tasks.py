"""Task sets of every built-in domain: splits, reproducibility, solvability, coverage of the policy."""

import pytest

from muarl.domain import get_domain, load_tasks
from muarl.gold import gold_score
from muarl.taskgen import GenerationError, user_split
from muarl.types import SPLITS

DOMAINS = ["retail", "airline", "telecom"]
#: What every domain's task families must cover (issue 2): by family-name keyword.
REQUIRED_BEHAVIOURS = ["withheld", "change_of_mind", "out_of_policy", "multi", "info"]


@pytest.fixture(scope="module", params=DOMAINS)
def domain(request):
    return get_domain(request.param)


def test_splits_are_disjoint_by_user_and_by_task(domain):
    tasks = domain.tasks()
    users = {s: {t.user_id for t in tasks if t.split == s} for s in SPLITS}
    assert all(users[s] for s in SPLITS)
    assert not (users["train"] & users["dev"]) and not (users["train"] & users["test"]) and not (users["dev"] & users["test"])
    assert all(user_split(t.user_id) == t.split for t in tasks)
    assert len({t.id for t in tasks}) == len(tasks)
    bodies = {s: {t.model_dump_json(exclude={"id", "split"}) for t in tasks if t.split == s} for s in SPLITS}
    assert not (bodies["train"] & bodies["test"]) and not (bodies["train"] & bodies["dev"])


def test_shipped_default_set_is_reproducible_from_its_seed(domain):
    assert domain.tasks_file is not None and domain.tasks_file.exists()
    shipped = load_tasks(domain.tasks_file)
    fresh = domain.generate_tasks(seed=domain.task_seed, counts=domain.task_counts)
    assert [t.model_dump() for t in shipped] == [t.model_dump() for t in fresh]
    assert {s: sum(t.split == s for t in shipped) for s in SPLITS} == dict(domain.task_counts)


def test_every_default_task_scores_one_by_gold_replay(domain):
    for task in domain.tasks():
        reward = gold_score(domain, task).reward
        assert reward.reward == 1.0 and reward.tcr == 1.0, (task.id, reward.diff, reward.checks)
        assert reward.violations == [], (task.id, reward.violations)


def test_families_span_the_policy(domain):
    families = {t.family for t in domain.tasks()}
    for behaviour in REQUIRED_BEHAVIOURS:
        assert any(behaviour in f for f in families), f"{domain.name} has no {behaviour} family: {families}"
    for task in domain.tasks():
        assert task.instruction and task.scenario.persona and task.scenario.intents
        assert set(task.scenario.withheld) <= set(task.scenario.known)
        if any(i.out_of_policy for i in task.scenario.intents):
            assert not [a for a in task.gold_actions if a.actor == "agent" and domain.agent_tools[a.name].is_write]


def test_generation_is_deterministic_and_scales(domain):
    counts = {"train": 800, "dev": 100, "test": 100}
    a = domain.generate_tasks(seed=99, counts=counts)
    b = domain.generate_tasks(seed=99, counts=counts)
    c = domain.generate_tasks(seed=100, counts=counts)
    assert len(a) == 1000 and [t.model_dump() for t in a] == [t.model_dump() for t in b]
    assert [t.model_dump() for t in a] != [t.model_dump() for t in c]


def test_asking_for_an_unknown_split_is_a_clear_error(domain):
    with pytest.raises(ValueError, match="unknown split"):
        domain.generate_tasks(counts={"validation": 3})
    with pytest.raises(ValueError, match="unknown split"):
        domain.tasks("validation")


def test_a_database_too_small_fails_loudly_instead_of_shipping_fewer_tasks():
    from muarl.domain import Domain
    from muarl.taskgen import Draft, generate
    from muarl.types import Action, Intent, Scenario

    retail = get_domain("retail")
    tiny = Domain(name="tiny_retail", description="", policy="", tools=retail.tools, build_db=retail.build_db,
                  build_tasks=retail.build_tasks, owner_of=retail.owner_of, db_size=1)
    with pytest.raises(GenerationError, match="no users fall in split"):
        tiny.generate_tasks(counts={"train": 1, "dev": 1, "test": 1})

    def only_one(rng, db, user):  # a family with a single possible task per user
        return Draft(scenario=Scenario(persona="p", intents=[Intent(description="look")]), instruction="i",
                     gold_actions=[Action(name="list_all_product_types")])

    users = [f"user{i}" for i in range(30)]
    assert len(generate(retail, 0, {"train": 3}, {"one": (1.0, only_one)}, users)) == 3
    with pytest.raises(GenerationError, match="every family ran out of distinct tasks in split 'train' after"):
        generate(retail, 0, {"train": 200}, {"one": (1.0, only_one)}, users)


def test_a_bigger_database_yields_more_distinct_tasks():
    telecom = get_domain("telecom")
    big = telecom.with_database(size=600)
    assert big.database() is not telecom.database() and big.tasks_file is None
    assert len(big.database().tables["customers"]) == 600 and len(telecom.database().tables["customers"]) == 200
    tasks = big.generate_tasks(seed=3, counts={"train": 3000, "dev": 0, "test": 0})
    assert len(tasks) == 3000
    for task in tasks[::100]:
        assert gold_score(big, task).reward.reward == 1.0
