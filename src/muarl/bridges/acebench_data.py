"""ACEBench's English agent data, read from a directory the user names (muarl ships none of it).

The directory is ACEBench's ``data_en``: ``data_agent_<category>.json`` (one item per line: ``id``,
``question``, ``function``, ``initial_config``, ``involved_classes``) and
``possible_answer/data_agent_<category>.json`` (``ground_truth``: the expected end state, ``mile_stone``:
the expected call sequence, or several alternative sequences). It is named by ``--data DIR`` where a
command has that option, else by the environment variable ``MUARL_ACEBENCH_DATA``. Anything missing or
malformed is a :class:`DataError` whose message is one line naming the path and what is wrong, so the
CLI can print it as it is.

Milestones are ACEBench's call texts, ``[name(key='value', ...)]``. Some are not valid Python (an
apostrophe inside single quotes: ``merchant_name='Domino's'``); :func:`parse_calls` reads those the
way their authors meant them: a quote closes a string only where a delimiter follows it.
"""

from __future__ import annotations

import ast
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CATEGORIES = ("multi_turn", "multi_step")
ENV_VAR = "MUARL_ACEBENCH_DATA"
_ITEM_KEYS = {"id": str, "question": str, "function": list, "initial_config": dict, "involved_classes": list}
_ANSWER_KEYS = {"id": str, "ground_truth": list, "mile_stone": list}

#: one call: (function name, keyword arguments)
Call = tuple[str, dict[str, Any]]


class DataError(ValueError):
    """The ACEBench data directory is missing or malformed (a ValueError: the CLI prints it in one line)."""


@dataclass(frozen=True)
class Item:
    """One ACEBench agent item with its answer."""

    id: str
    category: str
    question: str
    functions: list[dict[str, Any]]
    initial_config: dict[str, Any]
    classes: list[str]
    ground_truth: list[dict[str, Any]]
    #: alternative milestone sequences (most items have one), each a list of call texts
    milestones: list[list[str]]


def data_source(explicit: str | Path | None = None) -> tuple[Path, str]:
    """The data directory and where it was named: ``explicit`` (a ``--data`` option) or ``$MUARL_ACEBENCH_DATA``.

    The source travels with the path so that every error about the directory can say which of the two
    named it: with both set, a user who fixed the variable would otherwise keep reading the option's path
    and wonder why nothing changed."""
    given = explicit not in (None, "")
    chosen = explicit if given else os.environ.get(ENV_VAR, "")
    if not chosen:
        raise DataError(f"the acebench domains need ACEBench's English agent data: pass --data DIR or set {ENV_VAR} "
                        "to its data_en directory, e.g. tests/data/acebench/data_en in a muarl checkout (the "
                        "package ships none of it)")
    source = "--data" if given else ENV_VAR
    path = Path(str(chosen)).expanduser()
    if not path.exists():
        raise DataError(f"acebench data directory {path} (from {source}) does not exist")
    if not path.is_dir():
        raise DataError(f"acebench data directory {path} (from {source}) is not a directory")
    return path, source


def data_dir(explicit: str | Path | None = None) -> Path:
    """The data directory: ``explicit`` (a ``--data`` option) or ``$MUARL_ACEBENCH_DATA``."""
    return data_source(explicit)[0]


def data_files(directory: Path, category: str) -> list[Path]:
    """The two files a category is read from: its items and their answers."""
    name = f"data_agent_{category}.json"
    return [directory / name, directory / "possible_answer" / name]


def _lines(path: Path, keys: dict[str, type]) -> list[dict[str, Any]]:
    if not path.is_file():
        raise DataError(f"acebench data file {path} is missing (expected ACEBench's data_en layout: "
                        "data_agent_<category>.json and possible_answer/data_agent_<category>.json)")
    rows = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise DataError(f"acebench data file {path} line {n} is not valid JSON ({err.msg})") from None
        if not isinstance(row, dict):
            raise DataError(f"acebench data file {path} line {n} is not a JSON object")
        for key, kind in keys.items():
            if not isinstance(row.get(key), kind):
                raise DataError(f"acebench data file {path} line {n} has no {kind.__name__} field {key!r}")
        rows.append(row)
    if not rows:
        raise DataError(f"acebench data file {path} has no items")
    return rows


def load_items(directory: Path, category: str, known_classes: set[str]) -> list[Item]:
    """The category's items with their answers, checked for the fields the bridge reads."""
    name = f"data_agent_{category}.json"
    items = _lines(directory / name, _ITEM_KEYS)
    answers = {a["id"]: a for a in _lines(directory / "possible_answer" / name, _ANSWER_KEYS)}
    out = []
    for item in items:
        answer = answers.get(item["id"])
        if answer is None:
            raise DataError(f"acebench data file {directory / 'possible_answer' / name} has no answer for {item['id']}")
        unknown = sorted(set(item["involved_classes"]) - known_classes)
        if unknown:
            raise DataError(f"acebench item {item['id']} in {directory / name} involves unknown classes {unknown}")
        stones = answer["mile_stone"]
        candidates = stones if stones and all(isinstance(s, list) for s in stones) else [stones]
        for candidate in candidates:
            for text in candidate:
                try:
                    parse_calls(str(text))
                except (SyntaxError, ValueError) as err:
                    raise DataError(f"acebench item {item['id']} in {directory / 'possible_answer' / name}: "
                                    f"milestone {text!r} is not a call list ({err})") from None
        out.append(Item(id=item["id"], category=category, question=item["question"], functions=item["function"],
                        initial_config=item["initial_config"], classes=list(item["involved_classes"]),
                        ground_truth=answer["ground_truth"], milestones=[[str(t) for t in c] for c in candidates]))
    return out


# -- call texts ------------------------------------------------------------------------------------------


def _requote(text: str) -> str:
    """Escape quotes that sit inside a string: a quote closes its string only before a delimiter."""
    out: list[str] = []
    quote: str | None = None
    i = 0
    while i < len(text):
        ch = text[i]
        if quote is None:
            quote = ch if ch in "'\"" else None
            out.append(ch)
        elif ch == "\\":
            out.append(text[i:i + 2])
            i += 1
        elif ch == quote:
            rest = text[i + 1:].lstrip()
            closes = not rest or rest[0] in ",)]}:"
            out.append(ch if closes else "\\" + ch)
            quote = None if closes else quote
        else:
            out.append(ch)
        i += 1
    return "".join(out)


def parse_calls(text: str) -> list[Call]:
    """``[f(a=1, b='x'), g()]`` (brackets optional) as calls; raises SyntaxError/ValueError otherwise."""
    node = ast.parse(_requote(text.strip()), mode="eval").body
    elements = node.elts if isinstance(node, ast.List | ast.Tuple) else [node]
    calls = []
    for element in elements:
        if not isinstance(element, ast.Call) or not isinstance(element.func, ast.Name) or element.args:
            raise ValueError(f"not a call with keyword arguments: {ast.unparse(element)}")
        calls.append((element.func.id, {k.arg: ast.literal_eval(k.value) for k in element.keywords if k.arg}))
    return calls


def call_text(name: str, arguments: dict[str, Any]) -> str:
    """One call as ACEBench's agents write it (Python literals), which its executor decodes."""
    return f"{name}({', '.join(f'{k}={v!r}' for k, v in arguments.items())})"


def message_text(calls: list[Call]) -> str:
    """One agent message's calls as ACEBench records it in the process trace: ``[f(...), g(...)]``."""
    return "[" + ", ".join(call_text(n, a) for n, a in calls) + "]"
