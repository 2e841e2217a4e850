"""A Sandbox's own session: calls made to a Sandbox resource directly (an agent's tools), not through a Workflow.

``journal.py`` keeps them in the Sandbox's call journal (a run of the namespace's store, owned by the Sandbox),
``rebuild.py`` brings the live sandbox to hold every earlier call (after a loss: the calls after the newest snapshot),
``service.py`` decides who may call and how much, ``http.py`` serves the call API from the operator process
(``kube_auth.py``: TokenReview and SubjectAccessReview; ``streaming.py``: a call's output while it runs;
``snapshots.py``: a snapshot on request), ``models.py`` is the API's wire format.
"""
