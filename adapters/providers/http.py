"""Providers reached over HTTP. aiohttp, not httpx: under concurrency its client
proxies several times more requests per second (measured; see the README).

A provider with a pool of endpoints (self-hosted pods) sends each request to the pod
its ``PodPool`` puts first. A pod that refuses the connection was sent nothing, so the
request goes on to the next pod in the pool's order (up to ``POD_TRIES``) and the pod
rests; any other failure is the dispatcher's, as for one endpoint."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping

import aiohttp
from yarl import URL

from portcullis.adapters import offload
from portcullis.adapters.config import ProviderConfig
from portcullis.adapters.providers import UpstreamUnreachable
from portcullis.adapters.providers.endpoints.pool import PodPool
from portcullis.engine.endpoint_policy import DEFAULT_POLICY, EndpointPolicy

POD_TRIES = 3


class HttpResponse:
    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response
        self.status = response.status
        self.headers: Mapping[str, str] = response.headers

    async def read(self, limit: int) -> bytes:
        body = bytearray()
        try:
            async for chunk in self._response.content.iter_any():
                body += chunk
                if len(body) > limit:
                    raise UpstreamUnreachable("response_too_large")
        except (TimeoutError, aiohttp.ClientError) as error:
            raise UpstreamUnreachable(_reason(error)) from None
        return bytes(body)

    async def chunks(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._response.content.iter_any():
                yield chunk
        except (TimeoutError, aiohttp.ClientError) as error:
            raise UpstreamUnreachable(_reason(error)) from None

    def release(self) -> None:
        # close(), not release(): an abandoned stream must not go back to the pool
        # half-read, and closing it is what stops the provider generating (and billing).
        self._response.close()


class HttpProvider:
    def __init__(self, config: ProviderConfig, protocol: str | None, endpoint_policy: Callable[[], EndpointPolicy] = lambda: DEFAULT_POLICY) -> None:
        self.name = config.name
        self.protocol = protocol
        self._config = config
        self._session: aiohttp.ClientSession | None = None
        self.pods = PodPool(config.name, config.pool, endpoint_policy) if config.pool is not None else None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = client_session(self._config)
        return self._session

    def protocol_for(self, model: str, client: str | None) -> str | None:
        return self.protocol

    async def send(self, path: str, query: str, headers: dict[str, str], body: bytes, affinity: str | None = None) -> HttpResponse:
        tail = path + (f"?{query}" if query else "")
        if self.pods is None:
            return await post(self._client(), f"{self._config.base_url}{tail}", headers, body)
        await self.pods.start()
        refused = UpstreamUnreachable("connect")  # no pod known yet: as if refused
        for endpoint in self.pods.order(affinity)[:POD_TRIES]:
            try:
                return await post(self._client(), f"{endpoint}{self.pods.config.base_path}{tail}", headers, body)
            except UpstreamUnreachable as failure:
                if failure.reason != "connect":  # it may have been sent: the dispatcher decides
                    raise
                self.pods.rest(endpoint)
                refused = failure
        raise refused

    async def close(self) -> None:
        if self.pods is not None:
            await self.pods.close()
        if self._session is not None:
            await self._session.close()


def client_session(config: ProviderConfig) -> aiohttp.ClientSession:
    """The pooled session a provider's requests share (created on first use, inside the loop)."""
    connector = aiohttp.TCPConnector(limit=config.max_connections, ttl_dns_cache=300, enable_cleanup_closed=True)
    timeout = aiohttp.ClientTimeout(total=None, connect=config.connect_timeout, sock_read=config.read_timeout)
    return aiohttp.ClientSession(connector=connector, timeout=timeout, auto_decompress=True, skip_auto_headers=("User-Agent",))


async def post(session: aiohttp.ClientSession, url: str | URL, headers: Mapping[str, str], body: bytes) -> HttpResponse:
    """POST ``body`` to ``url``, never following a redirect: one would carry the provider's
    credential and the prompt to another origin."""
    try:
        if len(body) > offload.threshold:  # sent in slices that yield to the loop, with its length (not chunked)
            headers = {**headers, "content-length": str(len(body))}
        response = await session.post(url, data=_payload(body), headers=headers, allow_redirects=False)
    except (TimeoutError, aiohttp.ClientError, OSError) as error:
        raise UpstreamUnreachable(_reason(error)) from None
    return HttpResponse(response)


def _payload(body: bytes) -> bytes | AsyncIterator[memoryview]:
    """A large body is written in slices that yield to the event loop between them; one
    write of 15 MB would hold the loop for the whole copy. Slices are views: no copy."""
    return _slices(body) if len(body) > offload.threshold else body


async def _slices(body: bytes) -> AsyncIterator[memoryview]:
    view = memoryview(body)
    for start in range(0, len(view), _SLICE):
        yield view[start : start + _SLICE]


_SLICE = 256 * 1024


def _reason(error: BaseException) -> str:
    if isinstance(error, asyncio.TimeoutError):
        return "timeout"
    if isinstance(error, aiohttp.ClientConnectorError):
        return "connect"
    return "connection_lost"
