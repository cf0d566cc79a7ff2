"""Every way a trainer's weights reach a rollout engine, in one package with one interface.

A :class:`WeightSync` is made once per run for its engine and told to :meth:`~WeightSync.push` after every
update (and once at the start); :meth:`~WeightSync.close` ends what it holds. The implementations:

- :class:`~muarl.weight_sync.engine.EngineSync`: an in-process vLLM engine (``--rollout-engine vllm``), the
  weights loaded in place, a LoRA adapter saved and reloaded;
- :class:`~muarl.weight_sync.servers.ServerSync`: vLLM servers by URL, over the broadcast link
  (:mod:`~muarl.weight_sync.link`, gloo or NCCL, :func:`~muarl.weight_sync.link.choose_backend`) or through
  files (:mod:`~muarl.weight_sync.files`), chosen in one place, :meth:`ServerSync.push
  <muarl.weight_sync.servers.ServerSync.push>`.

Beside them, what both ends of the link share: the bucket format (:mod:`~muarl.weight_sync.buckets`) and
the vLLM worker extension that receives (:mod:`~muarl.weight_sync.receiver`, which imports torch alone: it
runs inside a server's workers, so this package's ``__init__`` imports nothing else). muarl's own engine
samples from the trainer's model object and has nothing to sync.
"""

from __future__ import annotations

from typing import Any, Protocol


class WeightSync(Protocol):
    """The trainer's side of keeping one engine (or a set of servers) on its weights."""

    #: the bytes the last :meth:`push` moved (broadcast or written; 0 where nothing is counted)
    sync_bytes: int

    def push(self, model: Any) -> None:
        """Make the engine sample from ``model``'s current weights (a peft model: its adapter, or its merge)."""

    def close(self) -> None:
        """Release what the sync holds (a link, a directory, a loaded adapter); the engine is the caller's."""


class SyncFailed(RuntimeError):
    """An engine did not take the weights (a server refused or died, the link broke): one line naming it."""
