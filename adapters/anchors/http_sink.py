"""The HTTP sink: each anchor POSTed as its JSON to a receiver the operator runs (a
transparency log, a SIEM, another team's service), signed as a Standard Webhook when a
secret is configured, so the receiver can tell the gateway's anchors from anyone's.
What the receiver keeps, and whether the gateway's owner can rewrite it there, is the
receiver's affair: the anchor proves as much as that store does.

A redirect is not followed (the signed body must not wander to another host) and counts
as a failure, as any answer outside 2xx does. Errors name the status or the exception's
class: the URL (its query may hold a token) and the secrets never appear.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from urllib.parse import urlsplit

import aiohttp

from portcullis.adapters.anchors.base import AnchorSinkError, anchor_body, from_env
from portcullis.adapters.audit_config import HttpSinkConfig
from portcullis.adapters.events.signing import ID_HEADER, TIMESTAMP_HEADER, new_message_id, parse_secret, signature_headers
from portcullis.engine.audit_anchors import Anchor

USER_AGENT = "Portcullis-Anchors/1"


class HttpSink:
    def __init__(self, config: HttpSinkConfig, env: Mapping[str, str] | None = None, now: Callable[[], float] = time.time) -> None:
        """Reads the secrets from ``env`` (default: the process's) now, so a missing one fails at start-up."""
        env = os.environ if env is None else env
        parts = urlsplit(config.url)
        try:
            port = parts.port
        except ValueError:
            port = None
            parts = parts._replace(scheme="")  # refused below
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise AnchorSinkError("anchor sink http: url must be an http or https URL with a host")
        self.name = f"http:{parts.hostname}" + (f":{port}" if port else "")
        self._url = config.url
        self._timeout = aiohttp.ClientTimeout(total=config.timeout_seconds)
        self._timeout_seconds = config.timeout_seconds
        self._now = now
        self._secret: bytes | None = None
        if config.secret_env:
            try:
                self._secret = parse_secret(from_env(env, config.secret_env, self.name))
            except ValueError as error:  # parse_secret's message never repeats the secret
                raise AnchorSinkError(f"anchor sink {self.name}: {config.secret_env}: {error}") from None
        self._bearer: str | None = None
        if config.bearer_token_env:
            self._bearer = from_env(env, config.bearer_token_env, self.name)
            if any(c in self._bearer for c in "\r\n"):
                raise AnchorSinkError(f"anchor sink {self.name}: {config.bearer_token_env} must be a single line")
        self._session: aiohttp.ClientSession | None = None

    async def write(self, anchor: Anchor) -> None:
        body = anchor_body(anchor)
        message_id, stamp = new_message_id(), int(self._now())
        headers = {"content-type": "application/json", "user-agent": USER_AGENT}
        if self._secret is not None:
            headers |= signature_headers(self._secret, message_id, stamp, body)
        else:  # unsigned: the receiver can still de-duplicate by id
            headers |= {ID_HEADER: message_id, TIMESTAMP_HEADER: str(stamp)}
        if self._bearer is not None:
            headers["authorization"] = f"Bearer {self._bearer}"
        if self._session is None:  # made on the event loop that uses it
            self._session = aiohttp.ClientSession()
        try:
            async with self._session.post(self._url, data=body, headers=headers, allow_redirects=False, timeout=self._timeout) as response:
                status = response.status
        except TimeoutError:
            raise AnchorSinkError(f"{self.name}: no answer within {self._timeout_seconds:g} s") from None
        except (aiohttp.ClientError, OSError) as error:  # the class only: messages can hold the URL
            raise AnchorSinkError(f"{self.name}: {type(error).__name__}") from None
        if not 200 <= status < 300:
            raise AnchorSinkError(f"{self.name}: answered HTTP {status}")

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
