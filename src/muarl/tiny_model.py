"""The embedded model: a tiny Qwen3-architecture causal LM with a BPE tokenizer trained on our domains.

Nothing can be downloaded at run time, yet the whole pipeline must run on a laptop CPU and in CI. So
muarl builds its own model: the transformers ``Qwen3ForCausalLM`` class (random init, a few hundred
thousand parameters by default), the byte-level BPE tokenizer shipped with the base (trained once with
``tokenizers`` on the built-in domains' policies, tool schemas, task texts and conversations:
:mod:`muarl.tokenizer_training`), and a Qwen-style chat template with tool support
(``<tool_call>{json}</tool_call>``). It is saved as an ordinary HF checkpoint, so every other code path
treats it exactly like SmolLM2 or a real Qwen3.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from muarl.cache import cache_dir
from muarl.files import atomic_folder

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>",
                  "<tool_response>", "</tool_response>"]

#: A Qwen-style template with tools, written for muarl. Tool schemas go into the system turn; an
#: assistant turn renders its text, then one <tool_call> block per call; consecutive tool results are
#: grouped into one user turn of <tool_response> blocks.
CHAT_TEMPLATE = r"""
{%- set sys = messages[0]['content'] if messages and messages[0]['role'] == 'system' else '' -%}
{%- if tools -%}
<|im_start|>system
{% if sys %}{{ sys }}

{% endif %}# Tools

You may call one or more functions. Their signatures are inside <tools></tools>:
<tools>
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}</tools>

To call a function, write a JSON object with its name and arguments inside <tool_call></tool_call> tags:
<tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call><|im_end|>
{% elif sys -%}
<|im_start|>system
{{ sys }}<|im_end|>
{% endif -%}
{%- for message in messages -%}
{%- if message['role'] == 'system' and loop.first -%}
{%- elif message['role'] == 'assistant' -%}
<|im_start|>assistant
{{ message['content'] or '' }}
{%- for call in message.get('tool_calls') or [] -%}
{%- set fn = call['function'] if 'function' in call else call -%}
{{ '\n' if (message['content'] or not loop.first) else '' }}<tool_call>
{"name": "{{ fn['name'] }}", "arguments": {{ fn['arguments'] | tojson if fn['arguments'] is mapping else fn['arguments'] }}}
</tool_call>
{%- endfor %}<|im_end|>
{% elif message['role'] == 'tool' -%}
{%- if loop.first or loop.previtem['role'] != 'tool' %}<|im_start|>user
{% endif -%}
<tool_response>
{{ message['content'] }}
</tool_response>
{% if loop.last or loop.nextitem['role'] != 'tool' %}<|im_end|>
{% endif -%}
{%- else -%}
<|im_start|>{{ message['role'] }}
{{ message['content'] }}<|im_end|>
{% endif -%}
{%- endfor -%}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif -%}
""".strip()


#: The system turn of the compact template: the tool names only, no policy text and no schemas. A model
#: trained from random weights on one domain cannot read either (it learns the policy and the tools from
#: its data), and they are about half of every conversation's tokens (the demo's conversations: 683 tokens
#: on average instead of 1,342; README, "The CPU demo").
_COMPACT_SYSTEM = r"""
{%- if tools -%}
<|im_start|>system
tools: {% for tool in tools %}{{ (tool['function'] if 'function' in tool else tool)['name'] }}{{ ', ' if not loop.last else '' }}{% endfor %}<|im_end|>
{% endif -%}
"""

#: what ``init-model --prompt`` chooses from
PROMPTS = ("full", "compact")


def chat_template(prompt: str = "full") -> str:
    """The embedded model's chat template: ``full`` renders the policy and the tool schemas into the system
    turn (what a pretrained model reads); ``compact`` only the tool names (see :data:`_COMPACT_SYSTEM`).
    Either is saved with the model, so synth data, SFT, rollouts and GRPO all render the same way."""
    if prompt not in PROMPTS:
        raise ValueError(f"unknown prompt {prompt!r}: choose one of {', '.join(PROMPTS)}")
    if prompt == "full":
        return CHAT_TEMPLATE
    start, end = CHAT_TEMPLATE.index("{%- if tools -%}"), CHAT_TEMPLATE.index("{%- for message in messages -%}")
    return CHAT_TEMPLATE[:start] + _COMPACT_SYSTEM.strip() + "\n" + CHAT_TEMPLATE[end:]


@dataclass
class TinyConfig:
    """Size of the embedded model. The defaults run a GRPO step in seconds on two CPU cores."""

    vocab_size: int = 4096
    hidden_size: int = 64
    intermediate_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 16
    max_position_embeddings: int = 8192
    seed: int = 0

    @classmethod
    def shaped(cls, hidden_size: int = 64, layers: int = 2, heads: int = 4, head_dim: int = 0, kv_heads: int = 0,
               seed: int = 0, **rest: int) -> TinyConfig:
        """A config from the few numbers people choose (``init-model`` and the demo): the MLP 4x wide,
        ``head_dim`` 0 meaning hidden / heads and ``kv_heads`` 0 meaning heads / 2."""
        kv_heads = kv_heads or max(1, heads // 2)
        if heads % kv_heads:
            raise ValueError(f"{heads} attention heads must be a multiple of --kv-heads {kv_heads}")
        return cls(hidden_size=hidden_size, intermediate_size=4 * hidden_size, num_hidden_layers=layers,
                   num_attention_heads=heads, num_key_value_heads=kv_heads,
                   head_dim=head_dim or hidden_size // heads, seed=seed, **rest)


#: the tokenizer every embedded model shares: the shipped base's, which
#: :func:`muarl.tokenizer_training.train_tokenizer` trained once on the built-in domains' texts and
#: conversations (read here, not retrained: building ``tiny-random`` plays no episode)
SHIPPED_TOKENIZER = Path(__file__).resolve().parent / "base"


def shipped_tokenizer() -> Any:
    """The embedded models' tokenizer (:data:`SHIPPED_TOKENIZER`), with the full chat template."""
    from transformers import AutoTokenizer

    if not (SHIPPED_TOKENIZER / "tokenizer.json").exists():
        raise FileNotFoundError(f"the shipped tokenizer is missing from {SHIPPED_TOKENIZER}: reinstall muarl")
    tokenizer = AutoTokenizer.from_pretrained(SHIPPED_TOKENIZER)
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


#: bumped whenever the embedded model's recipe (tokenizer corpus, shape) changes, so caches rebuild
TINY_VERSION = 2


def tiny_path() -> Path:
    """The embedded tiny model from random weights, built on first use (deterministic: same seed, same
    weights); its tokenizer is the one every embedded model shares."""
    target = cache_dir() / f"tiny-{TINY_VERSION}"
    if not (target / "config.json").exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        build(target)
    return target


def build(out: str | Path, config: TinyConfig | None = None, tokenizer: Any | None = None,
          prompt: str = "full") -> Path:
    """Build and save the embedded model (tokenizer + random-init Qwen3) as an HF checkpoint at ``out``.

    ``tokenizer``: default the one every embedded model shares (:func:`shipped_tokenizer`); ``muarl
    init-model --vocab-size`` trains another (:mod:`muarl.tokenizer_training`). ``prompt`` picks the chat
    template (:func:`chat_template`).
    """
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = config or TinyConfig()
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} exists; remove it or choose another --out")
    if out.exists():  # an empty folder (say, made by mkdir -p) is fine
        out.rmdir()
    template = chat_template(prompt)  # an unknown prompt fails before any work
    tokenizer = tokenizer if tokenizer is not None else shipped_tokenizer()
    tokenizer.chat_template = template
    torch.manual_seed(config.seed)
    model_config = Qwen3Config(
        vocab_size=len(tokenizer), hidden_size=config.hidden_size, intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_hidden_layers, num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads, head_dim=config.head_dim,
        max_position_embeddings=config.max_position_embeddings, tie_word_embeddings=True,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"), bos_token_id=None,
    )
    model = Qwen3ForCausalLM(model_config)
    with atomic_folder(out) as tmp:  # a half-written checkpoint is never picked up; a finished one is kept
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    return out


def build_shaped(out: str | Path, hidden_size: int, layers: int, heads: int, head_dim: int, kv_heads: int,
                 seed: int, prompt: str) -> Path:
    """:func:`build` of a model shaped by :meth:`TinyConfig.shaped`, with the tokenizer every embedded model
    shares (:func:`shipped_tokenizer`): what the demo and ``muarl pretrain`` start from."""
    return build(out, TinyConfig.shaped(hidden_size, layers, heads, head_dim, kv_heads, seed), prompt=prompt)


def bias_end_of_turn(model: Any, tokenizer: Any, bias: float) -> Any:
    """Add ``bias`` to the end-of-turn logit of every forward pass (returns the hook handle).

    A randomly initialised model almost never ends its turn, so every episode would stop at the
    per-turn token limit. Benchmarks and tests that need realistic multi-turn episodes from an untrained
    model use this to make turns end after a few dozen tokens. ``handle.remove()`` undoes it.
    """
    stop = tokenizer.convert_tokens_to_ids("<|im_end|>")

    def hook(module: Any, inputs: Any, output: Any) -> Any:
        output[..., stop] += bias
        return output

    return model.get_output_embeddings().register_forward_hook(hook)
