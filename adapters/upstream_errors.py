"""What a provider's failure means for the request: move on to the next target, or
tell the client. Provider-side credential and routing problems are the operator's to
fix and are never described to the client; what a provider says about the request
reaches it without the account's details (ARNs, account ids, roles, signing)."""

from __future__ import annotations

import json
import logging
from typing import Any

from portcullis.adapters.json_bytes import parse
from portcullis.adapters.protocols.jsonbody import error_message
from portcullis.adapters.providers import UpstreamResponse, UpstreamUnreachable
from portcullis.engine.account_details import without_account_details
from portcullis.engine.errors import ErrorKind, GatewayError

log = logging.getLogger("portcullis.dispatch")

# Provider answers that say the request itself is wrong: another target would refuse
# it too, so they go back to the client. Any other non-2xx (overload, rate limits,
# timeouts, a target's expired credential or unknown model ID, a redirect) is about
# that target, and the next authorised one is tried.
CLIENT_ERROR_STATUS = frozenset({400, 413, 422, 431})
_CLIENT_ERROR_KINDS = {413: ErrorKind.REQUEST_TOO_LARGE, 431: ErrorKind.HEADERS_TOO_LARGE}


class TryNext(Exception):
    """This target failed before the client saw anything: the next one may serve."""

    def __init__(self, reason: str, error: GatewayError) -> None:
        super().__init__(reason)
        self.reason = reason  # the attempt's outcome in the audit record
        self.error = error  # what the client gets if no target serves


async def upstream_error(upstream: UpstreamResponse) -> GatewayError:
    """A provider's non-2xx answer as the client should see it."""
    try:
        body = json.loads(await upstream.read(1024 * 1024))
    except (UpstreamUnreachable, ValueError):
        body = None
    finally:
        upstream.release()
    status = upstream.status
    if status == 429:
        retry_after = _retry_after(upstream.headers.get("retry-after"))
        return GatewayError(
            ErrorKind.RATE_LIMITED, "the provider is rate limiting requests; try again later", code="upstream_rate_limited", retry_after=retry_after
        )
    if status in CLIENT_ERROR_STATUS:
        # The provider wrote it for the account's owner: ARNs, account ids and signing details are not the client's.
        message = without_account_details(error_message(body) or f"the provider rejected the request (status {status})")
        kind = _CLIENT_ERROR_KINDS.get(status, ErrorKind.INVALID_REQUEST)
        return GatewayError(kind, f"provider: {clip(message)}", code="upstream_invalid_request")
    if status >= 500 or status == 408:
        return GatewayError(ErrorKind.UPSTREAM, f"the provider failed (status {status})", code="upstream_error")
    log.warning("provider refused the gateway's request with status %d; check the provider's credential, base_url and model IDs", status)
    return GatewayError(ErrorKind.UPSTREAM, "the provider refused the gateway's request", code="upstream_refused")


async def read_json(upstream: UpstreamResponse, limit: int) -> tuple[bytes, Any]:
    """A 2xx answer's bytes and their JSON, the connection released; an answer cut short or
    not JSON is the next target's turn."""
    try:
        raw = await upstream.read(limit)
        return raw, parse(raw)
    except UpstreamUnreachable as failure:
        raise TryNext(failure.reason, unreachable(failure)) from None
    except ValueError:
        raise TryNext("malformed_response", GatewayError(ErrorKind.UPSTREAM, "the provider returned a malformed response")) from None
    finally:
        upstream.release()


def unreachable(failure: UpstreamUnreachable) -> GatewayError:
    if failure.reason == "timeout":
        return GatewayError(ErrorKind.TIMEOUT, "the provider did not answer in time", code="upstream_timeout")
    return GatewayError(ErrorKind.UPSTREAM, "the provider could not be reached", code="upstream_unreachable")


def clip(message: str, limit: int = 500) -> str:
    return message if len(message) <= limit else message[:limit] + "…"


def _retry_after(value: str | None) -> int | None:
    return int(value) if value and value.isdigit() else None
