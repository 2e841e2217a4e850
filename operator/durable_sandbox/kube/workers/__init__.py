"""A team's own worker (``dsb worker --kube``): it executes the runs of its namespace's Workflows with
``spec.worker`` on its queue, with the namespace's ServiceAccount and the namespace's worker key
(``kube/workers/runner.py``), under the same run Leases and fencing as the operator's executor."""
