"""What the gateway tells operators about itself: metrics (``registry``, ``gateway_metrics``,
served by ``listener`` in Prometheus's format, pushed by ``otlp``) and traces
(``tracing``), configured by ``config``. Labels and span attributes are ids, names and
counts from the configuration and the active bundle, never request content."""
