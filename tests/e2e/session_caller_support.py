"""A caller of a Sandbox's call API: a ServiceAccount token, granted ``create sandboxes/calls`` or not (the e2e tests
of session calls: ``test_sandbox_sessions.py``, ``test_session_durability_node.py``)."""

from __future__ import annotations

from typing import Any

from tests.e2e.controlplane import ControlPlane, wait_until
from tests.e2e.operator_support import OperatorProcess, http_get

__all__ = ["CALLER_RULE", "caller_token", "start"]

CALLER_RULE = {"apiGroups": ["durable-sandbox.dev"], "resources": ["sandboxes/calls"], "verbs": ["create"]}


def caller_token(cp: ControlPlane, ns: str, sa: str, *, granted: bool) -> str:
    """A TokenRequest token of ServiceAccount ``sa`` in ``ns``, bound (``granted``) to create sandboxes/calls there."""
    cp.kubectl("create", "serviceaccount", sa, "-n", ns)
    if granted:
        cp.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                  "metadata": {"name": f"{sa}-calls"}, "rules": [CALLER_RULE]}, "-n", ns)
        cp.kubectl("create", "rolebinding", f"{sa}-calls", f"--role={sa}-calls", f"--serviceaccount={ns}:{sa}", "-n", ns)
        wait_until(lambda: cp.kubectl("auth", "can-i", "create", "sandboxes.durable-sandbox.dev", "--subresource=calls", "-n", ns,
                                      as_user=f"system:serviceaccount:{ns}:{sa}", check=False).returncode == 0,
                   30, f"RBAC to grant {sa}")
    return cp.kubectl("create", "token", sa, "-n", ns, "--duration=1h").stdout.strip()


def start(operators: Any, port: int, *args: str, **kwargs: Any) -> OperatorProcess:
    op: OperatorProcess = operators("--allow-local-provider", "--session-port", str(port), "--session-host", "127.0.0.1",
                                    *args, **kwargs)
    wait_until(lambda: http_get(port, "/healthz")[0] == 200 or not op.alive(), 60, "the session API to answer")
    assert op.alive(), op.logs()[-3000:]
    return op
