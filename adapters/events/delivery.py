"""Delivers the gateway's events to operators' endpoints, signed (``signing``) and
retried, without ever holding up the request that caused them.

``publish`` only encodes the message and queues it; one task per target sends that
target's messages in order, so a slow or dead receiver delays its own events and no
one else's. Each message is encoded once: every retry sends the same bytes under the
same ``webhook-id``, so a receiver that saw it already can tell. What is retried is
what may pass (connection errors, timeouts, 408, 425, 429, 5xx), with exponential
backoff, full jitter and the receiver's Retry-After; a receiver's other 4xx, or a
redirect (never followed: the signed body must not wander to another host), ends the
message. Each queue is bounded: when full the oldest message goes, since the newest
events matter most. Logs name the target and event type, never the payload, the URL
or a secret; ``stats`` counts what happened per target.

An unsigned target (``secret=None``) is weaker: its receiver can tell neither a forged
event nor a replayed one from the gateway's, and only TLS and the bearer token, if
any, stand between them.
"""

from __future__ import annotations

import asyncio
import email.utils
import logging
import math
import random
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from portcullis.adapters.events.signing import new_message_id, signature_headers
from portcullis.adapters.json_bytes import compact

log = logging.getLogger("portcullis.events")

RETRIED_STATUSES = frozenset({408, 425, 429})  # and every 5xx
DROP_WARNING_INTERVAL_SECONDS = 60.0
USER_AGENT = "Portcullis-Webhooks/1"


@dataclass(frozen=True)
class WebhookTarget:
    """One operator endpoint. ``name`` is what logs and metrics show of it; the URL (its
    query may hold a token) and the secrets are never logged nor in the repr."""

    name: str
    url: str = field(repr=False)
    secret: bytes | tuple[bytes, ...] | None = field(repr=False)  # several while rotating: each signs; None: unsigned, see the module's note
    bearer_token: str | None = field(default=None, repr=False)  # sent as Authorization: Bearer
    timeout_seconds: float = 5.0  # each attempt, connecting to the last byte of the answer's head
    max_attempts: int = 6
    first_backoff_seconds: float = 1.0
    max_backoff_seconds: float = 60.0

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("webhook target: name must not be empty")
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"webhook target {self.name}: url must be an http or https URL with a host")
        if self.secret is not None and not self.secret:
            raise ValueError(f"webhook target {self.name}: secret must not be empty (None sends unsigned)")
        if self.bearer_token is not None and (not self.bearer_token or any(c in self.bearer_token for c in "\r\n")):
            raise ValueError(f"webhook target {self.name}: bearer_token must be a non-empty single line")
        if self.max_attempts < 1:
            raise ValueError(f"webhook target {self.name}: max_attempts must be at least 1")
        if not self.timeout_seconds > 0:
            raise ValueError(f"webhook target {self.name}: timeout_seconds must be positive")
        if not 0 <= self.first_backoff_seconds <= self.max_backoff_seconds:
            raise ValueError(f"webhook target {self.name}: need 0 <= first_backoff_seconds <= max_backoff_seconds")


def backoff_delay(attempt: int, first: float, maximum: float, rand: Callable[[], float] = random.random) -> float:
    """Seconds to wait after failed attempt ``attempt`` (1-based): full jitter, uniform
    below ``first * 2**(attempt-1)`` capped at ``maximum``, so many gateways that lost the
    same receiver do not come back to it in step."""
    ceiling = min(maximum, first * 2.0 ** min(attempt - 1, 64))
    return rand() * ceiling


def retry_after_seconds(value: str | None, now: float) -> float | None:
    """A Retry-After header as seconds from ``now``: delta-seconds or an HTTP date;
    None when absent or unreadable (the backoff decides then)."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = when.timestamp() - now
    if not math.isfinite(seconds):
        return None
    return max(0.0, seconds)


@dataclass
class _Message:
    id: str
    event_type: str
    body: bytes  # encoded once: every attempt sends these bytes


@dataclass
class AttemptOutcome:
    """What one HTTP attempt came to: an answer's status, or the error that stood for one
    (shared by the senders that retry: webhooks, decision logs)."""

    status: int | None = None  # the answer's, or None when none came
    error: str | None = None  # the exception's class name when none came
    retry_after: float | None = None
    transient: bool = True  # of an error: False when no retry can help (a malformed URL)

    @property
    def delivered(self) -> bool:
        return self.status is not None and 200 <= self.status < 300

    @property
    def retryable(self) -> bool:
        if self.status is None:
            return self.transient
        return self.status in RETRIED_STATUSES or self.status >= 500

    def describe(self) -> str:
        return f"status {self.status}" if self.status is not None else str(self.error)


@dataclass
class _Lane:
    """One target's queue, consumer task and counts."""

    target: WebhookTarget
    queue: deque[_Message] = field(default_factory=deque)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    in_flight: _Message | None = None
    delivered: int = 0
    retried: int = 0
    failed: int = 0
    dropped: int = 0
    warned_at: float | None = None  # the last queue-full warning

    @property
    def queued(self) -> int:
        return len(self.queue) + (self.in_flight is not None)


class WebhookDelivery:
    """Signed, retried, ordered delivery of events to named targets (see the module)."""

    def __init__(
        self,
        targets: Sequence[WebhookTarget],
        queue_size: int = 10_000,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
        now: Callable[[], float] = time.time,
    ) -> None:
        if queue_size < 1:
            raise ValueError("webhook delivery: queue_size must be at least 1")
        self._lanes: dict[str, _Lane] = {}
        for target in targets:
            if target.name in self._lanes:
                raise ValueError(f"webhook delivery: two targets are named {target.name}")
            self._lanes[target.name] = _Lane(target)
        self._queue_size = queue_size
        self._sleep = sleep
        self._now = now
        self._session: aiohttp.ClientSession | None = None
        self._closing = False

    def publish(self, target: str, event_type: str, data: Mapping[str, Any]) -> None:
        """Queue an event for ``target``; returns at once. An unknown target is a
        programming error (ValueError); anything else is logged and counted, never raised,
        so no request fails for its webhook. Called on the event loop's thread."""
        lane = self._lanes.get(target)
        if lane is None:
            raise ValueError(f"webhook delivery: no target is named {target}")
        if self._closing:
            lane.dropped += 1
            self._warn_dropped(lane, "closed")
            return
        try:
            published = datetime.fromtimestamp(self._now(), UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
            body = compact({"type": event_type, "timestamp": published, "data": dict(data)})
        except Exception as error:  # a value JSON cannot hold: the caller's bug, not the request's
            lane.failed += 1
            log.error("webhook %s: a %s event could not be encoded (%s); not sent", target, event_type, type(error).__name__)
            return
        if len(lane.queue) >= self._queue_size:
            lane.queue.popleft()
            lane.dropped += 1
            self._warn_dropped(lane, f"queue full ({self._queue_size})")
        lane.queue.append(_Message(new_message_id(), event_type, body))
        lane.wake.set()
        if lane.task is None or lane.task.done():
            lane.task = asyncio.get_running_loop().create_task(self._consume(lane), name=f"webhook {target}")
            lane.task.add_done_callback(self._consumer_ended)

    def stats(self) -> dict[str, dict[str, int]]:
        """Per target: delivered, retried (attempts after a message's first), failed (gave
        up or rejected), dropped (queue full or closed) and queued (waiting or being sent)."""
        return {
            name: {"delivered": lane.delivered, "retried": lane.retried, "failed": lane.failed, "dropped": lane.dropped, "queued": lane.queued}
            for name, lane in self._lanes.items()
        }

    async def close(self, timeout: float = 5.0) -> None:  # noqa: ASYNC109 -- a grace period, not a deadline: after it the session still closes
        """Send what is queued for up to ``timeout`` seconds, then cancel the rest (logged
        per target) and close the HTTP session. Never waits longer for a dead receiver."""
        self._closing = True
        for lane in self._lanes.values():
            lane.wake.set()
        tasks = [lane.task for lane in self._lanes.values() if lane.task is not None and not lane.task.done()]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=max(0.0, timeout))
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)
        for name, lane in self._lanes.items():
            if lane.queued:
                log.warning("webhook %s: %d messages left undelivered at close", name, lane.queued)
        if self._session is not None:
            await self._session.close()
            self._session = None

    # --- delivering ------------------------------------------------------------------------

    async def _consume(self, lane: _Lane) -> None:
        while True:
            while not lane.queue:
                if self._closing:
                    return
                lane.wake.clear()
                await lane.wake.wait()
            message = lane.queue.popleft()
            lane.in_flight = message
            try:
                await self._deliver(lane, message)
            except asyncio.CancelledError:
                raise  # in_flight stays set: close() counts it as undelivered
            except Exception as error:  # a bug here must not end the target's deliveries
                lane.failed += 1
                log.error("webhook %s: delivering a %s event failed unexpectedly (%s)", lane.target.name, message.event_type, type(error).__name__)
            lane.in_flight = None

    async def _deliver(self, lane: _Lane, message: _Message) -> None:
        target = lane.target
        attempt = AttemptOutcome()
        for number in range(1, target.max_attempts + 1):
            if number > 1:
                lane.retried += 1
            attempt = await self._attempt(target, message)
            if attempt.delivered:
                lane.delivered += 1
                return
            if not attempt.retryable:
                lane.failed += 1
                why = "redirects are not followed" if attempt.status is not None and 300 <= attempt.status < 400 else "not retried"
                log.warning("webhook %s: %s event %s refused (%s); %s", target.name, message.event_type, message.id, attempt.describe(), why)
                return
            if number == target.max_attempts:
                break
            delay = backoff_delay(number, target.first_backoff_seconds, target.max_backoff_seconds)
            if attempt.retry_after is not None:
                delay = min(attempt.retry_after, target.max_backoff_seconds)
            log.debug(
                "webhook %s: attempt %d of %s event %s failed (%s); retrying in %.1fs",
                target.name,
                number,
                message.event_type,
                message.id,
                attempt.describe(),
                delay,
            )
            await self._sleep(delay)
        lane.failed += 1
        log.warning(
            "webhook %s: gave up on %s event %s after %d attempts (last: %s)",
            target.name,
            message.event_type,
            message.id,
            target.max_attempts,
            attempt.describe(),
        )

    async def _attempt(self, target: WebhookTarget, message: _Message) -> AttemptOutcome:
        headers = {"content-type": "application/json", "user-agent": USER_AGENT}
        now = self._now()
        if target.secret is not None:
            headers |= signature_headers(target.secret, message.id, int(now), message.body)
        else:
            headers |= {"webhook-id": message.id, "webhook-timestamp": str(int(now))}  # receivers still de-duplicate by id
        if target.bearer_token is not None:
            headers["authorization"] = f"Bearer {target.bearer_token}"
        if self._session is None:
            self._session = aiohttp.ClientSession()
        try:
            async with self._session.post(
                target.url, data=message.body, headers=headers, allow_redirects=False, timeout=aiohttp.ClientTimeout(total=target.timeout_seconds)
            ) as response:
                return AttemptOutcome(status=response.status, retry_after=retry_after_seconds(response.headers.get("retry-after"), self._now()))
        except (aiohttp.ClientError, TimeoutError, OSError) as error:  # the class only: messages can hold the URL
            return AttemptOutcome(error=type(error).__name__, transient=not isinstance(error, aiohttp.InvalidURL))

    def _warn_dropped(self, lane: _Lane, why: str) -> None:
        """At most once a minute per target: a full queue drops thousands a second."""
        now = self._now()
        if lane.warned_at is None or now - lane.warned_at >= DROP_WARNING_INTERVAL_SECONDS or now < lane.warned_at:
            lane.warned_at = now
            what = "delivery closed; dropping new events" if why == "closed" else f"{why}; dropping the oldest events"
            log.warning("webhook %s: %s (%d dropped so far)", lane.target.name, what, lane.dropped)

    @staticmethod
    def _consumer_ended(task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("webhook consumer %s ended (%s)", task.get_name(), type(task.exception()).__name__)
