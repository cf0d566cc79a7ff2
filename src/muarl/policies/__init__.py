"""Agent policies: the model being trained or evaluated, behind one async interface."""

from muarl.policies.base import AgentTurn, Policy, PolicySession

__all__ = ["AgentTurn", "Policy", "PolicySession"]
