"""KubeAuthorizer (sessions/kube_auth.py) against fake TokenReview and SubjectAccessReview APIs: what it asks the
API server (the user the token names, create sandboxes/calls on the named Sandbox), 401/403 with what to do, an
allowed caller remembered for a few seconds by its token's digest, a refusal never remembered."""

from __future__ import annotations

import pytest

from durable_sandbox.sessions.errors import CallRefused
from durable_sandbox.sessions.kube_auth import KubeAuthorizer
from durable_sandbox.testing import FakeClock
from tests.unit.auth_support import FakeApiServer


def authorizer(server: FakeApiServer, clock: FakeClock) -> KubeAuthorizer:
    return KubeAuthorizer(None, authn=server, authz=server, cache_seconds=10, clock=clock)


async def test_it_asks_for_create_sandboxes_calls_on_the_sandbox_for_the_tokens_user() -> None:
    server = FakeApiServer(allowed={("system:serviceaccount:demo:agent", "demo", "box")})
    assert await authorizer(server, FakeClock(start=100.0)).check("t-agent", "demo", "box") == "system:serviceaccount:demo:agent"
    attrs = server.asked[0].spec.resource_attributes
    assert (attrs.verb, attrs.group, attrs.resource, attrs.subresource, attrs.namespace, attrs.name) == (
        "create", "durable-sandbox.dev", "sandboxes", "calls", "demo", "box")
    assert server.asked[0].spec.groups == ["system:serviceaccounts"]


@pytest.mark.parametrize(("token", "status", "do"), [
    (None, 401, "Authorization: Bearer"), ("forged", 401, "kubectl create token"),
    ("t-agent", 403, "durable-sandbox-sandbox-caller")])
async def test_refusals_say_what_to_do(token: str | None, status: int, do: str) -> None:
    with pytest.raises(CallRefused) as refused:
        await authorizer(FakeApiServer(), FakeClock(start=100.0)).check(token, "demo", "box")
    assert refused.value.status == status and do in refused.value.body.do
    assert "t-agent" not in str(refused.value) and "forged" not in str(refused.value)


async def test_an_allowed_caller_is_remembered_for_seconds_and_a_refusal_never() -> None:
    server, clock = FakeApiServer(), FakeClock(start=100.0)
    auth = authorizer(server, clock)
    with pytest.raises(CallRefused):
        await auth.check("t-agent", "demo", "box")
    server.allowed.add(("system:serviceaccount:demo:agent", "demo", "box"))  # granted: works at once
    await auth.check("t-agent", "demo", "box")
    await auth.check("t-agent", "demo", "box")
    assert len(server.asked) == 2  # the refusal, then one allow for both calls
    with pytest.raises(CallRefused):
        await auth.check("t-agent", "demo", "other-box")  # another Sandbox is asked about on its own
    server.allowed.clear()  # taken away: it stops working once the remembered allow runs out
    clock.advance(11)
    with pytest.raises(CallRefused):
        await auth.check("t-agent", "demo", "box")
    assert not any("t-agent" in str(k) for k in auth._allowed)


async def test_one_token_review_for_a_token_calling_several_sandboxes() -> None:
    server, clock = FakeApiServer(allowed={("system:serviceaccount:demo:agent", "demo", f"box-{i}") for i in range(5)}), FakeClock(start=100.0)
    auth = authorizer(server, clock)
    for i in range(5):
        await auth.check("t-agent", "demo", f"box-{i}")
    assert (len(server.reviews), len(server.asked)) == (1, 5)
    clock.now += 11  # remembered for the same seconds as an allow
    await auth.check("t-agent", "demo", "box-0")
    assert (len(server.reviews), len(server.asked)) == (2, 6)
    assert not any("t-agent" in str(k) for k in auth._users)
