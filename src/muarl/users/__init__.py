"""Simulated users: the other party of every episode. Never trained on, by construction."""

from muarl.users.base import SimulatorFault, UserReply, UserSession, UserSimulator

__all__ = ["SimulatorFault", "UserReply", "UserSession", "UserSimulator"]
