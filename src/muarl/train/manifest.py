"""Checksums of a checkpoint directory, so a resume never starts from damaged state.

A checkpoint that merely *exists* can still be wrong: a file cut short by a full disk or a crashed copy,
bytes flipped by failing storage, a file overwritten by hand. Every library that reads these files fails
differently (a raw traceback for a truncated ``.pt``, nothing at all for flipped bytes inside a tensor,
which resume "fine" and make the run diverge), so muarl checks them itself before it loads anything:
``manifest.json`` lists every file of the directory with its size and SHA-256. It is written last, through
a temporary file and a rename, so a directory whose manifest is there was saved completely, and
:func:`check_checkpoint` names the first file that does not match.

Checkpoints written by a muarl from before manifests (their ``state.json`` does not say ``manifest``) have
nothing to compare with; they are accepted when every file that can be parsed parses (see
:func:`_check_loads`), with a warning that damage which keeps a file loadable cannot be detected there.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from muarl.files import atomic_write, sha256_of

MANIFEST = "manifest.json"
FORMAT = 1
#: the key a checkpoint's state.json carries when its directory has a manifest (absent: an older muarl's)
STATE_KEY = "manifest"


@dataclass
class Verdict:
    """What :func:`check_checkpoint` found: ``problem`` (None: intact) and an optional ``warning``."""

    problem: str | None = None
    warning: str | None = None


def listed_files(directory: Path) -> list[str]:
    """The files under ``directory`` a manifest lists (relative, sorted): all but the manifest itself."""
    found = (p.relative_to(directory).as_posix() for p in directory.rglob("*") if p.is_file())
    return sorted(rel for rel in found if rel != MANIFEST and not rel.startswith(f".{MANIFEST}"))


def file_digests(directory: Path, files: list[str]) -> dict[str, dict[str, Any]]:
    """Size and SHA-256 of each of ``files`` (relative to ``directory``), each flushed to disk first: on
    disk before a manifest vouches for it. A sharded run's ranks each hash the files they wrote."""
    digests: dict[str, dict[str, Any]] = {}
    for rel in files:
        path = directory / rel
        with open(path, "rb") as f:
            os.fsync(f.fileno())
            digest = sha256_of(f)
        digests[rel] = {"size": path.stat().st_size, "sha256": digest}
    return digests


def write_manifest(directory: Path, digests: dict[str, dict[str, Any]] | None = None) -> None:
    """Write the manifest atomically: ``digests`` of every file (:func:`file_digests`, gathered from the
    ranks that wrote them), or by hashing every file under ``directory`` here.

    Called once every other file of the checkpoint is written: the manifest's presence means complete.
    """
    files = file_digests(directory, listed_files(directory)) if digests is None else \
        {rel: digests[rel] for rel in sorted(digests)}
    atomic_write(directory / MANIFEST, json.dumps({"format": FORMAT, "files": files}, indent=1) + "\n", durable=True)


def check_checkpoint(directory: Path) -> Verdict:
    """Whether ``directory`` holds exactly what its manifest lists; the problem names the file."""
    manifest = directory / MANIFEST
    if not manifest.is_file():
        return _without_manifest(directory)
    try:
        data = json.loads(manifest.read_text(encoding="utf-8"))
        files = data["files"]
        entries = [(rel, int(e["size"]), str(e["sha256"])) for rel, e in files.items()]
    except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError) as err:
        return Verdict(f"{MANIFEST} is garbled ({type(err).__name__}: {err})")
    if not entries:
        return Verdict(f"{MANIFEST} lists no files")
    for rel, size, _ in entries:  # sizes first: a truncated file is found without reading gigabytes
        path = directory / rel
        if not path.is_file():
            return Verdict(f"{rel} is missing")
        actual = path.stat().st_size
        if actual != size:
            kind = "truncated" if actual < size else "longer than saved"
            return Verdict(f"{rel} is {actual} bytes, the manifest says {size} ({kind})")
    for rel, _, sha in entries:
        with open(directory / rel, "rb") as f:
            if sha256_of(f) != sha:
                return Verdict(f"{rel} does not match its SHA-256 in the manifest (bytes changed since the save)")
    return Verdict()


def _without_manifest(directory: Path) -> Verdict:
    """No manifest: damage when this muarl wrote the directory, an older muarl's checkpoint otherwise."""
    state = directory / "state.json"
    if not state.is_file():
        return Verdict(f"{MANIFEST} and state.json are missing (not a complete checkpoint)")
    try:
        summary = json.loads(state.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as err:
        return Verdict(f"{MANIFEST} is missing and state.json is garbled ({err})")
    if not isinstance(summary, dict):
        return Verdict(f"{MANIFEST} is missing and state.json is garbled (not an object)")
    if summary.get(STATE_KEY):
        return Verdict(f"{MANIFEST} is missing (the save did not finish, or the file was deleted)")
    problem = _check_loads(directory)
    if problem:
        return Verdict(f"{problem} (a checkpoint without checksums, from an older muarl)")
    return Verdict(warning=f"{directory.name} has no {MANIFEST} (saved by an older muarl): its files load, but "
                           "damage that leaves a file loadable (flipped bytes) cannot be detected in it")


def _check_loads(directory: Path) -> str | None:
    """The first file of a manifest-less checkpoint that does not parse, as a problem; None if all do.

    ``.pt`` files are unpickled, ``.safetensors`` files read tensor by tensor, ``.json`` files parsed;
    other files (tokenizer vocabularies ...) cannot be checked without a manifest.
    """
    import torch
    from safetensors import safe_open

    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        rel = path.relative_to(directory).as_posix()
        try:
            if path.suffix == ".pt":
                torch.load(path, map_location="cpu", weights_only=False)
            elif path.suffix == ".safetensors":
                with safe_open(str(path), framework="pt") as f:
                    for key in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                        f.get_tensor(key)
            elif path.suffix == ".json":
                json.loads(path.read_text(encoding="utf-8"))
        except Exception as err:  # noqa: BLE001 (any library's failure to parse it is the finding)
            first = str(err).strip().splitlines()[0] if str(err).strip() else ""
            return f"{rel} does not load ({type(err).__name__}: {first[:200]})"
    return None
