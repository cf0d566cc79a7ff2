"""muarl.files: a file or folder is replaced whole or not at all, and no temporary is left behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from muarl.files import atomic_folder, atomic_open, atomic_write, temporary_name, write_lines


def test_atomic_write_replaces_the_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "metrics.jsonl"
    target.write_text("old\n")
    assert write_lines(target, ["a", "b"]) == target
    assert target.read_text() == "a\nb\n"
    atomic_write(target, "é\n", durable=True)
    assert target.read_text(encoding="utf-8") == "é\n"
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.jsonl"]


def test_a_failed_write_keeps_the_old_file(tmp_path: Path) -> None:
    target = tmp_path / "step_000001.jsonl"
    target.write_text("old\n")
    with pytest.raises(RuntimeError), atomic_open(target) as f:
        f.write("half")
        raise RuntimeError("killed")
    assert target.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["step_000001.jsonl"]


def test_the_temporary_name_matches_no_reader_pattern(tmp_path: Path) -> None:
    tmp = temporary_name(tmp_path / "step_000001.jsonl")
    assert tmp.parent == tmp_path and tmp.name.startswith(".") and not tmp.name.endswith(".jsonl")


def test_atomic_folder_keeps_a_folder_another_process_finished_first(tmp_path: Path) -> None:
    target = tmp_path / "model"
    with atomic_folder(target) as tmp:
        tmp.mkdir()
        (tmp / "config.json").write_text("{}")
    assert (target / "config.json").read_text() == "{}"
    with atomic_folder(target) as tmp:  # the race: target appeared while this copy was written
        tmp.mkdir()
        (tmp / "config.json").write_text('{"mine": 1}')
    assert (target / "config.json").read_text() == "{}"
    assert [p.name for p in tmp_path.iterdir()] == ["model"]
