"""A provider's pool of endpoints (self-hosted pods), as configured: a fixed list
(``endpoints``) or the addresses a DNS name resolves to (``endpoints_from_dns``, a
Kubernetes headless Service), and how their load is scraped. Checked here so a
mistake names its field: one provider has ``base_url`` or a pool, never both."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit


class EndpointConfigError(ValueError):
    """The pool cannot be used; the message names the field (after the provider's name)."""


@dataclass(frozen=True)
class DnsEndpoints:
    """Every A/AAAA record of ``host``, each reached on ``port``."""

    host: str
    port: int
    scheme: str = "http"
    refresh_seconds: float = 10.0


@dataclass(frozen=True)
class EndpointPool:
    static: tuple[str, ...] = ()  # origins: scheme://host:port
    dns: DnsEndpoints | None = None
    base_path: str = ""  # joins each origin the way base_url's path would (``/v1`` for type openai)
    scrape_seconds: float = 5.0  # how often each pod's load is scraped; 0: never
    scrape_timeout_seconds: float = 2.0
    metrics_path: str = "/metrics"
    cooldown_seconds: float = 5.0  # a pod that refused a connection is tried last for this long

    @property
    def scrapes(self) -> bool:
        """Load only chooses among pods: a fixed pool of one has nothing to choose."""
        return self.scrape_seconds > 0 and (self.dns is not None or len(self.static) > 1)


POOL_FIELDS = ("endpoints", "endpoints_from_dns", "base_path", "endpoint_metrics", "endpoint_cooldown_seconds")
POOL_TYPES = ("openai", "anthropic")
DEFAULT_BASE_PATH = {"openai": "/v1", "anthropic": ""}


def endpoint_pool(entry: dict[str, Any]) -> EndpointPool | None:
    """The provider's pool, or None when it has one ``base_url``."""
    present = [name for name in POOL_FIELDS if name in entry]
    if not present:
        return None
    if entry["type"] not in POOL_TYPES:
        raise EndpointConfigError(f"{present[0]} applies only to types {' and '.join(POOL_TYPES)}")
    if "base_url" in entry:
        raise EndpointConfigError("give base_url or endpoints/endpoints_from_dns, not both")
    if ("endpoints" in entry) == ("endpoints_from_dns" in entry):
        raise EndpointConfigError("give endpoints or endpoints_from_dns (exactly one)")
    static = tuple(_origin(url, f"endpoints[{i}]") for i, url in enumerate(entry.get("endpoints") or []))
    if "endpoints" in entry and not static:
        raise EndpointConfigError("endpoints is empty")
    duplicates = sorted({url for url in static if static.count(url) > 1})
    if duplicates:
        raise EndpointConfigError(f"endpoints: {duplicates[0]} is listed twice")
    dns = _dns(entry["endpoints_from_dns"]) if "endpoints_from_dns" in entry else None
    base_path = entry.get("base_path", DEFAULT_BASE_PATH[entry["type"]]).rstrip("/")
    if base_path and not base_path.startswith("/"):
        raise EndpointConfigError("base_path must start with /")
    metrics = entry.get("endpoint_metrics") or {}
    if not str(metrics.get("path", "/metrics")).startswith("/"):
        raise EndpointConfigError("endpoint_metrics.path must start with /")
    return EndpointPool(
        static=static,
        dns=dns,
        base_path=base_path,
        scrape_seconds=float(metrics.get("interval_seconds", 5.0)),
        scrape_timeout_seconds=float(metrics.get("timeout_seconds", 2.0)),
        metrics_path=metrics.get("path", "/metrics"),
        cooldown_seconds=float(entry.get("endpoint_cooldown_seconds", 5.0)),
    )


def _origin(url: Any, field: str) -> str:
    """``scheme://host:port``, checked: the path of each request goes in base_path."""
    if not isinstance(url, str):
        raise EndpointConfigError(f"{field} is not a URL")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise EndpointConfigError(f"{field}: {url!r} is not a valid URL") from None
    if parts.scheme not in ("http", "https"):
        raise EndpointConfigError(f"{field}: {url!r} must be an http:// or https:// URL")
    if not parts.hostname:
        raise EndpointConfigError(f"{field}: {url!r} names no host")
    if parts.username or parts.password:
        raise EndpointConfigError(f"{field}: credentials do not belong in a URL; use api_key_env")
    if parts.path.strip("/") or parts.query or parts.fragment:
        raise EndpointConfigError(f"{field}: {url!r} must be scheme://host:port only; the API path goes in base_path")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{parts.scheme}://{host}" + (f":{port}" if port is not None else "")


def _dns(section: dict[str, Any]) -> DnsEndpoints:
    host = section["host"]
    if "/" in host or ":" in host or not host.strip("."):
        raise EndpointConfigError("endpoints_from_dns.host must be a DNS name, without scheme or port")
    return DnsEndpoints(host=host, port=section["port"], scheme=section.get("scheme", "http"), refresh_seconds=float(section.get("refresh_seconds", 10.0)))
