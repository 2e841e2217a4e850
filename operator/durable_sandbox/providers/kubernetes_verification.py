"""Every exec of the kubernetes provider goes to the Pod the operator sealed, not merely to a Pod of its name.

``pods/exec`` addresses a Pod by name. Anyone who may delete and create Pods in the namespace can replace a
sandbox Pod with one of their own under the same name (labels and annotations copied), and until the next lease
renewal the sandbox's calls would run there: its script, a call's env (which may carry Secret values), a restore's
files would be sent to it, and its answers taken for the sandbox's. So each exec is bracketed by two reads of the
Pod (``_verify_pod``):

* **before**, nothing is sent unless the Pod under the name is the sandbox's own: the uid recorded in its handle
  (the journal holds the handle, sealed), or, for a handle recorded without one, a Pod the operator sealed over
  its uid (``kubernetes_identity.py``);
* **after**, the result is believed only if the Pod is still that one. A uid is never reused and a name holds
  one object at a time, so the same uid before and after means no other Pod held the name in between: the exec
  ran in the sandbox's Pod.

A mismatch is the sandbox's loss (:class:`SandboxGone`): the call's result is never used, the foreign Pod is
refused visibly (a Warning Event on it, never deleted), and the run recovers as from any loss, by restore and
replay into a Pod the operator makes. Its price is two Pod reads per exec (benchmarks/kubernetes_provider.py,
``call``)."""

from __future__ import annotations

from durable_sandbox.providers.contract import SandboxGone, SandboxHandle
from durable_sandbox.providers.exec_target import ExecTarget
from durable_sandbox.providers.kubernetes_connection import split_id
from durable_sandbox.providers.kubernetes_identity import identify
from durable_sandbox.providers.kubernetes_lifecycle import PodLifecycle
from durable_sandbox.providers.kubernetes_template import CONTAINER

__all__ = ["PodVerification"]

_REPLACED = "its Pod was replaced by another Pod of the same name"


class PodVerification(PodLifecycle):
    """The check each exec makes before it sends anything and after it ends (the ``ExecTargets`` hook of
    ``exec_target.py``: the Pod of the handle's name, its container, verified by uid or seal)."""

    async def _exec_target(self, handle: SandboxHandle, what: str) -> ExecTarget:
        namespace, name = split_id(handle.id)
        uid = await self._verify_pod(handle, what, before=True)
        return ExecTarget(namespace=namespace, pod=name, uid=uid, container=CONTAINER)

    async def _confirm_target(self, handle: SandboxHandle, target: ExecTarget, what: str) -> None:
        await self._verify_pod(handle, what, before=False)

    async def _verify_pod(self, handle: SandboxHandle, what: str, *, before: bool) -> str:
        """The Pod's uid, returned only if the Pod named by ``handle`` is the sandbox's own (its recorded uid, else the operator's
        seal), and ``before`` an exec, not being deleted; else the sandbox is lost (:class:`SandboxGone`)."""
        namespace, name = split_id(handle.id)
        pod = await self._read_pod(namespace, name)
        if pod is None:
            raise SandboxGone(handle.id, "its Pod no longer exists")
        meta = pod["metadata"]
        recorded = handle.metadata.get("uid")
        if isinstance(recorded, str) and recorded:
            foreign = None if meta.get("uid") == recorded else f"its uid is not {recorded}, the sandbox Pod's"
        else:
            identity = identify(pod, self._seal_key)
            foreign = None if identity.sealed else identity.why
        if foreign is not None:
            self._gone[handle.id] = _REPLACED
            await self._refuse(pod, f"it replaced sandbox {handle.id}'s Pod under the same name ({foreign}): "
                                    f"{what} was not run in it, nor its result used")
            raise SandboxGone(handle.id, f"{_REPLACED} ({what} not run there, nor its result used)")
        if before and meta.get("deletionTimestamp"):  # (after: a call that ended in its own Pod did run there)
            raise SandboxGone(handle.id, "its Pod is being deleted")
        return str(meta.get("uid"))
