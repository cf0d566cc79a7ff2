"""Weights through files a vLLM server reads (``--vllm-weight-sync file``, a LoRA run's adapter, and a
server without muarl's receiver): written once into a directory of the run's own, loaded by every server.

Full weights are one safetensors file, reloaded in place by the workers' ``reload_weights`` through ``POST
/collective_rpc`` (dev mode) between ``/pause?mode=wait`` and ``/resume``, so no sequence is sampled from two
policies; an adapter is saved by peft and loaded under one name with ``POST /v1/load_lora_adapter
{"load_inplace": true}``. Each sync gets a fresh directory: vLLM hashes an adapter's cached blocks with its
path, so a new path keeps the prefix cache honest without dev mode. The previous sync's directory goes once
every server has loaded the new one; the current one stays (vLLM may read an adapter again from its path).
"""

from __future__ import annotations

import itertools
import shutil
import tempfile
from pathlib import Path
from typing import Any

from muarl.policies.vllm import LORA_NAME


class SyncFiles:
    """A directory of this sync's own inside ``root`` (made if missing; default: the system's temporary
    directory, which serves a server on this machine; one elsewhere needs a shared filesystem), removed on
    :meth:`close`. Runs sharing ``root`` never collide."""

    def __init__(self, root: str | Path | None = None):
        try:
            if root is not None:
                Path(root).mkdir(parents=True, exist_ok=True)
            self.directory = Path(tempfile.mkdtemp(prefix="muarl-vllm-server-", dir=root))
        except OSError as err:
            raise ValueError(f"cannot make a sync directory in {root or tempfile.gettempdir()} "
                             f"({err.strerror or err})") from None
        self._count = itertools.count(1)
        self._loaded: dict[str, Path] = {}  # per kind ("weights", "lora"): the directory last loaded
        self.sync_bytes = 0  # bytes the last write put on disk

    def write(self, source: Any, lora: bool) -> Path:
        """A fresh directory holding what a sync loads: ``lora``, the adapter of ``source`` (a peft model);
        else ``source``'s (HF name, tensor) pairs as safetensors (tied weights written twice, as copies)."""
        from safetensors.torch import save_file

        path = self.directory / f"{'lora' if lora else 'weights'}-{next(self._count):05d}"
        path.mkdir(parents=True)
        if lora:
            source.save_pretrained(str(path))
            self.sync_bytes = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
            return path
        tensors: dict[str, Any] = {}
        seen: set[int] = set()
        for name, tensor in source:
            tensor = tensor.detach().to("cpu").contiguous()
            if tensor.data_ptr() in seen:  # tied weights (embeddings and LM head): safetensors wants copies
                tensor = tensor.clone()
            seen.add(tensor.data_ptr())
            tensors[name] = tensor
        save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
        self.sync_bytes = (path / "model.safetensors").stat().st_size
        return path

    def loaded(self, path: Path, lora: bool) -> None:
        """Every server has loaded ``path``: the previous directory of its kind goes."""
        kind = "lora" if lora else "weights"
        previous = self._loaded.get(kind)
        if previous is not None:
            shutil.rmtree(previous, ignore_errors=True)
        self._loaded[kind] = path

    def close(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)


def load_into(server: Any, path: Path, lora: bool) -> None:
    """Have ``server`` (a :class:`~muarl.policies.vllm_server.VLLMServer`) load a directory :meth:`SyncFiles.write`
    wrote: the adapter in place under muarl's adapter name, or every weight in place, generation paused around
    it and the prefix cache dropped after it (its KV came from the old weights)."""
    if lora:
        server.load_lora(LORA_NAME, str(path))
        return
    with server.paused():
        server.rpc("reload_weights", weights_path=str(path))
    server.stats.weight_syncs += 1
