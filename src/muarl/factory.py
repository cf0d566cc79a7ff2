"""Policies and users from command-line specs, so every command names them the same way.

Policies: ``expert`` | ``expert-noconfirm`` | ``noop`` (the do-nothing baseline: how much success a
table owes to tasks that need no action) | ``hf:PATH`` (a checkpoint directory, a LoRA adapter directory
(``OUT/adapter``, merged into its base) or ``hf:tiny`` / ``hf:smollm2``) | ``vllm:PATH`` (the same
checkpoints served by vLLM, an adapter served on its base, token in / token out; needs
vLLM: ``scripts/install_vllm.sh``) | ``vllm-server:URL#MODEL`` (the same, from a running vLLM server;
needs no vLLM here) | ``openai:URL#MODEL`` | ``module:attr`` (a :class:`Policy` of one's own, or a
zero-argument factory of one). Users: ``scripted`` | ``static`` (the task stated whole in one opening, then
only yes to the wanted action: the ablation's user without a dialogue) | ``llm`` (SmolLM2) or ``llm:MODEL_DIR`` (a
local checkpoint), each served for the run by :mod:`muarl.users.embedded` | ``llm:URL#MODEL`` | ``replay:FILE.jsonl`` |
``module:attr`` (a :class:`UserSimulator`, or a factory). A known prefix wins over ``module:attr``
(``openai:http://...`` holds colons). An API key for an endpoint comes from ``$OPENAI_API_KEY`` (default
"EMPTY" for local servers).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from muarl import plugins
from muarl.policies.base import Policy
from muarl.users.base import UserSimulator

#: the accepted --policy forms, for help texts and error messages
POLICY_FORMS = ("expert | expert-noconfirm | noop | hf:PATH | vllm:PATH | vllm-server:URL#MODEL | openai:URL#MODEL"
                " | module:attr")
#: the accepted --user forms
USER_FORMS = "scripted | static | llm (SmolLM2, served for the run) | llm:MODEL_DIR (the same) | llm:URL#MODEL | replay:FILE.jsonl | module:attr"


class SpecError(ValueError):
    """A malformed --policy / --user value; the message says what the accepted forms are."""


def split_endpoint(spec: str, kind: str) -> tuple[str, str]:
    """(URL, model) of a ``PREFIX:URL#MODEL`` spec; a malformed one is a one-line SpecError naming ``kind``."""
    rest = spec.split(":", 1)[1]
    url, sep, model = rest.rpartition("#")
    if not sep or not url or not model:
        raise SpecError(f"{kind} {spec!r}: expected {spec.split(':')[0]}:URL#MODEL, "
                        f"e.g. {spec.split(':')[0]}:http://127.0.0.1:8000/v1#my-model")
    return url, model


def reproducible_user(spec: str | None) -> bool:
    """Whether a ``--user`` spec plays the same way whatever the timing: the in-process users (scripted,
    static, replay, one's own module). An LLM user behind a server is not (its server batches requests as
    they come), so holding muarl's engine to a fixed batch order for it would only slow the run (6.3x the wall
    time at 200 ms a reply, benchmarks/rollout_throughput.py) without making it reproducible."""
    return not (spec or "scripted").startswith("llm")


def make_policy(spec: str, **options: Any) -> Policy:
    """A policy from its spec; ``options`` go to the backend (temperature, max_new_tokens, seed ...)."""
    if spec in ("expert", "expert-noconfirm"):
        from muarl.policies.expert import ExpertPolicy

        return ExpertPolicy(skip_confirmation=spec == "expert-noconfirm")
    if spec == "noop":
        from muarl.policies.noop import NoopPolicy

        return NoopPolicy()
    if spec.startswith("hf:"):
        from muarl.policies.hf import HFPolicy

        keys = ("temperature", "top_p", "max_new_tokens", "max_context", "max_batch", "seed", "deterministic")
        return HFPolicy(spec[3:], **{k: v for k, v in options.items() if k in keys and v is not None})
    if spec.startswith("vllm-server:"):
        from muarl.policies.vllm_server import ServerError, VLLMServerPolicy

        url, model = split_endpoint(spec, "policy")
        keys = ("temperature", "top_p", "max_new_tokens", "max_context", "max_batch", "seed")
        try:
            return VLLMServerPolicy(url, model, **{k: v for k, v in options.items() if k in keys and v is not None})
        except ServerError as err:  # unreachable, or not serving MODEL: one line, not a traceback
            raise SpecError(f"policy {spec!r}: {err}") from None
    if spec.startswith("vllm:"):
        from muarl.policies.vllm_engine import import_vllm

        try:
            import_vllm()
        except ImportError as err:  # one line naming the install script, not a traceback
            raise SpecError(f"policy {spec!r}: {err}") from None
        from muarl.policies.vllm import VLLMPolicy

        keys = ("temperature", "top_p", "max_new_tokens", "max_context", "max_batch", "seed")
        return VLLMPolicy(spec[5:], **{k: v for k, v in options.items() if k in keys and v is not None})
    if spec.startswith("openai:"):
        from muarl.policies.openai import OpenAIPolicy

        url, model = split_endpoint(spec, "policy")
        keys = ("temperature", "seed")
        kwargs = {k: v for k, v in options.items() if k in keys and v is not None}
        if options.get("max_new_tokens"):
            kwargs["max_tokens"] = options["max_new_tokens"]
        return OpenAIPolicy(url, model, api_key=os.environ.get("OPENAI_API_KEY", "EMPTY"), **kwargs)
    if ":" in spec:
        return plugins.load(spec, Policy, "--policy", "policies")
    raise SpecError(f"unknown policy {spec!r}; use {POLICY_FORMS.replace(' | ', ', ')}")


def make_user(spec: str, http_timeout: float | None = None, max_tokens: int | None = None) -> UserSimulator:
    """A user from its spec; ``http_timeout`` sets an llm: user's per-request HTTP timeout (seconds),
    ``max_tokens`` its cap on one message's tokens."""
    if http_timeout is not None and http_timeout <= 0:
        raise SpecError(f"--user-http-timeout must be above 0 seconds, not {http_timeout:g}")
    if max_tokens is not None and max_tokens < 1:
        raise SpecError(f"--user-max-tokens must be at least 1 (got {max_tokens})")
    if spec == "scripted":
        from muarl.users.scripted import ScriptedUser

        return ScriptedUser()
    if spec == "static":
        from muarl.users.static import StaticUser

        return StaticUser()
    http: dict[str, Any] = {}
    from muarl.users import embedded

    if embedded.served_model(spec) is not None:  # a server a muarl command started for its run: waited on, not retried
        spec, max_tokens = embedded.resolve(spec), max_tokens or embedded.MAX_TOKENS
        http = {"timeout": embedded.HTTP_TIMEOUT_S, "max_retries": 0}
    if spec.startswith("llm:"):
        from muarl.users.llm import LLMUser

        url, model = split_endpoint(spec, "user")
        if http_timeout is not None:
            http["timeout"] = http_timeout
        return LLMUser(url, model, api_key=os.environ.get("OPENAI_API_KEY", "EMPTY"), max_tokens=max_tokens, **http)
    if spec.startswith("replay:"):
        from muarl.rollout import load_trajectories
        from muarl.users.replay import ReplayUser

        path = Path(spec[7:])
        if not path.exists():
            raise SpecError(f"user {spec!r}: no such file {path}")
        return ReplayUser(load_trajectories(path).values())
    if ":" in spec:
        return plugins.load(spec, UserSimulator, "--user", "users")
    raise SpecError(f"unknown user {spec!r}; use {USER_FORMS.replace(' | ', ', ')}")
