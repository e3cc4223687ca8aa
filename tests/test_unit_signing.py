from __future__ import annotations

import hashlib
import json

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from portcullis.engine.signing import SIGNATURES_FILE, SignatureError, VerificationKey, canonical_bytes, file_digest, parse_structured, sign_files, verify_files

FILES = {".manifest": b'{"revision": "1", "roots": ["p"]}', "p/policy.rego": b"package p\n\nx := 1\n", "p/data.yaml": b"b: 2\na: [1, 2.50]\n"}


def pem_pair(kind: str) -> tuple[bytes, bytes]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048) if kind == "rsa" else ec.generate_private_key(ec.SECP256R1())
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    public = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return private, public


def test_structured_files_hash_like_opa() -> None:
    # OPA hashes JSON as sorted keys, no whitespace, numbers exactly as written.
    assert (
        canonical_bytes(parse_structured("d.json", '{"b": 1.50, "a": {"y": [true, null], "x": "é<"}}'.encode()))
        == '{"a":{"x":"é<","y":[true,null]},"b":1.50}'.encode()
    )
    assert file_digest("x.rego", b"package x\n") == hashlib.sha256(b"package x\n").hexdigest()
    assert file_digest("d.json", b'{"a": 1}') == file_digest("d.json", b'{\n  "a" : 1\n}')


@pytest.mark.parametrize(("kind", "algorithm"), [("rsa", "RS256"), ("ec", "ES256")])
def test_sign_then_verify(kind: str, algorithm: str) -> None:
    private, public = pem_pair(kind)
    signed = {**FILES, SIGNATURES_FILE: sign_files(FILES, private, algorithm, "release")}
    assert verify_files(signed, [VerificationKey("release", algorithm, public)]) == "release"
    token = json.loads(signed[SIGNATURES_FILE])["signatures"][0]
    assert token.count(".") == 2


def test_verification_failures() -> None:
    private, public = pem_pair("rsa")
    other_private, other_public = pem_pair("rsa")
    keys = [VerificationKey("release", "RS256", public)]
    signed = {**FILES, SIGNATURES_FILE: sign_files(FILES, private, "RS256", "release")}
    cases = {
        "not signed": (FILES, keys),
        "no policy.public_keys": (signed, []),
        "not among policy.public_keys": ({**FILES, SIGNATURES_FILE: sign_files(FILES, private, "RS256", "other")}, keys),
        "does not verify": ({**FILES, SIGNATURES_FILE: sign_files(FILES, other_private, "RS256", "release")}, keys),
        "does not match its signed digest": ({**signed, "p/policy.rego": b"package p\n\nx := 2\n"}, keys),
        "not covered": ({**signed, "p/more.rego": b"package p\n"}, keys),
        "missing from the bundle": ({k: v for k, v in signed.items() if k != "p/data.yaml"}, keys),
        "does not match key": (signed, [VerificationKey("release", "ES256", other_public)]),
        "scope does not match": (signed, [VerificationKey("release", "RS256", public, scope="prod")]),
        "exactly one JWT": ({**FILES, SIGNATURES_FILE: b'{"signatures": []}'}, keys),
    }
    for expected, (files, configured) in cases.items():
        with pytest.raises(SignatureError, match=expected):
            verify_files(files, configured)


def test_reformatting_a_signed_json_file_keeps_it_valid() -> None:
    private, public = pem_pair("rsa")
    signed = {**FILES, SIGNATURES_FILE: sign_files(FILES, private, "RS256", "release")}
    signed[".manifest"] = b'{\n  "roots": ["p"],\n  "revision": "1"\n}\n'
    assert verify_files(signed, [VerificationKey("release", "RS256", public)]) == "release"
