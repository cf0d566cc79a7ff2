"""The run viewer: ``muarl view RUN_DIR`` writes one self-contained HTML report of a run directory.

``data`` reads the run (trajectories as swimlanes, groups, diffs against gold), ``tokens`` prepares the
loss-mask overlay, ``plots`` draws training curves as inline SVG, ``html`` assembles the page (with
``viewer.js`` / ``viewer.css`` inlined), ``cli`` adds the command.
"""

from muarl.report.data import EmptyRunError, load_run
from muarl.report.html import build_report

__all__ = ["EmptyRunError", "build_report", "load_run"]
