"""The in-memory weight sync's wire (muarl.weight_sync.buckets) without vLLM: the trainer's buckets,
broadcast over a real gloo group to another process that unpacks them as a vLLM worker's receiver does,
arrive as the trainer's tensors cast to the wire dtype. The whole path into a vLLM server is
tests/test_vllm.py's (test_server_full_weight_sync_moves_the_server_as_the_trainer)."""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
import textwrap

import torch
import torch.distributed as dist

from muarl.weight_sync.buckets import bucket_nbytes, open_group, pack, plan

RECEIVER = textwrap.dedent("""
    import datetime, json, os, sys
    import torch, torch.distributed as dist
    from muarl.weight_sync.buckets import bucket_nbytes, open_group, unpack
    port, out = int(sys.argv[1]), sys.argv[2]
    buckets = json.loads(sys.stdin.read())
    store = dist.TCPStore("127.0.0.1", port, 2, False, timeout=datetime.timedelta(seconds=60))
    group = open_group(store, 1, 2, "gloo", 60)
    got = {}
    for bucket in buckets:
        buffer = torch.empty(bucket_nbytes(bucket), dtype=torch.uint8)
        group.broadcast(buffer, 0).wait()
        got.update({name: tensor.clone() for name, tensor in unpack(buffer, bucket)})
    torch.save(got, out)
    # a vLLM worker's group lives as long as the worker; a gloo group's threads torn down by the interpreter's
    # exit abort now and then ("terminate called without an active exception"), which is not this test's matter
    os._exit(0)
""")


def _weights() -> list[tuple[str, torch.Tensor]]:
    torch.manual_seed(0)
    embed = torch.randn(50, 16)
    return [("embed.weight", embed), ("layers.0.q.weight", torch.randn(16, 16)),
            ("layers.0.norm.weight", torch.randn(16)), ("layers.1.q.weight", torch.randn(16, 16)[:, :8]),
            ("position_ids", torch.arange(7)), ("lm_head.weight", embed)]  # a strided view; a tied pair


def test_buckets_hold_every_weight_once_in_order_and_no_bucket_is_over_the_limit():
    weights = _weights()
    limit = 16 * 16 * 2 + 16 * 2  # one bf16 square and one norm
    buckets = plan(weights, torch.bfloat16, bucket_bytes=limit)
    assert [e["name"] for b in buckets for e in b] == [name for name, _ in weights]
    oversized = [b for b in buckets if bucket_nbytes(b) > limit]
    assert all(len(b) == 1 for b in oversized) and len(oversized) == 2  # the two vocabulary tables, alone
    assert {e["name"]: e["dtype"] for b in buckets for e in b}["position_ids"] == "int64"  # ints keep theirs
    assert len(buckets) >= 4


def test_buckets_broadcast_over_gloo_arrive_as_the_trainers_tensors_in_the_wire_dtype(tmp_path):
    weights = _weights()
    buckets = plan(weights, torch.bfloat16, bucket_bytes=600)
    store = dist.TCPStore("127.0.0.1", 0, 2, True, wait_for_workers=False, timeout=datetime.timedelta(seconds=60))
    out = tmp_path / "received.pt"
    receiver = subprocess.Popen([sys.executable, "-c", RECEIVER, str(store.port), str(out)], stdin=subprocess.PIPE,
                                text=True)
    receiver.stdin.write(json.dumps(buckets))
    receiver.stdin.close()
    group = open_group(store, 0, 2, "gloo", 60)
    tensors = dict(weights)
    for bucket in buckets:
        group.broadcast(pack([tensors[e["name"]] for e in bucket], bucket, torch.device("cpu")), 0).wait()
    assert receiver.wait(timeout=60) == 0
    got = torch.load(out)
    assert list(got) == [name for name, _ in weights]
    for name, tensor in weights:
        want = tensor.to(torch.bfloat16) if tensor.is_floating_point() else tensor
        assert got[name].dtype == want.dtype and torch.equal(got[name], want), name
