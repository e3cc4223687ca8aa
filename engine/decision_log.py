"""Decision-log events in Open Policy Agent's decision-log format, from one decision.

Each event is the JSON object an OPA decision-log service receives: the decision's id,
the entry point evaluated (``path``), the input document the policy read (after
masking) and the document it returned (``result``), the bundle's revision, the labels
of the gateway that decided, and when. Portcullis adds the bundle's digest
(``bundle_digest``), since a revision names a bundle but only the digest proves which.

Masking follows OPA's ``remove`` semantics: each JSON pointer (RFC 6901, rooted at the
event: ``/input/...`` or ``/result/...``) that names a value removes it, a pointer that
names nothing changes nothing, and ``erased`` lists the pointers that removed
something. Pure: no I/O, no clock, no randomness.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

DECISION_PATH = "portcullis/decision"  # the entry point, as OPA names a path: data.portcullis.decision
BUNDLE_NAME = "portcullis"
APP = "portcullis"
MASKABLE_ROOTS = ("input", "result")
_SAMPLE_SPACE = float(1 << 64)

Pointer = tuple[str, ...]


class PointerError(ValueError):
    """A mask pointer that is not an RFC 6901 pointer under /input or /result."""


def parse_pointer(pointer: str) -> Pointer:
    """``/input/principal/user`` as its reference tokens (``~1`` is ``/``, ``~0`` is ``~``)."""
    if not pointer.startswith("/"):
        raise PointerError(f"{pointer!r} is not a JSON pointer (it must start with /)")
    tokens = pointer[1:].split("/")
    for token in tokens:
        if "~" in token.replace("~0", "").replace("~1", ""):
            raise PointerError(f"{pointer!r}: ~ must be escaped as ~0 (and / as ~1)")
    parsed = tuple(token.replace("~1", "/").replace("~0", "~") for token in tokens)
    if parsed[0] not in MASKABLE_ROOTS:
        raise PointerError(f"{pointer!r} must start with /input or /result")
    return parsed


def format_pointer(pointer: Pointer) -> str:
    return "".join("/" + token.replace("~", "~0").replace("/", "~1") for token in pointer)


def erase(document: Any, pointer: Pointer) -> bool:
    """Remove the value ``pointer`` names from ``document`` (in place); False when it
    names nothing: a missing key, an index out of range, or a step through a scalar."""
    parent = document
    for token in pointer[:-1]:
        parent = _child(parent, token)
        if parent is _MISSING:
            return False
    last = pointer[-1]
    if isinstance(parent, dict):
        return parent.pop(last, _MISSING) is not _MISSING
    if isinstance(parent, list):
        index = _index(last, len(parent))
        if index is None:
            return False
        del parent[index]
        return True
    return False


def sampled(decision_id: str, ratio: float) -> bool:
    """Whether this decision is logged: a hash of its id below ``ratio``, so every
    replica (and a replay) picks the same decisions, whatever order they came in."""
    if ratio >= 1.0:
        return True
    if ratio <= 0.0:
        return False
    digest = hashlib.blake2b(decision_id.encode("utf-8", "surrogatepass"), digest_size=8, person=b"portcullis-dl").digest()
    return int.from_bytes(digest, "big") / _SAMPLE_SPACE < ratio


def rfc3339_nanos(when: dt.datetime) -> str:
    """UTC, with nine fractional digits: ``2025-06-01T12:00:00.123456000Z``."""
    utc = when.astimezone(dt.UTC) if when.tzinfo is not None else when.replace(tzinfo=dt.UTC)
    return f"{utc:%Y-%m-%dT%H:%M:%S}.{utc.microsecond:06d}000Z"


def decision_event(
    *,
    decision_id: str,
    input_document: Any,
    result: Any,
    revision: str,
    digest: str,
    labels: Mapping[str, str],
    timestamp: dt.datetime,
    mask: Sequence[Pointer] = (),
    metrics: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """One decision as an OPA decision-log event. ``input_document`` and ``result`` are
    the event's own from here on: masking removes from them in place (copy a shared one)."""
    event: dict[str, Any] = {
        "decision_id": decision_id,
        "labels": dict(labels),
        "bundles": {BUNDLE_NAME: {"revision": revision}},
        "path": DECISION_PATH,
        "input": input_document,
        "result": result,
        "timestamp": rfc3339_nanos(timestamp),
        "bundle_digest": digest,
    }
    if metrics:
        event["metrics"] = dict(metrics)
    erased = [format_pointer(pointer) for pointer in mask if _erase_from(event, pointer)]
    if erased:
        event["erased"] = erased
    return event


def _erase_from(event: dict[str, Any], pointer: Pointer) -> bool:
    if len(pointer) == 1:  # the whole input (or result)
        return event.pop(pointer[0], _MISSING) is not _MISSING
    return erase(event.get(pointer[0], _MISSING), pointer[1:])


class _Missing:
    pass


_MISSING: Any = _Missing()


def _child(value: Any, token: str) -> Any:
    if isinstance(value, dict):
        return value.get(token, _MISSING)
    if isinstance(value, list):
        index = _index(token, len(value))
        return _MISSING if index is None else value[index]
    return _MISSING


def _index(token: str, length: int) -> int | None:
    """An array index as RFC 6901 spells one: digits, no leading zero, in range."""
    if not token.isdigit() or not token.isascii() or (len(token) > 1 and token[0] == "0"):
        return None
    index = int(token)
    return index if index < length else None
