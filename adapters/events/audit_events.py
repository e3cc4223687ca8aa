"""Operational events, derived from audit records and nothing else: an event never says
more than the record it came from (and records never hold prompt text, keys or personal
data), and there is one place where what happened is written down.

``events_of`` maps one record to its events, picking named fields only, so whatever else
a record carries never reaches a webhook. ``EventPublisher`` is the audit log's listener:
it maps each record and queues the events for the webhooks that want their type.

Records are told to listeners before their seq and hash exist, so events do not carry
the audit seq; ``request_id`` (or the bundle's revision) leads to the record. A denied
tool call is reported when its request's outcome record is written, at the end of the
request, as that is the record that lists the denials.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

from portcullis.adapters.audit_records import OUTCOME_EVENTS
from portcullis.adapters.events.config import (
    BUDGET_THRESHOLD_CROSSED,
    BUNDLE_ACTIVATED,
    BUNDLE_REFUSED,
    EVENT_TYPES,
    INJECTION_BLOCKED,
    TOOL_CALL_DENIED,
    EventsConfig,
    WebhookConfig,
)
from portcullis.adapters.events.delivery import WebhookDelivery

log = logging.getLogger("portcullis.events")

Event = tuple[str, dict[str, Any]]

OUTCOME_RECORDS = frozenset(OUTCOME_EVENTS.values())
PRINCIPAL_FIELDS = ("team", "user", "key_id")
MAX_TEXT = 200  # an id or a name; anything longer is cut, never passed on whole
MAX_REASON = 500  # bundle_refused's reason, as the record holds it


def events_of(record: Mapping[str, Any], principal: Mapping[str, Any] | None = None) -> list[Event]:
    """The events one audit record stands for (most stand for none). ``principal`` is
    the request's, for outcome records, which do not repeat it (see EventPublisher)."""
    kind = record.get("event")
    if kind == "budget_threshold":
        fields = ("request_id", "counter", "scope", "metric", "period", "threshold")
        return [(BUDGET_THRESHOLD_CROSSED, {name: _scalar(record.get(name)) for name in fields})]
    if kind in OUTCOME_RECORDS:
        return _tool_denials(record, principal)
    if kind == "request_denied":
        return _injection_block(record)
    if kind == "bundle_activated":
        return [(BUNDLE_ACTIVATED, {name: _scalar(record.get(name)) for name in ("trigger", "previous_revision", "revision", "digest")})]
    if kind == "bundle_refused":
        data = {name: _scalar(record.get(name)) for name in ("trigger", "serving_revision")}
        data["reason"] = _scalar(record.get("reason"), MAX_REASON)
        return [(BUNDLE_REFUSED, data)]
    return []


def _tool_denials(record: Mapping[str, Any], principal: Mapping[str, Any] | None) -> list[Event]:
    denied = _mapping(record.get("integrity")).get("tool_calls_denied")
    if not isinstance(denied, list):
        return []
    events: list[Event] = []
    for denial in denied:
        if not isinstance(denial, Mapping):
            continue
        data: dict[str, Any] = {"request_id": _scalar(record.get("request_id"))}
        if principal is not None:
            data["principal"] = _principal(principal)
        data |= {"tool": _scalar(denial.get("tool")), "rule": _scalar(denial.get("rule"))}
        events.append((TOOL_CALL_DENIED, data))
    return events


def _injection_block(record: Mapping[str, Any]) -> list[Event]:
    """Only a refusal the injection scan caused: a warning (request_started) or a warn
    finding on a request refused for another reason (a budget) is no block."""
    injection = _mapping(_mapping(record.get("integrity")).get("injection"))
    if injection.get("action") != "block" or _mapping(record.get("error")).get("code") != "prompt_injection":
        return []
    findings = {
        str(_scalar(surface)): [_scalar(rule) for rule in rules]
        for surface, rules in _mapping(injection.get("findings")).items()
        if isinstance(rules, list | tuple)
    }
    data: dict[str, Any] = {"request_id": _scalar(record.get("request_id"))}
    if isinstance(record.get("principal"), Mapping):
        data["principal"] = _principal(record["principal"])
    data["findings"] = findings
    return [(INJECTION_BLOCKED, data)]


def _principal(principal: Mapping[str, Any]) -> dict[str, Any]:
    return {name: _scalar(principal.get(name)) for name in PRINCIPAL_FIELDS if name in principal}


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _scalar(value: Any, limit: int = MAX_TEXT) -> str | int | float | bool | None:
    """Numbers and short strings pass; anything else (a nested object) is dropped: an
    event carries ids, names and numbers, never a structure a record happened to hold."""
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, str):
        return value[:limit]
    return None


class EventPublisher:
    """The audit log's listener (``audit.subscribe(publisher)``): each record's events,
    queued for the webhooks that want their type. Never raises, never blocks."""

    def __init__(self, delivery: WebhookDelivery, webhooks: Sequence[WebhookConfig], max_open_requests: int = 10_000) -> None:
        self._delivery = delivery
        self._routes = {event_type: tuple(webhook.name for webhook in webhooks if webhook.wants(event_type)) for event_type in EVENT_TYPES}
        # Outcome records do not repeat the principal: it is kept from request_started until then.
        self._track_principals = bool(self._routes[TOOL_CALL_DENIED])
        self._principals: OrderedDict[str, Mapping[str, Any]] = OrderedDict()
        self._max_open = max_open_requests
        self._lock = threading.Lock()  # records may come from another thread than the loop's
        self._loop = _running_loop()  # built on the loop: known before a record comes from another thread
        self.unpublished = 0  # events lost before reaching the delivery queue (no loop, a bug)

    @classmethod
    def build(cls, config: EventsConfig, environ: Mapping[str, str] | None = None) -> EventPublisher | None:
        """From the configuration, secrets read now (EventsConfigError when one is
        missing or malformed); None when no webhook is configured."""
        if not config.webhooks:
            return None
        targets = config.targets(os.environ if environ is None else environ)
        return cls(WebhookDelivery(targets, queue_size=config.queue_size), config.webhooks)

    def __call__(self, record: Mapping[str, Any]) -> None:
        try:
            events = events_of(record, self._principal_for(record))
            if events:
                self._hand_over(events)
        except Exception as error:  # a listener's fault must never reach the request
            self.unpublished += 1
            log.error("events: a %s record could not be published (%s)", _kind(record), type(error).__name__)

    def stats(self) -> dict[str, dict[str, int]]:
        return self._delivery.stats()

    async def close(self, timeout: float = 5.0) -> None:  # noqa: ASYNC109 -- a grace period, passed to the delivery
        await self._delivery.close(timeout)

    def _principal_for(self, record: Mapping[str, Any]) -> Mapping[str, Any] | None:
        if not self._track_principals:
            return None
        kind, request_id = record.get("event"), record.get("request_id")
        if not isinstance(request_id, str):
            return None
        with self._lock:
            if kind == "request_started" and isinstance(record.get("principal"), Mapping):
                self._principals[request_id] = _principal(record["principal"])
                if len(self._principals) > self._max_open:  # a request that never finished: forget the oldest
                    self._principals.popitem(last=False)
                return None
            if kind in OUTCOME_RECORDS:
                return self._principals.pop(request_id, None)
        return None

    def _hand_over(self, events: list[Event]) -> None:
        """Publish on the event loop's thread, where the delivery lives."""
        running = _running_loop()
        if self._loop is None and running is not None:
            self._loop = running
        if running is not None and running is self._loop:
            self._publish(events)
        elif self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._publish, events)
        else:
            self.unpublished += len(events)
            log.warning("events: %d %s event(s) not published: no event loop to deliver them from", len(events), events[0][0])

    def _publish(self, events: list[Event]) -> None:
        for event_type, data in events:
            for name in self._routes.get(event_type, ()):
                try:
                    self._delivery.publish(name, event_type, data)
                except Exception as error:  # one webhook's failure does not cost the others theirs
                    self.unpublished += 1
                    log.error("events: a %s event could not be queued for webhook %s (%s)", event_type, name, type(error).__name__)


def _kind(record: Any) -> str:
    return str(record.get("event"))[:64] if isinstance(record, Mapping) else type(record).__name__


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
