"""Run by tests/test_gpu_paths.py as one rank of a launch (``LOCAL_RANK``, ``LOCAL_WORLD_SIZE`` set by the
test): enters ``muarl.users.embedded.user_server`` for SPEC, records the servers this rank started (their
``--device``), the endpoint it plays against and the models that endpoint lists, then leaves once both ranks
have recorded (local rank 0's server must outlive rank 1's use). Usage: SPEC RUN_DIR."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from muarl.users import embedded

if __name__ == "__main__":
    spec, run = sys.argv[1], Path(sys.argv[2])
    run.mkdir(parents=True, exist_ok=True)
    rank = int(os.environ["LOCAL_RANK"])
    started: list[list[str]] = []
    popen = subprocess.Popen

    def recording(command, *args, **kwargs):
        started.append([command[command.index("--device") + 1]])
        return popen(command, *args, **kwargs)

    embedded.subprocess.Popen = recording  # type: ignore[misc]
    with embedded.user_server([spec], run) as endpoints:
        url = endpoints[0][len("llm:"):].split("#")[0]
        with urllib.request.urlopen(url + "/models", timeout=30) as reply:
            models = [m["id"] for m in json.loads(reply.read())["data"]]
        (run / f"worker{rank}.json").write_text(json.dumps(
            {"started": started, "endpoint": endpoints[0], "models": models, "handoff": str(embedded._handoff(spec))}))
        deadline = time.monotonic() + 120
        while not all((run / f"worker{r}.json").exists() for r in (0, 1)) and time.monotonic() < deadline:
            time.sleep(0.1)
