"""A domain that is not built in, written with muarl's public API only: a lending library.

Issue 16's yardstick for "bring your own domain": the scenario-driven scripted user and the generic
teacher must play it from its tasks and declared tools alone (``tests/test_own_domain.py`` runs it
through the command line as ``library_domain:domain``). It is deliberately not the README's example:
members authenticate by card number, loans live in their own table, a third renewal is against the
policy, and one family withholds the card number until the agent asks for it.
"""

from __future__ import annotations

import datetime as dt
import random

from muarl.domain import Domain
from muarl.taskgen import Draft, generate
from muarl.tools import ToolError, tool
from muarl.types import Action, Intent, Scenario

MAX_RENEWALS = 2
TITLES = ["The Silent Sea", "Winter Orchard", "A Map of Salt", "Copper Kites", "The Ninth Lantern",
          "Glass Harbour", "Paper Moons", "The Quiet Engine", "Salt and Thunder", "North of Maple",
          "The Long Ferry", "Velvet Cartography"]
FIRST = ["Ada", "Bruno", "Chen", "Dara", "Elif", "Femi", "Greta", "Hugo", "Ines", "Jonas"]
LAST = ["Okafor", "Lindqvist", "Moreau", "Tanaka", "Varga", "Quinn", "Reyes", "Sato"]
POLICY = """You are a library desk agent.
- Authenticate the member first with find_member and their library card number; never act for anyone else.
- Before any change (renew_loan, return_book, reserve_book) state what you will do and get an explicit yes.
- A loan can be renewed at most 2 times; refuse a third renewal.
- Answer questions about the member's own loans only."""


def build_db(seed: int, size: int) -> dict:
    rng = random.Random(seed)
    books = {f"BK{i:03d}": {"book_id": f"BK{i:03d}", "title": title, "copies": rng.randint(0, 3), "reserved_by": []}
             for i, title in enumerate(TITLES)}
    members, loans = {}, {}
    start = dt.date(2026, 11, 1)
    for m in range(size):
        member_id = f"M{m:04d}"
        members[member_id] = {"member_id": member_id, "name": f"{rng.choice(FIRST)} {rng.choice(LAST)}",
                              "card_number": f"{rng.randrange(10**6):06d}"}
        for book_id in rng.sample(sorted(books), rng.randint(1, 3)):
            loan_id = f"L{len(loans):05d}"
            due = start + dt.timedelta(days=rng.randint(3, 40))
            loans[loan_id] = {"loan_id": loan_id, "member_id": member_id, "book_id": book_id,
                              "due": due.isoformat(), "renewals": rng.choice([0, 0, 1, 2]), "returned": False}
    return {"books": books, "members": members, "loans": loans}


@tool(authenticates=True)
def find_member(db, card_number: str) -> str:
    """Find a member by library card number; this authenticates them. Returns the member id.

    Args:
        card_number: The 6-digit library card number.
    """
    for member_id, member in db.members.items():
        if member["card_number"] == card_number:
            db.authenticate(member_id)
            return member_id
    raise ToolError("no member has that card number")


@tool
def get_loans(db, member_id: str) -> list:
    """A member's current loans: loan id, book id, title, due date and renewals so far.

    Args:
        member_id: The member id, such as "M0007".
    """
    if member_id not in db.members:
        raise ToolError(f"unknown member {member_id}")
    return [{**loan, "title": db.books[loan["book_id"]]["title"]}
            for loan in db.loans.values() if loan["member_id"] == member_id and not loan["returned"]]


@tool
def search_books(db, title: str) -> list:
    """Books whose title contains the text (case-insensitive), with copies on the shelf.

    Args:
        title: Part of the title.
    """
    return [{"book_id": b["book_id"], "title": b["title"], "copies": b["copies"]}
            for b in db.books.values() if title.lower() in b["title"].lower()]


def _open_loan(db, loan_id: str) -> dict:
    if loan_id not in db.loans or db.loans[loan_id]["returned"]:
        raise ToolError(f"no open loan {loan_id}")
    return db.loans[loan_id]


@tool(write=True)
def renew_loan(db, loan_id: str) -> str:
    """Renew a loan for 14 more days (at most 2 renewals per loan). Only after the member says yes.

    Args:
        loan_id: The loan id, such as "L00012".
    """
    loan = _open_loan(db, loan_id)
    if loan["renewals"] >= MAX_RENEWALS:
        raise ToolError(f"loan {loan_id} was already renewed {MAX_RENEWALS} times")
    edited = db.loans.edit(loan_id)
    edited["renewals"] += 1
    edited["due"] = (dt.date.fromisoformat(loan["due"]) + dt.timedelta(days=14)).isoformat()
    return f"loan {loan_id} renewed, now due {edited['due']}"


@tool(write=True)
def return_book(db, loan_id: str) -> str:
    """Record a book as returned. Only after the member says yes.

    Args:
        loan_id: The loan id, such as "L00012".
    """
    loan = _open_loan(db, loan_id)
    db.loans.edit(loan_id)["returned"] = True
    db.books.edit(loan["book_id"])["copies"] += 1
    return f"loan {loan_id} returned"


@tool(write=True)
def reserve_book(db, member_id: str, book_id: str) -> str:
    """Reserve a book for a member (they are told when a copy is free). Only after the member says yes.

    Args:
        member_id: The member id.
        book_id: The book id, such as "BK004".
    """
    if book_id not in db.books:
        raise ToolError(f"unknown book {book_id}")
    if member_id in db.books[book_id]["reserved_by"]:
        raise ToolError(f"{member_id} already reserved {book_id}")
    db.books.edit(book_id)["reserved_by"].append(member_id)
    return f"{book_id} reserved for {member_id}"


def _loans(db, member_id: str) -> list[dict]:
    return [loan for loan in db.loans.values() if loan["member_id"] == member_id and not loan["returned"]]


def _known(db, member_id: str) -> dict[str, str]:
    member = db.members[member_id]
    return {"name": member["name"], "card_number": member["card_number"]}


def renew(withhold: bool):
    """Renew one loan that still may be; ``withhold``: the member gives the card number only when asked."""
    def family(rng: random.Random, db, member_id: str) -> Draft | None:
        options = [loan for loan in _loans(db, member_id) if loan["renewals"] < MAX_RENEWALS]
        if not options:
            return None
        loan = rng.choice(options)
        title = db.books[loan["book_id"]]["title"]
        args = {"loan_id": loan["loan_id"]}
        known = {**_known(db, member_id), "book_title": title}
        card = known["card_number"]
        return Draft(
            scenario=Scenario(persona="a busy reader" if not withhold else "a cautious reader", known=known,
                              withheld=["card_number"] if withhold else [],
                              intents=[Intent(description=f"renew my loan of {title}", action="renew_loan",
                                              args=args)]),
            instruction=(f"You want to renew your loan of '{title}'. Your library card number is {card}"
                         + (" but you only give it when asked." if withhold else ".")),
            gold_actions=[Action(name="renew_loan", arguments=args)],
        )
    return family


def third_renewal(rng: random.Random, db, member_id: str) -> Draft | None:
    """The member wants a loan renewed a third time: against the policy, so the gold is no write."""
    options = [loan for loan in _loans(db, member_id) if loan["renewals"] >= MAX_RENEWALS]
    if not options:
        return None
    loan = rng.choice(options)
    title = db.books[loan["book_id"]]["title"]
    return Draft(
        scenario=Scenario(persona="an insistent reader", known={**_known(db, member_id), "book_title": title},
                          intents=[Intent(description=f"renew my loan of {title} once more",
                                          action="renew_loan", args={"loan_id": loan["loan_id"]},
                                          out_of_policy=True)]),
        instruction=f"You want to renew '{title}' again although you already renewed it twice. Insist.",
        gold_actions=[],
    )


def give_back(rng: random.Random, db, member_id: str) -> Draft | None:
    loans = _loans(db, member_id)
    if not loans:
        return None
    loan = rng.choice(loans)
    title = db.books[loan["book_id"]]["title"]
    args = {"loan_id": loan["loan_id"]}
    return Draft(
        scenario=Scenario(persona="a tidy reader", known={**_known(db, member_id), "book_title": title},
                          intents=[Intent(description=f"return {title}", action="return_book", args=args)]),
        instruction=f"You are handing back '{title}' and want it recorded as returned.",
        gold_actions=[Action(name="return_book", arguments=args)],
    )


def reserve_changed_mind(rng: random.Random, db, member_id: str) -> Draft | None:
    """The member asks to reserve one book, then changes their mind for another (gold: the second only)."""
    free = sorted(b for b, rec in db.books.items() if member_id not in rec["reserved_by"])
    if len(free) < 2:
        return None
    first, second = rng.sample(free, 2)
    first_title, second_title = db.books[first]["title"], db.books[second]["title"]
    args = {"member_id": member_id, "book_id": second}
    return Draft(
        scenario=Scenario(persona="an undecided reader", known={**_known(db, member_id), "book_title": second_title},
                          intents=[Intent(description=f"reserve {second_title}", action="reserve_book", args=args,
                                          first_args={"member_id": member_id, "book_id": first})]),
        instruction=f"You first ask to reserve '{first_title}', then change your mind: '{second_title}' instead.",
        gold_actions=[Action(name="reserve_book", arguments=args)],
        context={"first_title": first_title},
    )


def due_date(rng: random.Random, db, member_id: str) -> Draft | None:
    """An information request: when is a loan due? The answer must be said (a required output)."""
    loans = _loans(db, member_id)
    if not loans:
        return None
    loan = rng.choice(loans)
    title = db.books[loan["book_id"]]["title"]
    return Draft(
        scenario=Scenario(persona="a forgetful reader", known={**_known(db, member_id), "book_title": title},
                          intents=[Intent(description=f"know when {title} is due",
                                          question=f"When is {title} due?", answer=loan["due"])]),
        instruction=f"You want to know when your loan of '{title}' is due.",
        gold_actions=[],
        required_outputs=[loan["due"]],
    )


FAMILIES = {
    "renew": (1.0, renew(withhold=False)),
    "renew_withheld_card": (1.0, renew(withhold=True)),
    "third_renewal": (0.6, third_renewal),
    "return_book": (1.0, give_back),
    "reserve_changed_mind": (1.0, reserve_changed_mind),
    "due_date": (0.8, due_date),
}


def _owner(table: str, record: dict) -> str | None:
    return record.get("member_id") if table in ("members", "loans") else None


domain = Domain(
    name="lending-library",
    description="A lending library desk: members, books and loans.",
    policy=POLICY,
    tools=[find_member, get_loans, search_books, renew_loan, return_book, reserve_book],
    build_db=build_db,
    build_tasks=lambda d, seed, counts: generate(d, seed, counts, FAMILIES, list(d.database().tables["members"])),
    owner_of=_owner,
    db_size=120,
    task_counts={"train": 24, "dev": 6, "test": 12},
)
