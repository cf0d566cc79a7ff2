"""Several rollout servers (``--rollout-engine vllm-server:URL1#M,URL2#M``, issue 29 item 4), the parts that
need no vLLM: the spec's parsing and its one-line refusals, the resume comparison of a server list, and the
routing of whole groups over several policies. The runs against real vLLM servers (both synced every step,
one killed mid-run, two training processes) are in tests/test_vllm.py.
"""

from __future__ import annotations

import asyncio
import socket

import pytest

from muarl.train.engine_spec import server_endpoints
from muarl.train.grpo_config import GRPOConfig


def _dead_port() -> int:
    """A port nothing listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_server_list_is_parsed_and_a_bad_one_is_refused_in_one_line(tmp_path, capsys):
    """Each endpoint of the comma-separated list is URL#MODEL; a malformed one, one without a scheme, or a
    server named twice (localhost and 127.0.0.1 are one) is refused by the config in one line naming the
    list; a server that is not there is refused before the run directory exists, naming that server."""
    from muarl.cli import main

    engine = "vllm-server:http://10.0.0.1:8000/v1#tiny,http://10.0.0.2:8000/v1#tiny"
    assert server_endpoints(engine) == [("http://10.0.0.1:8000/v1", "tiny"), ("http://10.0.0.2:8000/v1", "tiny")]
    assert server_endpoints("vllm-server:http://a:1#m") == [("http://a:1", "m")]  # one server, as before
    assert GRPOConfig(rollout_engine=engine).rollout_engine == engine
    for bad, message in (
            ("vllm-server:http://a:1/v1#m,", "'' is not URL#MODEL; expected vllm-server:URL#MODEL,URL#MODEL"),
            ("vllm-server:http://a:1/v1#m,http://b:1/v1", "'http://b:1/v1' is not URL#MODEL"),
            ("vllm-server:http://a:1/v1#m,b:1#m", "the URL must start with http:// or https://"),
            ("vllm-server:http://localhost:8000/v1#m,http://127.0.0.1:8000#m",
             "names the server http://127.0.0.1:8000 twice")):
        with pytest.raises(ValueError, match=message) as refused:
            GRPOConfig(rollout_engine=bad)
        assert "\n" not in str(refused.value) and str(refused.value).startswith(f"--rollout-engine {bad!r}")
    alive_or_not = f"vllm-server:http://127.0.0.1:{_dead_port()}/v1#tiny,http://127.0.0.1:{_dead_port()}/v1#tiny"
    for engine, message in (("vllm-server:http://a:1/v1#m,", "is not URL#MODEL"),
                            (alive_or_not, f"no vLLM server at {alive_or_not.split(':', 1)[1].split('/v1')[0]}")):
        out = tmp_path / "run"
        code = main(["grpo", "--preset", "tiny", "--steps", "1", "--rollout-engine", engine, "--out", str(out),
                     "--no-progress"])
        err = capsys.readouterr().err.strip()
        assert code == 2 and err.splitlines() == [err], err
        assert err.startswith(f"muarl: error: --rollout-engine '{engine}'") and message in err, err
        assert not out.exists()


def test_a_user_on_any_of_the_servers_is_refused_under_full_fine_tuning():
    """An llm: user served by one of the rollout servers would learn with the policy (each server's weights
    are replaced after every update), whichever server of the list it is."""
    engine = "vllm-server:http://127.0.0.1:8000/v1#tiny,http://127.0.0.1:8001/v1#tiny"
    with pytest.raises(ValueError, match="the user would learn with the policy"):
        GRPOConfig(rollout_engine=engine, user="llm:http://localhost:8001/v1#tiny", lora_r=0)
    GRPOConfig(rollout_engine=engine, user="llm:http://127.0.0.1:8002/v1#tiny", lora_r=0)  # another server
    GRPOConfig(rollout_engine=engine, user="llm:http://127.0.0.1:8001/v1#tiny", lora_r=4)  # the frozen base


def test_a_resume_compares_the_servers_count_and_models_not_their_addresses():
    """What a resume compares of ``--rollout-engine``: servers restarted elsewhere (any address) resume the
    run; another number of servers, or another model name on one of them, does not."""
    from muarl.train.run import _comparable

    two = "vllm-server:http://10.0.0.1:8000/v1#tiny,http://10.0.0.2:8000/v1#tiny"
    moved = "vllm-server:http://10.0.0.7:9000#tiny,https://gpu-3.example:8443/v1#tiny"
    assert _comparable("rollout_engine", two) == _comparable("rollout_engine", moved) == "vllm-server:URL#tiny,URL#tiny"
    assert _comparable("rollout_engine", two) != _comparable("rollout_engine", "vllm-server:http://10.0.0.1:8000/v1#tiny")
    assert _comparable("rollout_engine", two) != _comparable("rollout_engine", "vllm-server:http://10.0.0.1:8000/v1#tiny,http://10.0.0.2:8000/v1#big")
    assert _comparable("user", "llm:http://10.0.0.1:8000/v1#user") == _comparable("user", "llm:http://h:1#user")  # as before


@pytest.mark.parametrize("first", [0, 1])
def test_whole_groups_go_to_the_server_with_the_fewest_episodes_in_flight(first):
    """:class:`RoutedPolicy` over two policies (muarl's transformers engine on one shared tiny model, each
    named as a server would be): every member of a group on one server, the groups alternating between the
    servers as each fills (3 groups: 2 and 1), ties broken from server ``first`` on (a training process's
    rank, so that ranks start on different servers). Which server samples an episode does not change it:
    the episodes are those one policy alone samples."""
    from muarl.domain import get_domain
    from muarl.models import load
    from muarl.policies.hf import HFPolicy
    from muarl.rollout import EpisodeConfig, RolloutEngine
    from muarl.train.samplers import RoutedPolicy
    from muarl.users.scripted import ScriptedUser

    model, tokenizer = load("tiny")
    servers = [HFPolicy((model.eval(), tokenizer), temperature=1.0, max_new_tokens=8, seed=5) for _ in range(2)]
    for k, policy in enumerate(servers):
        policy.name = f"server-{k}"
    domain = get_domain("retail")
    tasks = domain.tasks("test")[:3]

    def play(policy):
        engine = RolloutEngine(domain, policy, ScriptedUser(), EpisodeConfig(max_turns=2), group_size=3,
                               progress=False)
        return asyncio.run(engine.run(tasks))

    routed = play(RoutedPolicy(servers, first=first))
    chosen = [{t.metadata["server"] for t in group} for group in routed]
    assert all(len(names) == 1 for names in chosen), chosen  # whole groups
    order = [f"server-{(first + k) % 2}" for k in (0, 1, 0)]
    assert [names.pop() for names in chosen] == order
    alone = play(HFPolicy((model, tokenizer), temperature=1.0, max_new_tokens=8, seed=5))
    for ours, theirs in zip(routed, alone, strict=True):
        assert [t.token_ids for t in ours] == [t.token_ids for t in theirs]
