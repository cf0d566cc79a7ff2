"""Where a training run's per-step metrics go: ``metrics.jsonl`` always, plus the chosen trackers.

``report_to`` is a comma-separated list of ``tensorboard`` (the default; ``out/tensorboard``), ``wandb``
and ``mlflow`` (optional extras: ``pip install 'muarl[wandb]'`` / ``'muarl[mlflow]'``), or ``none``.
Each tracker is imported only when asked for, with an error that says which extra to install.

On resume, ``metrics.jsonl`` is rewritten to the records the checkpoint holds (records of steps after
the checkpoint are dropped: those steps are played again), TensorBoard purges its events from the
first replayed step on, and W&B / MLflow continue the same run (its id is kept in the run directory).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from muarl.files import write_lines

TRACKERS = ("tensorboard", "wandb", "mlflow")


class TrackerUnavailable(ValueError):
    """A tracker was asked for whose package is not installed."""


def parse_report_to(report_to: str | list[str] | None) -> list[str]:
    """Tracker names from ``"tensorboard,wandb"`` (``none`` or empty: metrics.jsonl only)."""
    names = report_to.split(",") if isinstance(report_to, str) else list(report_to or [])
    names = [n.strip().lower() for n in names if n.strip() and n.strip().lower() != "none"]
    unknown = [n for n in names if n not in TRACKERS]
    if unknown:
        raise ValueError(f"unknown tracker(s) {', '.join(unknown)}; choose from {', '.join(TRACKERS)} or none")
    return list(dict.fromkeys(names))


def check_report_to(report_to: str | list[str] | None) -> None:
    """Fail now, before a model is loaded, on an unknown or uninstalled tracker."""
    for tracker in parse_report_to(report_to):
        if tracker != "tensorboard":
            _require(tracker, tracker)


class Trackers:
    """metrics.jsonl and the chosen trackers, written by the main process only.

    ``history`` is the metrics of the steps already done (from the checkpoint when resuming).
    """

    def __init__(self, out: Path, report_to: str | list[str] | None, config: dict[str, Any],
                 history: list[dict[str, Any]] | None = None, enabled: bool = True, name: str = "train"):
        self.names = parse_report_to(report_to)
        self.enabled = enabled
        self.out = Path(out)
        self._sinks: list[Any] = []
        self.log_file = None
        if not enabled:
            return
        check_report_to(self.names)  # fail before anything is opened or truncated
        history = history or []
        first = history[-1]["step"] + 1 if history else 1
        path = self.out / "metrics.jsonl"
        write_lines(path, [json.dumps(r) for r in history])  # a kill here leaves the old or the truncated file
        self.log_file = path.open("a")
        for tracker in self.names:
            self._sinks.append(_OPENERS[tracker](self.out, config, first, name))

    def log(self, record: dict[str, Any], step: int) -> None:
        """Append one step's record to metrics.jsonl and send its numbers to every tracker."""
        if not self.enabled or self.log_file is None:
            return
        self.log_file.write(json.dumps(record) + "\n")
        self.log_file.flush()
        numbers = {k: float(v) for k, v in record.items()
                   if isinstance(v, int | float) and not isinstance(v, bool) and k != "step"}
        for sink in self._sinks:
            sink.log(numbers, step)

    def close(self) -> None:
        for sink in self._sinks:
            sink.close()
        self._sinks = []
        if self.log_file is not None:
            self.log_file.close()
            self.log_file = None


def _require(module: str, extra: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise TrackerUnavailable(f"--report-to {extra} needs the {module} package: pip install 'muarl[{extra}]' "
                                 f"(or leave {extra} out of --report-to)") from None


class _TensorBoard:
    def __init__(self, out: Path, config: dict[str, Any], first: int, name: str):
        from torch.utils.tensorboard import SummaryWriter

        # purge_step drops events at and after the first step to be replayed after a resume
        self.writer = SummaryWriter(str(out / "tensorboard"), purge_step=first if first > 1 else None)

    def log(self, numbers: dict[str, float], step: int) -> None:
        for key, value in numbers.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class _WandB:
    def __init__(self, out: Path, config: dict[str, Any], first: int, name: str):
        wandb = _require("wandb", "wandb")
        id_file = out / "wandb_run_id"
        run_id = id_file.read_text().strip() if id_file.exists() else wandb.util.generate_id()
        id_file.write_text(run_id)
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", "muarl"), name=f"{name}:{out.name}",
                              id=run_id, resume="allow", dir=str(out), config=config)

    def log(self, numbers: dict[str, float], step: int) -> None:
        self.run.log(numbers, step=step)

    def close(self) -> None:
        self.run.finish()


class _MLflow:
    def __init__(self, out: Path, config: dict[str, Any], first: int, name: str):
        self.mlflow = _require("mlflow", "mlflow")
        if not os.environ.get("MLFLOW_TRACKING_URI"):
            self.mlflow.set_tracking_uri((out / "mlruns").resolve().as_uri())
        id_file = out / "mlflow_run_id"
        if id_file.exists():
            self.run = self.mlflow.start_run(run_id=id_file.read_text().strip())
        else:
            self.run = self.mlflow.start_run(run_name=f"{name}:{out.name}")
            id_file.write_text(self.run.info.run_id)
            self.mlflow.log_params({k: str(v)[:250] for k, v in config.items()})

    def log(self, numbers: dict[str, float], step: int) -> None:
        self.mlflow.log_metrics(numbers, step=step)

    def close(self) -> None:
        self.mlflow.end_run()


_OPENERS = {"tensorboard": _TensorBoard, "wandb": _WandB, "mlflow": _MLflow}
