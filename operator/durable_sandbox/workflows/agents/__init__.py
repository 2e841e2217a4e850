"""Checkpointed agent adapters: one agent invocation's model and tool calls journaled as steps.

``core`` is framework-neutral (:class:`DurableAgentRun`); ``strands`` integrates ``strands-agents``
(optional dependency: ``pip install 'durable-sandbox[agents]'``) and is imported on demand.
"""

from durable_sandbox.workflows.agents.core import DurableAgent, DurableAgentRun, current_run

__all__ = ["DurableAgent", "DurableAgentRun", "current_run"]
