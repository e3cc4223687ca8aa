"""Optional body capture for investigations: the request body as the gateway passes it
on (after the PII transforms, so masked; in the client's protocol, before a target is
chosen), kept encrypted beside the audit log rather than in it, for a bounded time and
a bounded size. The audit record names the capture by
its id; ``portcullis capture show`` opens it.

Off by default. Everything about a capture but its random id is inside the ciphertext
(AES-256-GCM, a key of its own: never the PII vault's, so whoever reads captures cannot
reverse the vault's tokens, and the reverse), and the id is bound as associated data,
so a file renamed to another id does not open. Storing never fails a request: a body
too large, a full quota or a disk error is a skipped capture, counted and logged
without content.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import os
import re
import secrets
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

log = logging.getLogger("portcullis.capture")

_ID = re.compile(r"[0-9a-f]{32}")  # 128 random bits, hex: nothing else names a file here
_SUFFIX, _TEMP = ".cap", ".tmp"
_VERSION = b"\x01"
_NONCE_BYTES, _TAG_BYTES = 12, 16
_WARN_EVERY = 60.0  # seconds between two warnings of one kind: a full disk must not flood the log
# How often the directory is counted again, off the request path: other workers write
# to it and `portcullis capture purge` deletes from it, which this process's own total
# does not see. Between counts the quota can be overrun by what the others wrote.
_RESCAN_EVERY = 60.0


class CaptureConfigError(Exception):
    """A capture setting cannot be used; the message names it, never a key. (Not the
    configuration's ConfigError: that module imports this one.)"""


class CaptureError(Exception):
    """A capture cannot be read: its id is malformed, it is missing or expired, or the
    key does not open it."""


@dataclass(frozen=True)
class CaptureConfig:
    enabled: bool = False
    directory: Path = Path(".portcullis/captures")
    key_env: str | None = None  # base64 (or hex) 32 bytes, as pii.vault.key_env, but never the same key
    max_body_bytes: int = 1024 * 1024  # a larger body is not captured; the request goes on regardless
    quota_bytes: int = 1024**3  # on disk, all captures: when full, new ones are skipped, old ones kept
    retention_seconds: int = 7 * 86_400
    teams: tuple[str, ...] = ()  # empty: every team's requests

    def key(self, vault_key: str | bytes | None = None) -> bytes:
        """Read the capture key, at start-up so a missing one fails fast. ``vault_key``:
        the PII vault's key (as configured, or decoded), which this one must not equal."""
        from portcullis.adapters.pii.vault import vault_key as decode  # here: pii.vault imports the store, which imports the config

        if self.key_env is None:
            raise CaptureConfigError("capture.key_env: not set; captures are encrypted with a key of their own")
        value = os.environ.get(self.key_env)
        if not value:
            raise CaptureConfigError(f"capture.key_env: environment variable {self.key_env} is not set")
        try:
            key = decode(value)
        except ValueError:
            raise CaptureConfigError(f"capture.key_env: environment variable {self.key_env} must hold a 32-byte key, base64 or hex encoded") from None
        if vault_key is not None and hmac.compare_digest(key, _as_key(vault_key, decode)):
            raise CaptureConfigError(
                f"capture.key_env: environment variable {self.key_env} holds the PII vault's key (pii.vault.key_env); captures need a key of their own"
            )
        return key


def _as_key(value: str | bytes, decode: Callable[[str], bytes]) -> bytes:
    if isinstance(value, bytes):
        return value
    try:
        return decode(value)
    except ValueError:
        return value.strip().encode()  # a malformed vault key is the vault's error to report; it still must not be ours


def capture_config(document: Mapping[str, Any], resolve: Callable[[str], Path]) -> CaptureConfig:
    """From the validated configuration (``schemas/config.schema.json``): its ``capture``
    section, checked against ``pii.vault`` so the two keys cannot be one variable."""
    section = document.get("capture") or {}
    config = CaptureConfig(
        enabled=section.get("enabled", False),
        directory=resolve(section.get("directory", ".portcullis/captures")),
        key_env=section.get("key_env"),
        max_body_bytes=section.get("max_body_bytes", CaptureConfig.max_body_bytes),
        quota_bytes=section.get("quota_bytes", CaptureConfig.quota_bytes),
        retention_seconds=section.get("retention_seconds", CaptureConfig.retention_seconds),
        teams=tuple(section.get("teams", ())),
    )
    if config.enabled and config.key_env is None:
        raise CaptureConfigError("capture.key_env: required when capture.enabled is true (captures are encrypted with a key of their own)")
    vault_env = (document.get("pii") or {}).get("vault", {}).get("key_env")
    if config.key_env is not None and config.key_env == vault_env:
        raise CaptureConfigError("capture.key_env: names the PII vault's variable (pii.vault.key_env); captures need a key of their own")
    if config.quota_bytes < config.max_body_bytes:
        raise CaptureConfigError("capture.quota_bytes: smaller than capture.max_body_bytes, so the largest bodies could never be captured")
    return config


@dataclass(frozen=True)
class Captured:
    capture_id: str
    request_id: str
    team: str
    content_type: str
    created: datetime
    body: bytes = field(repr=False)  # never in a repr, a log line or a traceback


@dataclass
class CaptureStats:
    stored: int = 0
    skipped_too_large: int = 0
    skipped_quota: int = 0
    failed: int = 0
    bytes_on_disk: int = 0


class BodyCapture:
    """One directory of captures. ``store`` is called on the request path (from the event
    loop or an offload thread), so it is synchronous, cheap and never raises."""

    def __init__(self, config: CaptureConfig, key: bytes) -> None:
        self.config = config
        self.stats = CaptureStats()
        self._aead = AESGCM(key)
        self._lock = threading.Lock()  # offload threads store too: the quota is checked and taken at once
        self._in_flight = 0  # bytes taken from the quota by writes not yet finished
        self._warned: dict[str, float] = {}
        if config.enabled:
            _make_directory(config.directory)
        try:
            self.stats.bytes_on_disk = _scan(config.directory)
        except OSError as error:
            raise CaptureConfigError(f"capture.directory: cannot read {config.directory} ({error.strerror})") from None
        self._scanned_at = time.monotonic()

    def wants(self, team: str) -> bool:
        """Whether a request of ``team`` is captured: asked on the loop, so requests that
        are not pay no hop to a thread."""
        return self.config.enabled and (not self.config.teams or team in self.config.teams)

    def store(self, request_id: str, team: str, body: bytes, content_type: str, now: datetime) -> str | None:
        """The new capture's id, or None when it was skipped (not enabled, team not
        selected, too large, quota full, disk error)."""
        config = self.config
        if not self.wants(team):
            return None
        if time.monotonic() - self._scanned_at >= _RESCAN_EVERY:
            self._scanned_at = time.monotonic()
            with contextlib.suppress(RuntimeError):  # no thread to be had: the next minute tries again
                threading.Thread(target=self.recount, name="capture-recount", daemon=True).start()
        if len(body) > config.max_body_bytes:
            with self._lock:
                self.stats.skipped_too_large += 1
            return None
        capture_id = secrets.token_hex(16)  # random, never derived from the request: an id says nothing about it
        if now.tzinfo is None:
            now = now.replace(tzinfo=UTC)  # read compares it with an aware time
        try:
            header = json.dumps({"request_id": request_id, "team": team, "content_type": content_type, "created": now.isoformat()}).encode()
        except (TypeError, ValueError) as error:  # a caller's bug: the request goes on regardless
            return self._failed(capture_id, type(error).__name__)
        size = len(_VERSION) + _NONCE_BYTES + 4 + len(header) + len(body) + _TAG_BYTES
        with self._lock:
            if self.stats.bytes_on_disk + self._in_flight + size > config.quota_bytes:
                self.stats.skipped_quota += 1
                full = True
            else:
                self._in_flight += size
                full = False
        if full:
            # Skipped, not evicted: an investigation must not lose evidence it already has.
            self._warn("quota", f"capture quota full ({config.quota_bytes} bytes in {config.directory}): new captures are skipped until purge frees room")
            return None
        try:
            nonce = os.urandom(_NONCE_BYTES)
            sealed = self._aead.encrypt(nonce, len(header).to_bytes(4, "big") + header + body, _associated(capture_id))
            _write(config.directory, capture_id, _VERSION + nonce + sealed, now.timestamp())
        except Exception as error:  # anything at all: a capture never fails the request it records
            with self._lock:
                self._in_flight -= size
            return self._failed(capture_id, getattr(error, "strerror", None) or type(error).__name__)
        with self._lock:
            self._in_flight -= size
            self.stats.bytes_on_disk += size
            self.stats.stored += 1
        return capture_id

    def read(self, capture_id: str, now: datetime | None = None) -> Captured:
        """Open one capture; ``now`` (default: the current time) decides whether it expired."""
        if not _ID.fullmatch(capture_id):
            raise CaptureError(f"{capture_id!r} is not a capture id (32 hexadecimal digits)")
        try:
            blob = (self.config.directory / f"{capture_id}{_SUFFIX}").read_bytes()
        except FileNotFoundError:
            raise CaptureError(f"capture {capture_id} does not exist in {self.config.directory} (never stored, or purged)") from None
        except OSError as error:
            raise CaptureError(f"capture {capture_id} cannot be read: {error.strerror}") from None
        try:
            if blob[:1] != _VERSION:
                raise InvalidTag
            plain = self._aead.decrypt(blob[1 : 1 + _NONCE_BYTES], blob[1 + _NONCE_BYTES :], _associated(capture_id))
        except InvalidTag:
            raise CaptureError(f"capture {capture_id} does not open with this key (another key, or the file was altered)") from None
        length = int.from_bytes(plain[:4], "big")
        header = json.loads(plain[4 : 4 + length])
        created = datetime.fromisoformat(header["created"])
        expires = created + timedelta(seconds=self.config.retention_seconds)
        if (now or datetime.now(UTC)) >= expires:
            raise CaptureError(f"capture {capture_id} expired at {expires.isoformat()} (capture.retention_seconds {self.config.retention_seconds})")
        return Captured(capture_id, header["request_id"], header["team"], header["content_type"], created, plain[4 + length :])

    def purge(self, now: datetime) -> int:
        """Delete expired captures; the directory's scan also corrects the running total
        for what other processes (workers, ``portcullis capture purge``) wrote or deleted."""
        deleted, remaining = purge_expired(self.config.directory, self.config.retention_seconds, now)
        with self._lock:
            self.stats.bytes_on_disk = remaining
        return deleted

    def recount(self) -> int:
        """Count the bytes on disk again (every minute on a thread of its own, started by
        ``store``). Writes finishing during the scan may be missed until the next count:
        the total is an estimate, never a reason to fail a request."""
        try:
            total = _scan(self.config.directory)
        except OSError:
            return self.stats.bytes_on_disk
        with self._lock:
            self.stats.bytes_on_disk = total
        return total

    def _failed(self, capture_id: str, reason: str) -> None:
        with self._lock:
            self.stats.failed += 1
        self._warn("failed", f"capture {capture_id} not stored ({reason}); the request goes on without it")
        return None

    def _warn(self, kind: str, message: str) -> None:
        moment = time.monotonic()
        last = self._warned.get(kind)
        if last is None or moment - last >= _WARN_EVERY:
            self._warned[kind] = moment
            log.warning(message)


def open_capture(config: CaptureConfig, vault_key: str | bytes | None = None) -> BodyCapture | None:
    """The gateway's capture, or None when it is off; a missing or reused key, or a
    directory that cannot be made, stops start-up (CaptureConfigError)."""
    return BodyCapture(config, config.key(vault_key)) if config.enabled else None


def purge_expired(directory: Path, retention_seconds: int, now: datetime) -> tuple[int, int]:
    """Delete the captures (and torn temporary files) older than the retention; return
    how many went and the bytes left. Needs no key: a purge job need not read captures.

    Age is the file's modification time, which ``store`` sets to the capture's created
    time: decrypting every file to learn its age would cost a key and a read per file."""
    cutoff = now.timestamp() - retention_seconds
    deleted = remaining = 0
    for entry in _entries(directory):
        try:
            stat = entry.stat()
            if stat.st_mtime < cutoff:
                os.unlink(entry.path)
                deleted += 1
            else:
                remaining += stat.st_size
        except FileNotFoundError:
            continue  # deleted meanwhile by another purge
    return deleted, remaining


def _associated(capture_id: str) -> bytes:
    return b"portcullis capture\x00" + _VERSION + capture_id.encode()


def _write(directory: Path, capture_id: str, blob: bytes, mtime: float) -> None:
    """Whole or not at all (a temporary file renamed into place), readable by its owner
    only. Not fsynced: that would cost milliseconds on the request path, and a crash
    loses at most the last captures, never leaves a torn one under a capture's name."""
    temporary = directory / f"{capture_id}{_TEMP}"
    # Bare descriptors, not a file object: the creation and the rename are most of the
    # cost already (~45 of ~55 µs for 10 KB on ext4; AES-GCM is ~2).
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        try:
            view = memoryview(blob)
            while view:
                view = view[os.write(descriptor, view) :]
            os.utime(descriptor, (mtime, mtime))  # the created time, which purge reads
        finally:
            os.close(descriptor)
        os.replace(temporary, directory / f"{capture_id}{_SUFFIX}")
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def _make_directory(directory: Path) -> None:
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        mode = directory.stat().st_mode & 0o777
    except OSError as error:
        raise CaptureConfigError(f"capture.directory: cannot create {directory} ({error.strerror})") from None
    if mode & 0o077:
        log.warning("capture.directory %s is accessible to others (mode %o); 0700 is advised", directory, mode)


def _entries(directory: Path) -> list[os.DirEntry[str]]:
    """Captures and temporary files: names the gateway made, nothing else in the directory."""
    try:
        with os.scandir(directory) as scan:
            return [e for e in scan if e.name.endswith((_SUFFIX, _TEMP)) and _ID.fullmatch(e.name.rsplit(".", 1)[0]) and e.is_file(follow_symlinks=False)]
    except FileNotFoundError:
        return []


def _scan(directory: Path) -> int:
    total = 0
    for entry in _entries(directory):
        try:
            total += entry.stat().st_size
        except FileNotFoundError:
            continue
    return total
