"""The gateway's own measurements: counters, histograms and gauges with fixed label names,
kept in plain dicts.

Why not the OpenTelemetry SDK's instruments on the request path: measured here, each
``Counter.add`` / ``Histogram.record`` with four attributes costs ~10 µs (it freezes the
attribute dict and walks its views on every call), and a request records six or more
measurements; these cost about a microsecond each. The SDK keeps what it does well: its
data model and its OTLP exporter read these instruments (``otlp.py``), with the
OpenTelemetry names, units and bucket boundaries kept as declared here.

Cardinality is bounded twice: label values come from ``labels.LabelBounds`` (configuration
and the active bundle only), and an instrument holds at most ``max_series`` label sets;
past that, a measurement lands in one series whose every label is ``_overflow`` (and the
overflow is counted), so no client input can grow memory or series without bound.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

OVERFLOW = "_overflow"
MAX_SERIES = 2_000  # per instrument: teams × models × outcomes of a large tenant stays well below

Labels = tuple[str, ...]
InstrumentT = TypeVar("InstrumentT", bound="Instrument")


class Instrument:
    kind = ""  # counter | histogram | gauge

    def __init__(self, name: str, unit: str, description: str, labels: tuple[str, ...], max_series: int = MAX_SERIES) -> None:
        self.name = name  # OpenTelemetry's dotted name, e.g. gen_ai.client.operation.duration
        self.unit = unit
        self.description = description
        self.labels = labels
        self.max_series = max_series
        self.overflowed = 0  # measurements that found the series cap reached
        self.buckets: tuple[float, ...] = ()

    def _key(self, values: Labels, series: dict[Labels, Any]) -> Labels:
        if values in series or len(series) < self.max_series:
            return values
        self.overflowed += 1
        return (OVERFLOW,) * len(self.labels)

    def snapshot(self) -> dict[Labels, Any]:
        raise NotImplementedError


class Counter(Instrument):
    kind = "counter"

    def __init__(self, name: str, unit: str, description: str, labels: tuple[str, ...], max_series: int = MAX_SERIES) -> None:
        super().__init__(name, unit, description, labels, max_series)
        self.series: dict[Labels, float] = {}

    def add(self, values: Labels, amount: float = 1) -> None:
        key = self._key(values, self.series)
        self.series[key] = self.series.get(key, 0) + amount

    def snapshot(self) -> dict[Labels, Any]:
        return dict(self.series)


class Histogram(Instrument):
    kind = "histogram"

    def __init__(self, name: str, unit: str, description: str, labels: tuple[str, ...], buckets: tuple[float, ...], max_series: int = MAX_SERIES) -> None:
        super().__init__(name, unit, description, labels, max_series)
        self.buckets = buckets  # upper bounds, ascending; +Inf is implied
        self.series: dict[Labels, list[float]] = {}  # each bucket's count, +Inf's count, then sum, min, max

    def record(self, values: Labels, amount: float) -> None:
        key = self._key(values, self.series)
        counts = self.series.get(key)
        if counts is None:
            counts = self.series[key] = [0] * (len(self.buckets) + 2) + [amount, amount]
        counts[bisect.bisect_left(self.buckets, amount)] += 1
        counts[-3] += amount
        if amount < counts[-2]:
            counts[-2] = amount
        elif amount > counts[-1]:
            counts[-1] = amount

    def snapshot(self) -> dict[Labels, Any]:
        return {key: list(counts) for key, counts in self.series.items()}


class Gauge(Instrument):
    """Read when collected: ``observe`` returns each label set's current value."""

    kind = "gauge"

    def __init__(self, name: str, unit: str, description: str, labels: tuple[str, ...], observe: Callable[[], Iterable[tuple[Labels, float]]]) -> None:
        super().__init__(name, unit, description, labels)
        self.observe = observe

    def snapshot(self) -> dict[Labels, Any]:
        found: dict[Labels, Any] = {}
        for values, value in self.observe():
            found[self._key(values, found)] = value
        return found


class ObservedCounter(Gauge):
    """A count kept elsewhere (a webhook delivery's, an anchorer's), read when collected:
    a counter to its readers, so processes' counts add up."""

    kind = "counter"


@dataclass(frozen=True)
class Described:
    """An instrument without its measurements: what a snapshot needs to be read elsewhere."""

    name: str
    kind: str
    unit: str
    description: str
    labels: tuple[str, ...]
    buckets: tuple[float, ...] = ()


Snapshot = list[tuple[Described, dict[Labels, Any]]]


class Registry:
    def __init__(self) -> None:
        self._instruments: list[Instrument] = []

    def counter(self, name: str, unit: str, description: str, labels: tuple[str, ...]) -> Counter:
        return self._add(Counter(name, unit, description, labels))

    def histogram(self, name: str, unit: str, description: str, labels: tuple[str, ...], buckets: tuple[float, ...]) -> Histogram:
        return self._add(Histogram(name, unit, description, labels, buckets))

    def gauge(self, name: str, unit: str, description: str, labels: tuple[str, ...], observe: Callable[[], Iterable[tuple[Labels, float]]]) -> Gauge:
        return self._add(Gauge(name, unit, description, labels, observe))

    def observed_counter(
        self, name: str, unit: str, description: str, labels: tuple[str, ...], observe: Callable[[], Iterable[tuple[Labels, float]]]
    ) -> ObservedCounter:
        return self._add(ObservedCounter(name, unit, description, labels, observe))

    def _add(self, instrument: InstrumentT) -> InstrumentT:
        if any(known.name == instrument.name for known in self._instruments):
            raise ValueError(f"instrument {instrument.name} is registered twice")
        self._instruments.append(instrument)
        return instrument

    def snapshot(self) -> Snapshot:
        """Every instrument's series now, plus how many measurements overflowed."""
        taken: Snapshot = []
        for instrument in self._instruments:
            described = Described(instrument.name, instrument.kind, instrument.unit, instrument.description, instrument.labels, instrument.buckets)
            taken.append((described, instrument.snapshot()))
        overflow = Described(
            "portcullis.metrics.overflow", "counter", "{measurement}", "Measurements whose label set found its instrument full", ("instrument",)
        )
        taken.append((overflow, {(i.name,): i.overflowed for i in self._instruments if i.overflowed}))
        return taken


def merge(snapshots: Iterable[Snapshot]) -> Snapshot:
    """Several processes' snapshots as one: counters and histograms add up, a gauge keeps
    the highest value any process reported (they report shared state: a bundle revision,
    a breaker's state, a counter's utilisation)."""
    merged: dict[str, tuple[Described, dict[Labels, Any]]] = {}
    for snapshot in snapshots:
        for described, series in snapshot:
            _, into = merged.setdefault(described.name, (described, {}))
            for key, value in series.items():
                known = into.get(key)
                if known is None:
                    into[key] = list(value) if isinstance(value, list) else value
                elif described.kind == "gauge":
                    into[key] = max(known, value)
                elif isinstance(value, list):  # bucket counts and sum add up; min and max are the extremes
                    into[key] = [*(a + b for a, b in zip(known[:-2], value[:-2], strict=True)), min(known[-2], value[-2]), max(known[-1], value[-1])]
                else:
                    into[key] = known + value
    return list(merged.values())
