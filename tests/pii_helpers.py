"""What the PII suites share: the values they send, the regulated policy, bundles
with PII policies (and a classifier target) and the SDK clients."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anthropic
import openai

from tests.bundles import CATALOG, TENANTS, deep_copy, target, write_bundle
from tests.conftest import Fakes

SONNET_UPSTREAM = "claude-sonnet-4-5-20250929"
MINI_UPSTREAM = "gpt-4o-mini-2024-07-18"

EMAIL = "maria.garcia@example.com"
OTHER_EMAIL = "kenji.tanaka@example.jp"
CARD = "4111 1111 1111 1111"
IP = "203.0.113.42"
RRN = "900101-1234568"
IBAN = "DE89 3704 0044 0532 0130 00"
PHONE = "+44 20 7946 0958"
SECRET = "AKIAZ7QW3ERTY5UIOP12"
EVERY_VALUE = (EMAIL, OTHER_EMAIL, CARD, IP, RRN, IBAN, PHONE, SECRET, "4111111111111111", "900101")

REGULATED = {
    "teams": ["eng"],
    "actions": {
        "EMAIL": "pseudonymize",
        "PHONE": "pseudonymize",
        "CREDIT_CARD": "mask",
        "IP_ADDRESS": "redact",
        "IBAN": "tokenize",
        "KR_RRN": "block",
        "SECRET": "block",
    },
    "token_readers": ["eng/carol"],
}


def pii_bundle(directory: Path, policies: dict[str, Any] | None = None, catalog: dict[str, Any] | None = None) -> Path:
    return write_bundle(directory, deep_copy(TENANTS), catalog or deep_copy(CATALOG), pii=policies if policies is not None else {"regulated": REGULATED})


def claude(gateway: Any, key: str, **headers: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gateway.url, api_key=key, max_retries=0, default_headers=headers)


def chat(gateway: Any, key: str, **headers: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=key, max_retries=0, default_headers=headers)


def received(fakes: Fakes) -> list[dict[str, Any]]:
    return [r.json for fake in fakes.all() for r in fake.received]


def assert_nothing_leaked(*documents: Any) -> None:
    text = json.dumps(documents, ensure_ascii=False)
    for value in EVERY_VALUE:
        assert value not in text, value


def classifier_bundle(directory: Path, governance: dict[str, Any] | None = None) -> Path:
    catalog = deep_copy(CATALOG)
    catalog["models"]["pii-classifier"] = {"targets": [target("openai-main", "pii-classifier-8b", "us-east-1", internal=True)]}
    price = {"provider": "openai-main", "model": "pii-classifier-8b", "effective_from": "2025-01-01", "usd_per_mtok": {"input": "1", "output": "2"}}
    catalog["prices"].append(price)
    policies = {"contextual": {"teams": ["eng"], "actions": {"PERSON": "pseudonymize", "EMAIL": "pseudonymize"}, "detectors": ["classifier"]}}
    bundle = write_bundle(directory, deep_copy(TENANTS), catalog, governance=governance, pii=policies)
    data = bundle / "portcullis" / "pii" / "data.yaml"
    data.write_text(data.read_text() + "classifier: {model: pii-classifier, max_output_tokens: 200}\n")
    return bundle
