"""A consistent-hash ring over a provider's endpoints (pods).

A conversation's affinity key lands on one point of the ring; the endpoint owning
the next virtual node clockwise serves it, so the same conversation reaches the same
pod (and its KV-cache prefix is reused), and a pod that leaves gives up only its own
points: every other conversation keeps its pod. Each endpoint owns ``virtual_nodes``
points so the arc lengths, and with them the load, even out.

The hash is BLAKE2b cut to 64 bits: stable across processes, machines and Python
versions (``hash()`` is salted per process), so every gateway replica builds the same
ring from the same endpoints and sends a conversation to the same pod.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Iterable, Iterator

POINTS = 1 << 64


def point_of(key: str) -> int:
    """Where ``key`` lands on the ring: a stable 64-bit hash."""
    return int.from_bytes(hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "big")


class HashRing:
    """Immutable: a changed endpoint set is a new ring (built only when the set changes)."""

    def __init__(self, endpoints: Iterable[str], virtual_nodes: int = 128) -> None:
        if virtual_nodes < 1:
            raise ValueError("virtual_nodes must be at least 1")
        self.endpoints: frozenset[str] = frozenset(endpoints)
        self.virtual_nodes = virtual_nodes
        # Sorted by point, then by endpoint: a collision of two points is resolved the same way everywhere.
        nodes = sorted((point_of(f"{endpoint}#{i}"), endpoint) for endpoint in self.endpoints for i in range(virtual_nodes))
        self._points = [point for point, _ in nodes]
        self._owners = [endpoint for _, endpoint in nodes]

    def __len__(self) -> int:
        return len(self.endpoints)

    def owner(self, point: int) -> str | None:
        """The endpoint serving ``point`` (None on an empty ring)."""
        return next(self.walk(point), None)

    def walk(self, point: int) -> Iterator[str]:
        """Every endpoint once, in ring order from ``point`` clockwise: the owner first,
        then the pod that would take its conversations if it left, and so on."""
        count = len(self._points)
        if count == 0:
            return
        start = bisect.bisect_left(self._points, point % POINTS)
        seen: set[str] = set()
        for step in range(count):
            endpoint = self._owners[(start + step) % count]
            if endpoint not in seen:
                seen.add(endpoint)
                yield endpoint
                if len(seen) == len(self.endpoints):
                    return
