"""The endpoint picker: the key's own pod first; an overloaded pod is skipped for the
next distinct pod on the ring; load never refuses; a resting pod goes last. And the
policy it reads: the bundle's ``data.portcullis.endpoints``, defaults when absent."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from portcullis.adapters.endpoint_config import EndpointPool
from portcullis.adapters.providers.endpoints.pool import PodPool
from portcullis.engine.activation import activate
from portcullis.engine.bundle import BundleError, parse_bundle, read_bundle_files
from portcullis.engine.endpoint_pick import overloaded, pick_order
from portcullis.engine.endpoint_policy import DEFAULT_POLICY, EndpointPolicy
from portcullis.engine.hash_ring import HashRing, point_of
from portcullis.engine.pod_load import PodLoad
from tests.bundles import write_bundle

PODS = [f"http://10.0.0.{i}:8000" for i in range(5)]
RING = HashRing(PODS, 128)
POLICY = EndpointPolicy(max_waiting=16, max_kv_cache_percent=90)
KEYS = [f"conversation-{i}" for i in range(300)]


def test_with_no_load_known_the_key_s_own_pod_comes_first() -> None:
    for key in KEYS:
        order = pick_order(RING, point_of(key), {}, set(), POLICY)
        assert order == list(RING.walk(point_of(key)))


def test_an_overloaded_pod_is_skipped_for_the_next_pod_on_the_ring() -> None:
    for load in (PodLoad(waiting=17), PodLoad(kv_cache_fraction=0.95), PodLoad(waiting=40, kv_cache_fraction=0.99)):
        for key in KEYS:
            owner, heir, *_ = RING.walk(point_of(key))
            order = pick_order(RING, point_of(key), {owner: load}, set(), POLICY)
            assert order[0] == heir and order[-1] == owner


def test_at_the_threshold_a_pod_is_not_overloaded_and_unknown_load_never_is() -> None:
    assert not overloaded(PodLoad(waiting=16, kv_cache_fraction=0.90), POLICY)
    assert overloaded(PodLoad(waiting=16.5), POLICY) and overloaded(PodLoad(kv_cache_fraction=0.905), POLICY)
    assert not overloaded(None, POLICY) and not overloaded(PodLoad(None, None), POLICY)


def test_when_every_pod_is_overloaded_the_key_keeps_its_own_pod() -> None:
    loads = dict.fromkeys(PODS, PodLoad(waiting=100))
    for key in KEYS:
        assert pick_order(RING, point_of(key), loads, set(), POLICY)[0] == RING.owner(point_of(key))


def test_a_resting_pod_goes_last_even_behind_overloaded_ones() -> None:
    key = point_of("conversation-1")
    owner, heir, third, *_ = RING.walk(key)
    order = pick_order(RING, key, {heir: PodLoad(waiting=100)}, {owner}, POLICY)
    assert order[0] == third and order.index(heir) < order.index(owner) == len(PODS) - 1


def test_load_only_reorders_the_pods_it_was_given() -> None:
    loads = {pod: PodLoad(waiting=i * 10) for i, pod in enumerate(PODS)}
    for key in KEYS[:50]:
        assert sorted(pick_order(RING, point_of(key), loads, {PODS[0]}, POLICY)) == sorted(PODS)
    assert pick_order(HashRing([], 128), 0, {}, set(), POLICY) == []


def test_the_pool_builds_its_ring_only_when_the_pods_or_the_virtual_nodes_change() -> None:
    policy = [EndpointPolicy(virtual_nodes=64)]
    pool = PodPool("vllm", EndpointPool(static=tuple(PODS)), lambda: policy[0])
    first = pool.ring(policy[0])
    assert pool.ring(policy[0]) is first and len(first) == 5 and first.virtual_nodes == 64
    pool._use(frozenset(PODS[:4]))  # what a DNS refresh does
    second = pool.ring(policy[0])
    assert second is not first and second.endpoints == frozenset(PODS[:4])
    policy[0] = EndpointPolicy(virtual_nodes=32)
    assert pool.ring(policy[0]).virtual_nodes == 32


def test_the_pool_puts_a_pod_that_refused_a_connection_last_for_its_cooldown() -> None:
    now = [100.0]
    pool = PodPool("vllm", EndpointPool(static=tuple(PODS), cooldown_seconds=5), lambda: DEFAULT_POLICY, clock=lambda: now[0])
    owner = pool.order("conversation-1")[0]
    pool.rest(owner)
    assert pool.order("conversation-1")[-1] == owner
    now[0] += 5.1
    assert pool.order("conversation-1")[0] == owner


def test_a_keyless_request_goes_to_any_pod() -> None:
    pool = PodPool("vllm", EndpointPool(static=tuple(PODS)), lambda: DEFAULT_POLICY)
    assert {pool.order(None)[0] for _ in range(400)} == set(PODS)


def _activate(tmp_path: Path, endpoints: dict | None) -> object:
    directory = write_bundle(tmp_path / "bundle", sections={"endpoints": endpoints} if endpoints is not None else None)
    return activate(parse_bundle(read_bundle_files(directory), []), ["anthropic-us", "anthropic-eu", "openai-main"], dt.date(2026, 6, 1))


def test_the_policy_is_read_from_the_bundle_with_defaults_for_what_it_leaves_out(tmp_path: Path) -> None:
    assert _activate(tmp_path, None).endpoints == EndpointPolicy(system_blocks=2, virtual_nodes=128, max_waiting=16, max_kv_cache_percent=90)
    active = _activate(tmp_path, {"max_waiting": 4, "virtual_nodes": 32})
    assert active.endpoints == EndpointPolicy(system_blocks=2, virtual_nodes=32, max_waiting=4, max_kv_cache_percent=90)


@pytest.mark.parametrize(
    "data, field",
    [({"virtual_nodes": 0}, "virtual_nodes"), ({"max_kv_cache_percent": 120}, "max_kv_cache_percent"), ({"max_queue": 3}, "max_queue")],
)
def test_a_bundle_with_a_bad_endpoint_policy_is_refused_naming_the_field(tmp_path: Path, data: dict, field: str) -> None:
    with pytest.raises(BundleError, match=field):
        _activate(tmp_path, data)


def test_the_product_bundle_ships_the_defaults() -> None:
    import yaml

    shipped = yaml.safe_load((Path(__file__).resolve().parent.parent / "policies" / "portcullis" / "endpoints" / "data.yaml").read_text())
    assert EndpointPolicy.from_data(shipped) == DEFAULT_POLICY
