"""Amazon Bedrock Runtime as a provider: every request signed with SigV4 (botocore's
signer, service name ``bedrock``) by credentials from the standard AWS chain, never
from the configuration or the bundle.

The credentials are resolved once at start-up, so a gateway without any fails to start
and says where it looked. Temporary ones (web identity, container, instance) are
refreshed by botocore before they expire; a refresh can be a network call, so it runs
on a worker thread and the event loop never waits on it.

The path arrives percent-encoded (``/model/anthropic.claude-...-v1%3A0/converse``,
ARNs with ``%2F``) and goes out exactly as it was signed: aiohttp is handed an
already-encoded URL and leaves it alone (a plain string would be re-quoted, ``%3A``
turned back into ``:``, and the signature would no longer match). botocore's canonical
request encodes that path once more (``%253A``), as AWS recomputes it for every service
but S3, so what boto3 itself signs and what is signed here agree. Only the headers Bedrock reads go upstream,
so nothing of the client's (a credential above all) reaches AWS; Bedrock Runtime's
operations take no query string, so the client's is not sent either.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Mapping
from typing import Protocol
from urllib.parse import quote

import aiohttp
import botocore.exceptions
import botocore.session
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials, ReadOnlyCredentials
from yarl import URL

from portcullis.adapters import offload
from portcullis.adapters.config import ConfigError, ProviderConfig
from portcullis.adapters.providers import UpstreamUnreachable
from portcullis.adapters.providers.http import HttpResponse, client_session, post

log = logging.getLogger("portcullis.providers.bedrock")


class _WithoutTraceback(logging.Filter):
    """botocore logs a failed credential refresh with its traceback; the gateway logs
    the failure itself, in one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.exc_info, record.exc_text = None, None
        return True


logging.getLogger("botocore.credentials").addFilter(_WithoutTraceback())

SERVICE = "bedrock"  # the signing name of Bedrock Runtime (its endpoint prefix is bedrock-runtime)
INVOKE = "bedrock_invoke"
CONVERSE = "bedrock_converse"
# Clients whose requests go to an Anthropic model as InvokeModel: a Messages body with a new envelope.
INVOKE_CLIENTS = frozenset({"anthropic_messages", INVOKE})
# What Bedrock reads besides the signature; every other header is dropped.
_FORWARDED = frozenset({"content-type", "accept"})
_FORWARDED_PREFIXES = ("x-amzn-bedrock-",)  # Bedrock reads no other header of the gateway's
_CHAIN = "environment, shared config/credentials profile, web identity (IRSA), container (ECS/Pod Identity), instance metadata"
# A model id, behind a cross-region inference profile's prefix or not: us.anthropic.claude-...
_ANTHROPIC_ID = re.compile(r"(?:[a-z][a-z-]*\.)?anthropic\.")


class _Credentials(Protocol):
    def get_frozen_credentials(self) -> ReadOnlyCredentials: ...


def is_anthropic_model(model: str) -> bool:
    """An Anthropic model on Bedrock: ``anthropic.claude-...``, behind an optional
    cross-region prefix (``us.``, ``eu.``, ``apac.``, ``global.``), or an ARN (of a
    foundation model or an inference profile) whose resource names one."""
    if model.startswith("arn:"):
        return "anthropic." in model.split(":", 5)[-1]
    return _ANTHROPIC_ID.match(model) is not None


def resolve_credentials(config: ProviderConfig) -> Credentials:
    """The AWS credential chain's answer for ``config`` (its profile, if it names one),
    or a ConfigError naming the provider and where the chain looked."""
    try:
        credentials = botocore.session.Session(profile=config.profile).get_credentials()
    except botocore.exceptions.BotoCoreError as error:
        raise ConfigError(f"providers.{config.name}: AWS credentials could not be loaded ({type(error).__name__})") from None
    if credentials is None:
        raise ConfigError(f"providers.{config.name}: no AWS credentials found (looked in: {_CHAIN})")
    return credentials


def sign(credentials: ReadOnlyCredentials, region: str, url: str, headers: Mapping[str, str], body: bytes) -> dict[str, str]:
    """``headers`` with SigV4's own added (Authorization, X-Amz-Date, and the session
    token when there is one) for a POST of ``body`` to ``url``."""
    request = AWSRequest(method="POST", url=url, data=body, headers=dict(headers))
    SigV4Auth(credentials, SERVICE, region).add_auth(request)
    return dict(request.headers.items())


class BedrockProvider:
    def __init__(self, config: ProviderConfig, credentials: _Credentials | None = None) -> None:
        if not config.region:
            raise ConfigError(f"providers.{config.name}: type bedrock needs a region")
        self.name = config.name
        self._config = config
        self._region = config.region
        self._credentials = credentials if credentials is not None else resolve_credentials(config)
        self._fresh = False  # frozen credentials were had once: a later read needs no I/O unless refresh_needed
        self._refresh: asyncio.Task[ReadOnlyCredentials] | None = None
        self._session: aiohttp.ClientSession | None = None

    def protocol_for(self, model: str, client: str | None) -> str | None:
        """InvokeModel for an Anthropic model asked in Messages (its body carries over
        nearly untouched); Converse, which every Bedrock model speaks, otherwise."""
        return INVOKE if client in INVOKE_CLIENTS and is_anthropic_model(model) else CONVERSE

    async def send(self, path: str, query: str, headers: dict[str, str], body: bytes, affinity: str | None = None) -> HttpResponse:
        credentials = await self._current()
        url = self._config.base_url + quote(path, safe="/%")  # already encoded; anything left raw is encoded now
        outbound = {name: value for name, value in headers.items() if _forwarded(name)}
        signed = await offload.off_loop(len(body), sign, credentials, self._region, url, outbound, body)  # hashes the body
        if self._session is None:
            self._session = client_session(self._config)
        return await post(self._session, URL(url, encoded=True), signed, body)

    async def _current(self) -> ReadOnlyCredentials:
        """Credentials to sign with. Reading them is local unless botocore must refresh
        them (or has not loaded them yet); then it is done once, off the loop, however
        many requests are waiting."""
        refresh_needed = getattr(self._credentials, "refresh_needed", None)
        if self._fresh and not (refresh_needed is not None and refresh_needed()):
            return self._credentials.get_frozen_credentials()
        if self._refresh is None:
            self._refresh = asyncio.ensure_future(asyncio.to_thread(self._credentials.get_frozen_credentials))
            self._refresh.add_done_callback(self._refreshed)
        try:
            return await asyncio.shield(self._refresh)
        except Exception as error:  # any failure of the chain: this target cannot sign, the next may serve
            log.warning("provider %s: AWS credentials could not be refreshed (%s)", self.name, type(error).__name__)
            raise UpstreamUnreachable("credentials") from None

    def _refreshed(self, task: asyncio.Task[ReadOnlyCredentials]) -> None:
        self._refresh = None
        self._fresh = not task.cancelled() and task.exception() is None

    async def close(self) -> None:
        if self._refresh is not None:
            self._refresh.cancel()
        if self._session is not None:
            await self._session.close()


def _forwarded(name: str) -> bool:
    lower = name.lower()
    return lower in _FORWARDED or lower.startswith(_FORWARDED_PREFIXES)
