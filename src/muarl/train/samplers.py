"""What samples a GRPO step's rollouts (``--rollout-engine``): muarl's transformers engine on the trainer's
own model, or a vLLM engine whose weights follow the trainer's after every update: in this process
(``vllm``) or vLLM servers addressed by URL (``vllm-server:URL#MODEL``, or several comma-separated, which
need no vLLM here).

Both hand the step a :class:`~muarl.policies.base.Policy` per batch of tasks, seeded by (run seed, step,
batch), and both produce the same :class:`~muarl.types.Trajectory` (token ids, loss mask, the sampler's
log-probs), so the update cannot tell them apart except through the rollout-training mismatch it logs
(:mod:`muarl.algorithms.mismatch`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

import torch

from muarl.faults import EngineFailed
from muarl.models import ModelFiles, causal_lm, is_lora
from muarl.policies.base import Policy, PolicySession
from muarl.train.distributed import Dist
from muarl.train.engine_spec import SERVER, server_endpoints
from muarl.train.memory import give_back_freed
from muarl.weight_sync import SyncFailed

#: how many of the opening prompt's last positions :meth:`VLLMSampler.check` compares (the trainer builds
#: a vocabulary-sized row of logits for each; the system turn of a tau2 domain is thousands of tokens)
PROBE_TOKENS = 256


class Sampler(Protocol):
    def policy(self, seed: int) -> Policy:
        """The policy one batch of a step samples with; its episodes' draws depend on ``seed`` and the task."""

    def check(self, model: Any, domain: Any) -> None:
        """Before the first step: refuse (ValueError, one line) a sampler that does not sample ``model``."""

    def release(self) -> None:
        """Before an update: give back what the update needs more (an engine's GPU memory) until ``sync``."""

    def sync(self, model: Any) -> float:
        """Make the next rollouts sample from ``model``'s current weights; the seconds it took."""

    def close(self) -> None:
        """Release what the sampler holds (an engine's memory)."""


class _Unsynced:
    """A sampler with no weights of its own to follow the trainer's: nothing to check, release, sync or
    close."""

    def check(self, model: Any, domain: Any) -> None:
        pass

    def release(self) -> None:
        pass

    def sync(self, model: Any) -> float:
        return 0.0

    def close(self) -> None:
        pass


class HFSampler(_Unsynced):
    """muarl's own engine (:class:`~muarl.policies.hf.HFPolicy`) on the trainer's model object: the weights
    are shared, so there is nothing to sync."""

    def __init__(self, model: Any, tokenizer: Any, temperature: float, max_new_tokens: int,
                 deterministic: bool = True):
        self.model, self.tokenizer = model, tokenizer
        self.temperature, self.max_new_tokens = temperature, max_new_tokens
        self.deterministic = deterministic  # a fixed batch order (muarl.policies.hf): same run, any timing

    def policy(self, seed: int) -> Policy:
        from muarl.policies.hf import HFPolicy
        # a fresh policy per batch: its sampling generators depend on (seed, task, episode order) only, so a
        # resumed run samples what an uninterrupted one would have sampled
        return HFPolicy((causal_lm(self.model), self.tokenizer), temperature=self.temperature,
                        max_new_tokens=self.max_new_tokens, seed=seed, deterministic=self.deterministic)


class VLLMSampler:
    """A vLLM engine for the whole run, synced to the trainer's weights at once (a resumed run's included)
    and after every update: a LoRA run's adapter is saved and reloaded in place, a full fine-tuning run's
    weights are pushed in. ``engine_policy``: an in-process :class:`~muarl.policies.vllm.VLLMPolicy`
    (:meth:`in_process`) or a :class:`~muarl.policies.vllm_server.VLLMServerPolicy`; the sampler owns it
    (closes it, also when the first sync fails). ``sleep``: the in-process engine sleeps through each update
    (started with ``enable_sleep_mode``; GPU builds only) and wakes for the next sync."""

    def __init__(self, engine_policy: Any, model: Any, lora: bool, sleep: bool = False):
        from muarl.weight_sync.engine import EngineSync

        self.engine_policy, self.lora, self.sleep = engine_policy, lora, sleep
        self.weights = EngineSync(engine_policy, lora)
        self.asleep = False
        try:
            self.sync(model)
        except BaseException:
            self.close()
            raise

    @classmethod
    def in_process(cls, base: str, model: Any, temperature: float, max_new_tokens: int, lora_rank: int = 0,
                   sleep: bool = False, **engine_options: Any) -> VLLMSampler:
        """One in-process engine started on the run's base checkpoint; ``engine_options`` go to the engine
        (``dtype``, ``kv_cache_gib``, vLLM engine arguments)."""
        from muarl.policies.vllm import VLLMPolicy

        if sleep:
            engine_options["enable_sleep_mode"] = True
        if lora_rank > 0:
            engine_options.setdefault("max_lora_rank", lora_rank)  # the engine rounds it up to a rank vLLM serves
        engine_policy = VLLMPolicy(base, temperature=temperature, max_new_tokens=max_new_tokens,
                                   enable_lora=lora_rank > 0, **engine_options)
        return cls(engine_policy, model, lora_rank > 0, sleep=sleep)

    def policy(self, seed: int) -> Policy:
        self.engine_policy.seed = seed  # the episodes' seeds derive from it (and the task), as HFPolicy's do
        return self.engine_policy

    def check(self, model: Any, domain: Any) -> None:
        check_engine(self.engine_policy, model, domain, self.lora)

    def release(self) -> None:
        if self.sleep and not self.asleep:
            self.engine_policy.engine.sleep()
            self.asleep = True

    def sync(self, model: Any) -> float:
        """The new weights into the engine; an engine that fails to take them (a server gone, an engine
        dead) is an :class:`EngineFailed`, one line: the run stops, its checkpoints as they were."""
        began = time.perf_counter()
        try:
            if self.asleep:  # weights back from CPU memory and a fresh KV cache, then the new weights on top
                self.engine_policy.engine.wake_up()
                self.asleep = False
            self.weights.push(model)
        except RuntimeError as err:  # the server's ServerError, the in-process engine's errors
            raise EngineFailed(f"the rollout engine {self.engine_policy.name} could not take the updated weights "
                               f"({err}); rerun the command once it is back: the run resumes from its last "
                               "checkpoint") from err
        return time.perf_counter() - began

    def close(self) -> None:
        self.weights.close()
        self.engine_policy.close()


def check_engine(policy: Any, model: Any, domain: Any, lora: bool) -> None:
    """Refuse a vLLM engine (``policy``: a :class:`~muarl.policies.vllm.VLLMPolicy` or a server's) that,
    synced, still does not sample ``model``: its teacher-forced log-probs of the run's opening prompt (``domain``'s system turn, which every episode starts with, and a greeting)
    against the trainer's, on the last :data:`PROBE_TOKENS` positions. The sync makes them agree up to
    numerics unless the engine serves another base checkpoint than ``--model`` (a LoRA run trains an
    adapter on the engine's base) or did not take the weights (a full fine-tuning run); the mismatch
    warning of later steps would say so only after a step trained on another policy's episodes."""
    import asyncio

    from muarl.algorithms.mismatch import HIGH, LOW, WARN_OUTSIDE, mismatch_sums
    from muarl.train.scoring import sequence_logprobs
    from muarl.types import Message

    ids = policy.chat_format(domain).prompt_ids([Message(role="system", content=domain.policy),
                                                 Message(role="user", content="Hello.")])
    try:
        scored = asyncio.run(policy.engine.generate(ids, policy.engine.score_params(), policy.lora)).prompt_logprobs
    except RuntimeError as err:
        raise EngineFailed(f"the rollout engine {policy.name} could not score the opening prompt ({err})") from err
    mask = [int(p >= max(1, len(ids) - PROBE_TOKENS)) for p in range(len(ids))]
    engine = torch.tensor([0.0 if v is None else v for v in scored or []], dtype=torch.float64)
    if engine.shape[0] != len(ids):
        raise ValueError(f"{policy.name}: the engine returned {engine.shape[0]} prompt log-probs for a "
                         f"{len(ids)}-token prompt")
    with torch.no_grad():
        trainer, _ = sequence_logprobs(model, ids, 1.0, mask)
    kl, outside, tokens = mismatch_sums(trainer.double().cpu(), engine, torch.tensor(mask))
    if outside / tokens > WARN_OUTSIDE:
        cause = ("a LoRA run trains an adapter on the engine's base checkpoint, which must be --model's"
                 if lora else "the engine did not take the trainer's weights")
        raise ValueError(f"{policy.name}: the engine's log-probs of the run's opening prompt disagree with the "
                         f"trainer's after the weight sync (mismatch_kl {kl / tokens:.3g}, {outside / tokens:.0%} "
                         f"of {tokens:.0f} tokens with a probability ratio outside [{LOW:g}, {HIGH:g}]): it does "
                         f"not serve --model's weights ({cause})")


class CopySampler:
    """A sampler on a copy of the weights, for runs whose model the engine cannot sample from directly: a
    sharded run's (``--fsdp``), and an asynchronous run's (``--max-staleness``), whose engine samples while
    the trainer changes its weights. The engine ``config.rollout_engine`` names runs on ``plain``, an
    unsharded copy of the model into which the weights are copied (shards gathered), one parameter at a
    time, at the start (a resumed run's) and after every update. A LoRA run gathers only its adapter.

    The copy holds the weights alone (no gradients, no optimizer state), in the dtype the engine samples in
    (:func:`rollout_copy`). muarl's engine samples from it on every rank that plays episodes, so in lockstep every
    rank gathers (all-gathers); a vLLM engine takes the weights from it (in CPU memory). With servers only
    rank 0 pushes the weights, and under ``--max-staleness`` only rank 0's stream samples, so there only
    rank 0 holds a copy and receives the shards (the other ranks pass ``plain=None`` and only send theirs).
    ``release`` (before each update) gives the copy's memory back to the update and ``sync`` allocates it
    again and gathers into it, except where the copy must stay: an asynchronous run samples from it during
    the update, and a LoRA run's copy keeps its base (which is never gathered)."""

    def __init__(self, config: Any, model: Any, plain: Any | None, tokenizer: Any, dist: Dist | None = None,
                 files: ModelFiles | None = None):
        # only rank 0 holds a copy with servers (it alone pushes) and with a stream (it alone samples)
        self.to_main = config.rollout_engine.startswith(SERVER) or bool(config.max_staleness)
        self.lora = is_lora(model)
        self.releasable = not self.lora and not config.max_staleness  # an asynchronous stream samples on
        self.plain = plain.eval().requires_grad_(False) if plain is not None else None
        self.released: dict[str, torch.Size] = {}
        self._gather(model)
        self.inner = make_sampler(config, plain, tokenizer, dist, files)

    def _gather(self, model: Any) -> None:
        from muarl.train.sharding import gather_into

        if self.released:
            self._allocate()
        gather_into(model, self.plain, only_trainable=self.lora, to_main=self.to_main)

    def policy(self, seed: int) -> Policy:
        return self.inner.policy(seed)

    def check(self, model: Any, domain: Any) -> None:
        self.inner.check(self.plain, domain)

    def release(self) -> None:
        self.inner.release()
        if self.plain is None or not self.releasable or self.released:
            return
        with torch.no_grad():
            for name, param in self.plain.named_parameters():  # tied weights are one parameter, named once
                self.released[name] = param.shape
                param.data = param.data.new_empty(0)
        give_back_freed()

    def _allocate(self) -> None:
        give_back_freed()  # the update's activations and gradients, freed into the heap, before the copy returns
        with torch.no_grad():
            for name, param in self.plain.named_parameters():
                param.data = param.data.new_empty(self.released[name])
        self.released = {}

    def sync(self, model: Any) -> float:
        began = time.perf_counter()
        self._gather(model)
        return time.perf_counter() - began + self.inner.sync(self.plain)

    @property
    def sync_bytes(self) -> int:
        return int(getattr(self.inner, "sync_bytes", 0) or 0)

    @property
    def changed_share(self) -> float | None:
        return getattr(self.inner, "changed_share", None)

    def close(self) -> None:
        self.inner.close()


class Bystander(_Unsynced):
    """The sampler of a training process that plays no episode: under ``--max-staleness`` with several
    processes one stream, rank 0's, plays them all (:class:`~muarl.train.orchestrator.Streamed`), and the
    other ranks only send their shards to rank 0's copy at each sync (a :class:`CopySampler` around this)."""

    def policy(self, seed: int) -> Policy:
        raise RuntimeError("this training process plays no episode: rank 0's stream plays them all")


def samples_here(config: Any, dist: Dist) -> bool:
    """Whether this training process plays episodes: every process in lockstep, each its share of a step's
    groups; rank 0 alone under ``--max-staleness``, whose one stream plays every group."""
    return dist.main or not config.max_staleness


def rollout_copy(config: Any, dist: Dist) -> Any | None:
    """The unsharded copy a sharded run's :class:`CopySampler` samples from (or pushes to the engine), on
    the ranks that need one: every rank for muarl's engine (on its device), each rank's in-process vLLM
    engine (CPU memory), rank 0 alone for servers (CPU memory; None elsewhere). In the dtype the run's
    sharded forwards compute in (bfloat16 on GPUs, float32 on the CPU); the gather fills it
    (:func:`~muarl.train.sharding.plain_copy`)."""
    from muarl.train.sharding import mixed_precision, plain_copy

    if not dist.main and (config.rollout_engine.startswith(SERVER) or not samples_here(config, dist)):
        return None
    device = dist.device if config.rollout_engine == "hf" else torch.device("cpu")
    return plain_copy(config, torch.bfloat16 if mixed_precision(config, dist.device) else torch.float32, device)


class ServerSampler:
    """vLLM servers addressed by URL (``vllm-server:URL#MODEL``, or several comma-separated), the rollout
    engine of every training process of a run. ``policies``: one
    :class:`~muarl.policies.vllm_server.VLLMServerPolicy` per server, owned (closed) by the sampler.

    The servers are shared by the processes, so one of them, rank 0, does what changes a server: it writes
    the new weights (LoRA: the adapter) once and has every server load them, in parallel (a thread per
    server: each load is HTTP requests that wait on the server), at the start and after every update; it
    alone runs the pre-step check. The weights are the same on every rank after an update (the gradients
    are summed), so rank 0's are every rank's. The other ranks wait for rank 0's outcome before they sample
    again (sharing it is an all-gather, so also a barrier) and raise the same one-line error when it failed.
    A step's groups spread over the servers by :class:`RoutedPolicy`; with one server each batch samples
    from its policy directly, as :class:`VLLMSampler` does."""

    def __init__(self, policies: list[Any], model: Any, lora: bool, dist: Dist | None = None,
                 weight_sync: str = "memory", sync_dir: str | None = None):
        from muarl.weight_sync.servers import ServerSync

        self.policies, self.lora, self.dist = policies, lora, dist or Dist()
        try:
            self.weights = ServerSync(policies, lora, weight_sync, sync_dir)
            self.sync(model)
        except BaseException:
            self.close()
            raise

    @property
    def sync_bytes(self) -> int:
        return self.weights.sync_bytes

    @property
    def changed_share(self) -> float | None:
        return self.weights.changed_share

    def policy(self, seed: int) -> Policy:
        for policy in self.policies:
            policy.seed = seed  # the episodes' seeds derive from it (and the task), whichever server samples
        if len(self.policies) == 1:
            return self.policies[0]
        return RoutedPolicy(self.policies, first=self.dist.rank)

    def check(self, model: Any, domain: Any) -> None:
        """:func:`check_engine` on every server, by rank 0 (the weights are the same on every rank)."""
        def check_all() -> None:
            for policy in self.policies:
                check_engine(policy, model, domain, self.lora)

        self._on_main(check_all)

    def release(self) -> None:
        pass  # a server's memory is not the trainer's

    def sync(self, model: Any) -> float:
        """Rank 0 pushes ``model``'s weights into every server (:class:`~muarl.weight_sync.servers.ServerSync`);
        every rank returns once they are in (the seconds it took), or raises :class:`EngineFailed` naming the
        servers that did not take them."""
        began = time.perf_counter()
        self._on_main(lambda: self._push(model))
        if not self.dist.main:  # rank 0 loaded the adapter; every rank's turns sample with it
            self.weights.follow()
        return time.perf_counter() - began

    def _push(self, model: Any) -> None:
        try:
            self.weights.push(model)
        except SyncFailed as err:
            raise EngineFailed(f"{err}; rerun the command once it is back: the run resumes from its last "
                               "checkpoint") from None

    def _on_main(self, action: Callable[[], None]) -> None:
        """Run ``action`` on rank 0 and share its outcome: a failure is raised on every rank, in the same
        one line (rank 0's own exception there); the other ranks wait until rank 0 is done."""
        self.dist.from_main(action, shareable=(ValueError, EngineFailed))

    def close(self) -> None:
        if getattr(self, "weights", None) is not None:  # its adapter unloaded before the policies close
            self.weights.close()
            self.weights = None
        for policy in self.policies:
            policy.close()


class RoutedPolicy(Policy):
    """Several servers' policies as one, for one batch of a step: all the episodes of a task (a GRPO group)
    go to one server, the one with the fewest of this batch's episodes in flight when the group's first
    episode starts (ties: the first from server ``first`` on, so that training processes, each routing its
    own share of the groups, start on different servers).

    Whole groups, because a group's episodes share their opening (one task, one user seed), which the
    server's prefix cache then computes once. Which server samples an episode does not change what it
    samples: every server holds the same weights and an episode's seeds derive from the policy's seed, the
    task and the episode alone. Each trajectory's metadata names its server (``server``: the policy's
    name). Any policies route so; the servers' are :class:`~muarl.policies.vllm_server.VLLMServerPolicy`."""

    def __init__(self, policies: list[Any], first: int = 0):
        self.policies = policies
        self.first = first % len(policies)
        self.name = ",".join(policy.name for policy in policies)
        self.in_flight = [0] * len(policies)
        self.routes: dict[str, int] = {}

    def session(self, domain: Any, task: Any, seed: int | None = None) -> PolicySession:
        n = len(self.policies)
        server = self.routes.get(task.id)
        if server is None:
            server = min(range(n), key=lambda k: (self.in_flight[k], (k - self.first) % n))
            self.routes[task.id] = server
        inner = self.policies[server].session(domain, task, seed)
        self.in_flight[server] += 1
        return _RoutedSession(inner, self, server)

    def provenance(self) -> dict[str, Any]:
        return {"name": self.name, "servers": [policy.provenance() for policy in self.policies]}


class _RoutedSession(PolicySession):
    """One episode on the server :class:`RoutedPolicy` chose; its end frees a place there."""

    def __init__(self, inner: PolicySession, router: RoutedPolicy, server: int):
        self.inner, self.router, self.server = inner, router, server

    async def next(self, new_messages: list[Any]) -> Any:
        return await self.inner.next(new_messages)

    def close(self) -> dict[str, Any]:
        try:
            meta = self.inner.close()
        finally:
            self.router.in_flight[self.server] -= 1
        return {**(meta or {}), "server": self.router.policies[self.server].name}


def server_policies(config: Any) -> list[Any]:
    """A :class:`~muarl.policies.vllm_server.VLLMServerPolicy` on each of ``config.rollout_engine``'s
    servers, rendering episodes with the trainer's tokenizer (``config.model``); an unreachable server, or
    one not serving the model, is a one-line ValueError naming it (the others' connections closed)."""
    from muarl.policies.vllm_server import ServerError, VLLMServerPolicy

    policies: list[Any] = []
    try:
        for url, name in server_endpoints(config.rollout_engine):
            policies.append(VLLMServerPolicy(url, name, temperature=config.temperature,
                                             max_new_tokens=config.max_new_tokens, seed=config.seed,
                                             tokenizer=config.model))
    except ServerError as err:
        for policy in policies:
            policy.close()
        raise ValueError(f"--rollout-engine {config.rollout_engine!r}: {err}") from None
    except BaseException:
        for policy in policies:
            policy.close()
        raise
    return policies


def check_in_process_engine(config: Any, world: int) -> None:
    """Refuse ``--rollout-engine vllm`` in a run of several training processes (``torchrun``, ``accelerate
    launch``; ``world`` of them), in one line, before any weights load: an in-process vLLM engine there has
    never run (vLLM builds its own distributed state in the process, where the trainer's process group
    and torchrun's environment already are). vLLM servers, which every process shares, are the way."""
    if config.rollout_engine == "vllm" and world > 1:
        raise ValueError(f"--rollout-engine vllm runs a vLLM engine inside the training process, which a run of "
                         f"{world} training processes does not support: start a vLLM server (docs/vllm.md) and "
                         f"pass --rollout-engine {SERVER}URL#MODEL (every process samples from it), or train in "
                         "one process")


def check_rollout_engine(config: Any) -> None:
    """Refuse, before anything is written, a rollout engine that cannot run: vLLM not installed (in-process
    engine) or a server that cannot be reached or does not serve the model (one line each)."""
    if config.rollout_engine == "vllm":
        from muarl.policies.vllm_engine import INSTALL_HINT, available

        if config.vllm_sleep and not torch.cuda.is_available():
            raise ValueError("--vllm-sleep needs a GPU: vLLM's CPU build has no sleep mode (\"Sleep mode is not "
                             "supported on current platform.\")")
        if not available():
            raise ValueError(f"--rollout-engine vllm: {INSTALL_HINT}")
    elif config.rollout_engine.startswith(SERVER):
        for policy in server_policies(config):  # the run's own connections are opened by make_sampler
            policy.close()


def make_sampler(config: Any, model: Any, tokenizer: Any, dist: Dist | None = None,
                 files: ModelFiles | None = None) -> Sampler:
    """The sampler ``config.rollout_engine`` names, for a GRPO run's ``model`` on this process of ``dist``
    (servers are shared by the processes: rank 0 alone pushes the weights into them); ``files``: where
    ``--model``'s files are, as the run located them (looked up here when not given).

    A run whose ``--model`` is a LoRA adapter directory trains on that adapter merged into its base: the
    engine starts on the whole checkpoint beneath and is synced with full (merged) weights, as an adapter
    trained on top of the merged one cannot be served on that checkpoint."""
    from muarl.models import locate

    def located() -> ModelFiles:
        return files if files is not None else locate(config.model)

    lora = config.lora_r > 0 and not located().adapters
    if config.rollout_engine.startswith(SERVER):  # every rank: rank 0 pushes, the others wait on it
        return ServerSampler(server_policies(config), model, lora, dist, weight_sync=config.vllm_weight_sync,
                             sync_dir=config.vllm_sync_dir)
    if not samples_here(config, dist):
        return Bystander()
    if config.rollout_engine == "vllm":
        # the engine's precision follows the trainer's forwards: bf16 where they autocast to it (a GPU)
        cuda = torch.cuda.is_available()
        bf16 = config.bf16 if config.bf16 is not None else cuda
        # colocated with the trainer: vLLM's default (90% of the GPU for weights and KV cache) would starve it
        options = {"gpu_memory_utilization": config.vllm_gpu_memory} if cuda else {}
        return VLLMSampler.in_process(str(located().root), model, config.temperature,
                                      config.max_new_tokens, lora_rank=config.lora_r if lora else 0,
                                      sleep=config.vllm_sleep,
                                      dtype="bfloat16" if bf16 else "float32", seed=config.seed, **options)
    from muarl.factory import reproducible_user

    return HFSampler(model, tokenizer, config.temperature, config.max_new_tokens,
                     deterministic=reproducible_user(config.user) and not config.max_staleness)
