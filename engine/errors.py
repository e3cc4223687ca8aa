"""Protocol-neutral errors. Each ingress protocol renders them in its own wire format,
so the client always reads an error the way its SDK expects."""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum


class ErrorKind(Enum):
    INVALID_REQUEST = 400
    AUTHENTICATION = 401
    PAYMENT_REQUIRED = 402
    PERMISSION = 403
    NOT_FOUND = 404
    REQUEST_TOO_LARGE = 413
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


def printable(name: object) -> str:
    """A client-chosen name (a model, a field) safe to echo in errors and logs: clients
    can put anything, personal data included, where a name is expected."""
    text = name if isinstance(name, str) else ""
    if 0 < len(text) <= 128 and all(ch.isalnum() or ch in "._:/@-[]" for ch in text) and not _PERSONAL_LOOKING.search(text):
        return text
    return "<unprintable name>"


# An e-mail address, or a digit run longer than any date stamp in a model ID (phone, card and ID numbers).
_PERSONAL_LOOKING = re.compile(r"@[^@]*\.[^@]*[A-Za-z]|\d{9,}")
