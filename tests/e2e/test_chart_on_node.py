"""The Helm chart's operator as a real Pod on the test node (issue 22): the image built from the repository's
Dockerfile (scripts/image-build), imported into the node under the name the chart's defaults give it
(`durable-sandbox:<appVersion>`), installed with `helm install` exactly as the README says, and run by the
kubelet: in-cluster configuration through the `kubernetes` Service, the chart's ServiceAccount token and RBAC,
its probes, its securityContext applied by a real container runtime.

The tests share one release and run in order: install and reconcile hello, the Pod's security, then
`helm upgrade` rolls the Pod and `helm uninstall` leaves only the CRDs.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.e2b_state import FakeState
from tests.fakes.fixtures import fake_e2b_in_thread

from .image_support import build_image
from .node_support import NodeCluster, build_test_image
from .operator_support import check_journal, parse_samples, total
from .test_chart import CHART, run_helm

pytestmark = [pytest.mark.image, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
HELLO = ROOT / "examples" / "hello-workflow.yaml"
NODE_IP = "10.88.0.1"  # the node's address on its Pod bridge: where a Pod reaches a server of the host
RELEASE = "dsb"
OPERATOR_NS = "durable-sandbox-system"
DEPLOYMENT = f"{RELEASE}-durable-sandbox"
SELECTOR = f"app.kubernetes.io/instance={RELEASE}"
FLOWS_REF = "localhost/durable-sandbox-flows:0.1.0"
WORKER_CHART = ROOT / "charts" / "durable-sandbox-worker"
WORKER_REPO = "localhost/dsb-team-worker"  # a team's worker image (examples/worker/Dockerfile), tag = build id


@pytest.fixture(scope="module")
def operator_image(node_cluster: NodeCluster) -> str:
    image = build_image()
    version = image.name.rsplit(":", 1)[1]
    # What `durable-sandbox:0.1.0` (the chart's default) means to the container runtime.
    return node_cluster.load_image(image.name, f"docker.io/library/durable-sandbox:{version}")


@pytest.fixture(scope="module")
def flows_context(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The build context of the operator image plus this repository's example workflows."""
    image = build_image()
    base_id = subprocess.run(["buildah", "inspect", "--type", "image", "--format", "{{.FromImageID}}", image.name],
                             capture_output=True, text=True, check=True).stdout.strip()
    context = tmp_path_factory.mktemp("flows-image")
    shutil.copytree(ROOT / "examples" / "flows", context / "examples" / "flows",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (context / "examples" / "__init__.py").write_text("")
    # FROM by id: the context's content hash then changes whenever the operator image does.
    (context / "Dockerfile").write_text(
        f"FROM {image.name}\n# operator image {base_id}\n"
        "COPY examples /opt/dsb-test/examples\nENV PYTHONPATH=/opt/dsb-test\n")
    return context


@pytest.fixture(scope="module")
def flows_image(node_cluster: NodeCluster, operator_image: str, flows_context: Path) -> str:
    """The operator image plus this repository's example workflows (chart value ``workflows`` names modules
    importable in the image: this is how a user adds theirs)."""
    return node_cluster.build_image(flows_context, FLOWS_REF)


@pytest.fixture(scope="module")
def worker_images(node_cluster: NodeCluster, flows_image: str, flows_context: Path,
                  tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A team's worker image of each build: examples/worker/Dockerfile, unchanged, built by buildah FROM the flows
    image (so the team's code is examples.flows and team_flows), ``BUILD_ID`` v1 and v2; by build id."""
    _, base = build_test_image(flows_context, FLOWS_REF, local=True)
    context = tmp_path_factory.mktemp("worker-image")
    shutil.copytree(ROOT / "examples" / "worker", context, dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("__pycache__"))
    return {build: node_cluster.build_image(context, f"{WORKER_REPO}:{build}",
                                            build_args={"BASE": base, "BUILD_ID": build})
            for build in ("v1", "v2")}


@pytest.fixture(scope="module")
def fake_e2b(node_cluster: NodeCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeState]:
    """The fake E2B server on the node's address, reachable from the operator's Pod: its sandboxes (and the
    commands run in them, as host processes) live outside the Pod and survive its replacement."""
    with fake_e2b_in_thread(tmp_path_factory.mktemp("fake-e2b"), host=NODE_IP) as (state, _):
        yield state


@pytest.fixture(scope="module")
def helm_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("helm-home")


class Release:
    def __init__(self, cluster: NodeCluster, helm: Path, home: Path) -> None:
        self.k = cluster
        self.helm = helm
        self.home = home

    def helm_run(self, *args: str) -> str:
        return run_helm(self.helm, self.home, *args, kubeconfig=self.k.kubeconfig).stdout

    def pods(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.k.kubectl_json("get", "pods", "-n", OPERATOR_NS, "-l", SELECTOR)["items"]
        return [p for p in items if not p["metadata"].get("deletionTimestamp")]

    def ready_pod(self) -> str:
        # kubectl's own deadline, not the subprocess's, ends the wait: a rollout that does not finish then says
        # why (the Pods, their Events and the operator's log) instead of a bare timeout.
        out = self.k.kubectl("rollout", "status", f"deployment/{DEPLOYMENT}", "-n", OPERATOR_NS, "--timeout=300s",
                             check=False, timeout=330)
        if out.returncode != 0:
            raise AssertionError(f"the operator's rollout did not finish: {out.stdout}{out.stderr}\n{self.diagnosis()}")
        [pod] = self.pods()
        return str(pod["metadata"]["name"])

    def diagnosis(self) -> str:
        parts = []
        for args in (("get", "pods", "-n", OPERATOR_NS, "-o", "wide"),
                     ("describe", "pods", "-n", OPERATOR_NS, "-l", SELECTOR),
                     ("get", "events", "-n", OPERATOR_NS, "--sort-by=.lastTimestamp")):
            out = self.k.kubectl(*args, check=False)
            parts.append(f"--- kubectl {' '.join(args)}:\n{out.stdout}{out.stderr}")
        parts.append(f"--- operator log:\n{self.logs()}")
        return "\n".join(parts)

    def exec(self, pod: str, script: str) -> str:
        return self.k.kubectl("exec", pod, "-n", OPERATOR_NS, "--", "python3", "-c", script).stdout

    def metrics(self, pod: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        # Through the API server's Pod proxy: API server -> the Pod's address on the node's bridge.
        return parse_samples(self.k.kubectl("get", "--raw", f"/api/v1/namespaces/{OPERATOR_NS}/pods/{pod}:8080/proxy/metrics").stdout)

    def logs(self) -> str:
        out = self.k.kubectl("logs", "-n", OPERATOR_NS, "-l", SELECTOR, "--tail=200", "--prefix", check=False)
        return out.stdout + out.stderr


@pytest.fixture(scope="module")
def release(node_cluster: NodeCluster, helm: Path, helm_home: Path, operator_image: str) -> Iterator[Release]:
    r = Release(node_cluster, helm, helm_home)
    # The README's command, unchanged.
    r.helm_run("install", RELEASE, str(CHART), "-n", OPERATOR_NS, "--create-namespace", "--set", "allowLocalProvider=true")
    yield r
    r.helm_run("uninstall", RELEASE, "-n", OPERATOR_NS, "--ignore-not-found", "--wait")


def test_installed_operator_pod_is_ready_and_reconciles_hello(release: Release, tmp_path: Path) -> None:
    k = release.k
    pod = release.ready_pod()
    status = k.kubectl_json("get", "pod", pod, "-n", OPERATOR_NS)
    assert {c["type"]: c["status"] for c in status["status"]["conditions"]}["Ready"] == "True"
    [container] = status["status"]["containerStatuses"]
    assert container["restartCount"] == 0
    assert container["image"] == "docker.io/library/durable-sandbox:0.1.0"

    # The kubelet's own counts: its readiness probe (/readyz) and liveness probe (/healthz) were answered.
    def probes(kind: str) -> float:
        raw = k.kubectl("get", "--raw", f"/api/v1/nodes/{k.node}/proxy/metrics/probes").stdout
        return total(parse_samples(raw), "prober_probe_total", probe_type=kind, result="successful", pod=pod)

    assert probes("Readiness") >= 1
    k.wait_until(lambda: probes("Liveness") >= 1, 120, "the kubelet's first successful liveness probe")

    ns = f"hello-{uuid.uuid4().hex[:6]}"
    k.kubectl("create", "namespace", ns)
    k.kubectl("apply", "-n", ns, "-f", str(HELLO))
    try:
        k.kubectl("wait", "--for=condition=Succeeded", "workflow/hello", "-n", ns, "--timeout=180s")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n--- operator log:\n{release.logs()}") from exc
    wf = k.kubectl_json("get", "workflow", "hello", "-n", ns)["status"]
    assert wf["phase"] == "Succeeded" and wf["calls"] == {"completed": 4, "total": 4}
    assert [r["exitCode"] for r in wf["result"]["toolResults"]] == [0, 0, 0, 2]

    got = release.metrics(pod)
    assert total(got, "durable_sandbox_tool_calls_total", provider="local") == 4
    requests = [(dict(labels), v) for (n, labels), v in got.items() if n == "durable_sandbox_kube_api_requests_total"]
    assert sum(v for labels, v in requests if labels["code"].startswith("2") and labels["verb"] == "patch") > 0
    denied = [labels for labels, v in requests if labels["code"] == "403" and v]
    assert denied == [], f"the chart's RBAC refused requests the operator made: {denied}"
    # In-cluster configuration: the ServiceAccount token the kubelet mounted, the `kubernetes` Service.
    env = release.exec(pod, "import os; print(os.environ['KUBERNETES_SERVICE_HOST'], os.environ['KUBERNETES_SERVICE_PORT'])")
    assert env.split() == ["10.0.0.1", "443"]
    assert "KUBECONFIG" not in json.dumps(status["spec"]["containers"][0].get("env", []))
    k.kubectl("delete", "namespace", ns, "--wait=false")


SECURITY = r"""
import json, os
status = dict(line.split(":", 1) for line in open("/proc/1/status").read().splitlines())
root = [l.split() for l in open("/proc/1/mountinfo") if l.split()[4] == "/"][-1]
try:
    open("/written-to-root", "w")
    root_write = "allowed"
except OSError as exc:
    root_write = exc.strerror
cmdline = open("/proc/1/cmdline").read().split("\0")
print(json.dumps({k: status[k].strip() for k in ("Uid", "Gid", "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb",
                                                   "NoNewPrivs", "Seccomp")}
                 | {"root_options": root[5], "root_write": root_write, "cmdline": cmdline,
                    "self_uid": os.getuid()}))
"""


def test_the_pod_runs_restricted_as_the_container_runtime_applied_it(release: Release) -> None:
    pod = release.ready_pod()
    got = json.loads(release.exec(pod, SECURITY))
    # PID 1 is the operator itself (the image's entrypoint), not a shell.
    assert got["cmdline"][:3] == ["/opt/durable-sandbox/bin/python3", "/opt/durable-sandbox/bin/dsb", "operator"] \
        or got["cmdline"][1:3] == ["/opt/durable-sandbox/bin/dsb", "operator"], got["cmdline"]
    assert got["Uid"].split() == ["10001"] * 4 and got["Gid"].split() == ["10001"] * 4
    assert got["self_uid"] == 10001, "kubectl exec runs with the Pod's securityContext too"
    for cap in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(got[cap], 16) == 0, f"{cap} is {got[cap]}: capabilities drop ALL"
    assert got["NoNewPrivs"] == "1", "allowPrivilegeEscalation: false"
    assert got["Seccomp"] == "2", "seccomp RuntimeDefault: a filter is applied"
    assert got["root_options"].split(",")[0] == "ro" and got["root_write"] == "Read-only file system"


def effect_calls(effects: Path, n: int, gate: Path, gate_at: int) -> list[dict[str, Any]]:
    """Shell calls that append to a log on the host (outside any sandbox): one line per execution; call
    ``gate_at`` waits for ``gate`` to exist first, so the test knows it is in flight."""
    calls = []
    for i in range(1, n + 1):
        wait = f"while [ ! -e {gate} ]; do sleep 0.05; done; " if i == gate_at else ""
        calls.append({"type": "shell", "operationId": f"c{i}", "command": f"{wait}echo c{i} >> {effects}; echo c{i}"})
    return calls


def test_rollout_restart_hands_a_waiting_and_a_running_workflow_to_the_new_pod(
    release: Release, fake_e2b: FakeState, flows_image: str, tmp_path: Path
) -> None:
    k = release.k
    ns = f"handover-{uuid.uuid4().hex[:6]}"
    k.kubectl("create", "namespace", ns)
    k.kubectl("create", "secret", "generic", "e2b", "-n", OPERATOR_NS, f"--from-literal=E2B_API_KEY={fake_e2b.api_key}")
    repo, tag = flows_image.rsplit(":", 1)
    release.helm_run("upgrade", RELEASE, str(CHART), "-n", OPERATOR_NS, "--reuse-values",
                     "--set", f"image.repository={repo}", "--set", f"image.tag={tag}",
                     "--set", "workflows={examples.flows.hello_flow}", "--set", "providers.e2b.existingSecret=e2b",
                     "--set", f"providers.e2b.apiUrl={fake_e2b.api_url}",
                     "--set", f"providers.e2b.sandboxUrl={fake_e2b.sandbox_url}")
    old = release.ready_pod()

    effects, gate = tmp_path / "effects.log", tmp_path / "gate"
    k.apply({"apiVersion": "durable-sandbox.dev/v1alpha1", "kind": "Workflow", "metadata": {"name": "waits"},
             "spec": {"entrypoint": "examples.flows.hello_flow:hello", "input": {"name": "Ada", "approve": True}}},
            "-n", ns)
    k.apply({"apiVersion": "durable-sandbox.dev/v1alpha1", "kind": "Workflow", "metadata": {"name": "calls"},
             "spec": {"sandbox": {"provider": "e2b", "template": "base"}, "snapshotEveryNCalls": 2,
                      "toolCalls": effect_calls(effects, 6, gate, gate_at=3)}}, "-n", ns)

    def wf(name: str) -> dict[str, Any]:
        st: dict[str, Any] = k.kubectl_json("get", "workflow", name, "-n", ns).get("status") or {}
        return st

    try:
        k.wait_until(lambda: wf("waits").get("pendingCallbacks"), 180, "the workflow to wait on its callback")
        k.wait_until(lambda: effects.exists() and effects.read_text().split() == ["c1", "c2"], 180,
                     "calls c1 and c2 done, c3 in flight")
        [sandbox] = fake_e2b.live_sandboxes()

        k.kubectl("rollout", "restart", f"deployment/{DEPLOYMENT}", "-n", OPERATOR_NS)
        # The kubelet has sent the old Pod its SIGTERM (it is terminating) while c3 is still running in it.
        k.wait_until(lambda: k.kubectl_json("get", "pod", old, "-n", OPERATOR_NS)["metadata"].get("deletionTimestamp"),
                     120, "the old Pod to be terminating")
        gate.touch()
        k.kubectl("wait", "--for=delete", f"pod/{old}", "-n", OPERATOR_NS, "--timeout=180s")
        new = release.ready_pod()
        assert new != old
        k.kubectl("patch", "workflow", "waits", "-n", ns, "--type=merge",
                  "-p", json.dumps({"spec": {"signals": {"approval": {"approved": True, "by": "node-test"}}}}))
        for name in ("waits", "calls"):
            k.kubectl("wait", "--for=condition=Succeeded", f"workflow/{name}", "-n", ns, "--timeout=240s")
    except (AssertionError, TimeoutError) as exc:
        raise AssertionError(f"{exc}\n--- operator logs:\n{release.logs()}") from exc
    assert wf("waits")["result"]["approval"] == {"approved": True, "by": "node-test"}
    # No committed call ran again: one line per call, in order (the call in flight finished in the old Pod).
    assert effects.read_text().split() == [f"c{i}" for i in range(1, 7)]
    # One sandbox for the whole run, never finalized by the handover: the new Pod used the same one.
    created = [r for r in fake_e2b.calls("POST", "/v2/sandboxes") if r.path == "/v2/sandboxes"]
    assert len(created) == 1, [r.path for r in created]
    assert fake_e2b.calls("POST", f"/sandboxes/{sandbox}/pause") == []
    kills = [r.path for r in fake_e2b.calls("DELETE", f"/sandboxes/{sandbox}")]
    assert len(kills) <= 1, kills  # finalized once, when the run finished
    k.kubectl("delete", "namespace", ns, "--wait=false")


def test_two_replicas_with_their_pdb_run_a_batch_exactly_once_while_one_pod_is_force_deleted(
    release: Release, fake_e2b: FakeState, tmp_path: Path
) -> None:
    k = release.k
    release.helm_run("upgrade", RELEASE, str(CHART), "-n", OPERATOR_NS, "--reuse-values", "--set", "replicaCount=2")
    k.kubectl("rollout", "status", f"deployment/{DEPLOYMENT}", "-n", OPERATOR_NS, "--timeout=300s")
    k.wait_until(lambda: len(release.pods()) == 2, 120, "two operator Pods")
    # The disruption controller keeps the chart's PDB's status: an eviction would be allowed for one Pod only.
    k.wait_until(lambda: (k.kubectl_json("get", "pdb", DEPLOYMENT, "-n", OPERATOR_NS).get("status") or {})
                 .get("currentHealthy") == 2, 120, "the PDB to count two healthy Pods")
    pdb = k.kubectl_json("get", "pdb", DEPLOYMENT, "-n", OPERATOR_NS)
    assert pdb["spec"]["minAvailable"] == 1 and pdb["status"]["disruptionsAllowed"] == 1

    ns = f"batch-{uuid.uuid4().hex[:6]}"
    k.kubectl("create", "namespace", ns)
    effects = tmp_path / "effects.log"
    names = [f"b{i}" for i in range(20)]
    for name in names:
        calls = [{"type": "shell", "operationId": f"c{j}", "command": f"echo {name}/c{j} >> {effects}; sleep 0.2"}
                 for j in range(1, 4)]
        k.apply({"apiVersion": "durable-sandbox.dev/v1alpha1", "kind": "Workflow", "metadata": {"name": name},
                 "spec": {"sandbox": {"provider": "e2b", "template": "base"}, "toolCalls": calls}}, "-n", ns)
    # Once both replicas execute runs of the batch, one of them is force-deleted (no grace: its runs are not
    # handed over; their leases lapse and the other replica or the replacement takes them).
    k.wait_until(lambda: effects.exists() and len(effects.read_text().split()) >= 6, 180, "the batch to be under way")
    victim = release.pods()[0]["metadata"]["name"]
    k.kubectl("delete", "pod", victim, "-n", OPERATOR_NS, "--grace-period=0", "--force")
    try:
        for name in names:
            k.kubectl("wait", "--for=condition=Succeeded", f"workflow/{name}", "-n", ns, "--timeout=600s")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n--- operator logs:\n{release.logs()}") from exc
    lines = effects.read_text().split()
    for name in names:
        st = k.kubectl_json("get", "workflow", name, "-n", ns)["status"]
        assert st["phase"] == "Succeeded" and st["calls"] == {"completed": 3, "total": 3}, (name, st)
        check_journal(k, ns, st["runId"])
        counts = [lines.count(f"{name}/c{j}") for j in range(1, 4)]
        # Every call ran; a committed call never ran again. Only the one call a run had in flight in the killed
        # Pod may have run twice (its completion was never committed).
        assert min(counts) >= 1 and sum(counts) - 3 <= 1, (name, counts)
    k.wait_until(lambda: len(release.pods()) == 2, 120, "the Deployment to replace the deleted Pod")
    k.kubectl("delete", "namespace", ns, "--wait=false")


# ------------------------------------------------------------------------------ a team's workers (issue 39)
CICD_STAGES = ["checks-0", "checks-1", "design", "implement", "review", "rework-0", "tests"]  # before its approval
RELEASED = {"status": "released", "release": "rel-c0ffee1", "reworkRounds": 1}


class TeamWorkers:
    """The worker chart installed in a team namespace with the team's image; each Workflow's effects log (one
    JSON line per stage run, examples/flows/_effects.py) on a hostPath the test reads."""

    def __init__(self, release: Release, ns: str, effects: Path) -> None:
        self.release = release
        self.k = release.k
        self.ns = ns
        self.effects = effects

    def install(self, values: dict[str, Any]) -> None:
        path = self.effects.parent / "worker-values.json"  # JSON is YAML
        path.write_text(json.dumps(values))
        self.release.helm_run("install", "agents", str(WORKER_CHART), "-n", self.ns, "-f", str(path))

    def deployment(self, build: str) -> str:
        return f"agents-durable-sandbox-worker-{build}"

    def rolled_out(self, build: str) -> None:
        out = self.k.kubectl("rollout", "status", f"deployment/{self.deployment(build)}", "-n", self.ns,
                             "--timeout=120s", check=False, timeout=150)
        assert out.returncode == 0, f"the workers of build {build} did not roll out: {out.stdout}{out.stderr}\n" \
                                    f"{self.logs()}"

    def pods(self, build: str) -> list[str]:
        """The Ready workers of ``build`` (Ready: serving, its /readyz answered)."""
        items = self.k.kubectl_json("get", "pods", "-n", self.ns, "-l",
                                    f"durable-sandbox.dev/worker-build={build}")["items"]
        return [p["metadata"]["name"] for p in items if not p["metadata"].get("deletionTimestamp")
                and {c["type"]: c["status"] for c in p["status"].get("conditions", [])}.get("Ready") == "True"]

    def claimed(self, pod: str) -> float:
        raw = self.k.kubectl("get", "--raw", f"/api/v1/namespaces/{self.ns}/pods/{pod}:8080/proxy/metrics").stdout
        return total(parse_samples(raw), "durable_sandbox_worker_runs_claimed_total")

    def apply(self, name: str, signals: dict[str, Any] | None = None) -> None:
        spec: dict[str, Any] = {"entrypoint": "examples.flows.cicd:cicd", "worker": {"queue": "agents"},
                                "input": {"change": name, "log": f"/effects/{name}.log"}}
        self.k.apply({"apiVersion": "durable-sandbox.dev/v1alpha1", "kind": "Workflow", "metadata": {"name": name},
                      "spec": spec | ({"signals": signals} if signals else {})}, "-n", self.ns)

    def signal(self, name: str, signal: str, value: dict[str, Any]) -> None:
        self.k.kubectl("patch", "workflow", name, "-n", self.ns, "--type=merge",
                       "-p", json.dumps({"spec": {"signals": {signal: value}}}))

    def status(self, name: str) -> dict[str, Any]:
        st: dict[str, Any] = self.k.kubectl_json("get", "workflow", name, "-n", self.ns).get("status") or {}
        return st

    def waits_for(self, name: str, callback: str) -> None:
        self.k.wait_until(lambda: [c["id"] for c in self.status(name).get("pendingCallbacks") or []] == [callback],
                          90, f"{name} to wait for its {callback!r} callback (status {self.status(name)})\n"
                              f"{self.logs()}")

    def succeeded(self, name: str) -> dict[str, Any]:
        try:
            self.k.kubectl("wait", "--for=condition=Succeeded", f"workflow/{name}", "-n", self.ns, "--timeout=90s",
                           timeout=120)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\nstatus {self.status(name)}\n{self.logs()}") from exc
        return self.status(name)

    def stages(self, name: str) -> list[str]:
        log = self.effects / f"{name}.log"
        return [json.loads(line)["stage"] for line in log.read_text().splitlines()] if log.exists() else []

    def logs(self) -> str:
        out = self.k.kubectl("logs", "-n", self.ns, "-l", "app.kubernetes.io/instance=agents", "--tail=60",
                             "--prefix", check=False)
        return f"--- worker logs:\n{out.stdout}{out.stderr}"


@pytest.fixture
def team(release: Release, worker_images: dict[str, str], tmp_path: Path) -> Iterator[TeamWorkers]:
    """Namespace team-*, named in the operator's workerNamespaces (its worker key Secret), with the worker chart
    of build v1: two replicas of the team's image, the chart's own ServiceAccount and Role."""
    k = release.k
    ns = f"team-{uuid.uuid4().hex[:6]}"
    k.kubectl("create", "namespace", ns)
    release.helm_run("upgrade", RELEASE, str(CHART), "-n", OPERATOR_NS, "--reuse-values",
                     "--set", f"workerNamespaces={{{ns}}}")
    effects = tmp_path / "effects"
    effects.mkdir()
    effects.chmod(0o777)  # the workers run as 10001
    t = TeamWorkers(release, ns, effects)
    try:
        yield t
    finally:
        release.helm_run("uninstall", "agents", "-n", ns, "--ignore-not-found")
        # Before the namespace goes: a later upgrade of the release would render its Role into a namespace
        # being deleted (refused).
        release.helm_run("upgrade", RELEASE, str(CHART), "-n", OPERATOR_NS, "--reuse-values",
                         "--set-json", "workerNamespaces=[]")
        k.kubectl("delete", "namespace", ns, "--wait=false")


def test_a_team_s_worker_deployment_runs_example_flows_through_a_pod_kill_and_a_rolling_update(
    team: TeamWorkers, worker_images: dict[str, str]
) -> None:
    t, k = team, team.k
    repo = worker_images["v1"].rsplit(":", 1)[0]
    t.install({"queue": "agents", "build": "v1", "image": {"repository": repo, "pullPolicy": "Never"},
               "pollInterval": 0.2, "extraVolumes": [{"name": "effects", "hostPath": {"path": str(t.effects)}}],
               "extraVolumeMounts": [{"name": "effects", "mountPath": "/effects"}]})
    t.rolled_out("v1")
    t.apply("first")
    t.waits_for("first", "approve")
    assert sorted(t.stages("first")) == CICD_STAGES

    # The Pod that executed it is killed (no grace); the run resumes on another worker of its build.
    [holder] = [pod for pod in t.pods("v1") if t.claimed(pod) >= 1]
    k.kubectl("delete", "pod", holder, "-n", t.ns, "--grace-period=0", "--force")
    t.signal("first", "approve", {"approved": True, "by": "node-test"})
    t.waits_for("first", "integration-health")
    assert sorted(t.stages("first")) == sorted([*CICD_STAGES, "deploy"])  # no committed stage ran again

    # A rolling update to build v2, v1 kept for its pinned run (the chart's keepBuilds): a new run starts on v2,
    # the run in flight finishes on v1, both with the result of a run that never saw an update.
    t.release.helm_run("upgrade", "agents", str(WORKER_CHART), "-n", t.ns, "--reuse-values",
                       "--set", "build=v2", "--set", "keepBuilds[0].build=v1")
    t.rolled_out("v2")
    k.wait_until(lambda: len(t.pods("v1")) == 1, 90, "build v1 scaled to keepBuilds' one replica")
    [kept] = t.pods("v1")
    before = t.claimed(kept)
    t.signal("first", "integration-health", {"healthy": True})
    assert t.succeeded("first")["result"] == RELEASED
    assert t.claimed(kept) > before, "the run in flight finished on the build that started it"
    assert sum(t.claimed(pod) for pod in t.pods("v2")) == 0, "build v2 never executed v1's run"

    # Once no run is pinned to v1, v1 is dropped (keepBuilds emptied): a new run starts and finishes on v2.
    t.release.helm_run("upgrade", "agents", str(WORKER_CHART), "-n", t.ns, "--reuse-values",
                       "--set-json", "keepBuilds=[]")
    k.wait_until(lambda: not t.pods("v1") and not k.kubectl_json(
        "get", "deployments", "-n", t.ns, "-l", "durable-sandbox.dev/worker-build=v1")["items"], 90,
        "build v1 removed")
    t.apply("second", {"approve": {"approved": True, "by": "node-test"}, "integration-health": {"healthy": True}})
    assert t.succeeded("second")["result"] == RELEASED
    assert sum(t.claimed(pod) for pod in t.pods("v2")) >= 1, "the new run executed by build v2"
    assert sorted(t.stages("first")) == sorted(t.stages("second")) == sorted([*CICD_STAGES, "deploy"])
    for name in ("first", "second"):
        check_journal(k, t.ns, t.status(name)["runId"])


def test_helm_upgrade_rolls_the_pod_and_uninstall_leaves_only_the_crds(release: Release) -> None:
    k = release.k
    release.helm_run("upgrade", RELEASE, str(CHART), "-n", OPERATOR_NS, "--reuse-values", "--set", "replicaCount=1")
    before = release.ready_pod()
    release.helm_run("upgrade", RELEASE, str(CHART), "-n", OPERATOR_NS, "--reuse-values",
                     "--set", "maxConcurrentRuns=7")
    k.kubectl("rollout", "status", f"deployment/{DEPLOYMENT}", "-n", OPERATOR_NS, "--timeout=300s")
    k.wait_until(lambda: [p["metadata"]["name"] for p in release.pods()] not in ([], [before]), 120,
                 "the old Pod to be replaced")
    after = release.ready_pod()
    assert after != before
    [pod] = release.pods()
    assert "--max-concurrent-runs=7" in pod["spec"]["containers"][0]["args"]

    release.helm_run("uninstall", RELEASE, "-n", OPERATOR_NS, "--wait")
    # Gone, not just terminating: the kubelet has stopped them (the operator exits within its grace period).
    k.wait_until(lambda: not k.kubectl_json("get", "pods", "-n", OPERATOR_NS, "-l", SELECTOR)["items"], 180,
                 "the operator's Pods to be gone")
    kinds = ("deployments,replicasets,pods,services,serviceaccounts,roles,rolebindings,clusterroles,"
             "clusterrolebindings,poddisruptionbudgets,validatingadmissionpolicies,validatingadmissionpolicybindings,"
             "configmaps,secrets")
    left = k.kubectl_json("get", kinds, "-A", "-l", SELECTOR)["items"]
    assert [f"{i['kind']}/{i['metadata']['name']}" for i in left] == []
    crds = set(k.kubectl("get", "crd", "-o", "name").stdout.split())
    assert crds >= {"customresourcedefinition.apiextensions.k8s.io/workflows.durable-sandbox.dev",
                    "customresourcedefinition.apiextensions.k8s.io/sandboxes.durable-sandbox.dev"}
