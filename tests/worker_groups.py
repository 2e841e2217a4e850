"""How scripts/test's two pytest-xdist workers share the suite (docs/testing.md).

A test module runs whole, in order, on one worker: its module-scoped operator or cluster starts once. Every module
that uses the machine's node (the ``node_cluster`` fixture, or a node of its own: ``own_node``) is one group on one
worker, because the node is machine-wide and a session holds it from its first node test to its end: a second
worker asking for it would wait for the first one's whole session.

The grouping is decided in the controlling process, which never collects and so sees only node ids: hence a list
of the node's modules, which the e2e tier's collection checks against what its tests really use
(``check_node_modules``), so the list cannot fall behind. (pytest-xdist's own ``--dist loadgroup`` marks cannot be
used: it renames items through an attribute that pytest 9.2's node ids no longer read.)
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest
from xdist.scheduler import LoadScopeScheduling

__all__ = ["NODE_GROUP", "NODE_MODULES", "ModuleScheduling", "check_node_modules", "scope_of"]

NODE_GROUP = "node"
NODE_MODULES = frozenset({
    "tests/e2e/test_agent_sandbox_node.py",
    "tests/e2e/test_agent_sandbox_provider_node.py",
    "tests/e2e/test_chart_on_node.py",
    "tests/e2e/test_dev_cluster.py",
    "tests/e2e/test_kubernetes_pool_node.py",
    "tests/e2e/test_kubernetes_provider_node.py",
    "tests/e2e/test_node.py",
    "tests/e2e/test_operator_kubernetes_provider.py",
    "tests/e2e/test_sandbox_egress_node.py",
    "tests/e2e/test_session_durability_node.py",
})


def scope_of(nodeid: str) -> str:
    """The group a test runs in: the node's, else its module's."""
    module = nodeid.split("::", 1)[0]
    return NODE_GROUP if module in NODE_MODULES else module


class ModuleScheduling(LoadScopeScheduling):
    """pytest-xdist's scope scheduling with :func:`scope_of` as the scope: whole groups to a worker, in the order
    collected (the e2e conftest puts the node's tests first, so the longest group starts at once)."""

    def _split_scope(self, nodeid: str) -> str:
        return scope_of(nodeid)


def check_node_modules(items: Iterable[pytest.Item], uses_node: Iterable[bool]) -> None:
    """A module whose tests use the node must be in :data:`NODE_MODULES`, and one that is listed must use it."""
    using: dict[str, bool] = {}
    for item, uses in zip(items, uses_node, strict=True):
        module = item.nodeid.split("::", 1)[0]
        using[module] = using.get(module, False) or uses
    wrong = sorted(m for m, uses in using.items() if uses != (m in NODE_MODULES))
    if wrong:
        raise pytest.UsageError(
            f"tests/worker_groups.py: NODE_MODULES is out of date for {', '.join(wrong)}: list every module whose "
            f"tests use the node (node_cluster, own_node) and no other, so scripts/test's workers never both "
            f"wait for the machine's node")
