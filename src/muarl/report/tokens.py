"""Token data for the loss-mask overlay: which tokenizer decodes a run's ids, and a compact encoding.

Why compact: a token-backend trajectory carries the whole conversation as ids (thousands per episode,
most of them the system turn every episode shares), so the report stores that shared prefix once, the
loss mask as run lengths, and one decoded string per distinct id, instead of text per token per episode.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

MIN_PREFIX = 32  # shorter common prefixes are not worth a table entry


def find_tokenizer(run_dir: Path, spec: str | None = None) -> tuple[Any | None, str]:
    """(tokenizer or None, where it came from) for decoding ``run_dir``'s token ids.

    Tried in order: ``spec`` (a checkpoint path or an alias like ``tiny``), the run's own checkpoint
    ``run_dir/model`` (what ``muarl sft``/``muarl grpo`` save), the ``model`` named in ``config.json``.
    ``spec`` failing is an error (the user asked for it); the automatic guesses fail quietly.
    """
    from transformers import AutoTokenizer

    from muarl.models import tokenizer_dir

    if spec:
        return AutoTokenizer.from_pretrained(tokenizer_dir(spec)), spec
    candidates: list[str | Path] = []
    if (run_dir / "model" / "tokenizer_config.json").exists():
        candidates.append(run_dir / "model")
    config = run_dir / "config.json"
    if config.exists():
        try:
            model = json.loads(config.read_text(encoding="utf-8")).get("model")
        except (ValueError, AttributeError):
            model = None
        if isinstance(model, str):
            candidates.append(model)
    for candidate in candidates:
        try:
            source = candidate if isinstance(candidate, Path) else tokenizer_dir(candidate)
            return AutoTokenizer.from_pretrained(source), str(candidate)
        except (OSError, ValueError):
            continue
    return None, ""


def vocab(tokenizer: Any | None, ids: Iterable[int]) -> dict[str, str]:
    """Each distinct id decoded on its own (special tokens kept), keyed by the id as a JSON string."""
    unique = sorted(set(ids))
    if tokenizer is None or not unique:
        return {}
    pieces = tokenizer.batch_decode([[i] for i in unique], skip_special_tokens=False,
                                    clean_up_tokenization_spaces=False)
    return {str(i): p for i, p in zip(unique, pieces, strict=True)}


def run_lengths(mask: Sequence[int]) -> list[int]:
    """Alternating run lengths of a 0/1 mask, starting with a run of 0s (possibly of length 0)."""
    runs, current, count = [], 0, 0
    for bit in mask:
        bit = 1 if bit else 0
        if bit == current:
            count += 1
        else:
            runs.append(count)
            current, count = bit, 1
    runs.append(count)
    return runs


def expand_runs(runs: Sequence[int]) -> list[int]:
    """The inverse of :func:`run_lengths`."""
    mask: list[int] = []
    for n, length in enumerate(runs):
        mask.extend([n % 2] * length)
    return mask


def common_prefix(sequences: Sequence[Sequence[int]]) -> int:
    """Length of the longest prefix all ``sequences`` share."""
    if not sequences:
        return 0
    first = sequences[0]
    length = min(len(s) for s in sequences)
    for seq in sequences[1:]:
        n = 0
        while n < length and seq[n] == first[n]:
            n += 1
        length = n
    return length


class PrefixTable:
    """Shared token prefixes (one per domain: the system turn), stored once for the whole report."""

    def __init__(self, groups: dict[str, list[Sequence[int]]]):
        self.prefixes: list[list[int]] = []
        self.index: dict[str, int] = {}
        for key, seqs in groups.items():
            length = common_prefix(seqs)
            if length >= MIN_PREFIX:
                self.index[key] = len(self.prefixes)
                self.prefixes.append(list(seqs[0][:length]))

    def encode(self, key: str, ids: Sequence[int], mask: Sequence[int],
               logprobs: Sequence[float]) -> dict[str, Any]:
        """{prefix index or -1, the ids after it, the whole mask as runs, log-probs of masked tokens}."""
        p = self.index.get(key, -1)
        cut = len(self.prefixes[p]) if p >= 0 else 0
        lp = [round(v, 3) for v, m in zip(logprobs, mask, strict=False) if m] if logprobs else []
        return {"prefix": p, "ids": list(ids[cut:]), "mask": run_lengths(mask), "logprobs": lp}
