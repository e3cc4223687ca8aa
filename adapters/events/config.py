"""The ``events`` section: which webhooks receive which operational events, read from
the validated configuration; the webhooks' secrets are read from the environment once,
at start-up, so a missing or malformed one stops the gateway before it serves.

Errors name the field and the environment variable, never a value: the URL's query may
hold a token, and the secrets are secrets.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from portcullis.adapters.events.delivery import WebhookTarget
from portcullis.adapters.events.signing import parse_secret

BUDGET_THRESHOLD_CROSSED = "budget.threshold_crossed"
TOOL_CALL_DENIED = "tool_call.denied"
INJECTION_BLOCKED = "injection.blocked"
BUNDLE_ACTIVATED = "bundle.activated"
BUNDLE_REFUSED = "bundle.refused"
EVENT_TYPES = frozenset({BUDGET_THRESHOLD_CROSSED, TOOL_CALL_DENIED, INJECTION_BLOCKED, BUNDLE_ACTIVATED, BUNDLE_REFUSED})

LEGACY_INTEGRITY_NAME = "integrity"


class EventsConfigError(Exception):
    """The events configuration cannot be used; the message names the field or variable."""


@dataclass(frozen=True)
class WebhookConfig:
    """One ``events.webhooks`` entry. ``secret_env`` is None only for the legacy
    ``integrity.webhook``, which was never signed."""

    name: str
    url: str = field(repr=False)  # its query may hold a token
    secret_env: str | None
    bearer_token_env: str | None = None
    timeout_seconds: float = 5.0
    max_attempts: int = 6
    events: frozenset[str] = EVENT_TYPES

    def wants(self, event_type: str) -> bool:
        return event_type in self.events

    def secrets(self, environ: Mapping[str, str] | None = None) -> tuple[bytes, ...]:
        """Every key in ``secret_env`` (space-separated while rotating), in order; empty
        for an unsigned webhook."""
        if self.secret_env is None:
            return ()
        text = _variable(self._field("secret_env"), self.secret_env, os.environ if environ is None else environ)
        keys = []
        for number, part in enumerate(text.split(), start=1):
            try:
                keys.append(parse_secret(part))
            except ValueError as error:  # parse_secret's message never repeats the text
                raise EventsConfigError(f"{self._field('secret_env')}: environment variable {self.secret_env}, secret {number}: {error}") from None
        return tuple(keys)

    def target(self, environ: Mapping[str, str] | None = None) -> WebhookTarget:
        """The delivery target, secrets read from the environment (``os.environ`` unless
        given). While rotating, every secret signs (one signature each), so a receiver
        holding either the old or the new one accepts the message."""
        environ = os.environ if environ is None else environ
        keys = self.secrets(environ)
        token = None
        if self.bearer_token_env is not None:
            token = _variable(self._field("bearer_token_env"), self.bearer_token_env, environ).strip()
        try:
            return WebhookTarget(
                name=self.name,
                url=self.url,
                secret=keys or None,
                bearer_token=token,
                timeout_seconds=self.timeout_seconds,
                max_attempts=self.max_attempts,
            )
        except ValueError as error:  # WebhookTarget's messages name the target, never the URL or the token
            raise EventsConfigError(f"{self._field('url')}: {error}") from None

    def _field(self, name: str) -> str:
        if self.name == LEGACY_INTEGRITY_NAME and self.secret_env is None:
            return "integrity.webhook"
        return f"events.webhooks[{self.name}].{name}"


@dataclass(frozen=True)
class EventsConfig:
    queue_size: int = 1000  # per webhook
    webhooks: tuple[WebhookConfig, ...] = ()

    def with_webhook(self, webhook: WebhookConfig) -> EventsConfig:
        """This configuration and one more webhook (the legacy one), names kept unique."""
        if any(existing.name == webhook.name for existing in self.webhooks):
            raise EventsConfigError(f"events.webhooks: the name {webhook.name} is taken by integrity.webhook; name this webhook differently")
        return replace(self, webhooks=(*self.webhooks, webhook))

    def targets(self, environ: Mapping[str, str] | None = None) -> tuple[WebhookTarget, ...]:
        return tuple(webhook.target(environ) for webhook in self.webhooks)


def events_config(section: Mapping[str, Any] | None) -> EventsConfig:
    """The ``events`` section, already checked against schemas/config.schema.json (which
    guarantees the types, the required keys and the event names)."""
    section = section or {}
    webhooks: list[WebhookConfig] = []
    for index, entry in enumerate(section.get("webhooks", [])):
        name = entry["name"]
        if any(webhook.name == name for webhook in webhooks):
            raise EventsConfigError(f"events.webhooks[{index}].name: {name} names another webhook too; names must be unique")
        events = frozenset(entry.get("events", EVENT_TYPES))
        unknown = sorted(events - EVENT_TYPES)
        if unknown:  # the schema refuses these; kept so a caller that skipped it still fails by name
            raise EventsConfigError(f"events.webhooks[{index}].events: unknown event type {unknown[0]}")
        webhooks.append(
            WebhookConfig(
                name=name,
                url=entry["url"],
                secret_env=entry["secret_env"],
                bearer_token_env=entry.get("bearer_token_env"),
                timeout_seconds=float(entry.get("timeout_seconds", 5.0)),
                max_attempts=int(entry.get("max_attempts", 6)),
                events=events,
            )
        )
    return EventsConfig(queue_size=int(section.get("queue_size", 1000)), webhooks=tuple(webhooks))


def legacy_integrity_webhook(url: str, timeout_seconds: float = 5.0) -> WebhookConfig:
    """``integrity.webhook`` as an events webhook: unsigned as it always was, told only of
    denied tool calls, now retried. Its body changed shape, see ``audit_events``."""
    return WebhookConfig(name=LEGACY_INTEGRITY_NAME, url=url, secret_env=None, timeout_seconds=float(timeout_seconds), events=frozenset({TOOL_CALL_DENIED}))


def _variable(field_name: str, variable: str, environ: Mapping[str, str]) -> str:
    value = environ.get(variable)
    if value is None or not value.strip():
        raise EventsConfigError(f"{field_name}: environment variable {variable} is not set")
    return value
