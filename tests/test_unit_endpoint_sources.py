"""Where a pool's pods come from and how loaded they are, over real sockets: the DNS
source with the event loop's resolver (``localhost``; a ``.invalid`` name never
resolves), and the scraper against fake pods' ``/metrics``."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from portcullis.adapters.config import ConfigError, load_config
from portcullis.adapters.endpoint_config import DnsEndpoints, EndpointPool
from portcullis.adapters.providers.endpoints.dns import DnsEndpointSource, origin
from portcullis.adapters.providers.endpoints.pool import PodPool
from portcullis.adapters.providers.endpoints.scraper import LoadScraper
from portcullis.engine.endpoint_policy import DEFAULT_POLICY
from portcullis.engine.pod_load import MAX_BYTES, PodLoad
from tests.fakes import FakeProvider, free_port
from tests.fakes.pods import KV_CACHE, WAITING, FakePods


def test_a_dns_name_becomes_one_endpoint_per_address_and_ipv6_is_bracketed() -> None:
    seen: list[frozenset[str]] = []
    source = DnsEndpointSource("vllm", DnsEndpoints("localhost", 8000), seen.append)
    assert asyncio.run(source.refresh()) is True
    assert source.current == {"http://127.0.0.1:8000"} or "http://[::1]:8000" in source.current
    assert seen == [source.current]
    assert origin("https", "::1", 443) == "https://[::1]:443" and origin("http", "10.1.2.3", 80) == "http://10.1.2.3:80"


def test_a_failed_lookup_keeps_the_last_good_set_and_a_change_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    seen: list[frozenset[str]] = []
    spec = DnsEndpoints("localhost", 8000, refresh_seconds=0.05)
    source = DnsEndpointSource("vllm", spec, seen.append)

    async def run() -> None:
        assert await source.refresh()
        source._spec = replace(spec, host="pods.portcullis-test.invalid")  # the Service's name stops resolving
        assert not await source.refresh()
        source._spec = replace(spec, port=9000)  # a new set
        assert await source.refresh()
        assert await source.refresh()  # the same set: no change

    with caplog.at_level(logging.INFO, "portcullis.endpoints"):
        asyncio.run(run())
    assert len(seen) == 2 and seen[-1] == source.current and all(e.endswith(":9000") for e in source.current)
    messages = [record.getMessage() for record in caplog.records]
    assert sum("now 1" in message for message in messages) == 2
    assert any("pods.portcullis-test.invalid failed" in message and "keeping 1 endpoints" in message for message in messages)


def test_the_pool_waits_for_its_first_lookup_and_refreshes_in_the_background() -> None:
    async def run() -> tuple[frozenset[str], list[str]]:
        pool = PodPool("vllm", EndpointPool(dns=DnsEndpoints("localhost", 8123, refresh_seconds=0.05), scrape_seconds=0), lambda: DEFAULT_POLICY)
        await pool.start()
        endpoints = pool.endpoints
        order = pool.order("conversation")
        await asyncio.sleep(0.2)  # refreshes run; nothing changed
        assert pool.endpoints == endpoints
        await pool.close()
        return endpoints, order

    endpoints, order = asyncio.run(run())
    assert endpoints and sorted(order) == sorted(endpoints) and all(e.endswith(":8123") for e in endpoints)


@pytest.fixture(scope="module")
def pods() -> FakePods:
    running = FakePods(3, "sk-unused").start()
    yield running
    running.stop()


def test_the_scraper_reads_each_pod_and_a_failing_pod_is_unknown(pods: FakePods, caplog: pytest.LogCaptureFixture) -> None:
    pods.reset()
    pods.pods[0].metrics = {WAITING: 20, KV_CACHE: 0.5}
    pods.pods[1].metrics_status = 503
    closed = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    endpoints = frozenset([*pods.endpoints, closed])
    scraper = LoadScraper("vllm", lambda: endpoints, "/metrics", timeout=2)

    async def run() -> None:
        await scraper.scrape_all()
        await scraper.close()

    with caplog.at_level(logging.WARNING, "portcullis.endpoints"):
        asyncio.run(run())
    assert scraper.loads == {pods.pods[0].url: PodLoad(20.0, 0.5), pods.pods[1].url: None, pods.pods[2].url: PodLoad(None, None), closed: None}
    warned = " ".join(record.getMessage() for record in caplog.records)
    assert "status 503" in warned and closed in warned


def test_a_huge_or_slow_metrics_body_leaves_the_load_unknown() -> None:
    from starlette.responses import Response, StreamingResponse
    from starlette.routing import Route

    async def huge(request: object) -> Response:
        return Response(b"x_metric 1\n" * (MAX_BYTES // 10 + 10), media_type="text/plain")

    async def slow(request: object) -> StreamingResponse:
        async def body():  # type: ignore[no-untyped-def]
            yield b"vllm:num_requests_waiting 1\n"
            await asyncio.sleep(5)

        return StreamingResponse(body(), media_type="text/plain")

    fake = FakeProvider("sk-unused", "odd")
    fake.app.router.routes[:0] = [Route("/huge", huge), Route("/slow", slow)]
    fake.start()
    try:
        loads = {}
        for path in ("/huge", "/slow"):
            scraper = LoadScraper("vllm", lambda: frozenset([fake.url]), path, timeout=0.5)

            async def run(scraper: LoadScraper = scraper) -> None:
                await scraper.scrape_all()
                await scraper.close()

            asyncio.run(run())
            loads[path] = scraper.loads
        assert loads == {"/huge": {fake.url: None}, "/slow": {fake.url: None}}
    finally:
        fake.stop()


def _config(tmp_path: Path, provider: dict) -> Path:
    path = tmp_path / "portcullis.yaml"
    path.write_text(yaml.safe_dump({"policy": {"bundle": "b"}, "providers": [{"name": "vllm", "type": "openai", "api_key_env": "K", **provider}]}))
    return path


@pytest.mark.parametrize(
    "provider, message",
    [
        ({"base_url": "http://a/v1", "endpoints": ["http://a:1"]}, "base_url or endpoints/endpoints_from_dns, not both"),
        ({"endpoints": ["http://a:1"], "endpoints_from_dns": {"host": "a", "port": 1}}, "exactly one"),
        ({"endpoints": ["ftp://a:1"]}, "endpoints[0]"),
        ({"endpoints": ["http://a:1/v1"]}, "the API path goes in base_path"),
        ({"endpoints": ["http://user:secret@a:1"]}, "credentials do not belong in a URL"),
        ({"endpoints": ["http://a:1", "http://a:1/"]}, "listed twice"),
        ({"endpoints": []}, "endpoints"),
        ({"endpoints": ["http://a:99999"]}, "not a valid URL"),
        ({"endpoints_from_dns": {"host": "http://svc", "port": 8000}}, "a DNS name, without scheme or port"),
        ({"endpoints_from_dns": {"host": "svc"}}, "'port' is a required property"),
        ({"endpoints_from_dns": {"host": "svc", "port": 1, "scheme": "grpc"}}, "scheme"),
        ({"endpoints": ["http://a:1"], "base_path": "v1"}, "base_path must start with /"),
        ({"endpoints": ["http://a:1"], "endpoint_metrics": {"interval_seconds": -1}}, "interval_seconds"),
        ({"base_url": "http://a/v1", "endpoint_cooldown_seconds": 3}, "not both"),
    ],
)
def test_a_bad_pool_is_refused_naming_the_field(tmp_path: Path, provider: dict, message: str) -> None:
    with pytest.raises(ConfigError) as refused:
        load_config(_config(tmp_path, provider))
    assert message in str(refused.value) and "secret" not in str(refused.value)


def test_a_pool_for_a_bedrock_provider_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "portcullis.yaml"
    path.write_text(
        yaml.safe_dump({"policy": {"bundle": "b"}, "providers": [{"name": "b", "type": "bedrock", "region": "us-east-1", "endpoints": ["http://a:1"]}]})
    )
    with pytest.raises(ConfigError, match="endpoints applies only to types openai and anthropic"):
        load_config(path)


def test_a_pool_is_read_with_its_defaults(tmp_path: Path) -> None:
    static = load_config(_config(tmp_path, {"endpoints": ["http://pod-a:8000", "http://[::1]:8001/"]})).providers["vllm"].pool
    assert static is not None and static.static == ("http://pod-a:8000", "http://[::1]:8001") and static.base_path == "/v1"
    assert (static.scrape_seconds, static.scrape_timeout_seconds, static.metrics_path) == (5.0, 2.0, "/metrics")
    assert static.cooldown_seconds == 5.0 and static.scrapes
    dns = {"endpoints_from_dns": {"host": "vllm-qwen.ns.svc.cluster.local", "port": 8000}, "endpoint_metrics": {"interval_seconds": 0}}
    pool = load_config(_config(tmp_path, dns)).providers["vllm"].pool
    assert pool is not None and pool.dns == DnsEndpoints("vllm-qwen.ns.svc.cluster.local", 8000, "http", 10.0) and not pool.scrapes
    one = load_config(_config(tmp_path, {"endpoints": ["http://pod-a:8000"]})).providers["vllm"].pool
    assert one is not None and not one.scrapes  # one pod: nothing to choose between
