"""A snapshot in Prometheus's text exposition format (0.0.4), named as OpenTelemetry's
Prometheus exporters name things: dots become underscores, the unit is a suffix
(``s`` → ``_seconds``, ``1`` → ``_ratio``; an annotation such as ``{token}`` adds none),
counters end in ``_total``."""

from __future__ import annotations

import math
import re

from portcullis.adapters.telemetry.registry import Snapshot

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_UNIT_SUFFIXES = {"s": "seconds", "ms": "milliseconds", "By": "bytes", "1": "ratio"}
_INVALID = re.compile(r"[^a-zA-Z0-9_:]")


def metric_name(name: str, unit: str, kind: str) -> str:
    base = _INVALID.sub("_", name)
    suffix = _UNIT_SUFFIXES.get(unit)
    if suffix and not base.endswith(f"_{suffix}"):
        base = f"{base}_{suffix}"
    return f"{base}_total" if kind == "counter" and not base.endswith("_total") else base


def label_name(name: str) -> str:
    return _INVALID.sub("_", name)


def _value(value: float) -> str:
    if isinstance(value, float):
        if math.isinf(value):
            return "+Inf" if value > 0 else "-Inf"
        if math.isnan(value):
            return "NaN"
        if value.is_integer() and abs(value) < 1e15:
            return str(int(value))
    return repr(value) if isinstance(value, float) else str(value)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(names: tuple[str, ...], values: tuple[str, ...], extra: tuple[tuple[str, str], ...] = ()) -> str:
    pairs = [f'{label_name(n)}="{_escape(v)}"' for n, v in zip(names, values, strict=True)]
    pairs += [f'{n}="{_escape(v)}"' for n, v in extra]
    return "{" + ",".join(pairs) + "}" if pairs else ""


def render(snapshot: Snapshot) -> str:
    lines: list[str] = []
    for described, series in snapshot:
        name = metric_name(described.name, described.unit, described.kind)
        kind = {"counter": "counter", "histogram": "histogram"}.get(described.kind, "gauge")
        lines.append(f"# HELP {name} {_escape(described.description)}")
        lines.append(f"# TYPE {name} {kind}")
        for values, value in sorted(series.items()):
            if described.kind != "histogram":
                lines.append(f"{name}{_labels(described.labels, values)} {_value(value)}")
                continue
            running = 0
            for bound, count in zip((*described.buckets, math.inf), value[:-3], strict=True):
                running += count
                lines.append(f"{name}_bucket{_labels(described.labels, values, (('le', _value(float(bound))),))} {_value(running)}")
            lines.append(f"{name}_sum{_labels(described.labels, values)} {_value(float(value[-3]))}")
            lines.append(f"{name}_count{_labels(described.labels, values)} {_value(running)}")
    return "\n".join(lines) + "\n"
