"""The Workflow controller, one room per job; ``kube/workflow/controller.py`` wires them into the ``Operator``.

- ``settings.py``: the operator's policy and settings.
- ``runs.py``: what this replica keeps of each run (``RunView``) and the table every room shares (``Runs``).
- ``scheduler.py``: watch events to runs; which runs have a task here (active) and which are parked.
- ``parking.py``: a run with nothing to do keeps a ``Parked`` record and a timer, no task.
- ``admission.py``: policy and plan before anything is imported or provisioned; the run created.
- ``turn.py``: what an active run's task does, turn after turn, by the run's state.
- ``execution.py``: the run executed here under its Lease, in an execution slot, watched meanwhile.
- ``queued_runs.py``: a run the namespace's own workers execute (spec.worker): status from their journal,
  WaitingForWorker, the namespace's worker key.
- ``steering.py``: spec.signals and spec.cancel brought to the run.
- ``suspend.py``: spec.suspend on a run no replica executes.
- ``finished.py``: the final status, the Sandbox let go, ttlSecondsAfterFinished.
- ``leftovers.py``: what a finished run left on its providers (by their owner tags), removed once.
- ``cleanup.py``: the finalizer (deleting a Workflow).
- ``publishing.py``: status and Events as projections of what the executor writes.
- ``observed.py``: the store wrapper that reports those writes.
- ``engines.py``: one engine per namespace, the provider policy, the services extensions read.
- ``shutdown.py``: SIGTERM hands the runs executing here over.
- ``children.py``: a child workflow of a run executed here made a Workflow of its own, owned by the parent's
  (and sealed: only the operator's own is adopted after a crash).
- ``chain.py``: a Workflow whose run continues as new goes on with the next run of its chain.

The Sandbox controller (``kube/sandbox/``) is a peer: neither imports the other.
"""
