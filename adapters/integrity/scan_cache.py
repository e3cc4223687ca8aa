"""Scanner results already computed, so an agent's conversation is not rescanned every
turn (each turn resends every earlier tool result).

An entry is keyed by the tenant/session scope, the scanner version, the policy
version and the content hash, never the content itself: one tenant's results never
answer another's lookups, and a new bundle or scanner rescans everything. The cache
holds at most ``capacity`` entries, least recently used first out.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

from portcullis.engine.integrity.injection import ScanResult

SCANNER_VERSION = "rules-deobfuscated-2"  # how results are computed; bumping it drops every entry


class ScanCache:
    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._entries: OrderedDict[bytes, ScanResult] = OrderedDict()
        self.hits = self.misses = 0

    @staticmethod
    def key(scope: str, policy_version: str, text: str) -> bytes:
        digest = hashlib.sha256()
        for part in (scope, SCANNER_VERSION, policy_version):
            digest.update(part.encode())
            digest.update(b"\0")
        digest.update(text.encode("utf-8", "surrogatepass"))
        return digest.digest()

    def get(self, key: bytes) -> ScanResult | None:
        result = self._entries.get(key)
        if result is None:
            self.misses += 1
            return None
        self.hits += 1
        self._entries.move_to_end(key)
        return result

    def put(self, key: bytes, result: ScanResult) -> None:
        if self._capacity <= 0:
            return
        self._entries[key] = result
        self._entries.move_to_end(key)
        while len(self._entries) > self._capacity:
            self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)
