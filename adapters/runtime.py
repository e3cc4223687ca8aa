"""Assembly: configuration, bundle, store, providers, audit log and telemetry wired into
one ``Runtime``, everything checked before the gateway accepts a connection. The HTTP
application and its serving are ``app.py``'s."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from portcullis.adapters import offload
from portcullis.adapters.anchors.anchorer import Anchorer
from portcullis.adapters.anchors.base import AnchorSinkError
from portcullis.adapters.anchors.sinks import open_sinks
from portcullis.adapters.audit_log import AuditLog
from portcullis.adapters.auth import Authenticator
from portcullis.adapters.aws_credentials import configured_seal
from portcullis.adapters.breakers import BreakerFacts, Breakers
from portcullis.adapters.budget_facts import BudgetFacts
from portcullis.adapters.bundles import BundleManager, load_bundle
from portcullis.adapters.cache_domain import CacheDomainPin
from portcullis.adapters.capture import BodyCapture, CaptureConfigError, open_capture
from portcullis.adapters.config import Config, ConfigError, PiiConfig
from portcullis.adapters.count_limit import count_limit
from portcullis.adapters.decision_logs.config import DecisionLogsConfigError
from portcullis.adapters.decision_logs.logger import DecisionLogger
from portcullis.adapters.dispatch import Dispatcher
from portcullis.adapters.events.audit_events import EventPublisher
from portcullis.adapters.events.config import EventsConfigError
from portcullis.adapters.executor import Executor
from portcullis.adapters.governance import Governance
from portcullis.adapters.heap import freeze_startup_heap
from portcullis.adapters.integrity.guard import PromptIntegrity
from portcullis.adapters.intent.classifier import IntentClassifier
from portcullis.adapters.intent.features import FeatureSource
from portcullis.adapters.intent.routers import BundleRouters
from portcullis.adapters.intent.session_pin import SessionPin
from portcullis.adapters.pii.classifier import ClassifierDetector
from portcullis.adapters.pii.detectors import Detector
from portcullis.adapters.pii.guard import PiiGuard, VaultSettings
from portcullis.adapters.pii.vault import MemoryVault, RedisVault, Vault, vault_key
from portcullis.adapters.pipeline import Clock, FactSource, utc_now
from portcullis.adapters.providers import Provider, build_provider
from portcullis.adapters.providers.keys import KeyPool
from portcullis.adapters.store import Store, open_store
from portcullis.adapters.store import hosted as shared_state
from portcullis.adapters.telemetry.serving import Telemetry
from portcullis.adapters.telemetry.upkeep_metrics import watch_upkeep

if TYPE_CHECKING:
    from portcullis.adapters.store.state_host import StateClient

log = logging.getLogger("portcullis")


@dataclass
class Runtime:
    config: Config
    bundles: BundleManager
    store: Store
    providers: dict[str, Provider]
    audit: AuditLog
    gateway: Executor
    authenticator: Authenticator
    pii: PiiGuard
    integrity: PromptIntegrity
    telemetry: Telemetry
    capture: BodyCapture | None = None
    events: EventPublisher | None = None
    anchorer: Anchorer | None = None
    decision_logs: DecisionLogger | None = None

    async def close(self) -> None:
        """Release everything; one part failing to close does not keep the others open.
        The audit log closes last, so what closing the others records still reaches it."""
        closers: list[tuple[str, Any]] = [
            ("the PII guard", self.pii.close),
            *((f"provider {name}", provider.close) for name, provider in self.providers.items()),
            ("the store gauges", self.telemetry.stop_store_gauges),  # before the store they read
            ("the store", self.store.close),
            ("telemetry", self.telemetry.close),
            # The final anchor before the webhooks' grace period: a receiver that is down must
            # not spend the time the log's last anchor needs before a SIGKILL.
            *((("the audit anchors", self.anchorer.close),) if self.anchorer is not None else ()),
            *((("the event webhooks", self.events.close),) if self.events is not None else ()),
            *((("the decision logs", self.decision_logs.close),) if self.decision_logs is not None else ()),
            ("the audit log", self.audit.close),
        ]
        for name, close in closers:
            try:
                result = close()
                if asyncio.iscoroutine(result):
                    await result
            except Exception as error:  # keep closing the rest
                log.error("closing %s failed: %s: %s", name, type(error).__name__, error)


async def build_runtime(config: Config, clock: Clock = utc_now, hosted: StateClient | None = None) -> Runtime:
    """Everything the gateway needs, checked before it accepts a connection: a bad
    bundle, a missing secret or an unreachable store stops start-up with a clear error.
    ``clock`` is the one every part reads: prices, periods and bundle validity agree.
    ``hosted``: a worker's channel to the in-memory state its supervisor hosts (embedded
    store, ``workers`` > 1), used instead of this process's own counters and vault."""
    offload.configure(config.request_limits.offload_bytes)
    # Built first, so a provider's missing credentials stop start-up before the bundle is
    # read; a pool of pods reads the active bundle's endpoint policy on each request.
    providers = {name: build_provider(provider, lambda: bundles.active.endpoints) for name, provider in config.providers.items()}
    active = load_bundle(config, config.provider_regions(), clock().date())
    seal = configured_seal(config.aws_credentials)  # a missing or malformed seal key stops start-up here
    try:
        capture = open_capture(config.capture, config.pii.vault_key())  # as the seal: a missing or reused key stops it
        events = EventPublisher.build(config.events)  # reads the webhooks' secrets: a missing one stops start-up
        decision_logs = DecisionLogger.build(config.decision_logs)  # as the webhooks: a missing token or an unwritable file stops it
    except (CaptureConfigError, EventsConfigError, DecisionLogsConfigError) as error:
        raise ConfigError(f"{config.source}: {error}") from None
    except OSError as error:
        raise ConfigError(f"{config.source}: decision_logs.file.path: cannot be written ({error.strerror})") from None
    sole_gateway = config.workers == 1 and hosted is None  # several workers judge the file's counters together
    store = await open_store(config.store, config.max_auth_failures, config.auth_failure_window, sole_gateway=sole_gateway)
    if hosted is not None:
        store = shared_state.shared_store(store, hosted)
    try:
        pools = {name: KeyPool(provider, store.capacity) for name, provider in config.providers.items()}  # reads the secrets
        audit = AuditLog(config.audit.path, writing=config.audit.writing)
    except BaseException:
        await store.close()
        raise
    if events is not None:
        audit.subscribe(events)  # events are derived from the records, nothing else
    try:
        anchorer = await anchor_audit(config, audit)  # a sink that cannot open (no Object Lock, a missing secret) stops start-up
    except BaseException:
        await store.close()
        audit.close()
        raise
    bundles = BundleManager(config, config.provider_regions(), active, lambda: clock().date(), audit=audit)
    authenticator = Authenticator(store, config.key_cache_seconds, seal=seal)
    breakers = Breakers(store.breakers, audit)
    try:
        telemetry = Telemetry(config.telemetry, {name: p.type for name, p in config.providers.items()}, lambda: bundles.active, breakers.states)
    except BaseException:  # a missing metrics token stops start-up here
        if anchorer is not None:
            await anchorer.close()
        await store.close()
        audit.close()
        raise
    telemetry.watch_store(store.ledger, store.capacity, pools, clock)  # budget utilisation, keys' limits and cool-downs
    if telemetry.metrics is not None:
        watch_upkeep(telemetry.registry, anchorer, events)
        if decision_logs is not None:
            decision_logs.watch(telemetry.registry)
    pooled = [name for name, provider in config.providers.items() if provider.pool is not None]
    dispatcher = Dispatcher(providers, pools, config.max_attempts, pooled, breakers)
    governance = Governance(store.ledger, providers, audit, clock)
    classifier = ClassifierDetector(dispatcher, governance)
    vault = shared_state.shared_vault(hosted) if hosted is not None else None
    pii = await build_pii_guard(config.pii, store, config.store.redis_prefix, {"classifier": classifier}, vault)
    settings = config.integrity
    hops = frozenset(name for name, provider in config.providers.items() if provider.gateway_hop)
    integrity = PromptIntegrity(settings.spotlight_key(), settings.scan_cache_entries, settings.hop_key(), hops)
    # Filters run first, PII before integrity (the scanner reads what will be sent; the
    # operator's prompt is not the client's data); governance then sizes and reserves
    # exactly what goes upstream. Answer guards run in the same order. A token count's
    # own limit comes before them all: a refused count costs no detection work.
    windows = shared_state.shared_count_windows(hosted) if hosted is not None else None
    counts = count_limit(store, config.store.redis_prefix, config.count_tokens_per_minute, windows)
    # The cache-domain pin orders the targets before any step sizes or narrows them.
    steps = [counts, CacheDomainPin(store.sessions), pii, integrity, governance]
    # What the routing layers decide from, gathered before the policy decides (input.facts).
    routers = BundleRouters()
    # In this order: the classifier reads the features and the session's pin; the breakers are the targets' own.
    facts: tuple[FactSource, ...] = (
        FeatureSource(routers),
        SessionPin(store.sessions, routers),
        IntentClassifier(dispatcher, governance, routers),
        BudgetFacts(store.ledger, clock),
        BreakerFacts(breakers),
    )
    gateway = Executor(
        bundles,
        authenticator,
        dispatcher,
        audit,
        steps,
        config.max_request_bytes,
        clock,
        limits=config.request_limits,
        facts=facts,
        observers=(*telemetry.observers, *((decision_logs,) if decision_logs is not None else ())),
        tracer=telemetry.tracer,
        capture=capture,
    )
    freeze_startup_heap()
    return Runtime(config, bundles, store, providers, audit, gateway, authenticator, pii, integrity, telemetry, capture, events, anchorer, decision_logs)


async def anchor_audit(config: Config, audit: AuditLog) -> Anchorer | None:
    """The anchorer of ``audit.anchor``'s sinks, opened (and checked: S3 Object Lock) now."""
    anchor = config.audit.anchor
    if anchor is None:
        return None
    try:
        sinks = await open_sinks(anchor, config.audit.path)
    except AnchorSinkError as error:
        raise ConfigError(f"{config.source}: audit.anchor: {error}") from None
    return Anchorer(audit, sinks, anchor)


async def build_pii_guard(config: PiiConfig, store: Store, redis_prefix: str, detectors: dict[str, Detector], vault: Vault | None = None) -> PiiGuard:
    """``vault``: one given (a worker's proxy to the hosted vault), else the store's kind decides."""
    settings = VaultSettings(config.session_ttl_seconds, config.token_ttl_seconds)
    encoded = config.vault_key()
    try:
        key = vault_key(encoded) if encoded else None
    except ValueError as error:
        raise ConfigError(f"pii.vault.key_env: {error}") from None
    if vault is None and store.redis is not None:
        if key is None:
            log.warning("pii.vault.key_env is not set: the shared PII vault keeps values in Redis unsealed")
        vault = RedisVault(store.redis, redis_prefix, key)
    elif vault is None:
        vault = MemoryVault(config.max_sessions)
    if config.ner_enabled:
        from portcullis.adapters.pii.presidio import NerDetector

        ner = NerDetector(config.ner_model, config.ner_max_chars)
        try:
            await ner.load()
        except (ImportError, OSError) as error:  # OSError: spaCy cannot find the model package
            ner.close()
            raise ConfigError(f"pii.ner: the NER detector cannot load ({error}); install it with: pip install 'portcullis[ner]'") from None
        detectors["ner"] = ner
    return PiiGuard(vault, detectors, settings)
