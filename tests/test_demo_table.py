"""The demo's console comparison table (``muarl.experiments.comparison.table``) at 80 columns: every row one
line, every cell whole (short names, a fault row per party, the interval beside the change)."""

from __future__ import annotations

from rich.console import Console

from muarl.experiments.comparison import table

METRICS = ("pass^1", "pass^4", "policy_fault_rate", "user_fault_rate", "tool_fault_rate", "truncation_rate", "tcr",
           "avg_turns", "violation_rate", "compliant_success", "malformed_calls", "user_slip_rate")


def _evaluation(scale: float) -> dict[str, float]:
    """An evaluation's metrics: distinct values, avg turns in two digits (the widest cells)."""
    return {key: (12.5 if key == "avg_turns" else 0.05 * (i + 1)) * scale for i, key in enumerate(METRICS)}


def _comparison(width: float) -> dict:
    """A compare_runs report: every metric with a paired interval, negative and positive ends."""
    return {"metrics": [{"metric": key, "low": -width, "high": 10 * width} for key in METRICS]}


def _cells(text: str) -> list[list[str]]:
    """The body rows of a rendered table, each as its stripped cells (one entry per printed line)."""
    lines = text.splitlines()
    body = lines[lines.index(next(line for line in lines if line.startswith("┡"))) + 1:]
    return [[c.strip() for c in line.strip().strip("│").split("│")] for line in body if line.startswith("│")]


def test_the_demo_table_reads_one_line_per_row_at_80_columns():
    before, after = _evaluation(1.0), _evaluation(1.5)
    greedy = (_evaluation(0.5), _evaluation(2.0), _comparison(0.125))
    console = Console(width=80, record=True)
    console.print(table(before, after, 4, _comparison(0.25), greedy, 1.0, "test"))
    text = console.export_text()
    def ci(b: float, a: float, width: float) -> str:
        return f"{a - b:+.3f} [{-width:+.3f}, {10 * width:+.3f}]"

    rows = [["pass^1", "0.050", "0.075", ci(0.05, 0.075, 0.25)]]
    rows += [[f"{party} faults", f"{v:.3f}", f"{1.5 * v:.3f}", f"{0.5 * v:+.3f}"]
             for party, v in (("policy", 0.15), ("user", 0.2), ("tool", 0.25))]
    rows += [["pass^1, T = 0", "0.025", "0.100", ci(0.025, 0.1, 0.125)]]
    rows += [[f"{party} faults, T = 0", f"{0.5 * v:.3f}", f"{2 * v:.3f}", f"{1.5 * v:+.3f}"]
             for party, v in (("policy", 0.15), ("user", 0.2), ("tool", 0.25))]
    for name, key in (("pass^4", "pass^4"), ("truncation rate", "truncation_rate"), ("TCR", "tcr"),
                      ("avg turns", "avg_turns"), ("violation rate", "violation_rate"),
                      ("compliant success", "compliant_success"), ("malformed/episode", "malformed_calls"),
                      ("user slips", "user_slip_rate")):
        rows.append([name, f"{before[key]:.3f}", f"{after[key]:.3f}", ci(before[key], after[key], 0.25)])
    assert len(_cells(text)) == len(rows), text  # one line per row: a wrapped cell adds lines
    assert max(len(line) for line in text.splitlines()) <= 80
    head = next(line for line in text.splitlines() if line.startswith("┃"))
    assert [c.strip() for c in head.strip("┃").split("┃")] == ["metric", "cold start", "after RL",
                                                                "change [95% interval]"]
    assert _cells(text) == rows, text  # every cell whole: a cut one would end in "…"
