"""Every shell command of a fenced code block in README.md and docs/*.md, and what proves it (issue 24, item 9).

A block's language says what it is: ``sh``/``bash``/``shell``: every line is a command (``\\`` continues one,
a heredoc's body is part of it, ``# ...`` is a comment); ``console``: a transcript, where ``$ `` lines are the
commands and the lines after each are its output; anything else (``text``, ``python``, ``yaml``, ...) holds no
command. An untagged block is refused: nobody could tell whether its lines are commands.

``PROOFS`` says of each command, keyed by the doc and the command as written (comment removed), either which
test runs it (:class:`Run`; the runners below take their commands from here, so the entry is what they run) or
why no test here can (:class:`NotRun`). tests/unit/test_docs_commands.py fails when a doc gains a command that
is neither, or when an entry names a command or a test that no longer exists.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHELL = {"sh", "bash", "shell"}
TRANSCRIPT = {"console"}
FENCE = re.compile(r"^```(?P<lang>[^\n`]*)\n(?P<body>.*?)^```[ \t]*$", re.S | re.M)
HEREDOC = re.compile(r"<<-?\s*(['\"]?)(?P<word>[A-Za-z_]+)\1")


@dataclass(frozen=True)
class Command:
    doc: str  # relative to the repository root
    line: int  # of the command's first line in the doc
    text: str  # as written, continuation lines joined (with their backslash-newline), comment removed
    output: tuple[str, ...] = ()  # a transcript's lines after the command


@dataclass(frozen=True)
class Block:
    doc: str
    line: int
    lang: str
    body: str


@dataclass(frozen=True)
class Run:
    by: str  # tests/<file>.py::<test function>
    note: str = ""  # what of the command that test does not run, and why


@dataclass(frozen=True)
class NotRun:
    why: str


def docs() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def blocks(path: Path) -> list[Block]:
    text = path.read_text()
    doc = str(path.relative_to(ROOT))
    return [Block(doc, text[: m.start()].count("\n") + 1, m["lang"].strip(), m["body"]) for m in FENCE.finditer(text)]


def strip_comment(line: str) -> str:
    """``line`` without a trailing ``# comment`` (a ``#`` outside quotes that starts a word), right-stripped."""
    quote = ""
    for i, ch in enumerate(line):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1] in " \t"):
            return line[:i].rstrip()
    return line.rstrip()


def block_commands(block: Block) -> list[Command]:
    if block.lang not in SHELL | TRANSCRIPT:
        return []
    lines = block.body.splitlines()
    out: list[Command] = []
    i = 0
    while i < len(lines):
        start, raw = i, lines[i]
        i += 1
        if block.lang in TRANSCRIPT:
            if not raw.startswith("$ "):
                continue  # output of the command before it
            raw = raw[2:]
        text = strip_comment(raw)
        if not text:
            continue
        while text.endswith("\\") and i < len(lines):
            text += "\n" + strip_comment(lines[i])
            i += 1
        if heredoc := HEREDOC.search(text):
            end = next((j for j in range(i, len(lines)) if lines[j].strip() == heredoc["word"]), len(lines) - 1)
            text += "\n" + "\n".join(lines[i : end + 1])
            i = end + 1
        output: list[str] = []
        if block.lang in TRANSCRIPT:
            while i < len(lines) and not lines[i].startswith("$ "):
                output.append(lines[i])
                i += 1
        out.append(Command(block.doc, block.line + 1 + start, text, tuple(output)))
    return out


def all_commands() -> list[Command]:
    return [c for path in docs() for b in blocks(path) for c in block_commands(b)]


def commands_run_by(test: str, doc: str | None = None) -> list[Command]:
    """The commands ``test`` runs (each time one appears in its doc), in the order of the docs."""
    return [c for c in all_commands() if (doc is None or c.doc == doc)
            and isinstance(p := PROOFS.get(c.doc, {}).get(c.text), Run) and p.by == test]


# -- what proves each command ---------------------------------------------------------------------------------

CLI = "tests/unit/test_cli.py::test_docs_cli_examples_work"
SCHEDULE_DOCS = "tests/unit/test_dsb_schedule.py::test_the_docs_schedule_commands_work"
DOCS_SCHEDULE_COMMANDS = (
    "dsb schedule add nightly examples.flows.hello_flow:hello --input '{\"name\": \"Ada\"}' --cron \"30 2 * * *\" "
    "--time-zone Europe/Berlin",
    "dsb schedule add every-minute examples/hello-workflow.yaml --every 60s --concurrency-policy Forbid",
    "dsb schedule list",
)  # dsb, in order, in one DURABLE_SANDBOX_HOME
REGEN = "tests/unit/kube/test_crds.py::test_docs_regenerating_commands_write_the_committed_crds"
CLUSTER = "tests/e2e/test_docs_commands.py::test_cluster_commands_of_the_docs_work"  # a fresh control plane per doc
README = "tests/unit/test_readme.py::test_readme_first_command_runs_the_hello_workflow"
README_CODE = "tests/unit/test_readme.py::test_readme_code_first_example_runs_with_its_commands"
FORKS = "tests/unit/test_forks.py::test_the_docs_fork_commands_and_code_work"
REWIND = "tests/unit/test_session_rewind.py::test_the_docs_rewind_code_and_commands_work"
REWIND_NOTE = ("against the call API the test serves over a local sandbox (its Sandbox is named box, not dev-box), "
               "after the doc's Python code")
CHART_ON_NODE = "tests/e2e/test_chart_on_node.py::test_installed_operator_pod_is_ready_and_reconciles_hello"
DEV_CLUSTER = "tests/e2e/test_dev_cluster.py::test_up_runs_pods_and_down_leaves_nothing_behind"
REPLAY_CLUSTER = ("tests/e2e/test_operator_replay_policies.py::"
                  "test_the_example_replays_skips_and_asks_as_each_call_says_answered_through_spec_signals")
REPLAY_LOCAL = "tests/unit/test_replay_policies.py::test_docs_replay_commands_work"
REPLAY_NOTE = ("with the example's EFFECTS_LOG pointed into the test's own directory (the machine is shared), and "
               "the log checked line by line")
GVISOR_EXAMPLE = ("tests/e2e/test_operator_kubernetes_provider.py::"
                  "test_a_gvisor_template_runs_the_sandbox_under_gvisor_and_status_says_so")

NO_CONTAINER_ENGINE = NotRun(
    "needs a container engine (docker, kind), which these machines and CI do not have; the scripts/dev-cluster "
    "steps beside it are the tested equivalent (tests/e2e/test_chart_on_node.py, tests/e2e/test_image.py)")
PACKAGE_INDEX = NotRun(
    "installs from the package index into the user's environment; scripts/test installs the project the same way "
    "(pip install -e '.[test,agents,bench]') before every run")
BENCHMARK = NotRun(
    "a benchmark: minutes of deliberate load whose figures are measured, not asserted; "
    "tests/unit/test_benchmarks_smoke.py runs each part at a tiny size so they do not rot")

AGENTS = "tests/e2e/test_sandbox_sessions.py::test_the_docs_commands_call_a_sandbox"
SHELL_CLI = "tests/unit/test_sandbox_shell_cli.py::test_the_docs_exec_shell_and_snapshot_commands_work"
SHELL_CLI_NOTE = ("against the call API served in process over a local sandbox named box (dev-box renamed), its address "
                  "and token in $DSB_SESSION_URL and $DSB_SESSION_TOKEN")
AGENTS_NOTE = ("in the test's namespace instead of demo and with the test operator's port instead of 8443 (the "
               "machine is shared); the ClusterRole is the chart's rule, applied by the test")

PROOFS: dict[str, dict[str, Run | NotRun]] = {
    "docs/agents.md": {
        "kubectl create serviceaccount agent -n demo": Run(AGENTS, note=AGENTS_NOTE),
        "kubectl create rolebinding agent-calls --clusterrole=durable-sandbox-sandbox-caller "
        "--serviceaccount=demo:agent -n demo": Run(AGENTS, note=AGENTS_NOTE),
        "export DSB_SESSION_URL=http://127.0.0.1:8443": Run(AGENTS, note=AGENTS_NOTE),
        'export DSB_SESSION_TOKEN="$(kubectl create token agent -n demo)"': Run(AGENTS, note=AGENTS_NOTE),
        "dsb -n demo sandbox exec dev-box -- sh -c 'echo hello > greeting.txt; cat greeting.txt'":
            Run(AGENTS, note=AGENTS_NOTE),
        "dsb -n demo sandbox exec dev-box -- sh -c 'for i in 1 2 3; do echo \"step $i\"; sleep 1; done'":
            Run(SHELL_CLI, note=SHELL_CLI_NOTE),
        "printf 'echo hello > greeting.txt\\ncat greeting.txt\\n' | dsb -n demo sandbox shell dev-box --session-id "
        "first-session": Run(SHELL_CLI, note=SHELL_CLI_NOTE),
        "dsb -n demo sandbox snapshot dev-box --operation-id before-refactor": Run(SHELL_CLI, note=SHELL_CLI_NOTE),
    },
    "docs/forks.md": {text: Run(FORKS, note="in a directory holding the doc's code as forkdemo.py") for text in (
        "dsb run forkdemo:build --input '{\"calls\": 6}' --run-id base",
        "dsb fork base --after 3 --count 2",
        "dsb fork base --after 3 --resume",
    )} | {text: Run(REWIND, note=REWIND_NOTE) for text in (
        "dsb -n demo sandbox rewind dev-box --to-call 3",
        'curl -sS -X POST -H "Authorization: Bearer $DSB_SESSION_TOKEN" -d \'{"toCall": 2}\' '
        '"$DSB_SESSION_URL/v1/namespaces/demo/sandboxes/dev-box/rewind"',
    )},
    "README.md": {
        "python3 -m venv .venv && . .venv/bin/activate && pip install -e . && dsb run examples/hello-workflow.yaml":
            Run(README, note="the `dsb run` at its end; the venv and `pip install -e .` are what scripts/test does "
                             "before every run"),
        **{text: Run(README_CODE, note="in a directory holding the README's code as hello.py") for text in (
            "dsb run hello:hello --input '\"world\"' --run-id hello-world",
            "dsb signal hello-world approve true",
            "dsb resume hello-world",
        )},
        "kind create cluster --name dsb": NO_CONTAINER_ENGINE,
        "docker build -t durable-sandbox:0.1.0 .": NO_CONTAINER_ENGINE,
        "kind load docker-image durable-sandbox:0.1.0 --name dsb": NO_CONTAINER_ENGINE,
        "helm install durable-sandbox charts/durable-sandbox -n durable-sandbox-system --create-namespace \\\n"
        "  --set allowLocalProvider=true": Run(CLUSTER, note="its Pod runs in tests/e2e/test_chart_on_node.py"),
        "kubectl -n durable-sandbox-system rollout status deployment/durable-sandbox": Run(
            CHART_ON_NODE, note="needs a node for the Pod (the lead runs the node tier); without one the test's "
                                "own operator stands in for the Pod"),
        "kubectl apply -f examples/hello-workflow.yaml": Run(CLUSTER),
        "kubectl wait --for=condition=Succeeded workflow/hello --timeout=120s": Run(CLUSTER),
        "kubectl get dwf": Run(CLUSTER),
        "kubectl describe workflow hello": Run(CLUSTER),
        'eval "$(scripts/dev-cluster up)"': Run(DEV_CLUSTER, note="needs root and the machine's node"),
        "scripts/dev-cluster load-image": NotRun(
            "needs root, buildah and a running scripts/dev-cluster node; what it does (scripts/image-build, then "
            "the import into the node) is what tests/e2e/test_chart_on_node.py's image fixture does"),
        "scripts/dev-cluster down": Run(DEV_CLUSTER, note="needs root and the machine's node"),
        "scripts/test": NotRun("it is the whole suite: CI runs it (.ci/run), and it runs every test named here"),
    },
    "docs/benchmarks.md": {
        "pip install -e '.[bench]'": PACKAGE_INDEX,
        "python benchmarks/engine_steps.py": BENCHMARK,
        "python benchmarks/engine_parallel.py": BENCHMARK,
        "python benchmarks/sync_steps.py": BENCHMARK,
        "python benchmarks/engine_postgres.py": BENCHMARK,
        "python benchmarks/operator_throughput.py": BENCHMARK,
        "python benchmarks/operator_scale.py": BENCHMARK,
        "python benchmarks/ui_pages.py": BENCHMARK,
        "python benchmarks/fork.py": BENCHMARK,
        "python benchmarks/fork.py --node": BENCHMARK,
        "python benchmarks/sandbox_fork.py": BENCHMARK,
        "python benchmarks/continue_as_new.py --calls 9000 10000 11000 --rounds 5": BENCHMARK,
        "python benchmarks/operator_throughput.py --calls 500 --workflows 20 --calls-each 25": BENCHMARK,
        "python benchmarks/operator_throughput.py --kubeconfig .dev-cluster/kubeconfig": BENCHMARK,
        "python benchmarks/operator_throughput.py --py-spy": BENCHMARK,
        "python benchmarks/apiserver_patch.py": BENCHMARK,
        "python benchmarks/apiserver_patch.py --rounds 8 --per-round 12": BENCHMARK,
        "git show d5d36bd:crds/workflows.durable-sandbox.dev.yaml > /tmp/before.yaml": NotRun(
            "the first half of the crd_write_cost benchmark's recipe (the old CRD it compares with)"),
        "python benchmarks/crd_write_cost.py --calls 10000 --compare /tmp/before.yaml": BENCHMARK,
        "git worktree add --detach /tmp/before <commit>": NotRun(
            "the first half of the session_recovery benchmark's recipe (the tree it compares with)"),
        "python benchmarks/session_recovery.py --calls 1000 --rounds 11 --against /tmp/before/operator": BENCHMARK,
        "python benchmarks/operator_scale.py --idle 100,1000 --batch 0 --window 10": BENCHMARK,
        "python benchmarks/operator_scale.py --idle '' --batch 200": BENCHMARK,
        "python benchmarks/engine_postgres.py --steps 1000 --repeats 3 --profile": BENCHMARK,
        "python benchmarks/kubernetes_provider.py --parts store": BENCHMARK,
        "python benchmarks/kubernetes_provider.py --parts isolation --runtime-class gvisor --repeats 40": BENCHMARK,
        "python benchmarks/kubernetes_provider.py --image docker.io/library/busybox:1.36 --namespace default --profile":
            BENCHMARK,
        "python benchmarks/warm_pool.py --image docker.io/library/busybox:1.36 --namespace default": BENCHMARK,
        "python benchmarks/vs_agent_sandbox.py --rounds 5 --concurrent 20": NotRun(
            "a benchmark on the test node with agent-sandbox's controller beside it (minutes, the node's lock): its "
            "figures are measured, not asserted; it is not run by CI"),
        "python benchmarks/claim_phases.py --rounds 7": NotRun(
            "a profile on the test node (the node's lock): where a warm claim's and a cold create's time goes, "
            "measured, not asserted; it is not run by CI"),
        "python benchmarks/session_calls.py --calls 100": BENCHMARK,
        "python benchmarks/session_calls.py --node": BENCHMARK,
        "python benchmarks/session_call_phases.py": BENCHMARK,
    },
    "docs/workflows.md": {
        **{text: Run(SCHEDULE_DOCS) for text in DOCS_SCHEDULE_COMMANDS},
        "dsb worker --schedules": NotRun(
            "it serves until stopped; tests/unit/test_dsb_schedule.py runs the turn it takes at every poll (run-due)"),
    },
    "docs/cli.md": {
        **{text: Run(CLI) for text in (
            "dsb run examples/hello-workflow.yaml",
            "dsb run examples.flows.hello_flow:hello --input '{\"name\": \"Ada\"}'",
            "dsb run --dry-run examples/hello-workflow.yaml",
            "dsb run --detach examples.flows.hello_flow:hello --input '{\"name\": \"Ada\"}' --run-id hello-ada-bg",
            "dsb wait hello-ada-bg",
            "echo $?",
            "dsb run examples.flows.hello_flow:hello --input '{\"name\": \"Ada\", \"approve\": true}' --run-id hello-ada",
            "dsb signal hello-ada approval '{\"approved\": true}'",
            "dsb resume hello-ada",
            "dsb resume --wait hello-ada",
            "dsb inspect hello-ada",
            "dsb -o json inspect hello-ada",
            "dsb history hello-ada",
            "dsb -o yaml history hello-ada",
            "dsb logs hello-ada",
            "dsb -o json logs hello-ada",
            "dsb runs",
            "dsb runs --status waiting --status failed",
            "dsb -o json runs --workflow sandbox-agent --limit 5",
            "dsb run examples.flows.hello_flow:hello --input '{\"name\": \"Bo\", \"approve\": true}' --run-id hello-bo",
            "dsb cancel hello-bo --reason \"no longer needed\"",
            "dsb delete hello-ada-bg",
            "dsb prune --older-than 7d",
            "dsb worker --until-idle",
            "dsb run examples.flows.hello_flow:hello --input '{}'",
            "dsb run examples.flows.hello_flow:hello --input '{\"name\": [\"Ada\"]}' --dry-run",
            "dsb run examples.flows.hello_flow:hello --input '\"Ada\"'",
            "dsb run examples.flows.hello_flow:hello --input Ada",
        )},
        **{text: Run("tests/unit/test_queries_updates.py::test_the_query_and_update_commands_of_the_docs") for text in (
            "dsb run examples.flows.budget:budget --input '{\"limit\": 10}' --run-id budget-1",
            "dsb query budget-1 remaining",
            "dsb update budget-1 raise --input '{\"amount\": 5, \"reason\": \"incident grew\"}' --id raise-1",
            "dsb update budget-1 raise --input '{\"amount\": 5000}'",
        )},
        "cd /tmp && dsb resume r1": Run(
            "tests/unit/test_cli_wrong_directory.py::test_resume_from_another_directory_leaves_the_run_as_it_was_and_says_how"),
    },
    "docs/kubernetes.md": {
        "docker build -t registry.example/team-a/worker:v2 --build-arg BUILD_ID=v2 \\\n"
        "  --build-arg BASE=registry.example/durable-sandbox:0.1.0 examples/worker": NotRun(
            "needs a container engine and the durable-sandbox image; tests/unit/test_example_worker.py checks the "
            "Dockerfile (build id, module import, entrypoint) and runs the team module it ships"),
        "helm install agents charts/durable-sandbox-worker -n team-a --set queue=agents \\\n"
        "  --set image.repository=registry.example/team-a/worker --set build=v2 --set 'keepBuilds[0].build=v1'": Run(
            "tests/e2e/test_chart.py::test_the_worker_chart_keeps_older_builds_running_beside_the_new_one",
            note="rendered with helm template and the same values, not installed: its image is a team's own"),
        **{text: Run(REPLAY_CLUSTER, note=REPLAY_NOTE if "apply" in text else "") for text in (
            "kubectl apply -f examples/replay-policies-workflow.yaml",
            "kubectl wait --for=condition=WaitingForSignal workflow/replay-policies --timeout=120s",
            "kubectl get workflow replay-policies -o jsonpath='{.status.pendingCallbacks[*].id}'",
            "kubectl patch workflow replay-policies --type=merge -p "
            "'{\"spec\":{\"signals\":{\"replay:sandbox/notify\":\"rerun\"}}}'",
            "kubectl wait --for=condition=Succeeded workflow/replay-policies --timeout=120s",
            "kubectl describe workflow replay-policies",
        )},
        "pip install -e '.[kubernetes]'": PACKAGE_INDEX,
        "scripts/dev-cluster up": Run(DEV_CLUSTER, note="needs root and the machine's node; the test's own control "
                                                        "plane stands in for it in the rest of the page"),
        "export KUBECONFIG=$PWD/.dev-cluster/kubeconfig": NotRun(
            "names scripts/dev-cluster's cluster; the test points KUBECONFIG at its own control plane instead "
            "(tests/e2e/test_dev_cluster.py uses the kubeconfig `up` writes)"),
        **{text: Run(CLUSTER) for text in (
            "kubectl apply --server-side -f crds/",
            "dsb operator --allow-local-provider --workflows examples.flows &",
            "kubectl apply -f examples/hello-workflow.yaml",
            "kubectl wait --for=condition=Succeeded workflow/hello --timeout=120s",
            "kubectl get dwf",
            "kill %1",
            "kubectl apply -f crds/",
            "kubectl wait --for=condition=Established crd/workflows.durable-sandbox.dev crd/sandboxes.durable-sandbox.dev",
            "kubectl apply -f examples/approve-workflow.yaml",
            "kubectl wait --for=condition=WaitingForSignal workflow/approve --timeout=120s",
            "kubectl patch workflow approve --type=merge -p '{\"spec\":{\"signals\":{\"approval\":{\"ok\":true}}}}'",
            "kubectl patch workflow approve --type=merge -p '{\"spec\":{\"suspend\":true}}'",
            "kubectl patch workflow approve --type=merge -p '{\"spec\":{\"cancel\":true}}'",
            "kubectl apply -f examples/delegation-workflow.yaml",
            "kubectl wait --for=condition=Succeeded workflow/delegate --timeout=180s",
            "kubectl get dwf -l durable-sandbox.dev/parent=delegate",
            "kubectl delete -f examples/delegation-workflow.yaml --timeout=120s",
            "kubectl create namespace demo",
            "dsb --kube -n demo run examples/hello-workflow.yaml",
            "dsb --kube -n demo runs",
            "dsb --kube -n demo inspect hello",
            "dsb --kube -n demo history hello",
            "dsb --kube -n demo logs -f hello",
            "dsb --kube -n demo run --detach examples/approve-workflow.yaml",
            "dsb --kube -n demo signal approve approval '{\"ok\": true}'",
            "dsb --kube -n demo cancel approve",
            "dsb --kube -n demo sandboxes",
            "dsb --kube -n demo sandboxes -o yaml",
            "kubectl apply -f - <<'YAML'\n"
            "apiVersion: durable-sandbox.dev/v1alpha1\n"
            "kind: Sandbox\n"
            "metadata:\n"
            "  name: dev-box\n"
            "spec:\n"
            "  provider: local          # the operator must run with --allow-local-provider for this one; unset: its default\n"
            "  leaseSeconds: 600        # renewed at half its length while the Sandbox exists (5 to 86400)\n"
            "  # template: ...          # provider template; env: [{name, value | valueFrom.secretKeyRef}]\n"
            "  # fromSnapshot: <id>     # start from a snapshot of this namespace (not owned: never deleted by the Sandbox)\n"
            "  # idleSuspendAfterSeconds: 900   # suspend it when no Workflow has used it this long (see \"Idle Sandboxes\")\n"
            "YAML",
            "kubectl wait --for=condition=Ready dsbx/dev-box",
            "kubectl patch dsbx dev-box --type=merge -p '{\"spec\":{\"suspend\":true}}'",
            "kubectl wait --for=condition=Suspended dsbx/dev-box",
            "kubectl patch dsbx dev-box --type=merge -p '{\"spec\":{\"suspend\":false}}'",
            "kubectl get dsbx",
            "kubectl describe dsbx dev-box",
            "kubectl apply -f examples/idle-sandbox.yaml",
            "kubectl wait --for=condition=Succeeded workflow/fill-idle-box --timeout=120s",
            "kubectl wait --for=condition=Suspended dsbx/idle-box --timeout=120s",
            "kubectl get dsbx idle-box",
            "kubectl apply -f examples/idle-sandbox-resume.yaml",
            "kubectl wait --for=condition=Succeeded workflow/read-idle-box --timeout=120s",
        )},
        "python -m durable_sandbox.kube.spec.crds --write crds/": Run(REGEN),
        "python -m durable_sandbox.kube.spec.crds --write charts/durable-sandbox/crds/": Run(REGEN),
        "python -m durable_sandbox.kube.spec.crds --check crds/": Run(REGEN),
        "scripts/dev-cluster down": Run(DEV_CLUSTER, note="needs root and the machine's node"),
    },
    "docs/providers.md": {
        "kubectl get runtimeclass": Run(
            "tests/e2e/test_node.py::test_a_gvisor_pod_runs_under_gvisors_kernel_and_a_plain_one_does_not",
            note="reads the RuntimeClass gvisor with kubectl get -o json"),
        **{text: Run(GVISOR_EXAMPLE, note="in a namespace of its own (-n); the wait is on the Succeeded condition")
           for text in (
            "kubectl apply -f examples/gvisor-sandbox.yaml",
            "kubectl wait --for=condition=Succeeded workflow/under-gvisor --timeout=180s",
            "kubectl get dsbx isolated -o wide",
        )},
        **{text: Run(REPLAY_LOCAL, note=REPLAY_NOTE) for text in (
            "dsb run --run-id replay-demo examples/replay-policies-workflow.yaml",
            "dsb signal replay-demo replay:sandbox/notify '\"rerun\"'",
            "dsb resume replay-demo",
            "dsb inspect replay-demo",
            "cat /tmp/replay-policies-effects.log",
        )},
    },
    "docs/operations.md": {
        'dsb --store "$OPERATOR_DSN" store grant-namespace team-a --role dsb_team_a': Run(
            "tests/postgres/test_namespace_roles_postgres.py::"
            "test_a_worker_role_of_namespace_a_cannot_see_claim_or_commit_namespace_b_runs",
            note="with the test server's DSN and role names of the test's own"),
        "docker build -t durable-sandbox:0.1.0 .": NotRun(
            "needs a container engine; the comment's `buildah bud` is what scripts/image-build runs on the same "
            "Dockerfile (tests/e2e/test_image.py)"),
        "helm install durable-sandbox charts/durable-sandbox -n durable-sandbox-system --create-namespace \\\n"
        "  --set image.repository=durable-sandbox --set image.tag=0.1.0": Run(CLUSTER),
        "kubectl get workflow capped-07 -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].message}'": Run(
            "tests/e2e/test_operator_concurrency.py::test_the_cap_holds_runs_beyond_it_pending_with_the_reason_and_all_finish",
            note="the message's words are checked; its numbers depend on the moment"),
    },
    "docs/testing.md": {
        'DSB_TEST_OPERATOR_JOURNAL=postgres scripts/test tests/e2e -m "not node and not own_node"': NotRun(
            "the whole operator suite again on PostgreSQL (about 14 minutes); CI runs its both_journals subset "
            "and the lead runs the rest file by file"),
    },
    "docs/ui.md": {
        "dsb ui --allow-actions": Run(
            "tests/e2e/test_ui_local.py::test_signalling_a_callback_from_the_page_completes_the_run",
            note="it serves until Ctrl-C: the test starts it with --store and --allow-actions and stops it"),
    },
}


def shell(command: Command, cwd: Path, env: dict[str, str] | None = None,
          timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """Run ``command`` as the doc's reader would, in bash (see :func:`shell_env`)."""
    return subprocess.run(["bash", "-c", command.text], cwd=cwd, env=shell_env(env), capture_output=True, text=True,
                          timeout=timeout, check=False)


def shell_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """The reader's environment: this virtualenv's programs (dsb, kubectl, python) and the pinned helm (``.bin``)
    first on PATH, and ``env``."""
    path = os.pathsep.join([str(Path(sys.executable).parent), str(ROOT / ".bin"), os.environ.get("PATH", "")])
    return {**os.environ, "PATH": path, **(env or {})}


def failed(command: Command, done: subprocess.CompletedProcess[str]) -> str:
    return (f"{command.doc}:{command.line}: `{command.text}` exited {done.returncode}\n--- stdout:\n{done.stdout[-3000:]}"
            f"\n--- stderr:\n{done.stderr[-3000:]}")
