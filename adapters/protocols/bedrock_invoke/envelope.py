"""What an InvokeModel request for Claude has that a Messages request has not: the model
named in the path (``bedrock_paths``), ``anthropic_version`` in the body and the beta features as a body
list (``anthropic_beta``) where Anthropic reads an ``anthropic-beta`` header. Both
translator pairs and the ingress parser read and write the envelope here."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from portcullis.adapters.config import RequestLimits
from portcullis.adapters.protocols.jsonbody import invalid
from portcullis.engine.errors import ErrorKind, GatewayError

VERSION = "bedrock-2023-05-31"  # the anthropic_version Bedrock documents for the Messages body
VERSION_MEMBER = "anthropic_version"
BETA_MEMBER = "anthropic_beta"
BETA_HEADER = "anthropic-beta"
# Members a Messages body has and an Invoke body must not: Bedrock refuses them (the path says both).
MESSAGES_ONLY = ("model", "stream")
# A beta name goes into an HTTP header when the provider is Anthropic: nothing that could break one.
_BETA_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def check_envelope(body: Mapping[str, Any]) -> None:
    """Refuses what Bedrock would, naming the member: ``model`` or ``stream`` present,
    ``anthropic_version`` missing or not a string, ``anthropic_beta`` not a list of beta
    names."""
    for name in MESSAGES_ONLY:
        if name in body:
            raise invalid(f"{name}: not permitted in an InvokeModel body (the path names the model and whether to stream)")
    version = body.get(VERSION_MEMBER)
    if version is None:
        raise invalid(f"{VERSION_MEMBER}: field required ({VERSION!r})")
    # Any version string passes: Bedrock judges it, and AnthropicBedrock sends its SDK's own.
    if not isinstance(version, str) or not version:
        raise invalid(f"{VERSION_MEMBER}: expected a non-empty string such as {VERSION!r}")
    betas = body.get(BETA_MEMBER)
    if betas is None:
        return
    if not isinstance(betas, list):
        raise invalid(f"{BETA_MEMBER}: expected an array of strings")
    for i, beta in enumerate(betas):
        if not isinstance(beta, str) or not _BETA_NAME.fullmatch(beta):
            raise invalid(f"{BETA_MEMBER}[{i}]: expected a beta feature name (letters, digits, '.', '_', '-')")


def beta_header(body: Mapping[str, Any], limits: RequestLimits) -> dict[str, str]:
    """The body's beta list as the ``anthropic-beta`` header an Anthropic provider reads
    (empty when it has none); refused past the header cap, as a client header would be."""
    betas = body.get(BETA_MEMBER) or []
    if not betas:
        return {}
    value = ",".join(betas)
    if len(value) > limits.max_header_bytes:
        raise GatewayError(
            ErrorKind.HEADERS_TOO_LARGE, f"{BETA_MEMBER}: longer than this gateway forwards ({limits.max_header_bytes} bytes)", code="header_too_large"
        )
    return {BETA_HEADER: value}


def header_betas(forward: Mapping[str, str]) -> list[str]:
    """A Messages client's ``anthropic-beta`` header (comma-separated) as a beta list."""
    return [name for name in (part.strip() for part in forward.get(BETA_HEADER, "").split(",")) if name]
