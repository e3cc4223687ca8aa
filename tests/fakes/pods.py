"""A self-hosted pool of fake pods: K fake providers on K ports, as vLLM replicas
behind a headless Service would be. Each answers Chat Completions (plain and
streamed), puts its name in each completion's id (``chatcmpl-pod-1-…``) so a test
sees which pod served a request, and serves ``GET /metrics`` with the load a test
sets (``pods[i].metrics``, or ``PUT /fake/metrics`` when run standalone)."""

from __future__ import annotations

import re

from tests.fakes.server import FakeProvider

WAITING = "vllm:num_requests_waiting"
KV_CACHE = "vllm:kv_cache_usage_perc"
_POD_OF_ID = re.compile(r"^chatcmpl-(pod-[0-9]+)-")


class FakePods:
    def __init__(self, count: int, api_key: str) -> None:
        self.pods = [FakeProvider(api_key, f"pod-{i}") for i in range(count)]
        for pod in self.pods:
            pod.id_tag = f"{pod.name}-"

    def start(self) -> FakePods:
        for pod in self.pods:
            pod.start()
        return self

    def stop(self) -> None:
        for pod in self.pods:
            pod.stop()

    def reset(self) -> None:
        for pod in self.pods:
            pod.reset()

    @property
    def endpoints(self) -> list[str]:
        return [pod.url for pod in self.pods]

    def by_name(self, name: str) -> FakeProvider:
        return next(pod for pod in self.pods if pod.name == name)

    def by_url(self, url: str) -> FakeProvider:
        return next(pod for pod in self.pods if pod.url == url)


def pod_of(completion_id: str) -> str:
    """The pod that served a completion, from its id."""
    found = _POD_OF_ID.match(completion_id)
    assert found, f"{completion_id!r} names no pod"
    return found.group(1)
