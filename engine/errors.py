"""Protocol-neutral errors. Each ingress protocol renders them in its own wire format,
so the client always reads an error the way its SDK expects."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from enum import Enum


class ErrorKind(Enum):
    INVALID_REQUEST = 400
    AUTHENTICATION = 401
    PAYMENT_REQUIRED = 402
    PERMISSION = 403
    NOT_FOUND = 404
    METHOD_NOT_ALLOWED = 405
    UPGRADE_REQUIRED = 426  # a protocol upgrade (WebSocket) this gateway does not speak
    REQUEST_TIMEOUT = 408
    REQUEST_TOO_LARGE = 413
    HEADERS_TOO_LARGE = 431
    RATE_LIMITED = 429
    INTERNAL = 500
    UPSTREAM = 502
    UNAVAILABLE = 503
    TIMEOUT = 504

    @property
    def status(self) -> int:
        return self.value


@dataclass
class GatewayError(Exception):
    """An error to return to the client. ``message`` must never carry prompt text,
    keys or personal data: it is shown to the client and written to logs."""

    kind: ErrorKind
    message: str
    code: str | None = None
    retry_after: int | None = None

    def __str__(self) -> str:
        return f"{self.kind.name.lower()}: {self.message}"

    @property
    def error_code(self) -> str:
        """The machine-readable code every refusal carries: the specific one when the
        refusal has it, else one per kind (``invalid_request``, ``not_found``, ...)."""
        return self.code or self.kind.name.lower()


def printable(name: object) -> str:
    """A client-chosen name (a model, a field) safe to echo in errors and logs: clients
    can put anything, personal data included, where a name is expected."""
    text = name if isinstance(name, str) else ""
    if _NAME.fullmatch(text) and not _PERSONAL_LOOKING.search(text):
        return text
    return "<unprintable name>"


# 1 to 128 characters, each alphanumeric (re's \w is str.isalnum() plus "_") or one of "._:/@-[]":
# one C-level match where a generator tested each character (a request logs its model twice).
_NAME = re.compile(r"[\w.:/@\-\[\]]{1,128}")
# An e-mail address, or a digit run longer than any date stamp in a model ID (phone, card and ID numbers).
_PERSONAL_LOOKING = re.compile(r"@[^@]*\.[^@]*[A-Za-z]|\d{9,}")


EXCERPT_CHARS = 32


def excerpt(value: object) -> str:
    """A client value named in an error: strings as a short JSON-escaped excerpt (so
    control characters and markup stay inert and a 200 KB value stays 32 characters),
    anything else by its JSON type, never its content."""
    if isinstance(value, str):
        clipped = value[:EXCERPT_CHARS]
        quoted = json.dumps(clipped).replace("<", "\\u003c").replace(">", "\\u003e")
        return quoted[:-1] + '…"' if len(value) > EXCERPT_CHARS else quoted
    return json_type(value)


def json_type(value: object) -> str:
    """The JSON type of a parsed value, as a client would name it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"
