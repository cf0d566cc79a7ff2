"""Where the ablation puts each model and evaluation, and how its users are named: the layout every part of
:mod:`muarl.ablation` reads and writes by."""

from __future__ import annotations

import re
from collections.abc import Sequence

#: the arm every trained model is compared with, and where its models' folders go
COLD_START = "cold-start"
#: the default training and evaluation users: the method's interactive user, then the one without a dialogue
USERS = ("scripted", "static")


def slug(user: str) -> str:
    """A user spec as a folder name: ``llm:http://host:8000/v1#m`` -> ``llm-http-host-8000-v1-m``."""
    return re.sub(r"[^A-Za-z0-9._]+", "-", user).strip("-") or "user"


def arm(user: str) -> str:
    """The id (and folder) of the model trained with ``user``."""
    return f"rl-{slug(user)}"


def eval_name(model: str, user: str, greedy: bool = False) -> str:
    """The folder, under a split's folder, of ``model`` evaluated with ``user``."""
    return f"eval/{model}/{slug(user)}{'-greedy' if greedy else ''}"


def describe(user: str) -> str:
    """An evaluation or training user in words."""
    return {"scripted": "the scripted user (interactive)", "static": "the static user (no dialogue)"}.get(
        user, f"the user {user}")


def interactive(users: Sequence[str]) -> str:
    """The evaluation user the headline is read on: the first that holds a dialogue (not ``static``)."""
    return next((u for u in users if u != "static"), users[0])
