"""What ``--rollout-engine`` names, read and checked before any engine starts: the ``vllm-server:`` form's
servers (URL and served model of each), and whether an ``llm:`` user sits on a server the run trains.

Kept apart from :mod:`muarl.train.samplers` (which starts and drives the engines) because the config checks
these when it is built (:class:`~muarl.train.grpo_config.GRPOConfig`), long before a sampler exists.
"""

from __future__ import annotations

from typing import Any

SERVER = "vllm-server:"


def server_endpoints(engine: str) -> list[tuple[str, str]]:
    """(URL, served model name) of each server of a ``vllm-server:URL#MODEL[,URL#MODEL...]`` rollout
    engine; a malformed one, or a server named twice (it would be synced twice and counted as two), is a
    one-line ValueError."""
    from muarl.factory import split_endpoint

    pieces = engine[len(SERVER):].split(",")
    endpoints: list[tuple[str, str]] = []
    for piece in pieces:
        spec = piece.strip() if piece.strip().startswith(SERVER) else SERVER + piece.strip()
        if len(pieces) == 1:
            url, model = split_endpoint(engine, "--rollout-engine")
        else:
            try:
                url, model = split_endpoint(spec, "--rollout-engine")
            except ValueError:
                raise ValueError(f"--rollout-engine {engine!r}: {piece.strip()!r} is not URL#MODEL; expected "
                                 f"{SERVER}URL#MODEL,URL#MODEL,..., e.g. {SERVER}http://10.0.0.1:8000/v1#my-model,"
                                 "http://10.0.0.2:8000/v1#my-model") from None
        if "://" not in url:
            raise ValueError(f"--rollout-engine {engine!r}: the URL must start with http:// or https://, "
                             f"e.g. {SERVER}http://127.0.0.1:8000/v1#my-model")
        if any(_server_address(url) == _server_address(seen) for seen, _ in endpoints):
            raise ValueError(f"--rollout-engine {engine!r} names the server {url} twice: each server takes its "
                             "own share of the groups and is synced once")
        endpoints.append((url, model))
    return endpoints


def check_user_beside_policy(config: Any) -> None:
    """Refuse an ``llm:`` user that the run would train along with the policy: one served by the
    ``vllm-server`` the run syncs. A full fine-tuning run reloads that server's weights after every
    update, so its user would learn with the policy; a LoRA run changes only its adapter, so the user may
    be the base model there (adapter off: a frozen user on the policy's GPU), but not the adapter."""
    from muarl.factory import split_endpoint
    from muarl.policies.vllm import LORA_NAME
    from muarl.users.embedded import served_model

    if not (config.rollout_engine.startswith(SERVER) and config.user.startswith("llm:")) or served_model(config.user):
        return  # an embedded user (llm:MODEL_DIR) has its own server
    user_url, user_model = split_endpoint(config.user, "user")
    if all(_server_address(url) != _server_address(user_url) for url, _ in server_endpoints(config.rollout_engine)):
        return
    if config.lora_r == 0:
        raise ValueError(f"--user {config.user!r} is served by the --rollout-engine server, whose weights full "
                         "fine-tuning replaces after every update: the user would learn with the policy. Train "
                         "LoRA (--lora-r; the user is then the base model, adapter off) or serve the user elsewhere")
    if user_model == LORA_NAME:
        raise ValueError(f"--user {config.user!r} names the adapter the run trains ({LORA_NAME!r}); name the "
                         "server's base model to have a frozen user")


def _server_address(url: str) -> tuple[str, int]:
    """(host, port) of a server URL, localhost and 127.0.0.1 taken as one."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return ("127.0.0.1" if host in ("localhost", "::1") else host, port)
