"""The ``events`` configuration (``adapters/events/config.py``): the section as the
schema checked it, its defaults, names kept unique, and the webhooks' secrets and tokens
read from the environment at start-up, named in errors and never shown."""

from __future__ import annotations

import pytest

from portcullis.adapters.events.config import EVENT_TYPES, EventsConfig, EventsConfigError, WebhookConfig, events_config, legacy_integrity_webhook
from portcullis.adapters.events.signing import signature_headers, verify
from portcullis.engine import schemas
from tests.webhook_helpers import BAD_SECRET, WHSEC_A, WHSEC_B, checked, webhook


def test_unset_events_have_defaults_and_no_webhook() -> None:
    assert events_config(checked({})) == EventsConfig(queue_size=1000, webhooks=()) == events_config(None)


def test_webhooks_are_read_with_their_defaults() -> None:
    section = checked(
        {
            "queue_size": 50,
            "webhooks": [
                {"name": "ops", "url": "https://hooks.example/ops", "secret_env": "OPS_SECRET"},
                {
                    "name": "sec",
                    "url": "https://hooks.example/sec",
                    "secret_env": "SEC_SECRET",
                    "bearer_token_env": "SEC_TOKEN",
                    "timeout_seconds": 2.5,
                    "max_attempts": 3,
                    "events": ["tool_call.denied", "injection.blocked"],
                },
            ],
        }
    )
    assert events_config(section) == EventsConfig(
        50,
        (
            WebhookConfig("ops", "https://hooks.example/ops", "OPS_SECRET", None, 5.0, 6, EVENT_TYPES),
            WebhookConfig("sec", "https://hooks.example/sec", "SEC_SECRET", "SEC_TOKEN", 2.5, 3, frozenset({"tool_call.denied", "injection.blocked"})),
        ),
    )


def test_duplicate_webhook_names_are_refused_by_field() -> None:
    hook = {"name": "ops", "url": "https://hooks.example/a", "secret_env": "A"}
    with pytest.raises(EventsConfigError, match=r"^events\.webhooks\[1\]\.name: ops names another webhook"):
        events_config(checked({"webhooks": [hook, {**hook, "url": "https://hooks.example/b"}]}))


def test_the_schema_refuses_unknown_event_types_and_missing_secrets() -> None:
    hook = {"name": "ops", "url": "https://hooks.example/a", "secret_env": "A"}
    for bad in ({**hook, "events": ["request.finished"]}, {k: v for k, v in hook.items() if k != "secret_env"}):
        with pytest.raises(schemas.SchemaError):
            checked({"webhooks": [bad]})


def test_target_reads_the_secret_and_token_from_the_environment() -> None:
    target = webhook(bearer_token_env="OPS_TOKEN", timeout_seconds=2.0, max_attempts=3).target({"OPS_SECRET": WHSEC_A, "OPS_TOKEN": " tok-1\n"})
    assert target.secret == (b"a" * 32,) and target.bearer_token == "tok-1"
    assert (target.name, target.url, target.timeout_seconds, target.max_attempts) == ("ops", "https://hooks.example/h?token=qs-token", 2.0, 3)


def test_while_rotating_every_secret_is_checked_and_each_signs() -> None:
    config = webhook()
    assert config.secrets({"OPS_SECRET": f"{WHSEC_B} {WHSEC_A}"}) == (b"b" * 32, b"a" * 32)
    target = config.target({"OPS_SECRET": f"{WHSEC_B} {WHSEC_A}"})
    assert target.secret == (b"b" * 32, b"a" * 32)
    headers = signature_headers(target.secret, "msg_1", 1_700_000_000, b"{}")
    assert all(verify(key, headers, b"{}", 1_700_000_000) for key in (b"a" * 32, b"b" * 32))  # a receiver with either accepts
    assert not verify(b"c" * 32, headers, b"{}", 1_700_000_000)
    with pytest.raises(EventsConfigError, match=r"OPS_SECRET, secret 2: webhook secret"):
        config.target({"OPS_SECRET": f"{WHSEC_B} {BAD_SECRET}"})


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({}, r"^events\.webhooks\[ops\]\.secret_env: environment variable OPS_SECRET is not set$"),
        ({"OPS_SECRET": "  "}, r"OPS_SECRET is not set"),
        ({"OPS_SECRET": BAD_SECRET}, r"^events\.webhooks\[ops\]\.secret_env: environment variable OPS_SECRET, secret 1: webhook secret: decodes to 13 bytes"),
        ({"OPS_SECRET": "hunter2-not-whsec"}, r"OPS_SECRET, secret 1: webhook secret: expected"),
        ({"OPS_SECRET": WHSEC_A}, r"^events\.webhooks\[ops\]\.bearer_token_env: environment variable OPS_TOKEN is not set$"),
        ({"OPS_SECRET": WHSEC_A, "OPS_TOKEN": "hunter2\r\nx: y"}, r"^events\.webhooks\[ops\]\.url: webhook target ops: bearer_token"),
    ],
)
def test_a_missing_or_malformed_variable_is_named_never_shown(environ: dict[str, str], message: str) -> None:
    with pytest.raises(EventsConfigError, match=message) as raised:
        webhook(bearer_token_env="OPS_TOKEN").target(environ)
    text = str(raised.value)
    assert "hunter2" not in text and "qs-token" not in text
    for value in environ.values():
        assert not value.strip() or value.strip().removeprefix("whsec_") not in text


def test_legacy_integrity_webhook_is_an_unsigned_tool_call_webhook() -> None:
    legacy = legacy_integrity_webhook("https://old.example/hook", 3.0)
    assert legacy == WebhookConfig("integrity", "https://old.example/hook", None, None, 3.0, 6, frozenset({"tool_call.denied"}))
    target = legacy.target({})
    assert target.secret is None and target.bearer_token is None and target.timeout_seconds == 3.0
    config = events_config(checked({"webhooks": [{"name": "ops", "url": "https://hooks.example/a", "secret_env": "A"}]}))
    assert [hook.name for hook in config.with_webhook(legacy).webhooks] == ["ops", "integrity"]
    with pytest.raises(EventsConfigError, match=r"integrity is taken by integrity\.webhook"):
        config.with_webhook(legacy).with_webhook(legacy)
    with pytest.raises(EventsConfigError, match=r"^integrity\.webhook: webhook target integrity: url"):
        legacy_integrity_webhook("ftp://old.example/hook").target({})
