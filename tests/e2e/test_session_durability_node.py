"""Issue 35's acceptance for durable session calls, on the test node with the kubernetes provider and S3 snapshots
(versitygw): a client makes 30 calls to a Sandbox (a snapshot every 5); its Pod is deleted by hand mid-session and
the session recovers (the newest snapshot restored, the later calls replayed) with the client seeing no error; the
operator is SIGKILLed between a call's start and its run, and the retried call runs once; an idle suspend, then a
call resumes it with its files. The final workspace equals an undisturbed session's (checksums).

One operator (and its successor after the kill), one namespace; the undisturbed session runs first in the same
namespace, so the test costs two Sandboxes' Pods and ~70 calls.

Issue 36's acceptance on the node (``test_forks_of_a_50_call_session_...``): a 50-call session (a snapshot every
10 in S3), Sandboxes made from it (``spec.from``) at calls 17 (ten at once), 40 and 50, each fork's files equal to
what the calls themselves make up to that call (checksums of every file, computed here, not by a second session);
the source continued to 53 calls, rewound to 52 (its S3 snapshot at 50 restored, calls 50 and 51 replayed) and
continued; the source deleted first (a fork still answers), then the forks: no snapshot object and no Pod left.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import time
from typing import Any

from durable_sandbox.client import SandboxClient
from durable_sandbox.sessions.journal import SESSION, calls_run_id
from tests.e2e.controlplane import wait_until
from tests.e2e.kubernetes_operator_support import Cluster, cluster
from tests.e2e.operator_support import events, http_get, journal, namespace, operators
from tests.e2e.sandbox_support import control_plane_on_the_node, node, wait_for
from tests.e2e.session_caller_support import CALLER_RULE, caller_token
from tests.ports import free_port

__all__ = ["cluster", "control_plane_on_the_node", "namespace", "node", "operators"]  # fixtures

CALLS = 30
CHECKSUM = "cd w && find . -type f | sort | xargs md5sum"


def command(i: int) -> str:
    """Call ``i``: appends to a log, rewrites one of 7 files; every 9th exits nonzero (a completed call too)."""
    return f"mkdir -p w && echo {i} >> w/log && echo $(({i} * {i})) > w/f{i % 7}" + ("; exit 2" if i % 9 == 4 else "")


def box(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "durable-sandbox.dev/v1alpha1", "kind": "Sandbox", "metadata": {"name": name},
            "spec": {"provider": "kubernetes", "snapshotEveryNCalls": 5, "leaseSeconds": 20, **spec}}


def start(cluster: Cluster, port: int, **kwargs: Any) -> Any:
    op = cluster.operator("--session-port", str(port), "--session-host", "127.0.0.1", **kwargs)
    wait_until(lambda: http_get(port, "/healthz")[0] == 200 or not op.alive(), 90, "the session API to answer")
    assert op.alive(), op.logs()[-3000:]
    return op


def session(client: SandboxClient, prefix: str, *, after: int | None = None, then: Any = None) -> None:
    for i in range(CALLS):
        answer = client.run(command(i), operation_id=f"{prefix}{i}")
        assert answer.exit_code == (2 if i % 9 == 4 else 0), answer
        if after == i:
            then()


def test_a_session_survives_a_pod_deleted_by_hand_an_operator_kill_and_an_idle_suspend(cluster: Cluster) -> None:
    cp, ns, port = cluster.cp, cluster.ns, free_port()
    started = time.monotonic()
    first = start(cluster, port, fault=f"before:{SESSION}/k1")
    token = caller_token(cp, ns, "agent", granted=True)
    url = f"http://127.0.0.1:{port}"

    # The undisturbed session.
    cp.apply(box("undisturbed"), "-n", ns)
    wait_for(cp, ns, "undisturbed", "Ready", timeout=180)
    with SandboxClient.attach("undisturbed", namespace=ns, url=url, token=token) as client:
        session(client, "u")
        client.run("echo k1 >> w/log", operation_id="uk1")
        expected = client.run(CHECKSUM, operation_id="u-sum").stdout
    cp.kubectl("delete", "dsbx", "undisturbed", "-n", ns, "--wait=true", "--timeout=120s")
    wait_until(lambda: cluster.pods() == [], 90, "the undisturbed Sandbox's Pod to go")

    cp.apply(box("box"), "-n", ns)
    wait_for(cp, ns, "box", "Ready", timeout=180)
    uid = cp.kubectl_json("get", "dsbx", "box", "-n", ns)["metadata"]["uid"]

    def delete_the_pod() -> None:
        [pod] = cluster.pods()
        cp.kubectl("delete", "pod", "-n", ns, pod, "--grace-period=0", "--force")

    with SandboxClient.attach("box", namespace=ns, url=url, token=token) as client, \
            concurrent.futures.ThreadPoolExecutor(1) as pool:
        # The Pod deleted by hand after call 16 (the newest snapshot holds 15 calls): call 17 meets the loss and
        # waits; the controller restores the snapshot, calls 15 and 16 are replayed, then 17 runs. No error.
        session(client, "c", after=16, then=delete_the_pod)
        reasons = [e["reason"] for e in events(cp, ns, "box")]
        assert "SandboxLost" in reasons and "Recovered" in reasons, reasons
        rebuilt = [r for r in journal(cp, ns, calls_run_id(uid)) if r.op_id.startswith("rebuild/") and r.result]
        assert any(r.result["replayed"] == ["c15", "c16"] for r in rebuilt), [(r.meta, r.result) for r in rebuilt]

        # SIGKILL between k1's start and its run: the retry (same operation id, the next operator) runs it once.
        pending = pool.submit(client.run, "echo k1 >> w/log", operation_id="k1")
        assert first.wait_exit(timeout=90) != 0
        assert [r.status for r in journal(cp, ns, calls_run_id(uid)) if r.op_id == f"{SESSION}/k1"] == ["started"]
        start(cluster, port, home=first.home, name="operator-2")
        assert pending.result(timeout=240).exit_code == 0

        # Idle suspend, then a call resumes it with the files intact.
        cp.kubectl("patch", "dsbx", "box", "-n", ns, "--type=merge", "-p", '{"spec":{"idleSuspendAfterSeconds":3}}')
        wait_for(cp, ns, "box", "Suspended", timeout=180)
        wait_until(lambda: cluster.pods() == [], 90, "the idle Sandbox's Pod to go")
        assert client.run(CHECKSUM, operation_id="c-sum").stdout == expected
        assert client.read_file("w/log").splitlines() == [*map(str, range(CALLS)), "k1"]
    print(f"session durability on the node: {time.monotonic() - started:.0f}s")


FORK_CALLS, FORK_POINTS, SAME_POINT = 50, (17, 40, 50), 10
# 13 Pods at once on the 2-core node: the template's default CPU request would not fit them (as session_calls --node).
SMALL = {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "128Mi"}}
UPDATE_RULE = {"apiGroups": ["durable-sandbox.dev"], "resources": ["sandboxes"], "verbs": ["update"]}


def made_by_calls(n: int) -> dict[str, str]:
    """The md5 of every file that calls 0..n-1 (``command``) leave in ``w``, computed from the commands' meaning."""
    files = {"./log": "".join(f"{i}\n" for i in range(n))}
    files |= {f"./f{i % 7}": f"{i * i}\n" for i in range(n)}  # the last call writing each wins
    return {path: hashlib.md5(text.encode()).hexdigest() for path, text in sorted(files.items())}


def checksums(client: SandboxClient, op: str) -> dict[str, str]:
    answer = client.run(CHECKSUM, operation_id=op)
    assert answer.exit_code == 0, answer
    return {path: digest for digest, path in (line.split() for line in answer.stdout.splitlines())}


def test_forks_of_a_50_call_session_match_a_replay_and_leave_nothing_behind(cluster: Cluster) -> None:
    cp, ns, port = cluster.cp, cluster.ns, free_port()
    started = time.monotonic()
    start(cluster, port, resources=SMALL)
    token = caller_token(cp, ns, "agent", granted=True)
    url = f"http://127.0.0.1:{port}"
    cp.apply(box("src", snapshotEveryNCalls=10), "-n", ns)
    wait_for(cp, ns, "src", "Ready", timeout=180)
    with SandboxClient.attach("src", namespace=ns, url=url, token=token) as client:
        for i in range(FORK_CALLS):
            assert client.run(command(i), operation_id=f"c{i}").exit_code == (2 if i % 9 == 4 else 0)
    assert cluster.objects(), "the source's snapshots in the bucket"

    # Ten forks of call 17 at once, and one each of 40 and 50: their first call replays the source's calls.
    forks = {f"at17-{k}": 17 for k in range(SAME_POINT)} | {"at40": 40, "at50": 50}
    for name, point in forks.items():
        cp.apply(box(name, snapshotEveryNCalls=10, **{"from": {"sandbox": "src", "afterCall": point}}), "-n", ns)

    def fork_files(name: str) -> dict[str, str]:
        wait_for(cp, ns, name, "Ready", timeout=180)
        with SandboxClient.attach(name, namespace=ns, url=url, token=token) as forked:
            return checksums(forked, "sum")

    with concurrent.futures.ThreadPoolExecutor(len(forks)) as pool:
        got = dict(zip(forks, pool.map(fork_files, forks), strict=True))
    assert got == {name: made_by_calls(point) for name, point in forks.items()}
    forked_at = time.monotonic()

    # The source goes on to call 53, is rewound to 52 (its S3 snapshot at 50 restored, c50 and c51 replayed), and
    # continues from there.
    cp.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "agent-owner"},
              "rules": [CALLER_RULE, UPDATE_RULE]}, "-n", ns)
    cp.kubectl("create", "rolebinding", "agent-owner", "--role=agent-owner", f"--serviceaccount={ns}:agent", "-n", ns)
    wait_until(lambda: cp.kubectl("auth", "can-i", "update", "sandboxes.durable-sandbox.dev", "-n", ns,
                                  as_user=f"system:serviceaccount:{ns}:agent", check=False).returncode == 0,
               30, "RBAC to grant agent update")
    with SandboxClient.attach("src", namespace=ns, url=url, token=token) as client:
        for i in range(FORK_CALLS, FORK_CALLS + 3):
            client.run(command(i), operation_id=f"c{i}")
        done = client.rewind(52)
        assert (done["rewound"], done["replayed"]) == (["c52"], ["c50", "c51"]), done
        assert checksums(client, "after-rewind") == made_by_calls(52)  # the rewind's answer comes after the rebuild
        for i in (52, 53):
            client.run(command(i), operation_id=f"again{i}")
        assert checksums(client, "continued") == made_by_calls(54)

    # The source deleted first: its forks need nothing of it. Then the forks: nothing left.
    cp.kubectl("delete", "dsbx", "src", "-n", ns, "--wait=true", "--timeout=120s")
    with SandboxClient.attach("at50", namespace=ns, url=url, token=token) as forked:
        forked.run(command(FORK_CALLS), operation_id="next")
        assert checksums(forked, "sum-2") == made_by_calls(FORK_CALLS + 1)
    cp.kubectl("delete", "dsbx", "--all", "-n", ns, "--wait=true", "--timeout=120s")
    wait_until(lambda: cluster.pods() == [] and cluster.objects() == [], 120, "no Pod and no snapshot object left")
    print(f"forks on the node: {forked_at - started:.0f}s to 12 forks checked, {time.monotonic() - started:.0f}s in all")
