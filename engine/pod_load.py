"""A pod's load, read from its Prometheus text exposition (``GET /metrics``).

Only what the endpoint picker needs is read: the requests waiting in the pod's queue
and how full its KV cache is. vLLM names them ``vllm:num_requests_waiting`` and
``vllm:kv_cache_usage_perc`` (``vllm:gpu_cache_usage_perc`` before it was renamed;
either is accepted), SGLang ``sglang:num_queue_reqs`` and ``sglang:token_usage``. The
cache usage is a fraction (0..1) despite the ``perc`` in its name.

The parser is small, strict and bounded: the body has a size cap, other metrics are
skipped by their name alone, and a sample of a metric it reads must be well formed
(labels and all) or the whole scrape is refused. A refused scrape leaves the pod's
load unknown, which never counts as overloaded. Several samples of one metric (one
per model or engine label) add up for the queue; the fullest cache counts.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

MAX_BYTES = 1024 * 1024  # vLLM's exposition, histograms included, is a few hundred KB at most
MAX_LINE = 64 * 1024

WAITING = frozenset({"vllm:num_requests_waiting", "sglang:num_queue_reqs"})
KV_CACHE = frozenset({"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage"})
_READ = WAITING | KV_CACHE

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL = re.compile(r'\s*[a-zA-Z_][a-zA-Z0-9_]*\s*=\s*"(?:[^"\\\n]|\\[\\"n])*"\s*')
_VALUE = re.compile(r"[+-]?(?:Inf|inf|NaN|nan|(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)")
_TIMESTAMP = re.compile(r"-?[0-9]{1,19}")


class MetricsError(ValueError):
    """The exposition cannot be read; the message says why, never what it held."""


@dataclass(frozen=True)
class PodLoad:
    waiting: float | None = None  # requests queued, not yet running
    kv_cache_fraction: float | None = None  # 0..1


def parse_load(body: bytes) -> PodLoad:
    """The load a pod reports. Raises ``MetricsError`` for a body it will not read."""
    if len(body) > MAX_BYTES:
        raise MetricsError(f"the metrics body is over {MAX_BYTES} bytes")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise MetricsError("the metrics body is not UTF-8") from None
    waiting: float | None = None
    kv_cache: float | None = None
    for number, line in enumerate(text.split("\n"), 1):
        if len(line) > MAX_LINE:
            raise MetricsError(f"line {number} is over {MAX_LINE} characters")
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name = _NAME.match(line)
        if name is None:
            raise MetricsError(f"line {number} does not start with a metric name")
        if name.group() not in _READ:
            continue
        value = _sample_value(line, name.end(), number)
        if math.isnan(value):
            continue  # no reading: the pod has nothing to say yet
        if value < 0 or math.isinf(value):
            raise MetricsError(f"line {number}: {name.group()} is not a finite non-negative number")
        if name.group() in WAITING:
            waiting = (waiting or 0.0) + value
        else:
            if value > 1:
                raise MetricsError(f"line {number}: {name.group()} is not a fraction between 0 and 1")
            kv_cache = value if kv_cache is None else max(kv_cache, value)
    return PodLoad(waiting, kv_cache)


def _sample_value(line: str, at: int, number: int) -> float:
    """The value of one sample line, its labels checked (``name{a="b"} 1.5 [timestamp]``)."""
    if at < len(line) and line[at] == "{":
        at = _labels_end(line, at + 1, number)
    rest = line[at:].split()
    if not rest or len(rest) > 2 or not line[at : at + 1].isspace():
        raise MetricsError(f"line {number}: a sample is a name, labels, a value and an optional timestamp")
    if _VALUE.fullmatch(rest[0]) is None or (len(rest) == 2 and _TIMESTAMP.fullmatch(rest[1]) is None):
        raise MetricsError(f"line {number}: the value or timestamp is not a number")
    return float(rest[0])


def _labels_end(line: str, at: int, number: int) -> int:
    """The index just past the ``}`` closing the label set that starts at ``at``."""
    while True:
        if line.startswith("}", at):
            return at + 1
        label = _LABEL.match(line, at)
        if label is None:
            raise MetricsError(f"line {number}: malformed labels")
        at = label.end()
        if line.startswith(",", at):
            at += 1
        elif not line.startswith("}", at):
            raise MetricsError(f"line {number}: malformed labels")
