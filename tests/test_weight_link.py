"""The in-memory weight sync's link (muarl.weight_sync.link) without vLLM or a GPU (issue 56, item 2): the
transport chosen up front from where every end runs, the group built when the link opens, a failed link's
group aborted. The link is real (a gloo group, the trainer's WeightLink against muarl's WeightReceiver); the
vLLM worker the receiver is mixed into is a stand-in in this process (its model, its reload_weights), and so
is the server's HTTP route (each call made directly on the worker). The whole path into a vLLM server is
tests/test_vllm.py's."""

from __future__ import annotations

import contextlib
import threading
import time
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from muarl.weight_sync import SyncFailed
from muarl.weight_sync.link import LinkFailed, WeightLink, choose_backend
from muarl.weight_sync.receiver import WeightReceiver


def _gpu(uuid=None, host="node-a", index=0):
    return {"device": "cuda", "uuid": uuid, "host": host, "cuda_index": index}


def test_the_transport_is_nccl_only_between_distinct_gpus():
    trainer = _gpu("GPU-aaaa", index=0)
    assert choose_backend(trainer, [_gpu("GPU-bbbb", index=1)]) == "nccl"
    # a server on the trainer's own GPU (docs/gpu.md's one-GPU layouts): NCCL refuses the pair ("Duplicate GPU")
    assert choose_backend(trainer, [_gpu("GPU-aaaa", index=0)]) == "gloo"
    # the same GPU under another CUDA_VISIBLE_DEVICES: another index here, one UUID
    assert choose_backend(trainer, [_gpu("GPU-aaaa", index=3)]) == "gloo"
    # other GPUs seen as index 0 by each process (their own CUDA_VISIBLE_DEVICES): the UUIDs tell them apart
    assert choose_backend(trainer, [_gpu("GPU-bbbb", index=0), _gpu("GPU-cccc", index=0)]) == "nccl"
    assert choose_backend(trainer, [_gpu("GPU-bbbb"), _gpu("GPU-bbbb")]) == "gloo"  # two workers on one GPU
    # no UUID: (host, CUDA index)
    assert choose_backend(_gpu(index=0), [_gpu(index=0)]) == "gloo"
    assert choose_backend(_gpu(index=0), [_gpu(index=1), _gpu(host="node-b", index=0)]) == "nccl"
    # an end that does not say which GPU may be on any: gloo
    assert choose_backend(trainer, [{"device": "cuda"}]) == "gloo"
    # the CPU on either side
    assert choose_backend({"device": "cpu"}, [_gpu("GPU-bbbb")]) == "gloo"
    assert choose_backend(trainer, [_gpu("GPU-bbbb", index=1), {"device": "cpu"}]) == "gloo"


class _Worker(WeightReceiver):
    """A vLLM worker as the receiver sees it: rank, model runner, config, reload_weights."""

    rank = 0

    def __init__(self, fail: bool = False, dtype: torch.dtype = torch.float32, reload_s: float = 0.0):
        self.model = torch.nn.Linear(4, 3).to(dtype)
        self.reload_s = reload_s  # how long each reload takes
        self.model_runner = SimpleNamespace(get_model=lambda: self.model)
        self.vllm_config = SimpleNamespace(model_config=SimpleNamespace(dtype=dtype))
        self.fail, self.received = fail, {}

    def reload_weights(self, weights_iterator, is_checkpoint_format):
        if self.fail:
            raise RuntimeError("the worker's reload failed")
        self.received.update({name: tensor.clone() for name, tensor in weights_iterator})
        time.sleep(self.reload_s)  # after the last bytes arrived: the loading itself


class _Server:
    """A server of one worker whose routes are calls on it; ``events`` records its pauses."""

    url = "http://127.0.0.1:1"

    def __init__(self, worker: _Worker, events: list):
        self.worker, self.events = worker, events
        self.stats = SimpleNamespace(weight_syncs=0)

    def rpc(self, method: str, **kwargs):
        return [getattr(self.worker, method)(**kwargs)]

    @contextlib.contextmanager
    def paused(self):
        self.events.append(("pause",))
        try:
            yield
        finally:
            self.events.append(("resume",))


@pytest.fixture
def recorded(monkeypatch):
    """Every gloo group the link makes records its collectives and aborts (with the member's rank) in the
    returned list, in order."""
    events: list = []
    lock = threading.Lock()

    class Recording(dist.ProcessGroupGloo):
        def broadcast(self, *args, **kwargs):
            with lock:
                events.append(("collective", self.rank()))
            return super().broadcast(*args, **kwargs)

        def abort(self):
            with lock:
                events.append(("abort", self.rank()))
            return super().abort()

    monkeypatch.setattr(dist, "ProcessGroupGloo", Recording)
    return events


@pytest.fixture
def threshold_of_bytes(monkeypatch):
    """The whole-tensor threshold set by the bytes (25%), as on a GPU: these tests are of the changes' path,
    and AdamW at lr 1e-5 changes 5-15% of a small model's bf16 values, above the CPU's measured 5%."""
    from muarl.weight_sync import changes

    monkeypatch.setitem(changes.FULL_ABOVE, "cpu", changes.BY_BYTES)


def _weights():
    torch.manual_seed(0)
    return [("weight", torch.randn(3, 4)), ("bias", torch.randn(3))]


def test_the_link_is_built_when_it_opens_not_inside_the_first_pause(recorded):
    worker = _Worker()
    link = WeightLink.open([_Server(worker, recorded)])
    try:
        assert link is not None and link.backend == "gloo"  # this machine's CPU: no GPU on either end
        opened = list(recorded)
        # both ends ran a collective on the group before any sync: NCCL's communicator is built there
        assert {("collective", 0), ("collective", 1)} <= set(opened) and ("pause",) not in opened, opened
        assert link.send(_weights()) > 0
        first_pause = recorded.index(("pause",))
        assert set(recorded[:first_pause]) == {("collective", 0), ("collective", 1)}, recorded
        for name, tensor in _weights():
            assert torch.equal(worker.received[name], tensor), name
    finally:
        link.close()
    assert {("abort", 0), ("abort", 1)} <= set(recorded)  # a closed link's group is ended on both ends


def test_the_link_says_where_a_syncs_seconds_went(recorded):
    """``last_seconds``: "sent" ends at the last byte broadcast and "loaded" is the worker's receive with its
    reload, so a reload that takes 0.5 s shows in "loaded" and not in "sent", and neither exceeds the sync."""
    link = WeightLink.open([_Server(_Worker(reload_s=0.5), recorded)])
    try:
        began = time.perf_counter()
        link.send(_weights())
        wall = time.perf_counter() - began
        sent, loaded = link.last_seconds["sent"], link.last_seconds["loaded"]
        assert 0 < sent < 0.5 <= loaded <= wall, (sent, loaded, wall)
    finally:
        link.close()


def test_a_failed_link_is_aborted_before_it_is_dropped(recorded):
    link = WeightLink.open([_Server(_Worker(fail=True), recorded)])
    try:
        with pytest.raises(LinkFailed, match="the worker's reload failed"):
            link.send(_weights())
        # the trainer's end is aborted by the failure itself, before anything drops or reopens the link
        assert link.broken and ("abort", 0) in recorded, recorded
    finally:
        link.close()


class _LateWorker(_Worker):
    """A restarted server's new worker: no link of its own, so it refuses a sync, 0.5 s into it."""

    def muarl_receive(self, *args, **kwargs):
        time.sleep(0.5)
        return super().muarl_receive(*args, **kwargs)


def _refused_mid_broadcast(events: list) -> tuple[WeightLink, _Worker]:
    """(the broken link, the old worker) after a new worker refused a sync 0.5 s into a 64 MB broadcast (more
    than the sockets buffer) that the old worker, its group still open, never reads."""
    server = _Server(_Worker(), events)
    link = WeightLink.open([server])
    old, server.worker = server.worker, _LateWorker()
    with pytest.raises(LinkFailed, match="before muarl_open_link"):
        link.send([("weight", torch.randn(4096, 4096))])
    return link, old


def test_a_sync_refused_mid_broadcast_ends_without_waiting_out_the_links_timeout(recorded):
    """The failure, and closing the broken link, return at once, not when the broadcast no one reads times
    out (60 s in the tests, 600 s in a run): gloo's abort leaves the broadcast in flight, and dropping the
    group would wait for it."""
    began = time.perf_counter()
    link, old = _refused_mid_broadcast(recorded)
    link.close()
    assert time.perf_counter() - began < 20
    old.muarl_close_link()


_EXITS_AFTER_A_REFUSED_SYNC = """
import atexit, sys, threading, time
from concurrent.futures import Future
atexit.register(lambda: print("left running:", sorted(thread.name for thread in threading.enumerate()
                                                      if thread.name.startswith("muarl")), flush=True))  # runs last
set_exception = Future.set_exception
def slow_to_wind_up(future, err):  # the sender winds up 1 s after its broadcast timed out, past muarl's exit
    time.sleep(1.0)
    set_exception(future, err)
Future.set_exception = slow_to_wind_up
sys.path.insert(0, sys.argv[1])
from muarl.weight_sync import link
link.LINK_TIMEOUT_S = 10.0
from test_weight_link import _refused_mid_broadcast
broken, old = _refused_mid_broadcast([])
print("refused", flush=True)
broken.close()
"""


def test_a_process_that_ends_after_a_refused_sync_exits_cleanly(tmp_path):
    """The trainer's process ends while its broadcast to a worker that stopped reading is still in flight
    (a group ended but not yet destroyed): it waits for that broadcast's timeout, says so, and exits 0. The
    ended group and the sender are both waited for: a group destroyed during the interpreter's shutdown ends
    it with SIGABRT (exit -6), and so does a sender whose broadcast times out then (pthread_exit in C++: the
    likely cause of CI's -6, whose log was cut off; here the sender winds up 1 s late, so one left running shows)."""
    import subprocess
    import sys
    from pathlib import Path

    done = subprocess.run([sys.executable, "-c", _EXITS_AFTER_A_REFUSED_SYNC, str(Path(__file__).parent)],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0 and "refused" in done.stdout, (done.returncode, done.stdout, done.stderr[-2000:])
    assert "waiting for a failed weight sync's broadcast" in done.stderr, done.stderr[-2000:]
    assert "left running: []" in done.stdout, done.stdout


class _Engine:
    """A VLLMServerPolicy as ServerSync sees one: its name and its server."""

    def __init__(self, server: _Server):
        self.engine, self.name = server, server.url


def _adamw_steps(model: torch.nn.Module, optimizer: torch.optim.Optimizer, steps: int) -> None:
    """Real AdamW updates on a loss of the model's own output (what a GRPO step does to the weights)."""
    for _ in range(steps):
        loss = model(torch.randn(8, 64)).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()


def _engine_equals_trainer(worker: _Worker, model: torch.nn.Module) -> None:
    """Every weight the worker's model last loaded is the trainer's, in the engine's dtype, bit for bit."""
    dtype = worker.vllm_config.model_config.dtype
    bits = {2: torch.int16, 4: torch.int32}[dtype.itemsize]
    for name, tensor in model.state_dict().items():
        assert torch.equal(worker.received[name].view(bits), tensor.to(dtype).view(bits)), name


@pytest.mark.parametrize("engine_dtype", [torch.bfloat16, torch.float32])
def test_a_sync_of_changes_keeps_the_engine_on_the_trainers_weights_through_updates_and_resumes(engine_dtype, threshold_of_bytes):
    """``--vllm-weight-sync changed`` (issue 59, item 3): after every sync, over updates, the engine's
    weights are the trainer's in its dtype bit for bit (float32 too, the trainer's own: the record is a copy); syncs after the first send only what changed, and less
    than a full broadcast; a resumed trainer (a new link, the worker's mirror from before) and a restarted
    server (a new worker: the old link's change refused, the next link full) both end equal too."""
    from muarl.weight_sync.servers import ServerSync

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.LayerNorm(256), torch.nn.Linear(256, 64))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)

    def update(steps: int) -> None:  # bf16: AdamW at lr 1e-5; float32, where it moves every value: 1% of them
        if engine_dtype == torch.bfloat16:
            return _adamw_steps(model, optimizer, steps)
        with torch.no_grad():
            for _ in range(steps):
                for p in model.parameters():
                    p.view(-1)[torch.rand(p.numel()) < 0.01] += 1e-3
    server = _Server(_Worker(dtype=engine_dtype), [])
    sync = ServerSync([_Engine(server)], lora=False, how="changed")
    # every value, and each weight's 16-byte (send, count) in its bucket's header
    full = sum(t.numel() * engine_dtype.itemsize + 16 for t in model.state_dict().values())
    try:
        sync.push(model)
        assert sync.sync_bytes == full and sync.changed_share == 1.0  # a link's first sync is whole
        _engine_equals_trainer(server.worker, model)
        for _ in range(4):
            update(1)
            sync.push(model)
            _engine_equals_trainer(server.worker, model)
            assert 0 < sync.changed_share < 0.5 and sync.sync_bytes < full / 2, (sync.changed_share, sync.sync_bytes)
            assert set(sync.link.last_seconds) == {"sent", "loaded"} and sync.link.sent.seconds > 0  # the split
        sync.push(model)  # nothing changed: nothing on the wire
        assert sync.sync_bytes == 16 * len(model.state_dict()) and sync.changed_share == 0.0  # the headers alone
        _engine_equals_trainer(server.worker, model)

        # the trainer resumed from an earlier checkpoint: its sync opens a new link, the worker's mirror is dropped
        earlier = {name: tensor.clone() for name, tensor in model.state_dict().items()}
        update(2)
        sync.push(model)
        model.load_state_dict(earlier)
        sync.close()
        sync = ServerSync([_Engine(server)], lora=False, how="changed")
        sync.push(model)
        assert sync.sync_bytes == full
        _engine_equals_trainer(server.worker, model)

        # the server restarted: a new worker, which has no link nor mirror; the old link's sync is refused
        server.worker = _Worker(dtype=engine_dtype)
        update(1)
        with pytest.raises(SyncFailed):
            sync.push(model)
        sync.push(model)  # the next sync opens a new link to the new worker, and is whole
        assert sync.sync_bytes == full
        _engine_equals_trainer(server.worker, model)
        update(1)
        sync.push(model)
        assert sync.sync_bytes < full / 2
        _engine_equals_trainer(server.worker, model)
    finally:
        sync.close()


def test_a_change_to_a_weight_the_worker_never_received_whole_is_refused(threshold_of_bytes):
    """A worker whose mirror was lost (a failed load drops it) refuses a change instead of loading a weight
    built on nothing; the trainer's link breaks, and the next sync is whole."""
    from muarl.weight_sync.servers import ServerSync

    torch.manual_seed(1)
    model = torch.nn.Linear(64, 64)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    server = _Server(_Worker(dtype=torch.bfloat16), [])
    sync = ServerSync([_Engine(server)], lora=False, how="changed")
    try:
        sync.push(model)
        server.worker._muarl_mirror = None
        _adamw_steps(model, optimizer, 1)
        with pytest.raises(SyncFailed, match="has not received whole"):
            sync.push(model)
        sync.push(model)
        _engine_equals_trainer(server.worker, model)
    finally:
        sync.close()


class _Tied(torch.nn.Module):
    """Embeddings and an output head that are one tensor, as Qwen3-0.6B's are."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(512, 64)
        self.body = torch.nn.Linear(64, 64)
        self.head = torch.nn.Linear(64, 512, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, x):
        return self.head(self.body(x))


def test_a_tied_weight_is_compared_and_sent_once_and_reaches_the_engine_under_both_names(threshold_of_bytes):
    from muarl.weight_sync.servers import ServerSync

    torch.manual_seed(2)
    model = _Tied()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    server = _Server(_Worker(dtype=torch.bfloat16), [])
    sync = ServerSync([_Engine(server)], lora=False, how="changed")
    try:
        sync.push(model)
        # parameters(): the tied tensor once; and each weight's (send, count) in its bucket's header
        once = sum(p.numel() * 2 for p in model.parameters()) + 16 * len(model.state_dict())
        assert sync.sync_bytes == once < sum(t.numel() * 2 for t in model.state_dict().values())
        _engine_equals_trainer(server.worker, model)
        for _ in range(2):
            _adamw_steps(model, optimizer, 1)
            sync.push(model)
            _engine_equals_trainer(server.worker, model)  # head.weight included: the alias reloads it too
    finally:
        sync.close()


def test_a_large_tensor_whose_sample_says_most_values_changed_goes_whole_without_a_full_comparison():
    """Above ``FULL_ABOVE`` comparing every value costs more than sending the tensor whole (measured:
    research/benchmarks.md), so a large tensor is judged by a sample first: with most values changed it
    goes whole uncompared, with few it is compared and sends its changes; the engine is the trainer's
    after both."""
    from muarl.weight_sync.changes import SAMPLE
    from muarl.weight_sync.servers import ServerSync

    torch.manual_seed(3)
    model = torch.nn.Linear(256, 16 * SAMPLE // 256 + 1, bias=False)  # just above the sampled size
    values = model.weight.numel()
    server = _Server(_Worker(dtype=torch.bfloat16), [])
    sync = ServerSync([_Engine(server)], lora=False, how="changed")
    try:
        sync.push(model)
        for share, compared in ((0.6, 0), (0.01, values)):
            with torch.no_grad():
                flat = model.weight.view(-1)
                flat[torch.rand(values) < share] *= 1.5
            sync.push(model)
            assert sync.link.sent.compared == compared, (share, sync.link.sent.compared)
            assert (sync.sync_bytes >= 2 * values) == (share > sync.link.sent.full_above)  # whole, or its changes
            assert abs(sync.changed_share - share) < 0.05  # the sample's estimate, or the count
            _engine_equals_trainer(server.worker, model)
    finally:
        sync.close()
