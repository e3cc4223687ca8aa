"""What the served Bedrock suites share: the reference routing (Claude on Bedrock in
ap-northeast-2, then us-west-2, then Anthropic direct; a Converse-only Nova model), two
fake Bedrock Runtimes in those regions, a gateway process that signs for them with the
fake account's keys and verifies its clients' SigV4, a self-signed certificate for
HTTPS, and the real clients (boto3 ``bedrock-runtime``, ``AnthropicBedrock``)."""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import anthropic
import boto3
import botocore.config
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tests import bundles
from tests.bundles import TENANTS, deep_copy, target, write_bundle
from tests.conftest import BedrockFakes, Fakes, GatewayProcess, gateway_config, new_gateway
from tests.fakes import FakeProvider, Received
from tests.fakes.sigv4 import ACCESS_KEY, SECRET_KEY

CANONICAL = "claude-sonnet-4-5"
SONNET_ID = "anthropic.claude-sonnet-4-5-20250929-v1:0"  # what Bedrock clients name, and Oregon's target
APAC_ID = f"apac.{SONNET_ID}"  # Seoul's target: the APAC cross-region inference profile
SONNET_ARN = f"arn:aws:bedrock:ap-northeast-2::foundation-model/{SONNET_ID}"
DIRECT = "claude-sonnet-4-5-20250929"  # Anthropic's own id for it
NOVA = "amazon.nova-pro-v1:0"  # Converse only: not an Anthropic model
# The gateway signs its Bedrock requests with the fake account's key; nothing else of AWS is probed.
AWS_ENV = {
    "AWS_ACCESS_KEY_ID": ACCESS_KEY,
    "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
    "AWS_EC2_METADATA_DISABLED": "true",
    "AWS_CONFIG_FILE": "/nonexistent/aws-config",
    "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/aws-credentials",
}
SEAL_ENV = {"PORTCULLIS_AWS_SEAL_KEY": base64.b64encode(b"s" * 32).decode()}
# SigV4 for the gateway's clients: the credentials it issues are sealed with this key.
SIGV4 = {"aws_credentials": {"seal_key_env": "PORTCULLIS_AWS_SEAL_KEY"}}
CONVERSE = {"messages": [{"role": "user", "content": [{"text": "Say hello."}]}], "inferenceConfig": {"maxTokens": 64}}
INVOKE = {"anthropic_version": "bedrock-2023-05-31", "max_tokens": 64, "messages": [{"role": "user", "content": "Say hello."}]}


def reference_catalog() -> dict[str, Any]:
    """The reference routing (``tests.bundles.reference_catalog``: Seoul through the
    ``apac.`` profile, Oregon, Anthropic direct), Bedrock's ids as aliases, and Nova."""
    catalog = bundles.reference_catalog()
    catalog["models"][NOVA] = {"targets": [target("bedrock-usw2", NOVA, "us-west-2", capabilities=["streaming", "tools"])]}
    catalog["aliases"] |= {SONNET_ID: CANONICAL, SONNET_ARN: CANONICAL}
    catalog["prices"].append({"provider": "bedrock-usw2", "model": NOVA, "effective_from": "2024-12-03", "usd_per_mtok": {"input": "0.80", "output": "3.20"}})
    return catalog


def reference_tenants() -> dict[str, Any]:
    """The standard teams, and one allowed Nova only (a Claude request is not its to make)."""
    tenants = deep_copy(TENANTS)
    tenants["teams"]["eng"]["models"].append("amazon.*")
    tenants["teams"]["nova-only"] = {"models": ["amazon.*"]}
    return tenants


def reference_bundle(directory: Path, **extra: Any) -> Path:
    return write_bundle(directory, extra.pop("tenants", reference_tenants()), reference_catalog(), **extra)


def bedrock_gateway(
    directory: Path, fakes: Fakes, bedrock: BedrockFakes, bundle: Path | None = None, responses: bool = False, **overrides: Any
) -> GatewayProcess:
    """A started gateway with the reference providers (and ``openai-responses``, the
    OpenAI fake's Responses endpoint, if asked), SigV4 for its clients (sealed
    credentials) and the fake account's keys for its own signatures."""
    bundle = bundle or reference_bundle(directory / "bundle")
    providers = gateway_config(directory, fakes, bundle)["providers"]
    if responses:
        providers.append({**providers[-1], "name": "openai-responses", "wire": "responses"})
    # No rest after a 429: each test scripts its own throttling, and the next must find the region open.
    common = {"type": "bedrock", "timeouts": {"connect_seconds": 2, "read_seconds": 3}, "cooldown_seconds": 0}
    regional = [
        {"name": "bedrock-apne2", "region": "ap-northeast-2", "endpoint_url": bedrock.apne2.url, **common},
        {"name": "bedrock-usw2", "region": "us-west-2", "endpoint_url": bedrock.usw2.url, **common},
    ]
    overrides = {"providers": [*providers, *regional], "auth": SIGV4, **overrides}  # auth merges into the defaults
    return new_gateway(directory, fakes, bundle, **overrides).start({**SEAL_ENV, **AWS_ENV})


# --- HTTPS ---------------------------------------------------------------------------


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key (PEM files), signed by itself."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = dt.datetime.now(dt.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = directory / "gateway.crt", directory / "gateway.key"
    cert_file.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return cert_file, key_file


# --- the clients -----------------------------------------------------------------------


def boto3_client(gateway: GatewayProcess, credential: tuple[str, str], **config: Any) -> Any:
    """boto3's ``bedrock-runtime`` signing with an issued credential; no retries, so
    every request the test makes is one the gateway sees once."""
    return boto3.client(
        "bedrock-runtime",
        region_name="us-east-1",
        endpoint_url=gateway.url,
        aws_access_key_id=credential[0],
        aws_secret_access_key=credential[1],
        config=botocore.config.Config(retries={"total_max_attempts": 1}, read_timeout=15, **config),
    )


def anthropic_bedrock(gateway: GatewayProcess, credential: tuple[str, str]) -> anthropic.AnthropicBedrock:
    return anthropic.AnthropicBedrock(aws_access_key=credential[0], aws_secret_key=credential[1], aws_region="us-east-1", base_url=gateway.url, max_retries=0)


def cli(gateway: GatewayProcess, *args: str) -> subprocess.CompletedProcess:
    """A ``portcullis`` command against the gateway's configuration, with the seal key."""
    return subprocess.run(
        [sys.executable, "-m", "portcullis.adapters.cli", *args, "--config", str(gateway.config_path)],
        capture_output=True,
        text=True,
        env={**os.environ, **SEAL_ENV},
        check=True,
    )


def issue(gateway: GatewayProcess, team: str = "eng", user: str | None = None) -> tuple[str, str]:
    """An AWS-style credential pair (access key id, secret) from ``portcullis keys create --aws``."""
    printed = cli(gateway, "keys", "create", "--aws", "--team", team, *(["--user", user] if user else [])).stdout.splitlines()
    return printed[0].split("=", 1)[1], printed[1].split("=", 1)[1]


def invoke_body(**fields: Any) -> bytes:
    return json.dumps({**INVOKE, **fields}).encode()


def streamed_text(events: Any) -> str:
    """The text a ConverseStream's events carry, as boto3 yields them."""
    return "".join(event["contentBlockDelta"]["delta"].get("text", "") for event in events if "contentBlockDelta" in event)


def invoke_chunks(events: Any) -> list[dict[str, Any]]:
    """The Messages events an InvokeModel stream's ``chunk`` frames carry."""
    return [json.loads(event["chunk"]["bytes"]) for event in events if "chunk" in event]


def operations(fake: FakeProvider) -> list[str]:
    """The operation (the path's last segment) of each request the fake received."""
    return [received.path.rsplit("/", 1)[-1] for received in fake.received]


def signed_by_gateway(received: Received) -> bool:
    """The request carries the gateway's own signature, by the fake account's key (the
    fake verifies it: a wrong one is refused, so an answer means it held)."""
    return received.headers.get("authorization", "").startswith(f"AWS4-HMAC-SHA256 Credential={ACCESS_KEY}/")
