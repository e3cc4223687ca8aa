"""Layer B: untrusted content (tool results, retrieved documents) wrapped in
boundaries the content cannot close.

The boundary's suffix is an HMAC of the gateway's key and the request's scope: a
session's turns share it, so earlier tool results keep their bytes and the prompt
prefix stays cacheable, while whoever wrote the content cannot predict it. Without a
session the scope is the request. Content that still contains the suffix (it can
only have learned it from an earlier answer) has it replaced before wrapping.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from dataclasses import dataclass

_ATTRIBUTE = re.compile(r"[^A-Za-z0-9_.:/@+-]")


@dataclass(frozen=True)
class Boundary:
    suffix: str

    @property
    def tag(self) -> str:
        return f"untrusted-{self.suffix}"

    def opening(self, source: str, **attributes: str | None) -> str:
        named = "".join(f' {name}="{_attribute(value)}"' for name, value in attributes.items() if value)
        return f'<{self.tag} source="{source}"{named}>'

    def closing(self) -> str:
        return f"</{self.tag}>"

    def clean(self, text: str) -> str:
        if self.suffix not in text.lower():  # the suffix is lowercase hex; a model may echo it in capitals
            return text
        return re.sub(re.escape(self.suffix), "[boundary removed]", text, flags=re.IGNORECASE)

    def wrap(self, text: str, source: str, **attributes: str | None) -> str:
        return f"{self.opening(source, **attributes)}\n{self.clean(text)}\n{self.closing()}"


def boundary_for(key: bytes, scope: str) -> Boundary:
    return Boundary(hmac.new(key, scope.encode(), hashlib.sha256).hexdigest()[:16])


def _attribute(value: str) -> str:
    """Client-chosen names (tool names, ids) cannot break out of the tag."""
    return _ATTRIBUTE.sub("_", value[:128])
