"""OPA-compatible bundle signatures: ``.signatures.json`` holding one JWS (compact
JWT) whose payload lists every bundle file with its SHA-256.

JSON and YAML files (and ``.manifest``) are hashed as structured documents, the
way OPA does: object keys sorted, no whitespace, strings without HTML escaping,
numbers as written. Everything else is hashed as raw bytes. The verification
algorithm always comes from the configured key, never from the token's header.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import (
    decode_dss_signature,
    encode_dss_signature,
)

from portcullis.engine.documents import load_yaml

SIGNATURES_FILE = ".signatures.json"
ALGORITHMS = ("RS256", "ES256")
HASH_ALGORITHM = "SHA-256"


class SignatureError(Exception):
    """A bundle's signature is missing, malformed, untrusted or does not match its files."""


@dataclass(frozen=True)
class VerificationKey:
    key_id: str
    algorithm: str
    public_key_pem: bytes
    scope: str = ""


def is_structured(name: str) -> bool:
    base = name.rsplit("/", 1)[-1]
    return base == ".manifest" or base.endswith((".json", ".yaml", ".yml"))


def file_digest(name: str, content: bytes) -> str:
    """The hex SHA-256 OPA records for a bundle file."""
    if not is_structured(name):
        return hashlib.sha256(content).hexdigest()
    return hashlib.sha256(canonical_bytes(parse_structured(name, content))).hexdigest()


def parse_structured(name: str, content: bytes) -> Any:
    if name.endswith((".yaml", ".yml")):
        return load_yaml(content)
    return json.loads(content, parse_float=_Number, parse_int=_Number, parse_constant=_Number)


class _Number(str):
    """A JSON number kept exactly as written, so hashing never re-formats it."""


def canonical_bytes(value: Any) -> bytes:
    out: list[str] = []
    _encode(value, out)
    return "".join(out).encode()


def _encode(value: Any, out: list[str]) -> None:
    if isinstance(value, Mapping):
        if not all(isinstance(key, str) for key in value):
            raise ValueError("object keys must be strings")
        out.append("{")
        for i, key in enumerate(sorted(value)):
            if i:
                out.append(",")
            out.append(json.dumps(key, ensure_ascii=False))
            out.append(":")
            _encode(value[key], out)
        out.append("}")
    elif isinstance(value, list):
        out.append("[")
        for i, item in enumerate(value):
            if i:
                out.append(",")
            _encode(item, out)
        out.append("]")
    elif isinstance(value, _Number):
        out.append(str(value))
    elif value is None or isinstance(value, str | bool | int | float):
        out.append(json.dumps(value, ensure_ascii=False))
    else:
        raise ValueError(f"{type(value).__name__} is not a JSON value")


def sign_files(
    files: Mapping[str, bytes],
    private_key_pem: bytes,
    algorithm: str = "RS256",
    key_id: str = "default",
    scope: str = "",
) -> bytes:
    """The content of ``.signatures.json`` for ``files`` (which must exclude it)."""
    if algorithm not in ALGORITHMS:
        raise SignatureError(f"unsupported signing algorithm {algorithm!r}; use one of {', '.join(ALGORITHMS)}")
    payload: dict[str, Any] = {
        "files": [{"name": name, "hash": file_digest(name, content), "algorithm": HASH_ALGORITHM} for name, content in sorted(files.items())],
        "keyid": key_id,
    }
    if scope:
        payload["scope"] = scope
    header = {"alg": algorithm, "kid": key_id, "typ": "JWT"}
    signing_input = f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(payload).encode())}"
    key = serialization.load_pem_private_key(private_key_pem, password=None)
    signature = _sign(key, algorithm, signing_input.encode())
    token = f"{signing_input}.{_b64(signature)}"
    return (json.dumps({"signatures": [token]}, indent=2) + "\n").encode()


def verify_files(files: Mapping[str, bytes], keys: list[VerificationKey]) -> str | None:
    """Check a bundle's signature against the configured keys.

    Returns the id of the key that signed it, or ``None`` for an unsigned bundle
    when no keys are configured. Raises ``SignatureError`` otherwise.
    """
    signatures = files.get(SIGNATURES_FILE)
    if signatures is None:
        if keys:
            raise SignatureError("bundle is not signed, but policy.public_keys requires a signed bundle")
        return None
    if not keys:
        raise SignatureError("bundle is signed, but no policy.public_keys are configured to verify it")
    token = _single_token(signatures)
    header, payload, signing_input, signature = _split(token)
    key_id = header.get("kid") or payload.get("keyid")
    if not key_id:
        raise SignatureError("signature names no key id (kid)")
    key = next((k for k in keys if k.key_id == key_id), None)
    if key is None:
        raise SignatureError(f"signature key id {key_id!r} is not among policy.public_keys")
    if header.get("alg") != key.algorithm:
        raise SignatureError(f"signature algorithm {header.get('alg')!r} does not match key {key_id!r} ({key.algorithm})")
    _verify(key, signing_input, signature)
    if payload.get("scope", "") != key.scope:
        raise SignatureError("signature scope does not match the configured key's scope")
    _check_files(files, payload.get("files"))
    return key.key_id


def _single_token(content: bytes) -> str:
    try:
        document = json.loads(content)
        tokens = document["signatures"]
    except (ValueError, KeyError, TypeError):
        raise SignatureError(f'{SIGNATURES_FILE} is not valid: expected {{"signatures": [<JWT>]}}') from None
    if not isinstance(tokens, list) or len(tokens) != 1 or not isinstance(tokens[0], str):
        raise SignatureError(f"{SIGNATURES_FILE} must hold exactly one JWT")
    return tokens[0]


def _split(token: str) -> tuple[dict[str, Any], dict[str, Any], bytes, bytes]:
    parts = token.split(".")
    if len(parts) != 3:
        raise SignatureError("signature is not a compact JWS")
    try:
        header = json.loads(_unb64(parts[0]))
        payload = json.loads(_unb64(parts[1]))
        signature = _unb64(parts[2])
    except ValueError:
        raise SignatureError("signature is not a well-formed JWS") from None
    if not isinstance(header, dict) or not isinstance(payload, dict):
        raise SignatureError("signature is not a well-formed JWS")
    return header, payload, f"{parts[0]}.{parts[1]}".encode(), signature


def _check_files(files: Mapping[str, bytes], listed: Any) -> None:
    if not isinstance(listed, list):
        raise SignatureError("signature payload lists no files")
    expected: dict[str, Mapping[str, Any]] = {}
    for entry in listed:
        if not isinstance(entry, Mapping) or not isinstance(entry.get("name"), str):
            raise SignatureError("signature payload has a malformed file entry")
        expected[_normalise(entry["name"])] = entry
    for name, content in sorted(files.items()):
        if name == SIGNATURES_FILE:
            continue
        entry = expected.pop(name, None)
        if entry is None:
            raise SignatureError(f"file {name} is not covered by the bundle signature")
        if entry.get("algorithm") != HASH_ALGORITHM:
            raise SignatureError(f"file {name} is signed with unsupported hash {entry.get('algorithm')!r}")
        try:
            digest = file_digest(name, content)
        except (ValueError, yaml.YAMLError):
            raise SignatureError(f"file {name} cannot be parsed, so its signed digest cannot be checked") from None
        if entry.get("hash") != digest:
            raise SignatureError(f"file {name} does not match its signed digest")
    if expected:
        raise SignatureError(f"signed file {sorted(expected)[0]} is missing from the bundle")


def _normalise(name: str) -> str:
    return name.lstrip("/").removeprefix("./")


def _sign(key: Any, algorithm: str, data: bytes) -> bytes:
    if algorithm == "RS256":
        if not isinstance(key, rsa.RSAPrivateKey):
            raise SignatureError("RS256 needs an RSA private key")
        return key.sign(data, padding.PKCS1v15(), hashes.SHA256())
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.curve.name != "secp256r1":
        raise SignatureError("ES256 needs a P-256 EC private key")
    r, s = decode_dss_signature(key.sign(data, ec.ECDSA(hashes.SHA256())))
    return r.to_bytes(32, "big") + s.to_bytes(32, "big")  # JWS wants raw r||s, not DER


def _verify(key: VerificationKey, signing_input: bytes, signature: bytes) -> None:
    try:
        public_key = serialization.load_pem_public_key(key.public_key_pem)
    except ValueError:
        raise SignatureError(f"public key {key.key_id!r} is not a valid PEM public key") from None
    try:
        if key.algorithm == "RS256" and isinstance(public_key, rsa.RSAPublicKey):
            public_key.verify(signature, signing_input, padding.PKCS1v15(), hashes.SHA256())
            return
        if key.algorithm == "ES256" and isinstance(public_key, ec.EllipticCurvePublicKey):
            if len(signature) != 64:
                raise InvalidSignature()
            der = encode_dss_signature(int.from_bytes(signature[:32], "big"), int.from_bytes(signature[32:], "big"))
            public_key.verify(der, signing_input, ec.ECDSA(hashes.SHA256()))
            return
    except InvalidSignature:
        raise SignatureError(f"signature does not verify with key {key.key_id!r}") from None
    raise SignatureError(f"public key {key.key_id!r} does not fit algorithm {key.algorithm}")


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
