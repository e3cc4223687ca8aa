"""The consistent-hash ring: stable, balanced, and minimal in what moves when a pod
leaves or joins. Figures are over 20,000 keys; the hash is fixed (BLAKE2b), so these
are exact, not statistical, on every machine."""

from __future__ import annotations

import hashlib
import subprocess
import sys

import pytest

from portcullis.engine.hash_ring import HashRing, point_of

KEYS = [f"conversation-{i}" for i in range(20_000)]
BALANCE = 0.25  # with 128 virtual nodes, every pod's share is within 25% of the mean (measured worst: +20%, 5 pods)


def endpoints(count: int) -> list[str]:
    return [f"http://10.0.0.{i}:8000" for i in range(count)]


def owners(ring: HashRing) -> dict[str, str | None]:
    return {key: ring.owner(point_of(key)) for key in KEYS}


@pytest.mark.parametrize("count", [3, 5, 8])
def test_each_pod_gets_its_share_of_the_keys(count: int) -> None:
    owned = list(owners(HashRing(endpoints(count), 128)).values())
    mean = len(KEYS) / count
    shares = {endpoint: owned.count(endpoint) / mean for endpoint in endpoints(count)}
    assert all(1 - BALANCE <= share <= 1 + BALANCE for share in shares.values()), shares


@pytest.mark.parametrize("count", [3, 5, 8])
def test_a_pod_that_leaves_moves_only_its_own_keys(count: int) -> None:
    pods = endpoints(count)
    before = owners(HashRing(pods, 128))
    fractions = []
    for gone in pods:
        after = owners(HashRing([pod for pod in pods if pod != gone], 128))
        moved = {key for key in KEYS if after[key] != before[key]}
        assert moved == {key for key in KEYS if before[key] == gone}  # only the leaver's keys, and all of them
        fractions.append(len(moved) / len(KEYS))
        assert len(moved) / len(KEYS) <= (1 + BALANCE) / count
    assert sum(fractions) / count == pytest.approx(1 / count)  # on average exactly 1/N


@pytest.mark.parametrize("count", [3, 5, 8])
def test_a_pod_that_joins_takes_about_one_in_n_plus_one_keys_and_only_for_itself(count: int) -> None:
    pods = endpoints(count)
    before = owners(HashRing(pods, 128))
    after = owners(HashRing([*pods, "http://10.0.0.99:8000"], 128))
    moved = [key for key in KEYS if after[key] != before[key]]
    assert all(after[key] == "http://10.0.0.99:8000" for key in moved)
    assert abs(len(moved) / len(KEYS) - 1 / (count + 1)) <= BALANCE / (count + 1)


def test_the_walk_visits_every_pod_once_starting_with_the_owner() -> None:
    ring = HashRing(endpoints(5), 16)
    for key in KEYS[:500]:
        walk = list(ring.walk(point_of(key)))
        assert sorted(walk) == sorted(endpoints(5)) and walk[0] == ring.owner(point_of(key))


def test_the_second_pod_of_a_walk_is_who_inherits_the_key_when_the_owner_leaves() -> None:
    pods = endpoints(6)
    ring = HashRing(pods, 128)
    for key in KEYS[:2000]:
        owner, heir = list(ring.walk(point_of(key)))[:2]
        assert HashRing([pod for pod in pods if pod != owner], 128).owner(point_of(key)) == heir


def test_an_empty_ring_has_no_owner_and_a_ring_needs_virtual_nodes() -> None:
    assert HashRing([], 128).owner(point_of("x")) is None and list(HashRing([], 8).walk(0)) == []
    with pytest.raises(ValueError):
        HashRing(endpoints(2), 0)


def test_the_ring_is_the_same_in_every_process() -> None:
    """Every replica must send a conversation to the same pod: no per-process salt."""
    code = (
        "from portcullis.engine.hash_ring import HashRing, point_of\n"
        "r = HashRing([f'http://p{i}' for i in range(4)], 64)\n"
        "print([r.owner(point_of(f'k{i}')) for i in range(50)])"
    )
    runs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout for _ in range(2)}
    ring = HashRing([f"http://p{i}" for i in range(4)], 64)
    assert runs == {str([ring.owner(point_of(f"k{i}")) for i in range(50)]) + "\n"}
    assert point_of("conversation-0") == int.from_bytes(hashlib.blake2b(b"conversation-0", digest_size=8).digest(), "big")
