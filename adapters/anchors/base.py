"""What every anchor sink is: written to by the anchorer, read back by ``audit verify``.
Sink names and error messages are shown in logs and metrics: they name the file, the
bucket and prefix or the host, never a URL's query, a key or a secret."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from portcullis.adapters.json_bytes import compact
from portcullis.engine.audit_anchors import Anchor


class AnchorSinkError(Exception):
    """A sink could not be opened, written or read; the message is safe to log."""


class AnchorSink(Protocol):
    name: str  # "file:/path", "s3://bucket/prefix/", "http:host:port"

    async def write(self, anchor: Anchor) -> None:
        """Keep ``anchor`` durably, or raise ``AnchorSinkError``."""
        ...

    async def close(self) -> None: ...


@dataclass(frozen=True)
class AnchorReading:
    """One chain's anchors as a source holds them, and what it holds that is not one."""

    chain: str
    anchors: tuple[Anchor, ...]
    damaged: tuple[str, ...] = ()  # each: where, and why it is not an anchor
    hidden: int = 0  # S3: anchors behind a delete marker (read all the same; the gateway never deletes)


class AnchorSource(Protocol):
    """Anchors read back for verification (a file sink's file, an S3 bucket and prefix)."""

    name: str

    def chains(self) -> list[str]:
        """The chains the source holds anchors of, sorted."""
        ...

    def read(self, chain: str) -> AnchorReading: ...


def anchor_body(anchor: Anchor) -> bytes:
    return compact(anchor.as_record())


def from_env(env: Mapping[str, str], variable: str, sink: str) -> str:
    """A secret named in the configuration; the error names the variable, never a value."""
    value = env.get(variable)
    if not value:
        raise AnchorSinkError(f"anchor sink {sink}: environment variable {variable} is not set")
    return value
