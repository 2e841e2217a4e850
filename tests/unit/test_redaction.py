"""Every URL durable-sandbox prints goes through redact_url: userinfo and credential-like query values never show."""

from __future__ import annotations

import pytest

from durable_sandbox.providers.contract import ConfigurationError
from durable_sandbox.providers.e2b import E2BProvider
from durable_sandbox.providers.redaction import redact_url


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("https://api.e2b.app", "https://api.e2b.app"),
        ("https://alice:pw0rd@api.example.test:8443/v1", "https://***@api.example.test:8443/v1"),
        ("https://token-only@api.example.test", "https://***@api.example.test"),
        ("https://h/p?a=1&X-Amz-Signature=abc&access_token=xyz", "https://h/p?a=1&X-Amz-Signature=***&access_token=***"),
        ("http://[::1", "***"),  # does not parse: nothing of it is echoed
    ],
)
def test_redact_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown


async def test_e2b_provider_repr_and_errors_carry_no_credentials() -> None:
    provider = E2BProvider(api_key="e2b_" + "1" * 40, api_url="https://bob:hunter2@api.example.test")
    try:
        assert "hunter2" not in repr(provider) and "e2b_1111" not in repr(provider)
    finally:
        await provider.aclose()
    with pytest.raises(ConfigurationError) as info:
        E2BProvider(api_key="e2b_" + "1" * 40, api_url="ftp://bob:hunter2@api.example.test/?token=t0k")
    assert "hunter2" not in str(info.value) and "t0k" not in str(info.value) and "ftp://***@api.example.test" in str(info.value)
