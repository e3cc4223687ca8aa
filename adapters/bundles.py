"""Loading the policy bundle at start-up and hot-reloading it.

A new bundle is built off to the side (read, signature, schema, catalog and price
checks, its own policy tests, plan checks) and swapped in with one reference
assignment, so a request keeps the bundle it started with. A bundle that fails any
check never becomes active: the old one keeps serving and the failure is logged.
Reloads happen on SIGHUP and when the bundle's files change. Each activation and each
refusal is also an audit record (``bundle_activated`` / ``bundle_refused``), which the
operational events are derived from.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import traceback
from collections.abc import Callable, Collection
from pathlib import Path

from portcullis.adapters.audit_log import AuditLog
from portcullis.adapters.config import Config
from portcullis.engine.activation import ActiveBundle, activate
from portcullis.engine.bundle import BundleError, parse_bundle, read_bundle_files
from portcullis.engine.rego import PolicyError

log = logging.getLogger("portcullis.bundles")

MAX_AUDITED_REASON = 500  # a refusal is a bundle check's message; cut so one record stays a line, not a file


def load_bundle(config: Config, providers: Collection[str], today: dt.date) -> ActiveBundle:
    files = read_bundle_files(config.bundle_path)
    return activate(parse_bundle(files, config.public_keys), providers, today, config.pii.detectors())


def _load_off_thread(config: Config, providers: Collection[str], today: dt.date) -> ActiveBundle:
    """Build a bundle on a worker thread, leaving no engine of that thread behind, on
    success and on refusal alike: a refused bundle's error carries the frames of the
    checks that failed, and with them policies whose engines belong to this thread."""
    refusal: str | None = None
    try:
        bundle = load_bundle(config, providers, today)
    except Exception as error:  # every failure is a refusal: the old bundle keeps serving
        refusal = str(error) if isinstance(error, BundleError) else f"unexpected {type(error).__name__}: {error}"
        _clear_frames(error)
    if refusal is not None:
        raise BundleError(refusal)  # a fresh error, raised outside the handler: no frame of the checks travels with it
    bundle.policy.release_thread()
    return bundle


def _clear_frames(error: BaseException | None) -> None:
    """Drop the locals of every frame the error (and what it was raised from) holds,
    here on the thread that built them."""
    while error is not None:
        traceback.clear_frames(error.__traceback__)
        error = error.__cause__ or error.__context__


def fingerprint(path: Path) -> tuple:
    """Cheap change detection: names, sizes and modification times."""
    try:
        if path.is_dir():
            return tuple(sorted((str(p.relative_to(path)), p.stat().st_mtime_ns, p.stat().st_size) for p in path.rglob("*") if p.is_file()))
        stat = path.stat()
        return ((path.name, stat.st_mtime_ns, stat.st_size),)
    except OSError:
        return ()


class BundleManager:
    def __init__(
        self,
        config: Config,
        providers: Collection[str],
        active: ActiveBundle,
        today: Callable[[], dt.date] = lambda: dt.datetime.now(dt.UTC).date(),
        *,
        audit: AuditLog | None = None,
    ) -> None:
        self._config = config
        self._audit = audit
        self._providers = providers
        self._today = today
        self.active = active
        self.last_error: str | None = None
        self._seen = fingerprint(config.bundle_path)
        self._lock = asyncio.Lock()

    async def reload(self, trigger: str) -> bool:
        """Build and, if every check passes, activate the bundle on disk."""
        async with self._lock:
            self._seen = fingerprint(self._config.bundle_path)
            try:
                candidate = await asyncio.to_thread(_load_off_thread, self._config, self._providers, self._today())
            except BundleError as error:
                return self._refuse(trigger, str(error))
            if candidate.digest == self.active.digest:
                self.last_error = None
                return True
            try:
                candidate.warm()  # this thread's evaluator, built before the swap, not on a request
            except PolicyError as error:
                return self._refuse(trigger, f"policy error: {error}")
            previous, self.active = self.active, candidate
            self.last_error = None
            log.info("bundle reload (%s): revision %r -> %r (%s)", trigger, previous.revision, candidate.revision, candidate.digest[:12])
            if self._audit is not None:
                self._audit.append(
                    "bundle_activated", trigger=trigger, previous_revision=previous.revision, revision=candidate.revision, digest=candidate.digest
                )
            return True

    def _refuse(self, trigger: str, reason: str) -> bool:
        self.last_error = " ".join(part.strip() for part in reason.splitlines() if part.strip())  # one log line per refusal
        log.error("bundle reload (%s) refused, still serving revision %r: %s", trigger, self.active.revision, self.last_error)
        if self._audit is not None:  # a bundle check's message: files, data paths, rule ids, test names, bundle lines; never a request's text or a credential
            self._audit.append("bundle_refused", trigger=trigger, serving_revision=self.active.revision, reason=self.last_error[:MAX_AUDITED_REASON])
        return False

    async def watch(self) -> None:
        """Poll the bundle path and reload when its files change."""
        interval = self._config.watch_interval
        if interval <= 0:
            return
        while True:
            await asyncio.sleep(interval)
            if fingerprint(self._config.bundle_path) != self._seen:
                await self.reload("files changed")
