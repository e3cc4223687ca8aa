"""Which pod of a self-hosted pool serves a request: the order to try them in.

The ring says which pod owns the request's affinity key and which would inherit it.
Load only reorders, it never refuses: walking the ring from the key's point, the
first pod that is up and not overloaded comes first; a pod whose load is unknown (it
could not be scraped) counts as not overloaded. When every pod is overloaded, the
key's own pod still comes first, so the conversation keeps its cache. A pod resting
after a connection failure goes last, in case every other one fails too.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from portcullis.engine.endpoint_policy import EndpointPolicy
from portcullis.engine.hash_ring import HashRing
from portcullis.engine.pod_load import PodLoad


def overloaded(load: PodLoad | None, policy: EndpointPolicy) -> bool:
    if load is None:
        return False
    if load.waiting is not None and load.waiting > policy.max_waiting:
        return True
    return load.kv_cache_fraction is not None and load.kv_cache_fraction * 100 > policy.max_kv_cache_percent


def pick_order(ring: HashRing, point: int, loads: Mapping[str, PodLoad | None], resting: Collection[str], policy: EndpointPolicy) -> list[str]:
    """Every endpoint of ``ring``, best first, for a request whose key lands on ``point``."""
    free: list[str] = []
    busy: list[str] = []
    down: list[str] = []
    for endpoint in ring.walk(point):
        if endpoint in resting:
            down.append(endpoint)
        elif overloaded(loads.get(endpoint), policy):
            busy.append(endpoint)
        else:
            free.append(endpoint)
    return free + busy + down
