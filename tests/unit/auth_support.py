"""A fake TokenReview and SubjectAccessReview API for the call API's authorizer (sessions/kube_auth.py), shared by
the session and workflow call tests."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

__all__ = ["FakeApiServer"]


@dataclass
class FakeApiServer:
    tokens: dict[str, str] = field(default_factory=lambda: {"t-agent": "system:serviceaccount:demo:agent"})
    allowed: set[tuple[str, str, str]] = field(default_factory=set)  # (user, namespace, Sandbox)
    reviews: list[Any] = field(default_factory=list)
    asked: list[Any] = field(default_factory=list)

    async def create_token_review(self, body: Any) -> Any:
        self.reviews.append(body)
        user = self.tokens.get(body.spec.token)
        return SimpleNamespace(status=SimpleNamespace(
            authenticated=user is not None,
            user=SimpleNamespace(username=user, groups=["system:serviceaccounts"], uid="u1", extra={}) if user else None))

    async def create_subject_access_review(self, body: Any) -> Any:
        self.asked.append(body)
        attrs = body.spec.resource_attributes
        return SimpleNamespace(status=SimpleNamespace(allowed=(body.spec.user, attrs.namespace, attrs.name) in self.allowed))
