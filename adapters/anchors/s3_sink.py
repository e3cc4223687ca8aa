"""The S3 sink: each anchor one object, ``<prefix><chain>/<seq:020d>-<hash>.json``, put
under Object Lock (COMPLIANCE: no one, root included, can delete it or shorten its lock
before ``retention_days``). The key says the seq and hash, so the bucket's listing is
the anchor list, and a body put over it later (a new version) cannot change what the
key says: reading back checks that every version's body agrees with its key.

A bucket without Object Lock is refused at open: anchors there could be deleted by
whoever holds the gateway's credentials. Reading lists every version, so a delete marker
(which Object Lock allows, and which hides an object from a plain listing) hides nothing.

botocore is blocking: every call runs on a thread. Errors name the S3 error code or the
exception's class, never its message (it may repeat the endpoint URL) or a credential.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import re
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import botocore.session
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from portcullis.adapters.anchors.base import AnchorReading, AnchorSinkError, anchor_body, from_env
from portcullis.adapters.audit_config import S3SinkConfig
from portcullis.engine.audit_anchors import Anchor, AnchorFormatError, parse_anchor

KEY = re.compile(r"(?P<chain>[A-Za-z0-9._:-]{1,128})/(?P<seq>\d{20})-(?P<hash>[0-9a-f]{64})\.json")
READERS = 16  # bodies fetched side by side when reading back


def normal_prefix(prefix: str) -> str:
    """A prefix names a folder: ``anchors`` and ``anchors/`` are the same one."""
    return prefix if not prefix or prefix.endswith("/") else prefix + "/"


def anchor_key(prefix: str, anchor: Anchor) -> str:
    return f"{normal_prefix(prefix)}{anchor.chain}/{anchor.seq:020d}-{anchor.hash}.json"


def s3_client(region: str | None, endpoint_url: str | None, credentials: Mapping[str, str]) -> Any:
    """Unset credentials: the AWS chain (environment, profile, instance or pod role)."""
    config = Config(retries={"max_attempts": 3, "mode": "standard"}, connect_timeout=5, read_timeout=10, max_pool_connections=READERS)
    try:
        return botocore.session.get_session().create_client("s3", region_name=region, endpoint_url=endpoint_url, config=config, **credentials)
    except (BotoCoreError, ValueError) as error:
        raise AnchorSinkError(f"cannot create the S3 client ({type(error).__name__})") from None


def describe(error: Exception) -> str:
    if isinstance(error, ClientError):
        code = error.response.get("Error", {}).get("Code", "error")
        status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return f"{code} (HTTP {status})" if status else str(code)
    return type(error).__name__


class S3Sink:
    def __init__(self, client: Any, config: S3SinkConfig, clock: Callable[[], dt.datetime] | None = None) -> None:
        self.prefix = normal_prefix(config.prefix)
        self.name = f"s3://{config.bucket}/{self.prefix}"
        self._client = client
        self._bucket = config.bucket
        self._mode = config.mode
        self._retention = dt.timedelta(days=config.retention_days)
        self._clock = clock or (lambda: dt.datetime.now(dt.UTC))

    @classmethod
    async def open(cls, config: S3SinkConfig, env: Mapping[str, str] | None = None, clock: Callable[[], dt.datetime] | None = None) -> S3Sink:
        """A client for the bucket, once it is known to have Object Lock on."""
        name = f"s3://{config.bucket}/{normal_prefix(config.prefix)}"
        credentials = _credentials(config, os.environ if env is None else env, name)
        try:
            client = s3_client(config.region, config.endpoint_url, credentials)
        except AnchorSinkError as error:
            raise AnchorSinkError(f"anchor sink {name}: {error}") from None
        sink = cls(client, config, clock)
        try:
            await asyncio.to_thread(sink._check_lock)
        except BaseException:
            client.close()
            raise
        return sink

    def _check_lock(self) -> None:
        try:
            answer = self._client.get_object_lock_configuration(Bucket=self._bucket)
        except ClientError as error:
            code = error.response.get("Error", {}).get("Code")
            if code == "ObjectLockConfigurationNotFoundError":
                raise AnchorSinkError(self._unlocked()) from None
            if code in ("AccessDenied", "403"):
                raise AnchorSinkError(
                    f"anchor sink {self.name}: reading the bucket's Object Lock configuration was denied (s3:GetBucketObjectLockConfiguration)"
                ) from None
            raise AnchorSinkError(f"anchor sink {self.name}: checking Object Lock failed: {describe(error)}") from None
        except BotoCoreError as error:
            raise AnchorSinkError(f"anchor sink {self.name}: checking Object Lock failed: {describe(error)}") from None
        if answer.get("ObjectLockConfiguration", {}).get("ObjectLockEnabled") != "Enabled":
            raise AnchorSinkError(self._unlocked())

    def _unlocked(self) -> str:
        return f"anchor sink {self.name}: the bucket does not have Object Lock enabled, so its anchors could be deleted; use a bucket created with Object Lock"

    async def write(self, anchor: Anchor) -> None:
        await asyncio.to_thread(self._put, anchor)

    def _put(self, anchor: Anchor) -> None:
        try:
            self._client.put_object(
                Bucket=self._bucket,
                Key=anchor_key(self.prefix, anchor),
                Body=anchor_body(anchor),
                ContentType="application/json",
                ChecksumAlgorithm="SHA256",  # S3 requires a checksum (or Content-MD5) on a put with a lock
                ObjectLockMode=self._mode,
                ObjectLockRetainUntilDate=self._clock() + self._retention,
            )
        except (ClientError, BotoCoreError) as error:
            raise AnchorSinkError(f"{self.name}: {describe(error)}") from None

    async def close(self) -> None:
        self._client.close()


def _credentials(config: S3SinkConfig, env: Mapping[str, str], name: str) -> dict[str, str]:
    if config.access_key_id_env is None:
        if config.secret_access_key_env or config.session_token_env:
            raise AnchorSinkError(f"anchor sink {name}: secret_access_key_env and session_token_env need access_key_id_env")
        return {}
    if config.secret_access_key_env is None:
        raise AnchorSinkError(f"anchor sink {name}: access_key_id_env needs secret_access_key_env")
    found = {
        "aws_access_key_id": from_env(env, config.access_key_id_env, name),
        "aws_secret_access_key": from_env(env, config.secret_access_key_env, name),
    }
    if config.session_token_env:
        found["aws_session_token"] = from_env(env, config.session_token_env, name)
    return found


class S3AnchorSource:
    """An S3 sink's bucket and prefix read back: every version of every anchor object."""

    def __init__(self, bucket: str, prefix: str, endpoint_url: str | None = None, client: Any = None) -> None:
        self.prefix = normal_prefix(prefix)
        self.name = f"s3://{bucket}/{self.prefix}"
        self._bucket = bucket
        self._client = client if client is not None else s3_client(None, endpoint_url, {})
        self._versions: dict[str, list[tuple[str, str]]] = {}  # chain: (key, version id)
        self._damaged: dict[str | None, list[str]] = {}
        self._hidden: dict[str, set[str]] = {}  # chain: keys whose latest version is a delete marker
        try:
            for page in self._client.get_paginator("list_object_versions").paginate(Bucket=bucket, Prefix=self.prefix):
                for version in page.get("Versions", []):
                    self._listed(version["Key"], version["VersionId"])
                for marker in page.get("DeleteMarkers", []):
                    match = KEY.fullmatch(marker["Key"][len(self.prefix) :])
                    if match and marker.get("IsLatest"):
                        self._hidden.setdefault(match["chain"], set()).add(marker["Key"])
        except ClientError as error:
            denied = " (needs s3:ListBucketVersions)" if error.response.get("Error", {}).get("Code") == "AccessDenied" else ""
            raise AnchorSinkError(f"cannot list the anchors in {self.name}: {describe(error)}{denied}") from None
        except BotoCoreError as error:
            raise AnchorSinkError(f"cannot list the anchors in {self.name}: {describe(error)}") from None

    def _listed(self, key: str, version: str) -> None:
        match = KEY.fullmatch(key[len(self.prefix) :])
        if match:
            self._versions.setdefault(match["chain"], []).append((key, version))
            return
        folder = key[len(self.prefix) :].split("/", 1)[0]  # an object of no chain, or of one by its folder
        chain = folder if "/" in key[len(self.prefix) :] else None
        self._damaged.setdefault(chain, []).append(f"{key}: not an anchor's name ({self.prefix}<chain>/<seq>-<hash>.json)")

    def chains(self) -> list[str]:
        return sorted(set(self._versions) | {chain for chain in self._damaged if chain})

    def read(self, chain: str) -> AnchorReading:
        versions = self._versions.get(chain, [])
        with ThreadPoolExecutor(max_workers=READERS) as pool:
            results = list(pool.map(lambda kv: self._fetch(chain, *kv), versions))
        anchors = tuple(anchor for anchor, _ in results if anchor is not None)
        damaged = (*self._damaged.get(None, []), *self._damaged.get(chain, []), *(why for _, why in results if why))
        hidden = len(self._hidden.get(chain, set()) & {key for key, _ in versions})
        return AnchorReading(chain, anchors, tuple(damaged), hidden)

    def _fetch(self, chain: str, key: str, version: str) -> tuple[Anchor | None, str | None]:
        try:
            body = self._client.get_object(Bucket=self._bucket, Key=key, VersionId=version)["Body"].read()
        except (ClientError, BotoCoreError) as error:
            raise AnchorSinkError(f"cannot read the anchor {key} in s3://{self._bucket}: {describe(error)}") from None
        where = f"{key} (version {version})"
        try:
            anchor = parse_anchor(json.loads(body))
        except ValueError as error:  # AnchorFormatError too
            return None, f"{where}: {error if isinstance(error, AnchorFormatError) else 'not JSON'}"
        match = KEY.fullmatch(key[len(self.prefix) :])
        assert match is not None  # listed under its chain only when it matched
        if (anchor.chain, anchor.seq, anchor.hash) != (chain, int(match["seq"]), match["hash"]):
            return None, f"{where}: the body says seq {anchor.seq} of {anchor.chain}, not what its key says (written over?)"
        return anchor, None
