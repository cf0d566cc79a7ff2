"""The weights into vLLM servers addressed by URL (``--rollout-engine vllm-server:URL#MODEL``, one or
several): where "in memory, else files" is decided, once.

Full weights go over the broadcast link (``--vllm-weight-sync memory``, the default:
:class:`~muarl.weight_sync.link.WeightLink`, one broadcast every server takes at once, in the engines'
dtype; ``changed``: the same link sending only the values that changed since the last sync,
:mod:`~muarl.weight_sync.changes`) unless the run asks for files or a server has no muarl receiver (said once on stderr, then files
for good). Files (:mod:`muarl.weight_sync.files`) are written once, into one directory every server reads
(a shared filesystem when they run elsewhere), and loaded by every server at the same time; a LoRA run's
adapter always goes so. A server that does not take the weights is a :class:`~muarl.weight_sync.SyncFailed`
naming it.
"""

from __future__ import annotations

import contextlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from muarl.policies.vllm import LORA_NAME
from muarl.weight_sync import SyncFailed
from muarl.weight_sync.buckets import BUCKET_BYTES
from muarl.weight_sync.files import SyncFiles, load_into
from muarl.weight_sync.merged import merged_weights

#: ``--vllm-weight-sync``'s choices
WAYS = ("memory", "changed", "file")


class ServerSync:
    """Keeps every server of ``policies`` (:class:`~muarl.policies.vllm_server.VLLMServerPolicy`, one per
    server; they stay the caller's) on the trainer's weights. ``how``: "memory" (the link, else files),
    "changed" (the link sending what changed, else files) or "file"; ``sync_dir``: where the files' directory is made; ``bucket_bytes``: the link's bucket size.

    In a run of several processes only rank 0 pushes; the others call :meth:`follow` once it has, so their
    turns sample with the adapter it loaded. Closing unloads the adapter this sync loaded (before its files
    go: vLLM reading an adapter whose files are gone takes the engine down), ends the link, removes the files."""

    def __init__(self, policies: list[Any], lora: bool, how: str = "memory", sync_dir: str | Path | None = None,
                 bucket_bytes: int = BUCKET_BYTES):
        if how not in WAYS:
            raise ValueError(f"the weight sync must be one of {', '.join(WAYS)}, not {how!r}")
        self.policies, self.lora, self.how, self.bucket_bytes = policies, lora, how, bucket_bytes
        self.files = SyncFiles(sync_dir)
        self.sync_bytes = 0
        #: the share of the values the last sync found changed ("changed" over the link; else None)
        self.changed_share: float | None = None
        self._link: Any = None  # the LazyLink, made at the first full-weight push over memory
        self._adapter_loaded = False

    @property
    def names(self) -> str:
        return ", ".join(policy.name for policy in self.policies)

    @property
    def link(self) -> Any:
        """The open :class:`~muarl.weight_sync.link.WeightLink`, if any."""
        return self._link.link if self._link is not None else None

    def push(self, model: Any) -> None:
        """``model``'s weights (a LoRA run's adapter) into every server, or :class:`SyncFailed`."""
        if not self.lora and self.how != "file" and self._push_over_link(model):
            return
        path = self.files.write(model if self.lora else merged_weights(model), self.lora)
        self.sync_bytes = self.files.sync_bytes
        with ThreadPoolExecutor(len(self.policies), thread_name_prefix="muarl-sync") as pool:
            loads = [pool.submit(load_into, policy.engine, path, self.lora) for policy in self.policies]
        failed = [(policy, load.exception()) for policy, load in zip(self.policies, loads, strict=True)
                  if load.exception() is not None]
        for _, err in failed:
            if not isinstance(err, RuntimeError):  # not a server's failure (ServerError): a bug, as it is
                raise err
        if failed:
            raise SyncFailed("; ".join(f"the rollout engine {policy.name} could not take the updated weights "
                                       f"({err})" for policy, err in failed))
        self.files.loaded(path, self.lora)  # every server has the new weights: the previous ones go
        if self.lora:
            self._adapter_loaded = True
            self.follow()

    def _push_over_link(self, model: Any) -> bool:
        """The full weights over the link; False where there is none (a server without the receiver)."""
        from muarl.weight_sync.link import LazyLink, LinkFailed

        if self._link is None:
            self._link = LazyLink([policy.engine for policy in self.policies], bucket_bytes=self.bucket_bytes,
                                  changes=self.how == "changed")
        try:
            link = self._link.get()
            if link is None:
                return False
            self.sync_bytes = link.send(merged_weights(model))
            self.changed_share = link.changed_share
        except LinkFailed as err:
            raise SyncFailed(f"the rollout engine {self.names} could not take the updated weights over the weight "
                             f"link ({err}); --vllm-weight-sync file sends them through files instead") from None
        return True

    def follow(self) -> None:
        """Sample with what the last push loaded: a LoRA run's turns name muarl's adapter on every server."""
        if self.lora:
            for policy in self.policies:
                policy.lora = LORA_NAME

    def close(self) -> None:
        if self._adapter_loaded:
            from muarl.policies.vllm_server import ServerError

            for policy in self.policies:
                with contextlib.suppress(ServerError):  # a server already gone has nothing to unload
                    policy.engine.unload_lora(LORA_NAME)
                policy.lora = None
            self._adapter_loaded = False
        if self._link is not None:
            self._link.close()
            self._link = None
        self.files.close()
