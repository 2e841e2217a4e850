"""One reconciliation of a Sandbox: the spec checked, its provider chosen and pinned, the recorded operation
finished, then suspended or kept available; stopped if this replica loses the Sandbox's Lease meanwhile."""

from __future__ import annotations

import asyncio
import logging

from pydantic import ValidationError

from durable_sandbox.kube.sandbox.idle_suspend import SandboxIdle
from durable_sandbox.kube.sandbox.operations import SnapshotRefused
from durable_sandbox.kube.sandbox.view import SandboxView
from durable_sandbox.kube.spec.models import SandboxResource
from durable_sandbox.kube.spec.provider_choice import PINNED, refusal, sandbox_choice
from durable_sandbox.providers.contract import ProviderError, ProvisionError

log = logging.getLogger("durable_sandbox.kube.sandbox.controller")

__all__ = ["SandboxTurn"]


class SandboxTurn(SandboxIdle):
    """A reconciliation turn."""

    async def _reconcile(self, view: SandboxView) -> float | None:
        """One turn, stopped if the lease is lost meanwhile (then look again shortly)."""
        view.turn = asyncio.ensure_future(self._turn(view))
        try:
            return await asyncio.shield(view.turn)
        except asyncio.CancelledError:
            if not view.turn.cancelled():
                view.turn.cancel()  # this daemon itself is being cancelled: stop the turn too
                raise
            log.warning("sandbox %s/%s: the lease was lost during a reconciliation; stopped it", view.namespace, view.name)
            return 0.0
        finally:
            view.turn = None

    async def _turn(self, view: SandboxView) -> float | None:
        """One reconciliation; returns how long until the next one is due (None: on the next spec change)."""
        body = view.latest()
        view.generation = body.get("metadata", {}).get("generation")
        try:
            res = SandboxResource.model_validate(dict(body))
        except ValidationError as exc:
            err = exc.errors()[0]
            message = f"spec: {'.'.join(str(p) for p in err.get('loc', ()))}: {err.get('msg')}"
            await self._transition(view, "Failed", Ready=(False, "InvalidSpec", message))
            await self._emit(view, "InvalidSpec", message, "Warning")
            return None
        choice = sandbox_choice(view.status, res.spec.provider, self.settings.default_provider)
        refused = refusal(choice, where="spec.provider", allow_local=self.settings.allow_local_provider)
        if refused is not None:
            await self._transition(view, "Failed", Ready=(False, *refused))
            await self._emit(view, refused[0], refused[1], "Warning")
            return None
        try:
            provider = self.provider(choice.name)
        except Exception as exc:
            message = f"spec.provider: {exc}"
            await self._transition(view, "Failed", Ready=(False, "ProviderNotAllowed", message))
            await self._emit(view, "ProviderNotAllowed", message, "Warning")
            return None
        if choice.source != "pinned":
            # Before anything is made: what this Sandbox makes from now on, and cleans up at the end, is made with
            # this provider, whatever a later --default-provider (or a changed spec.provider) says.
            await self._patch(view, {PINNED: choice.name})
        elif res.spec.provider and res.spec.provider != choice.name:
            message = (f"spec.provider is {res.spec.provider!r}, but this Sandbox's sandboxes are {choice.name}'s (fixed "
                       f"when it was first reconciled); it stays on {choice.name}: create a new Sandbox for another provider")
            log.warning("sandbox %s/%s: %s", view.namespace, view.name, message)
            await self._emit(view, "ProviderFixed", message, "Warning")
        res = res.model_copy(update={"spec": res.spec.model_copy(update={"provider": choice.name})})
        if view.status.get("capabilities") is None:
            caps = provider.capabilities()
            await self._patch(view, {"capabilities": {
                "supported": sorted(c.value for c in caps.supported),
                "deliveryGuarantee": caps.delivery_guarantee,
                "maximumLeaseSeconds": caps.maximum_lease_seconds,
                "toolTypes": list(caps.tool_types),
            }})
        try:
            await self._finish_operation(view, res, provider)
            if res.spec.suspend:
                await self._drop_idle_claim(view)
                return await self._keep_suspended(view, res, provider)
            return await self._keep_available(view, res, provider)
        except LookupError as exc:  # a Secret named by spec.env is missing
            await self._transition(view, "Pending", Ready=(False, "SecretMissing", str(exc)))
            return self.settings.failed_retry
        except SnapshotRefused as exc:
            await self._transition(view, "Failed", Ready=(False, "SnapshotNotOwned", str(exc)))
            await self._emit(view, "SnapshotNotOwned", str(exc), "Warning")
            return None  # final until the spec changes
        except ProvisionError as exc:
            if exc.retryable:
                log.warning("sandbox %s/%s: %s", view.namespace, view.name, exc)
                return self.settings.retry
            await self._transition(view, "Failed", Ready=(False, "ProvisionFailed", str(exc)))
            await self._emit(view, "ProvisionFailed", str(exc), "Warning")
            return self.settings.failed_retry
        except (ProviderError, OSError) as exc:
            # Transient: the recorded operation (if any) is finished on the next turn, same operation id.
            log.warning("sandbox %s/%s: provider error, retrying: %s: %s", view.namespace, view.name, type(exc).__name__, exc)
            return self.settings.retry
