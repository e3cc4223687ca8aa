"""Audit anchors at the edge of the world: sinks that keep the audit chain's head where
the gateway cannot rewrite it (an append-only file, an Object Lock bucket, an HTTP
receiver), the task that writes to them (``anchorer``), and reading them back for
``portcullis audit verify --anchors`` (``sinks.open_anchor_source``). What an anchor
proves, and the comparison itself, are pure: ``portcullis.engine.audit_anchors``."""
