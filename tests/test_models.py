"""Naming a model: a Hugging Face Hub id (``org/name``) resolves through the Hub's local cache, as it does
on a GPU machine with ``--model Qwen/Qwen3-8B``.

Nothing can be downloaded here, so the cache is built on disk in the layout huggingface_hub writes
(``models--ORG--NAME/refs/main`` naming a snapshot folder with the files) and the command runs with
``HF_HUB_OFFLINE=1``: huggingface_hub's own ``snapshot_download`` finds it there, as it would after a
download.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

from conftest import run_muarl
from muarl.models import resolve


def _hub_cache(root: Path, repo_id: str) -> Path:
    """``root`` as a Hugging Face cache holding ``repo_id``: the shipped base's files in one snapshot."""
    repo = root / f"models--{repo_id.replace('/', '--')}"
    revision = "0123456789abcdef0123456789abcdef01234567"
    snapshot = repo / "snapshots" / revision
    snapshot.mkdir(parents=True)
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                 "chat_template.jinja", "generation_config.json"):
        shutil.copy(resolve("tiny") / name, snapshot / name)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    return snapshot


def _muarl(*args: str, cache: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    return run_muarl(*args, env=env)


def test_a_hub_model_id_is_played_from_the_hub_cache_and_a_missing_one_is_one_line(tmp_path):
    snapshot = _hub_cache(tmp_path / "hub", "muarl-test/tiny")
    done = _muarl("eval", "--domain", "retail-lite", "--split", "test", "--limit", "2", "--k", "1",
                  "--policy", "hf:muarl-test/tiny", "--max-turns", "4", "--max-new-tokens", "24", "--quiet",
                  "--out", str(tmp_path / "eval"), cache=tmp_path / "hub")
    assert done.returncode == 0, done.stderr[-2000:]
    episodes = (tmp_path / "eval" / "trajectories.jsonl").read_text().splitlines()
    assert len(episodes) == 2 and all(json.loads(e)["token_ids"] for e in episodes)
    assert json.loads((tmp_path / "eval" / "results.json").read_text())  # a result was written
    assert snapshot.is_dir()

    missing = _muarl("eval", "--domain", "retail-lite", "--split", "test", "--limit", "1", "--policy",
                     "hf:muarl-test/absent", "--out", str(tmp_path / "missing"), cache=tmp_path / "hub")
    assert missing.returncode == 2
    lines = missing.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("muarl: error: muarl-test/absent: not a local checkpoint "
                                                   "directory, and the Hugging Face Hub could not provide it"), lines
    assert "hf download muarl-test/absent" in lines[0]


def test_tiny_random_builds_from_the_shipped_tokenizer_without_playing_an_episode(tmp_path):
    """``tiny-random`` resolves below the episode loop (issue 58, item 3): built into an empty cache, in a
    fresh process, it imports no domain, policy or rollout module, and its tokenizer is the shipped one."""
    import sys

    code = ("import sys; from muarl.models import resolve; path = resolve('tiny-random'); "
            "print(path); print(sorted(m for m in sys.modules if m.startswith(('muarl.rollout', 'muarl.domain', "
            "'muarl.policies', 'muarl.users'))))")
    done = subprocess.run([sys.executable, "-c", code], env={**os.environ, "MUARL_CACHE": str(tmp_path)},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    path, imported = done.stdout.splitlines()[-2:]
    assert imported == "[]", imported
    from muarl.tiny_model import SHIPPED_TOKENIZER

    built = json.loads((Path(path) / "tokenizer.json").read_text())
    assert built["model"]["vocab"] == json.loads((SHIPPED_TOKENIZER / "tokenizer.json").read_text())["model"]["vocab"]


def test_the_shipped_tokenizer_is_what_training_on_the_corpus_gives():
    """The tokenizer ``tiny-random`` and the base share is the one :mod:`muarl.tokenizer_training` trains
    from the built-in domains (fails when the corpus or the trainer changes and the shipped one was not
    rebuilt with it: ``muarl init-model`` and ``tiny-random`` would then disagree)."""
    from muarl.tiny_model import SHIPPED_TOKENIZER, TinyConfig
    from muarl.tokenizer_training import train_tokenizer

    trained = json.loads(train_tokenizer(TinyConfig().vocab_size).backend_tokenizer.to_str())
    shipped = json.loads((SHIPPED_TOKENIZER / "tokenizer.json").read_text())
    assert trained["model"]["vocab"] == shipped["model"]["vocab"]
    assert trained["model"]["merges"] == shipped["model"]["merges"]
