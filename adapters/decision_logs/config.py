"""The ``decision_logs`` section: where each decision the policy made is logged, in Open
Policy Agent's decision-log format (engine/decision_log.py), and what is masked. Off
unless configured. The HTTP sink's bearer token is read from the environment once, at
start-up, so a missing one stops the gateway before it serves. Errors name the field or
the variable, never a value: the URL's query may hold a token."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from portcullis.engine.decision_log import Pointer, PointerError, parse_pointer


class DecisionLogsConfigError(Exception):
    """A decision-log setting cannot be used; the message names it, never a secret."""


@dataclass(frozen=True)
class FileSinkConfig:
    path: Path  # JSON lines, one event each, appended


@dataclass(frozen=True)
class HttpSinkConfig:
    url: str = field(repr=False)  # its query may hold a token
    bearer_token_env: str | None = None
    timeout_seconds: float = 5.0  # each attempt
    max_attempts: int = 5  # per batch, on network errors, 408, 425, 429 and 5xx

    def token(self, environ: Mapping[str, str] | None = None) -> str | None:
        """The bearer token, read at start-up so a missing one stops it."""
        if self.bearer_token_env is None:
            return None
        value = (os.environ if environ is None else environ).get(self.bearer_token_env, "").strip()
        if not value or "\n" in value or "\r" in value:
            raise DecisionLogsConfigError(f"decision_logs.http.bearer_token_env: environment variable {self.bearer_token_env} is not set")
        return value


@dataclass(frozen=True)
class DecisionLogsConfig:
    file: FileSinkConfig | None = None
    http: HttpSinkConfig | None = None
    sample_ratio: float = 1.0  # of decisions, chosen by a hash of the decision id: replicas agree
    mask: tuple[Pointer, ...] = ()  # removed from each event (OPA's remove), /input/... or /result/...
    buffer_events: int = 10_000  # waiting to be written or sent; when full the oldest go, counted
    flush_seconds: float = 5.0
    max_batch_events: int = 500

    @property
    def enabled(self) -> bool:
        return self.file is not None or self.http is not None


def decision_logs_config(section: Mapping[str, Any] | None, resolve: Callable[[str], Path]) -> DecisionLogsConfig:
    """From the validated ``decision_logs`` section (``schemas/config.schema.json``, which
    guarantees the types and ranges); absent: off."""
    if not section:
        return DecisionLogsConfig()
    if "file" not in section and "http" not in section:
        raise DecisionLogsConfigError("decision_logs: name a sink, file (a path) or http (a url), or leave the section out")
    mask = []
    for index, pointer in enumerate(section.get("mask", [])):
        try:
            mask.append(parse_pointer(pointer))
        except PointerError as error:
            raise DecisionLogsConfigError(f"decision_logs.mask[{index}]: {error}") from None
    http = section.get("http")
    if http is not None:
        parts = urlsplit(http["url"])
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise DecisionLogsConfigError("decision_logs.http.url: must be an http or https URL with a host")
    config = DecisionLogsConfig(
        file=FileSinkConfig(resolve(section["file"]["path"])) if "file" in section else None,
        http=HttpSinkConfig(
            url=http["url"],
            bearer_token_env=http.get("bearer_token_env"),
            timeout_seconds=float(http.get("timeout_seconds", 5.0)),
            max_attempts=int(http.get("max_attempts", 5)),
        )
        if http is not None
        else None,
        sample_ratio=float(section.get("sample_ratio", 1.0)),
        mask=tuple(mask),
        buffer_events=int(section.get("buffer_events", 10_000)),
        flush_seconds=float(section.get("flush_seconds", 5.0)),
        max_batch_events=int(section.get("max_batch_events", 500)),
    )
    if config.max_batch_events > config.buffer_events:
        raise DecisionLogsConfigError("decision_logs.max_batch_events: larger than decision_logs.buffer_events, so a batch could never fill")
    return config
