"""End-to-end tier: pytest's hooks and fixtures. The control plane itself (built from Kubernetes' own Go modules,
started, stopped) is a library, tests/e2e/controlplane.py; so are the support modules beside it.

The control plane binary is built (or found in the out-of-tree cache) once, when collection has finished and
e2e tests are selected: a cold build takes many minutes and must not count against a test's timeout.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.e2e.controlplane import (
    BUILD_SCRIPT,
    BUILD_TIMEOUT_S,
    E2E_DIR,
    HELM_PATH,
    build_controlplane,
)
from tests.e2e.journal_support import operator_journal
from tests.worker_groups import check_node_modules

__all__ = ["operator_journal"]  # a fixture, defined with its support module

if TYPE_CHECKING:
    from .node_support import NodeCluster


# tryfirst: the marks must be in place before `-m` deselection runs in the same hook.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Every test under tests/e2e belongs to the e2e tier, even if its module forgets `pytestmark`.
    for item in items:
        if E2E_DIR in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.e2e)
        if uses_node(item):
            item.add_marker(pytest.mark.node)
    from .journal_support import journal_items

    journal_items(config, [item for item in items if item.get_closest_marker("e2e")])
    # The node is machine-wide and held from its first test to the end of the session: run the tests that use
    # it last (in their order), so another worktree's session waits for it as briefly as possible; and the
    # tests that start a node of their own (scripts/dev-cluster) before the session's node holds the machine.
    # Under pytest-xdist (scripts/test) the node's tests are one group on one worker (tests/worker_groups.py),
    # put first: the longest group starts at once and the other worker takes everything else meanwhile.
    check_node_modules(items, [uses_node(item) or item.get_closest_marker("own_node") is not None for item in items])
    items.sort(key=run_order)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    from .journal_support import parametrize_both

    parametrize_both(metafunc)


def run_order(item: pytest.Item) -> int:
    """0 runs first: a node of the test's own, then (under xdist) the session node's tests, then the rest."""
    node_first = bool(os.environ.get("PYTEST_XDIST_WORKER"))
    if item.get_closest_marker("own_node"):
        return 0
    if uses_node(item):
        return 1 if node_first else 2
    return 2 if node_first else 1


def uses_node(item: pytest.Item) -> bool:
    return "node_cluster" in getattr(item, "fixturenames", ())


def will_run(items: list[pytest.Item]) -> list[pytest.Item]:
    """The items not skipped at collection (e.g. by the journal switch): only they need a browser or an image."""
    return [item for item in items if item.get_closest_marker("skip") is None]


def pytest_collection_finish(session: pytest.Session) -> None:
    if session.config.option.collectonly:
        return
    if any(item.get_closest_marker("e2e") for item in session.items):
        # Outside any test, so a cold build does not count against the per-test timeout; errors surface later.
        # Output capture is off meanwhile: the build's progress lines (a cold build takes many minutes) reach
        # the terminal as they come instead of minutes of silence.
        capture = session.config.pluginmanager.getplugin("capturemanager")
        with capture.global_and_fixture_disabled() if capture is not None else contextlib.nullcontext():
            try:
                build_controlplane()
            except RuntimeError:
                pass
    if any(uses_node(item) or item.get_closest_marker("own_node") for item in will_run(session.items)):
        from .node_support import prepare_node

        capture = session.config.pluginmanager.getplugin("capturemanager")
        with capture.global_and_fixture_disabled() if capture is not None else contextlib.nullcontext():
            try:
                prepare_node()
            except RuntimeError:  # remembered; the node tests raise it
                pass
    if any("network_policy_enforcer" in getattr(item, "fixturenames", ()) for item in will_run(session.items)):
        from .netpol_support import enforcer_binary

        capture = session.config.pluginmanager.getplugin("capturemanager")
        with capture.global_and_fixture_disabled() if capture is not None else contextlib.nullcontext():
            try:
                enforcer_binary()  # scripts/netpol-build: kube-router, for the tests that enforce NetworkPolicy
            except RuntimeError:  # remembered; the fixture raises it
                pass
    if any("agent_sandbox" in getattr(item, "fixturenames", ()) for item in will_run(session.items)):
        from .agent_sandbox_support import agent_sandbox_build

        capture = session.config.pluginmanager.getplugin("capturemanager")
        with capture.global_and_fixture_disabled() if capture is not None else contextlib.nullcontext():
            try:
                agent_sandbox_build()  # scripts/agent-sandbox-build: kubernetes-sigs/agent-sandbox's controller
            except RuntimeError:  # remembered; the fixture raises it
                pass
    if any("trace_collector" in getattr(item, "fixturenames", ()) for item in will_run(session.items)):
        from .trace_support import collector_binary

        capture = session.config.pluginmanager.getplugin("capturemanager")
        with capture.global_and_fixture_disabled() if capture is not None else contextlib.nullcontext():
            try:
                collector_binary()  # scripts/otelcol-build: the test trace backend (about two minutes cold)
            except RuntimeError:  # remembered; the fixture raises it
                pass
    if any(item.get_closest_marker("browser") for item in will_run(session.items)):
        from .browser_support import chromium

        capture = session.config.pluginmanager.getplugin("capturemanager")
        with capture.global_and_fixture_disabled() if capture is not None else contextlib.nullcontext():
            try:
                chromium()  # scripts/browser: installs Debian's chromium when missing, outside any test's timeout
            except RuntimeError:
                pass  # remembered; the browser tests raise it
            from .readme_install_support import readme_dsb

            for extra in ("", "kubernetes", "postgres"):
                with contextlib.suppress(RuntimeError):  # the test that starts `dsb ui` raises it again
                    readme_dsb(extra)  # the README's environments (cached), outside any test's timeout
    if any(item.get_closest_marker("image") for item in will_run(session.items)):
        from .image_support import build_image

        capture = session.config.pluginmanager.getplugin("capturemanager")
        with capture.global_and_fixture_disabled() if capture is not None else contextlib.nullcontext():
            try:
                build_image()
            except Exception:  # remembered; the tests that need the image raise it
                pass



@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Headless Chromium (Debian's) driven by Playwright, for the web view's tests (tests/e2e/browser_support.py).
    One per module, closed when the module's last test ends: Playwright's sync API keeps an event loop running
    in this thread while it is open, which no async test (pytest-asyncio) may find there."""
    from .browser_support import launch_browser

    yield from launch_browser()


@pytest.fixture(scope="session")
def helm() -> Path:
    """The pinned helm that scripts/controlplane-build installs into <project>/.bin."""
    if not os.access(HELM_PATH, os.X_OK):
        subprocess.run([str(BUILD_SCRIPT)], stdout=subprocess.DEVNULL, timeout=BUILD_TIMEOUT_S, check=True)
    if not os.access(HELM_PATH, os.X_OK):
        raise RuntimeError(f"{HELM_PATH} missing: run scripts/controlplane-build")
    return HELM_PATH


@pytest.fixture(scope="session")
def node_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeCluster]:
    """A control plane of its own with a Ready node (Pods run), one per session, holding the machine's node
    lock; see tests/e2e/node_support.py and docs/testing.md ("The node")."""
    from .node_support import session_node_cluster

    yield from session_node_cluster(tmp_path_factory)
