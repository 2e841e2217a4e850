"""What `dsb operator` was told: the policy it enforces and the settings of its Workflow controller."""

from __future__ import annotations

from dataclasses import dataclass, field

from durable_sandbox.engine.executor import default_worker_id
from durable_sandbox.kube.workflow.concurrency import DEFAULT_MAX_CONCURRENT_RUNS
from durable_sandbox.sandboxes.retries import CLEANUP_ATTEMPTS

__all__ = ["OperatorPolicy", "OperatorSettings"]


@dataclass(frozen=True)
class OperatorPolicy:
    """What this operator may do on behalf of the Workflows it serves."""

    allow_local_provider: bool = False
    # The provider of a Workflow's or Sandbox's sandbox that names none (kube/spec/provider_choice.py); pinned when the
    # operator first takes the resource up, so changing it later moves nothing that runs.
    default_provider: str = "local"
    # Modules (or packages) entrypoints may be imported from; the built-in sandbox-agent is always allowed.
    workflow_modules: tuple[str, ...] = ()


@dataclass
class OperatorSettings:
    worker_id: str = field(default_factory=default_worker_id)
    lease_ttl: float = 15.0  # a dead replica's runs are taken over after this long
    claim_retry: float = 1.0  # the least (and the jitter of) how long a run another replica holds is parked
    status_interval: float = 1.0  # status patches are coalesced to about one per this many seconds
    # Writes that follow the clock, not the work: status patches and run-event batches of all the Workflows
    # this process drives, each kind at most about this many per second together (beside phase changes,
    # which are written at once). Each Workflow's interval is stretched beyond status_interval (events: 1 s)
    # when more run at once: 20 Workflows get one status patch every 4 s each, not 20 patches a second.
    periodic_writes_per_s: float = 5.0
    handover_grace: float = 20.0  # how long a call in flight may take to finish when a run is handed over
    not_runnable_retry: float = 30.0
    # A run executed by the namespace's workers (spec.worker) is looked at this often while it is runnable: its
    # status is projected from its journal, and WaitingForWorker says whether a worker of its queue is alive.
    worker_poll: float = 2.0
    hibernate_after: float = 300.0  # default for runs whose spec says nothing (DESIGN 6)
    cleanup_backoff: tuple[float, ...] = (1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
    # How many times a run's cleanup tries a provider's destroy or snapshot deletion before it fails (then the
    # finalizer says CleanupBlocked and kopf tries again after cleanup_backoff): `dsb operator --cleanup-attempts`.
    cleanup_attempts: int = CLEANUP_ATTEMPTS
    # A wait longer than this parks the run (its task ends; a timer or the watch brings it back); shorter
    # waits are cheaper in the task than a re-admission (which reads the run's head and journal again).
    park_after: float = 2.0
    # Claim spreading: before claiming, a replica waits this long per run it executes already (times a
    # random factor in [0.5, 1.5), at most claim_delay_max), so the less busy replica claims new runs first.
    claim_delay_per_run: float = 0.1
    claim_delay_max: float = 1.5
    shutdown_grace: float = 60.0  # how long SIGTERM waits for active runs to be handed over
    # Runs admitted at once: an operator restart re-admits every Workflow, and each admission reads the run's
    # head and journal; a few at a time keep that burst's memory small (the RSS it leaves is its high-water mark).
    admissions: int = 8
    max_concurrent_runs: int = DEFAULT_MAX_CONCURRENT_RUNS  # runs this replica executes at once (kube/workflow/concurrency.py)
    # Every sandbox (and snapshot) this operator makes is labelled with it; the orphan sweep lists by it.
    installation_id: str = "durable-sandbox"
    sweep_interval: float = 300.0  # seconds between orphan sweeps (kube/sweep/sweeper.py); 0: no sweep
    sweep_grace: float = 600.0  # an orphan is removed once seen orphaned this long
