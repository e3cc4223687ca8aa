"""Endpoint picking in a self-hosted pool (routing layer L7), end to end: the official
``openai`` SDK through the gateway process to four fake vLLM pods. A conversation keeps
its pod turn after turn; conversations spread over the pods; a pod that stops gives up
only its own conversations, which still succeed elsewhere; a pod whose metrics say it
is overloaded is skipped for the next pod on the ring and gets its conversations back
when its load drops; endpoints can come from DNS."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
import yaml

from tests.bundles import write_bundle
from tests.conftest import UPSTREAM_KEY, Fakes, GatewayProcess, gateway_config
from tests.fakes.pods import KV_CACHE, WAITING, FakePods, pod_of

pytestmark = pytest.mark.served

MODEL = "local-llama"  # served by the provider openai-main, here a pool of pods
SCRAPE_SECONDS = 0.2
COOLDOWN_SECONDS = 1.5
POLICY = {"max_waiting": 4, "max_kv_cache_percent": 80}


@pytest.fixture(scope="module")
def pods() -> Iterator[FakePods]:
    running = FakePods(4, UPSTREAM_KEY).start()
    yield running
    running.stop()


@pytest.fixture
def pool(pods: FakePods) -> FakePods:
    pods.reset()
    return pods


def pool_gateway(directory: Path, fakes: Fakes, pooled: tuple[str, ...] = ("openai-main",), policy: dict = POLICY, **pool: Any) -> GatewayProcess:
    """A gateway whose ``pooled`` providers are each a pool of pods (``pool``: its fields)."""
    directory.mkdir(parents=True, exist_ok=True)
    config = gateway_config(directory, fakes, write_bundle(directory / "bundle", sections={"endpoints": policy}))
    for provider in config["providers"]:
        if provider["name"] in pooled:
            del provider["base_url"]
            provider.update(pool)
    (directory / "portcullis.yaml").write_text(yaml.safe_dump(config))
    return GatewayProcess(directory, directory / "portcullis.yaml").start()


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, session_fakes: Fakes, pods: FakePods) -> Iterator[GatewayProcess]:
    metrics = {"interval_seconds": SCRAPE_SECONDS, "timeout_seconds": 1}
    pool = {"endpoints": pods.endpoints, "endpoint_metrics": metrics, "endpoint_cooldown_seconds": COOLDOWN_SECONDS}
    running = pool_gateway(tmp_path_factory.mktemp("pool"), session_fakes, ("openai-main", "anthropic-us"), **pool)
    yield running
    running.stop()


class Conversation:
    """One chat, turn after turn, as an agent sends it: the whole history each time."""

    def __init__(self, client: openai.OpenAI, topic: str) -> None:
        self.client = client
        self.messages: list[dict[str, str]] = [{"role": "system", "content": "You are a careful assistant."}, {"role": "user", "content": topic}]

    def turn(self, stream: bool = False) -> str:
        """Send the conversation so far; the pod that answered."""
        if stream:
            chunks = list(self.client.chat.completions.create(model=MODEL, messages=self.messages, stream=True))  # type: ignore[arg-type]
            pods = {pod_of(chunk.id) for chunk in chunks}
            assert len(pods) == 1
            served, text = pods.pop(), "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
        else:
            completion = self.client.chat.completions.create(model=MODEL, messages=self.messages)  # type: ignore[arg-type]
            served, text = pod_of(completion.id), completion.choices[0].message.content or ""
        self.messages += [{"role": "assistant", "content": text}, {"role": "user", "content": f"and then? ({len(self.messages)})"}]
        return served


def client(gateway: GatewayProcess, team: str = "eng") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=gateway.key(team), max_retries=0)


def conversations(gateway: GatewayProcess, count: int, label: str) -> list[Conversation]:
    sdk = client(gateway)
    return [Conversation(sdk, f"{label}: task number {i}") for i in range(count)]


def wait_until(condition: Any, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


def test_one_conversation_reaches_the_same_pod_every_turn_streamed_or_not(gateway: GatewayProcess, pool: FakePods) -> None:
    chat = conversations(gateway, 1, "same-pod")[0]
    served = [chat.turn(stream=turn % 2 == 1) for turn in range(6)]
    assert len(set(served)) == 1
    home = pool.by_name(served[0])
    assert len(home.received) == 6 and all(not pod.received for pod in pool.pods if pod is not home)
    # the upstream saw the whole, growing conversation each turn
    assert [len(json.loads(r.body)["messages"]) for r in home.received] == [2, 4, 6, 8, 10, 12]


def test_many_conversations_spread_over_the_pods_and_each_keeps_its_own(gateway: GatewayProcess, pool: FakePods) -> None:
    chats = conversations(gateway, 60, "spread")
    first = [chat.turn() for chat in chats]
    counts = {pod.name: first.count(pod.name) for pod in pool.pods}
    assert all(count >= 5 for count in counts.values()) and max(counts.values()) <= 30, counts
    assert [chat.turn(stream=True) for chat in chats] == first
    # the same first message under another system text is another conversation: its own key, its own pod
    others = conversations(gateway, 60, "spread")
    for chat in others:
        chat.messages[0]["content"] = "You are a different assistant."
    assert [chat.turn() for chat in others] != first


def test_a_stopped_pod_gives_up_only_its_conversations_which_still_succeed_elsewhere(gateway: GatewayProcess, pool: FakePods) -> None:
    chats = conversations(gateway, 40, "failover")
    home = [chat.turn() for chat in chats]
    gone = pool.by_name(max(set(home), key=home.count))
    gone.stop()
    try:
        moved = [chat.turn(stream=i % 2 == 0) for i, chat in enumerate(chats)]  # every request succeeds
        for before, after in zip(home, moved, strict=True):
            assert after == before if before != gone.name else after != gone.name
        assert [chat.turn() for chat in chats] == moved  # the moved ones stay on their new pod
    finally:
        gone.start(gone.port)
    assert "refused a connection" in gateway.logs()
    time.sleep(COOLDOWN_SECONDS + 0.2)  # the pod rests, then its conversations come home
    assert [chat.turn() for chat in chats] == home


def test_an_overloaded_pod_is_skipped_for_the_next_on_the_ring_and_gets_its_conversations_back(gateway: GatewayProcess, pool: FakePods) -> None:
    chats = conversations(gateway, 12, "load")
    home = [chat.turn() for chat in chats]
    busy = pool.by_name(home[0])
    for metrics in ({WAITING: 9}, {KV_CACHE: 0.95}):  # over max_waiting 4; over max_kv_cache_percent 80
        busy.metrics = metrics
        assert wait_until(lambda: chats[0].turn() != busy.name), "the busy pod was not skipped"
        elsewhere = [chat.turn() for chat in chats]
        for before, after in zip(home, elsewhere, strict=True):
            assert after == before if before != busy.name else after != busy.name
        assert [chat.turn() for chat in chats] == elsewhere  # skipped to one pod, the same each turn
        busy.metrics = {WAITING: 1, KV_CACHE: 0.3}  # under both thresholds
        assert wait_until(lambda: chats[0].turn() == busy.name), "the pod did not get its conversation back"
        assert [chat.turn() for chat in chats] == home


def test_when_every_pod_is_overloaded_a_conversation_keeps_its_own_pod(gateway: GatewayProcess, pool: FakePods) -> None:
    chats = conversations(gateway, 8, "all-busy")
    home = [chat.turn() for chat in chats]
    for pod in pool.pods:
        pod.metrics = {WAITING: 50}
    time.sleep(SCRAPE_SECONDS * 4)
    assert [chat.turn() for chat in chats] == home  # load only chooses; it never refuses


def test_a_pod_whose_metrics_fail_is_not_treated_as_overloaded(gateway: GatewayProcess, pool: FakePods) -> None:
    chats = conversations(gateway, 8, "unknown-load")
    home = [chat.turn() for chat in chats]
    for pod in pool.pods:
        pod.metrics_status = 500
    time.sleep(SCRAPE_SECONDS * 4)
    assert [chat.turn() for chat in chats] == home
    assert "load unknown (metrics scrape: status 500)" in gateway.logs()


def test_the_thresholds_are_the_active_bundle_s_and_a_reload_changes_them(tmp_path: Path, fakes: Fakes, pool: FakePods) -> None:
    metrics = {"interval_seconds": SCRAPE_SECONDS}
    running = pool_gateway(tmp_path / "reload", fakes, policy={"max_waiting": 16}, endpoints=pool.endpoints, endpoint_metrics=metrics)
    try:
        chat = Conversation(client(running), "thresholds from the bundle")
        home = chat.turn()
        pool.by_name(home).metrics = {WAITING: 9}  # under 16
        time.sleep(SCRAPE_SECONDS * 4)
        assert chat.turn() == home
        write_bundle(running.directory / "bundle", sections={"endpoints": {"max_waiting": 8}}, revision="stricter")
        assert wait_until(lambda: "-> 'stricter'" in running.logs()), running.logs()
        assert chat.turn() != home  # 9 is over 8
    finally:
        running.stop()


def test_an_anthropic_provider_may_be_a_pool_too(gateway: GatewayProcess, pool: FakePods) -> None:
    claude = anthropic.Anthropic(base_url=gateway.url, api_key=gateway.key("eng"), max_retries=0)
    served: list[set[str]] = []
    for topic in (f"claude task {i}" for i in range(12)):
        messages: list[dict[str, str]] = [{"role": "user", "content": topic}]
        for _ in range(3):
            pool.reset()
            reply = claude.messages.create(model="claude-opus-4-1", max_tokens=16, system="be brief", messages=messages)  # type: ignore[arg-type]
            served.append({pod.name for pod in pool.pods if any(r.path == "/v1/messages" for r in pod.received)})
            messages += [{"role": "assistant", "content": reply.content[0].text}, {"role": "user", "content": "more"}]  # type: ignore[union-attr]
    assert all(len(pods) == 1 for pods in served)
    by_conversation = [set().union(*served[i : i + 3]) for i in range(0, len(served), 3)]
    assert all(len(pods) == 1 for pods in by_conversation)  # each conversation on one pod
    assert len(set().union(*by_conversation)) >= 2  # and the conversations on more than one


def test_endpoints_from_dns_are_resolved_and_served(tmp_path: Path, fakes: Fakes, pool: FakePods) -> None:
    target = pool.pods[2]
    dns = {"host": "localhost", "port": target.port, "scheme": "http", "refresh_seconds": 0.5}
    running = pool_gateway(tmp_path / "dns", fakes, endpoints_from_dns=dns, endpoint_metrics={"interval_seconds": SCRAPE_SECONDS})
    try:
        chat = Conversation(client(running), "resolved from DNS")
        assert {chat.turn(), chat.turn(stream=True)} == {target.name}
        assert f"endpoints from localhost now 1 (added ['http://127.0.0.1:{target.port}']" in running.logs()
        assert UPSTREAM_KEY not in running.logs()
    finally:
        running.stop()
