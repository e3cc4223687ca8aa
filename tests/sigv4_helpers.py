"""What the SigV4 suites share: an embedded key store to seal AWS-style credentials in,
and boto3's Bedrock Runtime client signing with one of them against a given endpoint,
one attempt only, so a refusal reaches the test rather than the SDK's retry."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import botocore.config

from portcullis.adapters.config import StoreConfig
from portcullis.adapters.store import Store, open_store


def embedded_store(folder: Path) -> Iterator[Store]:
    """A fresh embedded store in ``folder`` for a fixture to yield, closed afterwards."""
    opened = asyncio.run(open_store(StoreConfig(kind="embedded", path=folder / "keys.db"), max_failures=1000, window=60))
    yield opened
    asyncio.run(opened.close())


def bedrock_client(endpoint_url: str, credential: tuple[str, str], region: str) -> Any:
    """boto3's ``bedrock-runtime`` client signing with ``credential`` (access key id, secret)."""
    return boto3.client(
        "bedrock-runtime",
        region_name=region,
        endpoint_url=endpoint_url,
        aws_access_key_id=credential[0],
        aws_secret_access_key=credential[1],
        config=botocore.config.Config(retries={"max_attempts": 1}),
    )
