"""Test bundles: the product's Rego with the catalog, tenants and policies a test gives.

``CATALOG`` and ``TENANTS`` are what most tests use; ``write_bundle`` lays a bundle out
the way ``portcullis serve`` loads it, ``target`` builds one catalog target and
``reference_catalog`` the Bedrock-first reference routing.
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
POLICY_SOURCES = ROOT / "policies" / "portcullis"

TARGET_DEFAULTS = {"context_window": 200000, "max_output_tokens": 8192, "capabilities": ["streaming", "tools", "vision"]}


def target(provider: str, model: str, region: str, priority: int = 1, **extra: Any) -> dict[str, Any]:
    return {"provider": provider, "model": model, "region": region, "priority": priority, **TARGET_DEFAULTS, **extra}


# The catalog and tenants most tests use: two Anthropic providers in two regions, one
# OpenAI-compatible provider, a fallback chain, and teams that exercise every grant.
CATALOG: dict[str, Any] = {
    "aliases": {"sonnet": "claude-sonnet-4-5", "haiku": "claude-haiku-4-5", "mini": "gpt-4o-mini"},
    "models": {
        "claude-sonnet-4-5": {
            "targets": [
                target("anthropic-us", "claude-sonnet-4-5-20250929", "us-east-1", 1),
                target("anthropic-eu", "claude-sonnet-4-5-20250929", "eu-west-1", 2),
            ],
            "fallbacks": ["claude-haiku-4-5"],
        },
        "claude-haiku-4-5": {"targets": [target("anthropic-eu", "claude-haiku-4-5-20251001", "eu-west-1")]},
        "claude-opus-4-1": {"targets": [target("anthropic-us", "claude-opus-4-1-20250805", "us-east-1")]},
        "claude-sonnet-4-5-exact": {"targets": [target("anthropic-us", "claude-sonnet-4-5-exact", "us-east-1")]},
        "gpt-4o-mini": {"targets": [target("openai-main", "gpt-4o-mini-2024-07-18", "us-east-1")]},
        "gpt-4o-mini-exact": {"targets": [target("openai-main", "gpt-4o-mini-exact", "us-east-1")]},
        "local-llama": {"targets": [target("openai-main", "meta-llama/Llama-3.1-8B-Instruct", "us-east-1", capabilities=["streaming"])]},
    },
    "prices": [
        {
            "provider": "anthropic-us",
            "model": "claude-sonnet-4-5-20250929",
            "effective_from": "2025-09-29",
            "usd_per_mtok": {"input": "3", "output": "15", "cache_read": "0.30", "cache_write": "3.75"},
        },
        {
            "provider": "anthropic-eu",
            "model": "claude-sonnet-4-5-20250929",
            "effective_from": "2025-09-29",
            "usd_per_mtok": {"input": "3.30", "output": "16.50"},
        },
        {"provider": "anthropic-eu", "model": "claude-haiku-4-5-20251001", "effective_from": "2025-10-01", "usd_per_mtok": {"input": "1", "output": "5"}},
        {"provider": "anthropic-us", "model": "claude-opus-4-1-20250805", "effective_from": "2025-08-05", "usd_per_mtok": {"input": "15", "output": "75"}},
        {"provider": "anthropic-us", "model": "claude-sonnet-4-5-exact", "effective_from": "2025-09-29", "usd_per_mtok": {"input": "3", "output": "15"}},
        {
            "provider": "openai-main",
            "model": "gpt-4o-mini-2024-07-18",
            "effective_from": "2024-07-18",
            "usd_per_mtok": {"input": "0.15", "output": "0.60", "cache_read": "0.075"},
        },
        {"provider": "openai-main", "model": "gpt-4o-mini-exact", "effective_from": "2024-07-18", "usd_per_mtok": {"input": "0.15", "output": "0.60"}},
        {
            "provider": "openai-main",
            "model": "meta-llama/Llama-3.1-8B-Instruct",
            "effective_from": "2025-01-01",
            "usd_per_mtok": {"input": "0.05", "output": "0.10"},
        },
    ],
}

TENANTS: dict[str, Any] = {
    "teams": {
        "eng": {
            "models": ["claude-*", "gpt-*", "local-*"],
            "users": {"carol": {"models": ["claude-haiku-*"]}, "dave": {"regions": ["eu-west-1"]}},
        },
        "eu-team": {"models": ["claude-*"], "regions": ["eu-west-1"]},
        "sonnet-only": {"models": ["claude-sonnet-4-5"]},
    },
}


# Where Bedrock's APAC cross-region profile may process a request (the set AWS documents
# for the profile; declared in the catalog so region locks can hold for it).
APAC_PROFILE_REGIONS = ["ap-northeast-1", "ap-northeast-2", "ap-northeast-3", "ap-south-1", "ap-southeast-1", "ap-southeast-2"]
REFERENCE_PROVIDERS = ("bedrock-apne2", "bedrock-usw2", "anthropic-us")


def reference_catalog() -> dict[str, Any]:
    """``CATALOG`` with claude-sonnet-4-5 on the reference routing: Bedrock Seoul through
    the ``apac.`` inference profile (priority 1), Bedrock Oregon (2), Anthropic direct (3)."""
    catalog = copy.deepcopy(CATALOG)
    catalog["models"]["claude-sonnet-4-5"]["targets"] = [
        target("bedrock-apne2", "apac.anthropic.claude-sonnet-4-5-20250929-v1:0", "ap-northeast-2", 1, regions=APAC_PROFILE_REGIONS),
        target("bedrock-usw2", "anthropic.claude-sonnet-4-5-20250929-v1:0", "us-west-2", 2),
        target("anthropic-us", "claude-sonnet-4-5-20250929", "us-east-1", 3),
    ]
    usd = {"input": "3", "output": "15", "cache_read": "0.30", "cache_write": "3.75"}
    catalog["prices"] += [
        {"provider": "bedrock-apne2", "model": "apac.anthropic.claude-sonnet-4-5-20250929-v1:0", "effective_from": "2025-09-29", "usd_per_mtok": usd},
        {"provider": "bedrock-usw2", "model": "anthropic.claude-sonnet-4-5-20250929-v1:0", "effective_from": "2025-09-29", "usd_per_mtok": usd},
    ]
    return catalog


def write_bundle(
    directory: Path,
    tenants: dict[str, Any] | None = None,
    catalog: dict[str, Any] | None = None,
    revision: str = "test-1",
    extra: dict[str, str] | None = None,
    governance: dict[str, Any] | None = None,
    pii: dict[str, Any] | None = None,
    integrity: dict[str, Any] | None = None,
    sections: dict[str, Any] | None = None,
) -> Path:
    """A bundle in OPA layout: the product's Rego, the given data, a manifest.
    ``sections`` are further concerns' data by name (``{"intent": {...}}`` becomes
    ``portcullis/intent/data.yaml``)."""
    if directory.exists():
        shutil.rmtree(directory)
    (directory / "portcullis" / "tenants").mkdir(parents=True)
    (directory / "portcullis" / "catalog").mkdir(parents=True)
    for module in POLICY_SOURCES.glob("*.rego"):
        shutil.copy(module, directory / "portcullis" / module.name)
    # Through JSON first: bundles refuse YAML aliases, which PyYAML emits for shared objects.
    (directory / "portcullis" / "tenants" / "data.yaml").write_text(yaml.safe_dump(json.loads(json.dumps(tenants or TENANTS))))
    (directory / "portcullis" / "catalog" / "data.yaml").write_text(yaml.safe_dump(json.loads(json.dumps(catalog or CATALOG))))
    if governance is not None:
        (directory / "portcullis" / "governance").mkdir()
        (directory / "portcullis" / "governance" / "data.yaml").write_text(yaml.safe_dump(json.loads(json.dumps({"rules": governance}))))
    if pii is not None:
        (directory / "portcullis" / "pii").mkdir()
        (directory / "portcullis" / "pii" / "data.yaml").write_text(yaml.safe_dump(json.loads(json.dumps({"policies": pii}))))
    if integrity is not None:  # the product's scanner and tool rules, with the given policies
        rules = yaml.safe_load((POLICY_SOURCES / "integrity" / "data.yaml").read_text())
        (directory / "portcullis" / "integrity").mkdir()
        document = {"injection_rules": rules["injection_rules"], "tool_rules": rules["tool_rules"], "policies": integrity}
        (directory / "portcullis" / "integrity" / "data.yaml").write_text(yaml.safe_dump(json.loads(json.dumps(document))))
    for name, document in (sections or {}).items():
        (directory / "portcullis" / name).mkdir()
        (directory / "portcullis" / name / "data.yaml").write_text(yaml.safe_dump(json.loads(json.dumps(document))))
    (directory / ".manifest").write_text(f'{{"revision": "{revision}", "roots": ["portcullis"]}}')
    for name, content in (extra or {}).items():
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
        (directory / name).write_text(content)
    return directory


def deep_copy(value: Any) -> Any:
    return copy.deepcopy(value)
