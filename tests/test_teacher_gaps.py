"""The generic teacher's silent gaps (issue 33, item 3), each shown on a deliberately broken variant of the
lending library (``tests/library_domain.py``).

The generic teacher writes the cold-start data for domains nobody wrote a script for, so what it does is
what a model learns. Each gap below once played on quietly and taught the wrong thing: an id proposed
that nothing had shown, a refusal quoting the wrong rule, a login as nobody, a write statement sent to a
read tool, and a task set whose test split silently lacked a family the train split has.
"""

from __future__ import annotations

import dataclasses
import random
import re
import warnings

import pytest

import library_domain as lib
from conftest import play_episode
from muarl.domain import Domain
from muarl.policies.expert import ExpertPolicy
from muarl.policies.teacher import CannotPlay, identifiers, policy_rule
from muarl.taskgen import Draft, FamilyShareWarning, MissingFamilyWarning, generate
from muarl.tools import ToolError, tool
from muarl.types import Action, Intent, Scenario, Trajectory


def _variant(name: str, families: dict, tools: list | None = None, **changes) -> Domain:
    """The library with other tools and task families (a fresh task set of 6 train tasks)."""
    users = sorted(lib.domain.database().tables["members"])
    fields = {"name": name, "tools": tools or lib.domain.tools, "task_counts": {"train": 6, "dev": 0, "test": 0},
              "build_tasks": lambda d, seed, counts: generate(d, seed, counts, families, users)}
    return dataclasses.replace(lib.domain, **{**fields, **changes})


def _calls(traj: Trajectory) -> list[tuple[str, dict]]:
    return [(c.name, c.arguments) for m in traj.messages for c in m.tool_calls]


def _cannot_play(traj: Trajectory, *words: str) -> None:
    """The teacher stopped the episode with CannotPlay naming ``words``, having said nothing it had to make up."""
    fault = traj.metadata.get("fault")
    assert fault and traj.stop_reason == "policy_fault", (traj.stop_reason, traj.reward, traj.messages)
    assert "CannotPlay" in fault["message"] and traj.task_id in fault["message"], fault["message"]
    for word in words:
        assert word in fault["message"], fault["message"]


# -- 1. an identifier nothing showed ------------------------------------------------------------------------
def reserve_by_title(rng: random.Random, db, member_id: str) -> Draft | None:
    """The member names a book it has not borrowed by its title only: its id has to be searched for."""
    borrowed = {loan["book_id"] for loan in lib._loans(db, member_id)}
    free = sorted(b for b, rec in db.books.items() if member_id not in rec["reserved_by"] and b not in borrowed)
    if not free:
        return None
    book = rng.choice(free)
    title = db.books[book]["title"]
    args = {"member_id": member_id, "book_id": book}
    return Draft(
        scenario=Scenario(persona="a reader", known={**lib._known(db, member_id), "book_title": title},
                          intents=[Intent(description=f"reserve {title}", action="reserve_book", args=args,
                                          say="Please reserve {book_title} for me.")]),
        instruction=f"You want to reserve '{title}'.",
        gold_actions=[Action(name="reserve_book", arguments=args)],
    )


@tool
def search_books_optional(db, title: str = "") -> list:
    """Books whose title contains the text (all books without one).

    Args:
        title: Part of the title.
    """
    return lib.search_books.fn(db, title)


@tool
def book_details(db, book_id: str) -> dict:
    """One book by id.

    Args:
        book_id: The book id, such as "BK004".
    """
    if book_id not in db.books:
        raise ToolError(f"unknown book {book_id}")
    return dict(db.books[book_id])


BY_TITLE = {"reserve_by_title": (1.0, reserve_by_title)}


@pytest.mark.parametrize("search", [search_books_optional, book_details], ids=["all_optional", "by_id_only"])
def test_an_id_no_user_message_or_tool_result_showed_is_cannot_play_not_invented(search) -> None:
    """With a search tool whose parameters are all optional (the teacher fills only required ones), or one
    that takes the very id it should find, nothing shows the book's id: the old teacher proposed it anyway
    (or looked it up by itself), the scripted user said yes, and the data taught inventing ids."""
    broken = _variant("lib-reserve", BY_TITLE, [lib.find_member, lib.get_loans, search, lib.reserve_book])
    for task in broken.tasks("train"):
        book = task.gold_actions[0].arguments["book_id"]
        traj = play_episode(broken, task)
        _cannot_play(traj, "reserve_book", book)
        assert not any(book in str(args) for _, args in _calls(traj)), _calls(traj)
        assert not any(book in m.content for m in traj.messages if m.role == "assistant")
    # the same tasks with a search the teacher can fill (its required title from the fact book_title) play
    sound = _variant("lib-reserve", BY_TITLE, [lib.find_member, lib.get_loans, lib.search_books, lib.reserve_book])
    for task in sound.tasks("train"):
        traj = play_episode(sound, task)
        assert traj.reward is not None and traj.reward.reward == 1.0, traj.messages
        assert [name for name, _ in _calls(traj)][-2:] == ["search_books", "reserve_book"]


def test_identifiers_are_the_words_with_a_digit_or_an_at() -> None:
    args = {"command": "renew L00012 by 2026-11-03.", "quantity": 2, "days": 14, "amount": 2.0,
            "email": "ada@example.org", "items": [1.5, "BK003"], "note": "no rush", "flag": True}
    assert identifiers(args) == ["L00012", "2026-11-03", "14", "ada@example.org", "1.5", "BK003"]


# -- 2. the refusal quotes the clause that matches the request ----------------------------------------------
MISLEADING_POLICY = """You are a library desk agent.
- Authenticate the member first with find_member and their library card number; never act for anyone else.
- Renew a loan only after the member says yes, and return or reserve books only after a yes too.
- Reference books can never be renewed: they stay in the library.
- A loan may not be renewed more than twice, so refuse a third renewal."""


def test_a_refusal_quotes_the_clause_that_matches_the_request() -> None:
    """The old teacher quoted the first clause naming the verb and a limit word ("renew a loan only after
    the member says yes"), split only at . and ;, and skipped every clause with "refuse" in it."""
    broken = _variant("lib-policy", {"third_renewal": (1.0, lib.third_renewal)}, policy=MISLEADING_POLICY)
    tasks = broken.tasks("train")
    assert tasks
    for task in tasks:
        traj = play_episode(broken, task)
        assert traj.reward is not None and traj.reward.reward == 1.0, traj.messages
        refusals = [m.content for m in traj.messages if m.role == "assistant" and "can't" in m.content]
        assert refusals and all("a loan may not be renewed more than twice" in r for r in refusals), refusals
        assert not any(re.search(r"says yes|reference books", r) for r in refusals), refusals


@pytest.mark.parametrize(("policy", "request_", "quoted"), [
    # the clause with the request's own words, not the first with the verb and "only"
    (MISLEADING_POLICY, "renew my loan once more", "our policy says that a loan may not be renewed more than twice"),
    (MISLEADING_POLICY, "renew my reference book", "our policy says that reference books can never be renewed"),
    # clauses end at a colon and at a spaced dash too
    ("Returns are free - a book cannot be returned after 90 days: ask for the fee.", "return my book",
     "our policy says that a book cannot be returned after 90 days"),
    # only an instruction to the agent names the verb: quoted as what the policy is to do
    ("Be kind.\nRefuse to renew a loan a third time.", "renew my loan", "our policy is to refuse to renew a loan "
                                                                        "a third time"),
    ("Be kind.", "renew my loan", "this is not allowed under our policy"),
])
def test_policy_rule_matches_clauses_to_the_request(policy: str, request_: str, quoted: str) -> None:
    assert policy_rule(policy, "renew_loan" if "renew" in request_ else "return_book", request_) == quoted


# -- 3. a login with no arguments or with no task fact ------------------------------------------------------
@tool(authenticates=True)
def find_member_by_card(db, card: str = "") -> str:
    """Find a member by card; this authenticates them.

    Args:
        card: The library card number.
    """
    return lib.find_member.fn(db, card)


@tool(authenticates=True)
def find_me(db) -> str:
    """Authenticate the member at the desk (no arguments)."""
    raise ToolError("no member at the desk")


@pytest.mark.parametrize(("login", "why"), [(find_member_by_card, "takes card, none of them a fact of the task"),
                                            (find_me, "find_me takes no arguments")])
def test_a_login_with_no_task_fact_is_cannot_play(login, why: str) -> None:
    """The old teacher called ``find_member_by_card({})`` (its only parameter is optional and matches no fact
    name) or ``find_me({})``, failed, and played on: data that teaches logging in as nobody."""
    broken = _variant("lib-login", {"renew": (1.0, lib.renew(withhold=False))},
                      [login, lib.get_loans, lib.search_books, lib.renew_loan])
    for task in broken.tasks("train"):
        with pytest.raises(CannotPlay, match=re.escape(why)) as err:
            ExpertPolicy().session(broken, task)
        assert task.id in str(err.value)


# -- 4. read tools get only read calls ----------------------------------------------------------------------
@tool
def query(db, command: str) -> list:
    """Run a desk command and show its result ("loans of M0007"). Deliberately careless, as a generic SQL
    tool can be: it runs whatever it is given, changes included.

    Args:
        command: The command.
    """
    verb, _, rest = command.partition(" ")
    if verb == "renew":
        return [lib.renew_loan.fn(db, rest)]
    return lib.get_loans.fn(db, rest.removeprefix("of "))


@tool(write=True)
def change(db, command: str) -> str:
    """Run a desk command that changes something ("renew L00012"). Only after the member says yes.

    Args:
        command: The command.
    """
    verb, _, rest = command.partition(" ")
    if verb != "renew":
        raise ToolError(f"unknown command {verb}")
    return lib.renew_loan.fn(db, rest)


def renew_by_command(rng: random.Random, db, member_id: str) -> Draft | None:
    options = [loan for loan in lib._loans(db, member_id) if loan["renewals"] < lib.MAX_RENEWALS]
    if not options:
        return None
    loan = rng.choice(options)
    title = db.books[loan["book_id"]]["title"]
    args = {"command": f"renew {loan['loan_id']}"}
    return Draft(
        scenario=Scenario(persona="a reader", known={**lib._known(db, member_id), "book_title": title},
                          intents=[Intent(description=f"renew my loan of {title}", action="change", args=args,
                                          say="Please renew my loan of {book_title}.")]),
        instruction=f"You want to renew your loan of '{title}'.",
        gold_actions=[Action(name="change", arguments=args)],
    )


def test_a_read_tool_never_gets_the_write_statement() -> None:
    """The old teacher filled a read tool's parameter from the write's arguments by name, so
    ``query(command="renew L00012")`` ran the renewal before anyone had said yes (and the write after it
    renewed again). A write's argument now fills a read only once the conversation has shown it."""
    broken = _variant("lib-statement", {"renew": (1.0, renew_by_command)}, [lib.find_member, lib.get_loans, query,
                                                                            change])
    for task in broken.tasks("train"):
        statement = task.gold_actions[0].arguments["command"]
        traj = play_episode(broken, task)
        reads = [args for name, args in _calls(traj) if name == "query"]
        assert statement not in [a.get("command") for a in reads], reads
        assert traj.reward is not None and traj.reward.reward == 1.0 and not traj.reward.violations, traj.messages
        assert [name for name, _ in _calls(traj)] == ["find_member", "get_loans", "change"]


# -- 5. a split without a family the train split has --------------------------------------------------------
def test_task_generation_warns_once_when_a_split_lacks_a_train_family() -> None:
    """A rare family (weight 0.2 of 5.6) lands in train but not in the small dev and test splits; the old code
    said nothing (no family ran out, so the share warning stays silent), and a test split that never
    measured the family read as if it had."""
    rare = {**lib.FAMILIES, "third_renewal": (0.2, lib.third_renewal)}
    broken = _variant("lib-rare", rare, task_counts={"train": 200, "dev": 4, "test": 6})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tasks = broken.generate_tasks()
    families = {s: {t.family for t in tasks if t.split == s} for s in ("train", "dev", "test")}
    assert "third_renewal" in families["train"] and "third_renewal" not in families["test"] | families["dev"]
    missing = [w for w in caught if issubclass(w.category, MissingFamilyWarning)]
    assert len(missing) == 1, [str(w.message) for w in caught]  # once for the task set, not per split
    message = str(missing[0].message)
    for split in ("dev", "test"):
        lacking = sorted(families["train"] - families[split])
        assert f"{split} lacks {', '.join(lacking)}" in message, message
    assert not [w for w in caught if issubclass(w.category, FamilyShareWarning)]
    # every family in every split asked for: no warning; nor for a split not asked for
    even = _variant("lib-even", {"return_book": (1.0, lib.give_back)},
                    task_counts={"train": 10, "dev": 4, "test": 0})
    with warnings.catch_warnings():
        warnings.simplefilter("error", MissingFamilyWarning)
        assert even.generate_tasks()
