"""Metrics of the gateway's background upkeep: how far the audit anchors lag behind the
chain's head, and what the event webhooks delivered. Both keep their own counts; these
instruments read them when collected. Labels are configured names only: a sink's name
(its file, bucket or host) and a webhook's name, never a URL's query or a secret."""

from __future__ import annotations

from portcullis.adapters.anchors.anchorer import Anchorer
from portcullis.adapters.events.audit_events import EventPublisher
from portcullis.adapters.telemetry.registry import Registry

DELIVERY_RESULTS = ("delivered", "retried", "failed", "dropped")


def watch_upkeep(registry: Registry, anchorer: Anchorer | None, events: EventPublisher | None) -> None:
    if anchorer is not None:
        registry.gauge(
            "portcullis.audit.anchor.lag",
            "{record}",
            "Audit records written since the head was last anchored to each sink (by this process: until its first anchor there, the whole log)",
            ("sink",),
            lambda: [((name,), stats.lag_records) for name, stats in anchorer.stats().items()],
        )
        registry.gauge(
            "portcullis.audit.anchor.failing",
            "{sink}",
            "1 while the last anchor written to a sink failed",
            ("sink",),
            lambda: [((name,), float(stats.failing)) for name, stats in anchorer.stats().items()],
        )
        registry.observed_counter(
            "portcullis.audit.anchor.failures",
            "{anchor}",
            "Anchors a sink refused or did not take in time",
            ("sink",),
            lambda: [((name,), stats.failures) for name, stats in anchorer.stats().items()],
        )
    if events is not None:
        registry.observed_counter(
            "portcullis.events.deliveries",
            "{event}",
            "Events by webhook and what became of them: delivered, retried (attempts after the first), failed (gave up or refused), dropped (queue full)",
            ("webhook", "result"),
            lambda: [((name, result), counts[result]) for name, counts in events.stats().items() for result in DELIVERY_RESULTS],
        )
        registry.gauge(
            "portcullis.events.queued",
            "{event}",
            "Events waiting for each webhook (with workers: the fullest process's queue)",
            ("webhook",),
            lambda: [((name,), counts["queued"]) for name, counts in events.stats().items()],
        )
