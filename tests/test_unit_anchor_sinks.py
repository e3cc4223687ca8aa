"""The anchor sinks against the real things: a file forced to the disk (and warned about
on the log's own device), an S3 bucket with Object Lock (moto's server on 127.0.0.1:
each anchor locked, its locked version undeletable, a bucket without a lock refused)
and an HTTP receiver (aiohttp on 127.0.0.1: Standard Webhooks signature, bearer token,
a 5xx or a redirect a failure). Errors never show a secret or the URL's query; what is
read back reports damaged entries instead of failing on them."""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import json
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from botocore.exceptions import ClientError

from portcullis.adapters.anchors.base import AnchorSinkError
from portcullis.adapters.anchors.file_sink import FileAnchorSource, FileSink
from portcullis.adapters.anchors.http_sink import HttpSink
from portcullis.adapters.anchors.s3_sink import S3Sink, anchor_key
from portcullis.adapters.anchors.sinks import open_anchor_source, open_sinks
from portcullis.adapters.audit_config import AnchorConfig, FileSinkConfig, HttpSinkConfig, S3SinkConfig
from portcullis.adapters.events.signing import parse_secret, verify
from portcullis.engine.audit_anchors import Anchor
from tests.audit_helpers import MOTO_KEY, MOTO_SECRET, locked_bucket, moto_s3, s3_admin

SECRET_TEXT = "whsec_" + base64.b64encode(b"s" * 32).decode()
BEARER = "bearer-token-never-shown"
QUERY_TOKEN = "query-token-never-shown"
S3_ENV = {"ANCHOR_KEY_ID": MOTO_KEY, "ANCHOR_SECRET": MOTO_SECRET}


def anchor(seq: int, chain: str = "gw:audit.jsonl", digest: str | None = None) -> Anchor:
    return Anchor(seq, digest or f"{seq:064x}", f"2026-01-01T00:00:{seq % 60:02d}.000+00:00", chain)


# --- file ------------------------------------------------------------------------------


def test_file_sink_appends_one_line_per_anchor_and_reads_back(tmp_path: Path) -> None:
    path = tmp_path / "mount" / "anchors" / "audit.anchors.jsonl"  # its folder is created

    async def scenario() -> None:
        sink = FileSink.open(FileSinkConfig(path))
        await sink.write(anchor(1))
        await sink.write(anchor(7))
        await sink.close()
        sink = FileSink.open(FileSinkConfig(path))  # reopened: appended, not replaced
        await sink.write(anchor(9, chain="gw:audit.jsonl.w1"))
        await sink.close()

    asyncio.run(scenario())
    assert path.stat().st_mode & 0o777 == 0o600
    assert [json.loads(line) for line in path.read_bytes().splitlines()] == [
        a.as_record() for a in (anchor(1), anchor(7), anchor(9, chain="gw:audit.jsonl.w1"))
    ]
    source = FileAnchorSource(path)
    assert source.chains() == ["gw:audit.jsonl", "gw:audit.jsonl.w1"]
    reading = source.read("gw:audit.jsonl")
    assert reading.anchors == (anchor(1), anchor(7)) and reading.damaged == ()


def test_file_sink_on_the_logs_device_is_warned_about(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "log").mkdir()
    with caplog.at_level(logging.WARNING, logger="portcullis"):
        asyncio.run(FileSink.open(FileSinkConfig(tmp_path / "a.jsonl"), tmp_path / "log").close())
    assert "same device as the audit log" in caplog.text
    other = Path("/dev/shm")
    if not other.is_dir() or os.stat(other).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("no second device to put the sink on")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="portcullis"):
        asyncio.run(FileSink.open(FileSinkConfig(tmp_path / "b.jsonl"), other).close())
    assert "same device" not in caplog.text


def test_a_file_sink_that_cannot_write_says_why_and_starts_a_fresh_line_after(tmp_path: Path) -> None:
    sink = FileSink.open(FileSinkConfig(Path("/dev/full")))  # every write: ENOSPC

    async def scenario() -> None:
        with pytest.raises(AnchorSinkError, match="No space left"):
            await sink.write(anchor(1))
        assert sink._torn
        await sink.close()

    asyncio.run(scenario())


def test_damaged_anchor_lines_are_reported_not_fatal(tmp_path: Path) -> None:
    path = tmp_path / "anchors.jsonl"
    good, other = anchor(3), anchor(4, chain="other")
    lines = [
        json.dumps(good.as_record()),
        '{"chain": "gw:audit.jsonl", "seq": 5, "ha',  # a write cut short
        "",
        json.dumps({**anchor(6).as_record(), "hash": "not-a-digest"}),
        json.dumps(other.as_record()),
    ]
    path.write_text("\n".join(lines) + "\n")
    source = FileAnchorSource(path)
    reading = source.read("gw:audit.jsonl")
    assert reading.anchors == (good,)
    assert [why.split(": ", 1)[1] for why in reading.damaged] == ["not JSON (damaged, or a write cut short)", "hash is not a SHA-256 hex digest"]
    assert "line 2" in reading.damaged[0] and "line 4" in reading.damaged[1]
    assert len(source.read("other").damaged) == 1  # the cut line names no chain: every chain hears of it


# --- S3 --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def s3_url() -> Iterator[str]:
    with moto_s3() as url:
        yield url


def s3_config(bucket: str, url: str, **overrides: Any) -> S3SinkConfig:
    settings: dict[str, Any] = {
        "bucket": bucket,
        "endpoint_url": url,
        "region": "us-east-1",
        "access_key_id_env": "ANCHOR_KEY_ID",
        "secret_access_key_env": "ANCHOR_SECRET",
        "retention_days": 30,
    }
    return S3SinkConfig(**(settings | overrides))


@pytest.mark.parametrize("mode", ["COMPLIANCE", "GOVERNANCE"])
def test_s3_anchors_are_locked_objects_whose_version_cannot_be_deleted(s3_url: str, mode: str) -> None:
    admin = s3_admin(s3_url)
    bucket = locked_bucket(admin)
    written = anchor(42)

    async def scenario() -> str:
        sink = await S3Sink.open(s3_config(bucket, s3_url, mode=mode, prefix="anchors"), S3_ENV)
        await sink.write(written)
        await sink.close()
        return sink.name

    assert asyncio.run(scenario()) == f"s3://{bucket}/anchors/"
    key = anchor_key("anchors", written)
    assert key == f"anchors/gw:audit.jsonl/{42:020d}-{written.hash}.json"
    head = admin.head_object(Bucket=bucket, Key=key)
    assert head["ObjectLockMode"] == mode
    until = head["ObjectLockRetainUntilDate"] - dt.datetime.now(dt.UTC)
    assert dt.timedelta(days=29, hours=23) < until <= dt.timedelta(days=30)
    assert json.loads(admin.get_object(Bucket=bucket, Key=key)["Body"].read()) == written.as_record()
    with pytest.raises(ClientError, match="AccessDenied"):
        admin.delete_object(Bucket=bucket, Key=key, VersionId=head["VersionId"])


def test_a_bucket_without_object_lock_is_refused_at_open(s3_url: str) -> None:
    bucket = locked_bucket(s3_admin(s3_url), locked=False)
    with pytest.raises(AnchorSinkError, match="does not have Object Lock enabled"):
        asyncio.run(S3Sink.open(s3_config(bucket, s3_url), S3_ENV))
    with pytest.raises(AnchorSinkError, match="NoSuchBucket"):
        asyncio.run(S3Sink.open(s3_config("no-such-anchor-bucket", s3_url), S3_ENV))


def test_s3_credentials_missing_from_the_environment_are_named_not_shown(s3_url: str) -> None:
    bucket = locked_bucket(s3_admin(s3_url))
    with pytest.raises(AnchorSinkError, match="ANCHOR_SECRET is not set") as raised:
        asyncio.run(S3Sink.open(s3_config(bucket, s3_url), {"ANCHOR_KEY_ID": MOTO_KEY}))
    assert MOTO_KEY not in str(raised.value)
    with pytest.raises(AnchorSinkError, match="needs secret_access_key_env"):
        asyncio.run(S3Sink.open(s3_config(bucket, s3_url, secret_access_key_env=None), S3_ENV))


def test_s3_anchors_read_back_every_version_and_report_what_is_not_one(s3_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", MOTO_KEY)  # reading back uses the AWS credential chain
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", MOTO_SECRET)
    admin = s3_admin(s3_url)
    bucket = locked_bucket(admin)
    anchors = [anchor(1), anchor(2), anchor(3), anchor(1, chain="gw:audit.jsonl.w1")]

    async def scenario() -> None:
        sink = await S3Sink.open(s3_config(bucket, s3_url), S3_ENV)
        for each in anchors:
            await sink.write(each)
        await sink.close()

    asyncio.run(scenario())
    prefix = "portcullis-anchors/"
    admin.delete_object(Bucket=bucket, Key=anchor_key(prefix, anchors[0]))  # a delete marker hides it from a plain listing
    forged = {**anchors[1].as_record(), "hash": "f" * 64}
    admin.put_object(Bucket=bucket, Key=anchor_key(prefix, anchors[1]), Body=json.dumps(forged).encode())  # a new version over it
    admin.put_object(Bucket=bucket, Key=f"{prefix}gw:audit.jsonl/notes.txt", Body=b"hello")
    source = open_anchor_source(f"s3://{bucket}/portcullis-anchors", s3_url)
    assert source.chains() == ["gw:audit.jsonl", "gw:audit.jsonl.w1"]
    reading = source.read("gw:audit.jsonl")
    assert sorted(reading.anchors) == anchors[:3]  # the hidden one too, and the original under the forged version
    assert reading.hidden == 1
    assert len(reading.damaged) == 2
    assert any("notes.txt: not an anchor's name" in why for why in reading.damaged)
    assert any("not what its key says" in why for why in reading.damaged)
    assert source.read("gw:audit.jsonl.w1").anchors == (anchors[3],)


def test_open_sinks_refuses_the_whole_set_when_one_cannot_open(s3_url: str, tmp_path: Path) -> None:
    bucket = locked_bucket(s3_admin(s3_url), locked=False)
    config = AnchorConfig("gw", (FileSinkConfig(tmp_path / "a.jsonl"), s3_config(bucket, s3_url)))
    with pytest.raises(AnchorSinkError, match="Object Lock"):
        asyncio.run(open_sinks(config, tmp_path / "audit.jsonl", S3_ENV))
    twice = AnchorConfig("gw", (FileSinkConfig(tmp_path / "a.jsonl"), FileSinkConfig(tmp_path / "a.jsonl")))
    with pytest.raises(AnchorSinkError, match="configured twice"):
        asyncio.run(open_sinks(twice, tmp_path / "audit.jsonl"))


# --- HTTP ------------------------------------------------------------------------------


class Receiver:
    """A real HTTP receiver on 127.0.0.1 answering ``statuses`` in turn (then 204)."""

    def __init__(self, *statuses: int) -> None:
        self.statuses = list(statuses)
        self.received: list[tuple[dict[str, str], bytes]] = []
        self.url = ""

    async def __aenter__(self) -> Receiver:
        app = web.Application()
        app.router.add_post("/anchors", self._handle)
        app.router.add_post("/elsewhere", self._handle)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{self.port}/anchors?token={QUERY_TOKEN}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._runner.cleanup()

    async def _handle(self, request: web.Request) -> web.Response:
        self.received.append(({k.lower(): v for k, v in request.headers.items()}, await request.read()))
        status = self.statuses.pop(0) if self.statuses else 204
        return web.Response(status=status, headers={"location": "/elsewhere"} if 300 <= status < 400 else {})


HTTP_ENV = {"ANCHOR_HOOK_SECRET": SECRET_TEXT, "ANCHOR_HOOK_TOKEN": BEARER}


def http_config(url: str, **overrides: Any) -> HttpSinkConfig:
    return HttpSinkConfig(**({"url": url, "secret_env": "ANCHOR_HOOK_SECRET", "bearer_token_env": "ANCHOR_HOOK_TOKEN"} | overrides))


def test_http_anchors_are_signed_standard_webhooks_with_the_bearer_token() -> None:
    async def scenario() -> Receiver:
        async with Receiver() as receiver:
            sink = HttpSink(http_config(receiver.url), HTTP_ENV)
            assert sink.name == f"http:127.0.0.1:{receiver.port}"
            await sink.write(anchor(5))
            await sink.close()
        return receiver

    receiver = asyncio.run(scenario())
    [(headers, body)] = receiver.received
    assert json.loads(body) == anchor(5).as_record()
    assert verify(parse_secret(SECRET_TEXT), headers, body, now=int(time.time()))
    assert not verify(parse_secret("whsec_" + base64.b64encode(b"o" * 32).decode()), headers, body, now=int(time.time()))
    assert headers["authorization"] == f"Bearer {BEARER}" and headers["content-type"] == "application/json"


@pytest.mark.parametrize(("status", "attempts"), [(500, 1), (302, 1), (404, 1)])
def test_an_http_answer_outside_2xx_is_a_failure_that_names_the_status_only(status: int, attempts: int) -> None:
    async def scenario() -> tuple[Receiver, str]:
        async with Receiver(status) as receiver:
            sink = HttpSink(http_config(receiver.url), HTTP_ENV)
            with pytest.raises(AnchorSinkError) as raised:
                await sink.write(anchor(5))
            await sink.close()
        return receiver, str(raised.value)

    receiver, message = asyncio.run(scenario())
    assert message == f"http:127.0.0.1:{receiver.port}: answered HTTP {status}"
    assert len(receiver.received) == attempts  # a redirect is not followed


def test_an_unreachable_receiver_and_bad_secrets_fail_without_showing_them() -> None:
    async def scenario() -> str:
        sink = HttpSink(http_config(f"http://127.0.0.1:9/anchors?token={QUERY_TOKEN}", timeout_seconds=2), HTTP_ENV)
        with pytest.raises(AnchorSinkError) as raised:
            await sink.write(anchor(1))
        await sink.close()
        return str(raised.value)

    message = asyncio.run(scenario())
    assert message.startswith("http:127.0.0.1:9: ") and QUERY_TOKEN not in message
    with pytest.raises(AnchorSinkError, match="ANCHOR_HOOK_TOKEN is not set"):
        HttpSink(http_config("https://hooks.example/a"), {"ANCHOR_HOOK_SECRET": SECRET_TEXT})
    with pytest.raises(AnchorSinkError, match="ANCHOR_HOOK_SECRET: webhook secret") as raised:
        HttpSink(http_config("https://hooks.example/a"), {**HTTP_ENV, "ANCHOR_HOOK_SECRET": "not-a-whsec-secret"})
    assert "not-a-whsec-secret" not in str(raised.value)
    with pytest.raises(AnchorSinkError, match="url must be an http or https URL"):
        HttpSink(http_config("ftp://user:pw@hooks.example/a"), HTTP_ENV)
