"""No secret value reaches a page of the web view (ui/redact.py)."""

from __future__ import annotations

from durable_sandbox.ui.redact import REDACTED, redact


def test_env_values_are_masked_in_every_shape() -> None:
    value = {
        "sandbox": {"env": [{"name": "TOKEN", "value": "abc"}, {"name": "FROM", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]},
        "call": {"env": {"A": "1", "B": ""}},
        "Env": "whatever",
    }
    assert redact(value) == {
        "sandbox": {"env": [{"name": "TOKEN", "value": REDACTED},
                            {"name": "FROM", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]},
        "call": {"env": {"A": REDACTED, "B": ""}},
        "Env": REDACTED,
    }


def test_credential_keys_are_masked_but_counters_and_plain_keys_stay() -> None:
    value = {"apiKey": "sk-1", "E2B_API_KEY": "e2b_x", "password": "p", "envdAccessToken": "t", "Authorization": "Bearer x",
             "inputTokens": 12, "cacheKey": "k1", "nested": [{"client_secret": "s"}], "token": ""}
    out = redact(value)
    assert {k: out[k] for k in ("apiKey", "E2B_API_KEY", "password", "envdAccessToken", "Authorization")} == dict.fromkeys(
        ("apiKey", "E2B_API_KEY", "password", "envdAccessToken", "Authorization"), REDACTED)
    assert (out["inputTokens"], out["cacheKey"], out["nested"], out["token"]) == (12, "k1", [{"client_secret": REDACTED}], "")


def test_urls_lose_their_credentials() -> None:
    assert redact(["https://user:pw@h.example/p?token=abc&x=1", "not a url: token=abc"]) == [
        "https://***@h.example/p?token=***&x=1", "not a url: token=abc"]


def test_the_input_is_not_changed() -> None:
    value = {"env": {"A": "1"}}
    redact(value)
    assert value == {"env": {"A": "1"}}
