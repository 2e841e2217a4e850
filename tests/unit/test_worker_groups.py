"""scripts/test's worker groups (tests/worker_groups.py): whole modules to a worker, the node's modules together,
and the list of the node's modules checked against what the tests use."""

from __future__ import annotations

from typing import Any, cast

import pytest

from tests.worker_groups import NODE_GROUP, NODE_MODULES, check_node_modules, scope_of


class Item:
    def __init__(self, nodeid: str) -> None:
        self.nodeid = nodeid


def items(*nodeids: str) -> list[pytest.Item]:
    return cast(list[pytest.Item], [Item(n) for n in nodeids])


def test_a_module_is_its_own_scope_and_every_node_module_shares_one() -> None:
    assert scope_of("tests/unit/test_x.py::test_a[1]") == scope_of("tests/unit/test_x.py::TestY::test_b")
    assert scope_of("tests/unit/test_x.py::test_a") == "tests/unit/test_x.py"
    assert {scope_of(f"{module}::test_any") for module in NODE_MODULES} == {NODE_GROUP}
    assert "tests/e2e/test_dev_cluster.py" in NODE_MODULES  # its own node waits for the session's: same worker


def test_a_module_that_uses_the_node_but_is_not_listed_is_refused_and_so_is_a_listed_one_that_does_not() -> None:
    node_module = sorted(NODE_MODULES)[0]
    check_node_modules(items(f"{node_module}::a", f"{node_module}::b", "tests/e2e/test_x.py::c"), [True, False, False])
    with pytest.raises(pytest.UsageError, match=r"tests/e2e/test_new_node\.py"):
        check_node_modules(items("tests/e2e/test_new_node.py::a"), [True])
    with pytest.raises(pytest.UsageError, match=node_module):
        check_node_modules(items(f"{node_module}::a"), [False])


def test_the_check_pairs_items_with_their_flags() -> None:
    with pytest.raises(ValueError):
        check_node_modules(items("tests/e2e/test_x.py::a"), cast(Any, []))
