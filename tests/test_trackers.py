"""Metric sinks: metrics.jsonl and TensorBoard event files, truncated and purged on resume; clear errors."""

from __future__ import annotations

import importlib.util
import json

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from muarl.train.trackers import Trackers, TrackerUnavailable, parse_report_to


def _scalars(folder, tag):
    events = EventAccumulator(str(folder))
    events.Reload()
    return [(e.step, round(e.value, 6)) for e in events.Scalars(tag)]


def test_resume_truncates_metrics_and_purges_tensorboard_events(tmp_path):
    first = Trackers(tmp_path, "tensorboard", {"lr": 0.1})
    records = [{"step": s, "loss": 1.0 / s, "reward": 0.1 * s, "stop": "x"} for s in (1, 2, 3)]
    for r in records:
        first.log(r, r["step"])
    first.close()
    assert _scalars(tmp_path / "tensorboard", "loss") == [(1, 1.0), (2, 0.5), (3, round(1 / 3, 6))]

    # resumed from the checkpoint of step 1: steps 2 and 3 are played again, with other values
    again = Trackers(tmp_path, "tensorboard", {"lr": 0.1}, history=records[:1])
    assert [json.loads(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [1]
    for s in (2, 3):
        again.log({"step": s, "loss": 10.0 * s, "reward": 0.0}, s)
    again.close()
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(m["step"], m["loss"]) for m in lines] == [(1, 1.0), (2, 20.0), (3, 30.0)]
    assert _scalars(tmp_path / "tensorboard", "loss") == [(1, 1.0), (2, 20.0), (3, 30.0)]  # no stale events


def test_report_to_parsing_and_errors(tmp_path):
    assert parse_report_to("tensorboard, wandb,tensorboard") == ["tensorboard", "wandb"]
    assert parse_report_to("none") == [] and parse_report_to("") == []
    with pytest.raises(ValueError, match="unknown tracker.*comet.*choose from tensorboard, wandb, mlflow"):
        parse_report_to("tensorboard,comet")
    quiet = Trackers(tmp_path, "none", {})
    quiet.log({"step": 1, "loss": 0.5}, 1)
    quiet.close()
    assert not (tmp_path / "tensorboard").exists() and (tmp_path / "metrics.jsonl").read_text().count("\n") == 1
    silent = Trackers(tmp_path / "rank1", "tensorboard", {}, enabled=False)  # a rank other than 0 writes nothing
    silent.log({"step": 1}, 1)
    assert not (tmp_path / "rank1").exists()


@pytest.mark.parametrize("name", ["wandb", "mlflow"])
def test_a_missing_optional_tracker_names_its_extra(tmp_path, name):
    if importlib.util.find_spec(name) is not None:
        pytest.skip(f"{name} is installed here")
    with pytest.raises(TrackerUnavailable, match=rf"pip install 'muarl\[{name}\]'"):
        Trackers(tmp_path, f"tensorboard,{name}", {})
