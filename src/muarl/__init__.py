"""muarl: train tool-using agents with multi-turn RL against a simulated user (MUA-RL)."""

__version__ = "0.1.0"
