"""`serve --demo-key`, the quickstart's first minutes: one demo key kept across runs,
a clear answer when the port is already taken, and a start-up text that says what is
on and how to call it."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from portcullis.adapters.auth import create_key, hash_key
from portcullis.adapters.config import Config
from portcullis.adapters.store import Store

DEMO_KEY_FILE = "demo-key.json"
_INTEGRITY_LAYERS = (("spotlight", "spotlighting"), ("injection", "injection scan"), ("tools", "tool-call rules"), ("output", "output guard"))


@dataclass(frozen=True)
class Occupant:
    """Who answers on the gateway's port before it starts: nobody, a Portcullis
    (with its bundle revision) or another program."""

    kind: str  # "free" | "portcullis" | "other"
    revision: str | None = None


def probe_port(host: str, port: int, timeout: float = 2.0) -> Occupant:
    """A Portcullis answers GET /readyz with its bundle revision; anything else that
    accepts the connection is another program."""
    authority = f"[{host}]" if ":" in host else host  # an IPv6 listen address
    try:
        with urllib.request.urlopen(f"http://{authority}:{port}/readyz", timeout=timeout) as response:
            document = json.loads(response.read(65536))
    except urllib.error.HTTPError:
        return Occupant("other")  # it speaks HTTP, but not as a ready Portcullis
    except (urllib.error.URLError, ConnectionError) as error:
        reason = getattr(error, "reason", error)
        return Occupant("free") if isinstance(reason, ConnectionRefusedError) else Occupant("other")
    except (OSError, ValueError):
        return Occupant("other")
    bundle = document.get("bundle") if isinstance(document, dict) else None
    if isinstance(bundle, dict) and document.get("status") == "ready" and "revision" in bundle:
        return Occupant("portcullis", str(bundle["revision"]))
    return Occupant("other")


def state_dir(config: Config) -> Path:
    """Where the quickstart keeps its state: beside the embedded store's file, else
    beside the audit log."""
    return (config.store.path if config.store.kind == "embedded" else config.audit.path).parent


def stored_demo_key(directory: Path) -> dict[str, Any] | None:
    try:
        document = json.loads((directory / DEMO_KEY_FILE).read_text())
    except (OSError, ValueError):
        return None
    return document if isinstance(document, dict) and isinstance(document.get("key"), str) else None


async def demo_key(store: Store, directory: Path, team: str, user: str | None) -> tuple[str, str, bool]:
    """(key, key_id, reused): the key kept in ``directory`` when the store still knows
    it, unrevoked, for the same team and user; otherwise a new one, kept for next time."""
    stored = stored_demo_key(directory)
    if stored is not None and stored.get("team") == team and stored.get("user") == user:
        record = await store.keys.find_by_hash(hash_key(stored["key"]))
        if record is not None and record.revoked_at is None and record.team == team and record.user == user:
            _write_private(directory / DEMO_KEY_FILE, stored)  # re-asserts mode 0600
            return stored["key"], record.key_id, True
    record, key = await create_key(store, team, user, "quickstart")
    _write_private(directory / DEMO_KEY_FILE, {"key_id": record.key_id, "team": team, "user": user, "key": key})
    return key, record.key_id, False


def _write_private(path: Path, document: dict[str, Any]) -> None:
    """Owner-only from the first byte: the file holds a live key."""
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        os.fchmod(handle.fileno(), 0o600)
        json.dump(document, handle)


def policies_on(data: dict[str, Any], team: str) -> list[str]:
    """One line per kind of policy the bundle applies to ``team``, for the start-up text."""
    lines = []

    def applies(policy: dict[str, Any]) -> bool:
        teams = policy.get("teams") or []
        return team in teams or "*" in teams

    for name, policy in sorted(((data.get("integrity") or {}).get("policies") or {}).items()):
        if applies(policy):
            layers = [f"policy prompt v{policy['prompt']['version']}"] if policy.get("prompt") else []
            layers += [label for key, label in _INTEGRITY_LAYERS if policy.get(key)]
            lines.append(f"prompt integrity ({name}): {', '.join(layers)}")
    for name, policy in sorted(((data.get("pii") or {}).get("policies") or {}).items()):
        if applies(policy):
            by_action: dict[str, list[str]] = {}
            for entity, action in (policy.get("actions") or {}).items():
                by_action.setdefault(action, []).append(entity)
            lines.append(f"PII ({name}): " + "; ".join(f"{action} {', '.join(entities)}" for action, entities in by_action.items()))
    for name, rule in sorted(((data.get("governance") or {}).get("rules") or {}).items()):
        if (rule.get("subject") or {}).get("team") in (team, None):
            lines.append(f"limit ({name}): {_describe_rule(rule)}")
    return lines


def _describe_rule(rule: dict[str, Any]) -> str:
    parts = []
    if budget := rule.get("budget"):
        kind = "hard cap" if budget.get("hard_cap") else "budget"
        parts.append(f"${budget['limit_usd']} per {budget['period'].removeprefix('Calendar').lower()} {kind}")
    if rate := rule.get("rate"):
        parts += [f"{rate[key]} {key}" for key in ("rpm", "tpm") if key in rate]
    if quota := rule.get("quota"):
        parts += [f"{value} {key.replace('_', ' ')}" for key, value in quota.items()]
    if rule.get("unlimited"):
        parts.append("unlimited")
    scope = " each user" if (rule.get("subject") or {}).get("per") == "user" else ""
    warn = " (warning only)" if rule.get("failure_policy") == "Warn" else ""
    return ", ".join(parts) + scope + warn


def shown(path: Path) -> str:
    """A path as the user typed it: relative to the working directory when inside it."""
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path.resolve())


def quickstart_text(config: Config, key: str, key_id: str, bundle: Any, team: str, reused: bool) -> str:
    """What `serve --demo-key` prints once the gateway is ready."""
    base = f"http://{config.host}:{config.port}"
    models = list(bundle.catalog["models"])
    claude = next((m for m in models if m.startswith("claude")), models[0])
    other = next((m for m in models if m.startswith("gpt")), models[-1])
    kept = shown(state_dir(config) / DEMO_KEY_FILE)
    origin = f"reused from {kept}" if reused else f"new, kept in {kept} (mode 0600) for the next run"
    policies = "\n".join(f"    {line}" for line in policies_on(bundle.bundle.data["portcullis"], team)) or "    none"
    return f"""
Portcullis is ready on {base} (bundle revision {bundle.revision!r}).

  Virtual key ({key_id}, team {team}; {origin}):
    export PORTCULLIS_KEY={key}

  Policies on for team {team} (the bundle's data in {shown(config.bundle_path)}/portcullis/*/data.yaml;
  each request's decision is in the audit log {shown(config.audit.path)}):
{policies}

  Anthropic Messages with curl:
    curl -s {base}/v1/messages -H "x-api-key: $PORTCULLIS_KEY" -H "anthropic-version: 2023-06-01" \\
      -H "content-type: application/json" \\
      -d '{{"model": "{claude}", "max_tokens": 256, "messages": [{{"role": "user", "content": "Hello"}}]}}'

  OpenAI Chat with curl:
    curl -s {base}/v1/chat/completions -H "Authorization: Bearer $PORTCULLIS_KEY" \\
      -H "content-type: application/json" \\
      -d '{{"model": "{other}", "messages": [{{"role": "user", "content": "Hello"}}]}}'

  Python SDKs (Anthropic without /v1, OpenAI with it):
    anthropic.Anthropic(base_url="{base}", api_key=os.environ["PORTCULLIS_KEY"])
    openai.OpenAI(base_url="{base}/v1", api_key=os.environ["PORTCULLIS_KEY"])

  Claude Code (no /v1):
    ANTHROPIC_BASE_URL={base} ANTHROPIC_API_KEY=$PORTCULLIS_KEY claude

  opencode: a provider's baseURL is {base}/v1 (a complete opencode.json is in docs/clients.md)
  Models this key may use: curl -s {base}/v1/models -H "x-api-key: $PORTCULLIS_KEY"
"""


def already_serving_text(config: Config, occupant: Occupant, quickstart: bool) -> str:
    text = f"Portcullis is already serving on http://{config.host}:{config.port} (bundle revision {occupant.revision!r}); nothing to do."
    stored = stored_demo_key(state_dir(config)) if quickstart else None
    if stored is not None:
        text += f"\n  Its demo key is kept in {shown(state_dir(config) / DEMO_KEY_FILE)}:\n    export PORTCULLIS_KEY={stored['key']}"
    return text
