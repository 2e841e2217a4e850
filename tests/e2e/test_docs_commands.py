"""Issue 24, item 9: the docs' kubectl, helm and `dsb --kube` commands work as written against a real API server.

Each doc whose commands tests/docs_commands.py gives to this test gets a fresh control plane of its own (its
commands assume a cluster of their own: the default namespace, `helm install` of the one release name) and its
commands run in bash, in the doc's order (each once), from the repository root, with KUBECONFIG naming that control plane.
A command ending in ``&`` runs in the background as the reader's shell would run it, and ``kill %N`` stops the
N-th of them. The docs also assume an operator runs where they apply a Workflow (the chart's Pod, which needs a
node: tests/e2e/test_chart_on_node.py), so whenever the doc has none of its own running, the test runs one
(`dsb operator --allow-local-provider --workflows examples.flows`, the Quick start's) in its place. Every
operator's log is checked afterwards: no traceback and no ERROR (issue 24).
"""

from __future__ import annotations

import re
import signal
import subprocess
from pathlib import Path

import pytest

from tests.docs_commands import CLUSTER, ROOT, Command, commands_run_by, failed, shell, shell_env
from tests.e2e.controlplane import ControlPlane, private_control_plane
from tests.e2e.operator_support import OperatorProcess, log_problems

DOCS = sorted({c.doc for c in commands_run_by(CLUSTER)})


class DocShell:
    """The reader's shell: their environment, their background jobs, and the operator the docs take for granted."""

    def __init__(self, cp: ControlPlane, workdir: Path) -> None:
        self.env = {"KUBECONFIG": str(cp.kubeconfig), "KUBECACHEDIR": str(workdir / "kube-cache"),
                    "DURABLE_SANDBOX_HOME": str(workdir / "home")}
        self.workdir = workdir
        self.jobs: list[tuple[subprocess.Popen[bytes], Path]] = []
        self.stand_ins: list[OperatorProcess] = []
        self.stand_in()

    def stand_in(self) -> None:
        op = OperatorProcess(home=self.workdir / "home", log_path=self.workdir / f"stand-in-{len(self.stand_ins)}.log",
                             args=["--allow-local-provider", "--workflows", "examples.flows"], env=self.env)
        op.home.mkdir(parents=True, exist_ok=True)
        self.stand_ins.append(op.start())

    def run(self, command: Command) -> None:
        if command.text.endswith("&"):
            self.stand_ins[-1].stop()  # the doc's own operator is the one that acts now
            log = self.workdir / f"job-{len(self.jobs) + 1}.log"
            with log.open("wb") as out:
                job = subprocess.Popen(["bash", "-c", f"exec {command.text[:-1].strip()}"], cwd=ROOT, stdout=out,
                                       stderr=subprocess.STDOUT, env=shell_env(self.env), start_new_session=True)
            self.jobs.append((job, log))
        elif kill := re.fullmatch(r"kill %(\d+)", command.text):
            job, log = self.jobs[int(kill[1]) - 1]
            job.send_signal(signal.SIGTERM)
            code = job.wait(timeout=60)
            assert code == 0, f"{command.doc}:{command.line}: the job it stops exited {code}:\n{log.read_text()[-4000:]}"
            self.stand_in()
        else:
            done = shell(command, cwd=ROOT, env=self.env)
            assert done.returncode == 0, failed(command, done)

    def close(self) -> list[str]:
        """Stop whatever still runs; the problems in the operators' logs."""
        problems = []
        for job, log in self.jobs:
            if job.poll() is None:
                job.send_signal(signal.SIGTERM)
                job.wait(timeout=60)
            problems += [f"{log.name}: {line}" for line in log_problems(log.read_text(errors="replace"))]
        for op in self.stand_ins:
            op.stop()
            problems += [f"{op.log_path.name}: {line}" for line in op.log_problems()]
        return problems


@pytest.mark.timeout(900)
@pytest.mark.parametrize("doc", DOCS)
def test_cluster_commands_of_the_docs_work(doc: str, tmp_path: Path, helm: Path) -> None:
    # Each command once, where it first appears: a doc's blocks may be alternatives (the README's kind and
    # scripts/dev-cluster steps share their helm and kubectl lines), and a second `helm install` of a release fails.
    seen: set[str] = set()
    commands = [c for c in commands_run_by(CLUSTER, doc) if not (c.text in seen or seen.add(c.text))]
    assert commands
    (tmp_path / "controlplane").mkdir()
    with private_control_plane(tmp_path / "controlplane") as cp:
        reader = DocShell(cp, tmp_path)
        try:
            for command in commands:
                reader.run(command)
        finally:
            problems = reader.close()
        assert not problems, "tracebacks or ERROR lines in the operators' logs:\n" + "\n".join(problems[:20])
