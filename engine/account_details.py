"""What of the operator's cloud account a provider's error message may reveal, removed
before the message reaches a client or a log line.

Providers explain a refusal in words meant for the account's owner: Bedrock names the
model or inference-profile ARN (with the account id and region in it), the role the
gateway assumed, the access key id it signed with, and, for a signature mismatch, the
canonical request and string to sign. A client of the gateway is not that owner: it
gets the explanation with each such detail replaced by a neutral placeholder.
"""

from __future__ import annotations

import re

_SIGNING_DETAIL = re.compile(r"(?is)\b(The Canonical String for this request should have been|The String-to-Sign should have been)\b.*")
_RULES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"\barn:aws[a-z-]*:[A-Za-z0-9-]*:[a-z0-9-]*:\d{0,12}:[^\s\"',;)]+"), "(an AWS resource)"),
    (re.compile(r"\b(?:assumed-role|role|user|group|instance-profile)/[\w+=,.@/-]+"), "(an AWS identity)"),
    (re.compile(r"\b(?:AKIA|ASIA|AROA|AIDA|ANPA|AGPA)[A-Z0-9]{12,20}\b"), "(an access key id)"),
    (re.compile(r"\b(?:Credential|Signature|SignedHeaders|X-Amz-(?:Security-Token|Credential|Signature))=[^\s,&\"']+", re.I), "(signing detail)"),
    (re.compile(r"(?<![\d.-])(?:\d{12}|\d{4}-\d{4}-\d{4})(?!\d|[.-]\d)"), "(an account id)"),
)


def without_account_details(message: str) -> str:
    message = _SIGNING_DETAIL.sub("(signing details removed)", message)
    for pattern, placeholder in _RULES:
        message = pattern.sub(placeholder, message)
    return message
