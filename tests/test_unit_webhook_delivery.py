"""Signed webhook delivery (``adapters/events/``) against a real aiohttp receiver on
127.0.0.1: what arrives verifies as Standard Webhooks and is exactly what was published;
retries keep the message's id and bytes, wait as the backoff or Retry-After says and stop
where they should; redirects are not followed; a full queue drops the oldest; a target's
order holds; close() never waits on a dead receiver; logs and errors never show a
secret, the URL's query or the payload. Sleeps are recorded, not slept."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
from collections.abc import Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import pytest

from portcullis.adapters.events.delivery import WebhookDelivery, WebhookTarget, backoff_delay, retry_after_seconds
from portcullis.adapters.events.signing import generate_secret, new_message_id, parse_secret, signature_headers, verify
from portcullis.adapters.json_bytes import compact
from tests.fakes.server import free_port
from tests.webhook_helpers import QUERY_TOKEN, Receiver

SECRET = parse_secret("whsec_" + base64.b64encode(b"k" * 32).decode())
Script = Sequence[tuple[int, dict[str, str]]]


def run(scenario: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run(scenario)


@dataclass
class Sleeps:
    """Stands in for asyncio.sleep: records the delay, returns at once."""

    delays: list[float] = field(default_factory=list)

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)
        await asyncio.sleep(0)


def target(url: str, **overrides: Any) -> WebhookTarget:
    settings: dict[str, Any] = {"name": "ops", "url": url, "secret": SECRET, "max_attempts": 4, "first_backoff_seconds": 1.0, "max_backoff_seconds": 8.0}
    return WebhookTarget(**(settings | overrides))


def counts(**nonzero: int) -> dict[str, int]:
    return {"delivered": 0, "retried": 0, "failed": 0, "dropped": 0, "queued": 0} | nonzero


def statuses(*codes: int) -> Script:
    return [(code, {}) for code in codes]


def exchange(
    events: Iterable[dict[str, Any]],
    script: Script = (),
    hang: float = 0.0,
    sleeps: Sleeps | None = None,
    now: Callable[[], float] = time.time,
    **overrides: Any,
) -> tuple[Receiver, WebhookDelivery]:
    """Publishes ``events`` to one target at a fresh receiver, then closes (which drains)."""

    async def scenario() -> tuple[Receiver, WebhookDelivery]:
        async with Receiver(script=list(script), hang=hang) as receiver:
            delivery = WebhookDelivery([target(receiver.url, **overrides)], sleep=sleeps or Sleeps(), now=now)
            for data in events:
                delivery.publish("ops", "tool.denied", data)
            await delivery.close(timeout=5)
        return receiver, delivery

    return run(scenario())


# --- signing --------------------------------------------------------------------------------


def test_signature_matches_the_standard_webhooks_test_vector() -> None:
    key = parse_secret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
    body = b'{"test": 2432232314}'
    headers = signature_headers(key, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body)
    signed = {"webhook-id": "msg_p5jXN8AQM9LWM0D4loKWxJek", "webhook-timestamp": "1614265330"}
    assert headers == signed | {"webhook-signature": "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="}
    assert verify(key, headers, body, now=1614265330)


def test_verify_takes_any_rotated_secret_and_rejects_malformed_headers() -> None:
    old, new = b"o" * 32, b"n" * 32
    rotating = signature_headers([old, new], "msg_1", 1000, b"{}")
    assert len(rotating["webhook-signature"].split(" ")) == 2
    assert verify(old, rotating, b"{}", now=1000) and verify(new, rotating, b"{}", now=1000)
    assert not verify(b"x" * 32, rotating, b"{}", now=1000)
    headers = signature_headers(SECRET, "msg_1", 1000, b"{}")
    assert verify(SECRET, {k.upper(): v for k, v in headers.items()}, b"{}", now=1000)  # names are case-insensitive
    assert not verify(SECRET, {k: v for k, v in headers.items() if k != "webhook-signature"}, b"{}", now=1000)
    assert not verify(SECRET, headers | {"webhook-timestamp": "1000.5"}, b"{}", now=1000)
    assert not verify(SECRET, headers | {"webhook-id": "msg_2"}, b"{}", now=1000)
    assert not verify(SECRET, headers | {"webhook-signature": headers["webhook-signature"].replace("v1,", "v2,")}, b"{}", now=1000)
    assert not verify(SECRET, headers | {"webhook-signature": "v1,é"}, b"{}", now=1000)


def test_parse_secret_accepts_the_standard_form() -> None:
    made = generate_secret()
    assert made.startswith("whsec_") and len(parse_secret(made)) == 32
    unpadded = "whsec_" + base64.b64encode(b"s" * 25).decode().rstrip("=")
    assert parse_secret(unpadded) == b"s" * 25
    assert parse_secret(f"  {made}\n") == parse_secret(made)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "hunter2-hunter2-hunter2-hunter2-hunter2",  # no prefix
        base64.b64encode(b"hunter2-hunter2-hunter2-x").decode(),  # base64 without the prefix
        "whsec_hunter2!!hunter2!!hunter2!!",  # not base64
        "whsec_" + base64.b64encode(b"hunter2-short").decode(),  # 13 bytes
        "whsec_" + base64.urlsafe_b64encode(b"\xfb\xff" * 16).decode(),  # URL-safe alphabet
    ],
)
def test_parse_secret_rejects_without_echoing(text: str) -> None:
    with pytest.raises(ValueError, match="webhook secret") as raised:
        parse_secret(text)
    message = str(raised.value)
    assert "hunter2" not in message
    if text:
        assert text not in message and text.removeprefix("whsec_") not in message


def test_message_ids_are_unique_and_shaped() -> None:
    ids = {new_message_id() for _ in range(1000)}
    assert len(ids) == 1000
    assert all(i.startswith("msg_") and len(i) == 30 and i[4:].isalnum() for i in ids)


# --- what arrives ---------------------------------------------------------------------------


def test_delivered_message_verifies_and_tampering_fails() -> None:
    [got] = exchange([{"n": 1}])[0].received
    now = int(time.time())
    assert abs(int(got.headers["webhook-timestamp"]) - now) <= 5
    assert verify(SECRET, got.headers, got.body, now=now)
    assert not verify(SECRET, got.headers, got.body.replace(b'"n":1', b'"n":2'), now=now)
    assert not verify(b"z" * 32, got.headers, got.body, now=now)
    stamp = int(got.headers["webhook-timestamp"])
    assert not verify(SECRET, got.headers, got.body, now=stamp + 301)
    assert not verify(SECRET, got.headers, got.body, now=stamp - 301)
    assert verify(SECRET, got.headers, got.body, now=stamp + 300)
    assert not verify(SECRET, got.headers | {"webhook-timestamp": str(stamp + 1)}, got.body, now=stamp)


def test_body_is_exactly_what_was_published() -> None:
    data = {"request_id": "req_1", "tool": "shell", "rule": "deny-shell", "nested": {"ok": True, "count": 3, "ratio": 0.5, "name": "ünï"}}
    [got] = exchange([data], now=lambda: 1700000000.25)[0].received
    expected = {"type": "tool.denied", "timestamp": "2023-11-14T22:13:20.250Z", "data": data}
    assert got.body == compact(expected)
    assert got.body == json.dumps(expected, separators=(",", ":"), ensure_ascii=False).encode()
    assert got.path == "/hook" and got.headers["content-type"] == "application/json" and "authorization" not in got.headers
    assert got.headers["webhook-timestamp"] == "1700000000" and verify(SECRET, got.headers, got.body, now=1700000000)


def test_unsigned_target_sends_no_signature_and_bearer_token_is_sent() -> None:
    [unsigned] = exchange([{"n": 1}], secret=None)[0].received
    assert "webhook-signature" not in unsigned.headers and "authorization" not in unsigned.headers
    assert unsigned.headers["webhook-id"].startswith("msg_")  # still there: receivers de-duplicate by it
    [bearing] = exchange([{"n": 1}], bearer_token="tok-abc")[0].received
    assert bearing.headers["authorization"] == "Bearer tok-abc" and "webhook-signature" in bearing.headers


# --- retries --------------------------------------------------------------------------------


def test_retry_on_503_keeps_id_and_bytes_then_succeeds() -> None:
    sleeps = Sleeps()
    receiver, delivery = exchange([{"n": 1}], sleeps=sleeps, script=statuses(503, 503))
    assert len(receiver.received) == 3
    assert len({got.headers["webhook-id"] for got in receiver.received}) == 1
    assert len({got.body for got in receiver.received}) == 1
    assert all(verify(SECRET, got.headers, got.body, now=int(time.time())) for got in receiver.received)
    assert delivery.stats()["ops"] == counts(delivered=1, retried=2)
    assert len(sleeps.delays) == 2 and 0 <= sleeps.delays[0] <= 1.0 and 0 <= sleeps.delays[1] <= 2.0


@pytest.mark.parametrize("status", [408, 425, 429, 500, 502, 504])
def test_transient_statuses_are_retried(status: int) -> None:
    receiver, delivery = exchange([{"n": 1}], script=statuses(status))
    assert len(receiver.received) == 2
    assert delivery.stats()["ops"]["delivered"] == 1


@pytest.mark.parametrize("status", [400, 401, 404, 410, 422])
def test_other_4xx_is_not_retried_and_logged_once(status: int, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="portcullis.events")
    sleeps = Sleeps()
    receiver, delivery = exchange([{"n": 1, "secret_field": "payload-value"}], sleeps=sleeps, bearer_token="tok-abc", script=statuses(status))
    assert len(receiver.received) == 1 and sleeps.delays == []
    assert delivery.stats()["ops"] == counts(failed=1)
    [text] = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert f"status {status}" in text and "ops" in text and "tool.denied" in text
    assert_nothing_secret_logged(caplog)


def test_retry_after_is_honoured_and_capped() -> None:
    sleeps = Sleeps()
    script = [(429, {"Retry-After": "7"}), (503, {"Retry-After": "3600"})]
    delivery = exchange([{"n": 1}], sleeps=sleeps, max_backoff_seconds=60.0, script=script)[1]
    assert sleeps.delays == [7.0, 60.0]
    assert delivery.stats()["ops"]["delivered"] == 1


def test_gives_up_after_max_attempts_then_carries_on(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="portcullis.events")
    sleeps = Sleeps()
    receiver, delivery = exchange(
        [{"n": 1}, {"n": 2}], sleeps=sleeps, max_attempts=4, first_backoff_seconds=1.0, max_backoff_seconds=3.0, script=statuses(500, 500, 500, 500)
    )
    assert receiver.numbers() == [1, 1, 1, 1, 2]
    assert delivery.stats()["ops"] == counts(delivered=1, retried=3, failed=1)
    assert len(sleeps.delays) == 3 and all(0 <= delay <= min(3.0, 2 ** (n - 1)) for n, delay in enumerate(sleeps.delays, start=1))
    [gave_up] = [r.getMessage() for r in caplog.records if "gave up" in r.getMessage()]
    assert "after 4 attempts" in gave_up and "status 500" in gave_up
    assert_nothing_secret_logged(caplog)


def test_connection_refused_is_retried_and_logged_by_class(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="portcullis.events")
    sleeps = Sleeps()

    async def scenario() -> WebhookDelivery:
        delivery = WebhookDelivery([target(f"http://127.0.0.1:{free_port()}/hook?token={QUERY_TOKEN}", max_attempts=3)], sleep=sleeps)
        delivery.publish("ops", "tool.denied", {"n": 1})
        await delivery.close(timeout=5)
        return delivery

    delivery = run(scenario())
    assert delivery.stats()["ops"] == counts(retried=2, failed=1)
    assert len(sleeps.delays) == 2
    [gave_up] = [r.getMessage() for r in caplog.records if "gave up" in r.getMessage()]
    assert "ClientConnectorError" in gave_up
    assert_nothing_secret_logged(caplog)


def test_attempt_timeout_is_retried() -> None:
    receiver, delivery = exchange([{"n": 1}], timeout_seconds=0.1, max_attempts=2, hang=1.0)
    assert len(receiver.received) == 2
    assert delivery.stats()["ops"] == counts(retried=1, failed=1)


def test_redirect_is_not_followed() -> None:
    receiver, delivery = exchange([{"n": 1}, {"n": 2}], script=[(302, {"Location": "/elsewhere"}), (307, {"Location": "/elsewhere"})])
    assert [got.path for got in receiver.received] == ["/hook", "/hook"]
    assert delivery.stats()["ops"] == counts(failed=2)


def test_backoff_is_exponential_capped_and_jittered() -> None:
    assert [backoff_delay(n, 1.0, 8.0, rand=lambda: 1.0) for n in range(1, 7)] == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    assert backoff_delay(3, 1.0, 8.0, rand=lambda: 0.5) == 2.0
    assert backoff_delay(5000, 1.0, 60.0, rand=lambda: 1.0) == 60.0  # no overflow on long runs
    assert len({backoff_delay(4, 1.0, 60.0) for _ in range(50)}) > 1


def test_retry_after_forms() -> None:
    now = 1_700_000_000.0
    assert [retry_after_seconds(value, now) for value in ("7", " 2.5 ", "-3")] == [7.0, 2.5, 0.0]
    date = format_datetime(datetime.fromtimestamp(now, UTC) + timedelta(seconds=30), usegmt=True)
    assert retry_after_seconds(date, now) == pytest.approx(30.0)
    for unreadable in (None, "", "soon", "nan", "inf"):
        assert retry_after_seconds(unreadable, now) is None


# --- queueing, order, closing --------------------------------------------------------------


def test_order_is_preserved_through_retries() -> None:
    assert exchange([{"n": n} for n in range(8)], script=statuses(200, 200, 503, 200, 500))[0].numbers() == [0, 1, 2, 2, 3, 3, 4, 5, 6, 7]


def test_full_queue_drops_oldest_and_warns_once_a_minute(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="portcullis.events")
    clock = [1_700_000_000.0]

    async def scenario() -> tuple[Receiver, WebhookDelivery, dict[str, int]]:
        async with Receiver() as receiver:
            delivery = WebhookDelivery([target(receiver.url)], queue_size=3, sleep=Sleeps(), now=lambda: clock[0])
            for n in range(10):  # publish never yields: the consumer has not run yet
                delivery.publish("ops", "tool.denied", {"n": n})
            clock[0] += 30
            delivery.publish("ops", "tool.denied", {"n": 10})
            clock[0] += 31
            delivery.publish("ops", "tool.denied", {"n": 11})
            before = delivery.stats()["ops"]
            await delivery.close(timeout=5)
        return receiver, delivery, before

    receiver, delivery, before = run(scenario())
    assert before == counts(dropped=9, queued=3) and receiver.numbers() == [9, 10, 11]
    assert delivery.stats()["ops"] == counts(delivered=3, dropped=9)
    warnings = [r.getMessage() for r in caplog.records if "queue full" in r.getMessage()]
    assert len(warnings) == 2  # the first drop, then the first one 61 s later; not the 30 s one
    assert "(1 dropped so far)" in warnings[0] and "(9 dropped so far)" in warnings[1]


def test_close_returns_within_timeout_when_the_receiver_hangs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="portcullis.events")

    async def scenario() -> tuple[float, WebhookDelivery, Receiver]:
        async with Receiver(hang=30.0) as slow, Receiver() as fast:
            delivery = WebhookDelivery([target(slow.url, name="slow", timeout_seconds=20.0), target(fast.url, name="fast")], sleep=asyncio.sleep)
            for n in range(3):
                delivery.publish("slow", "tool.denied", {"n": n})
                delivery.publish("fast", "tool.denied", {"n": n})
            started = time.monotonic()
            await delivery.close(timeout=0.3)
            elapsed = time.monotonic() - started
        return elapsed, delivery, fast

    elapsed, delivery, fast = run(scenario())
    assert elapsed < 2.0 and fast.numbers() == [0, 1, 2]  # one target's dead receiver does not hold up another's
    assert delivery.stats() == {"slow": counts(queued=3), "fast": counts(delivered=3)}
    assert any("slow: 3 messages left undelivered" in r.getMessage() for r in caplog.records)


def test_publish_contract(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="portcullis.events")

    async def scenario() -> WebhookDelivery:
        delivery = WebhookDelivery([target("https://example.invalid/hook")])
        with pytest.raises(ValueError, match="no target is named nope"):
            delivery.publish("nope", "tool.denied", {})
        delivery.publish("ops", "tool.denied", {"when": object()})  # not JSON: counted and logged, never raised
        await delivery.close()
        await delivery.close()  # twice, and with nothing ever sent: no session to close
        delivery.publish("ops", "tool.denied", {"n": 1})  # after close: dropped, not raised
        return delivery

    assert run(scenario()).stats()["ops"] == counts(failed=1, dropped=1)
    assert any("could not be encoded (TypeError)" in r.getMessage() for r in caplog.records)
    assert any("delivery closed" in r.getMessage() for r in caplog.records)


def test_target_settings_are_checked_and_secrets_kept_out_of_repr() -> None:
    shown = repr(target(f"https://hooks.example/h?token={QUERY_TOKEN}", bearer_token="tok-abc"))
    assert "ops" in shown and QUERY_TOKEN not in shown and "tok-abc" not in shown and repr(SECRET) not in shown
    urls = ({"url": "ftp://hooks.example/h"}, {"url": "https:///no-host"})
    for bad in (*urls, {"max_attempts": 0}, {"timeout_seconds": 0}, {"bearer_token": "a\r\nb"}, {"secret": b""}, {"name": ""}):
        with pytest.raises(ValueError):
            target(**({"url": "https://hooks.example/h"} | bad))
    with pytest.raises(ValueError, match="two targets"):
        WebhookDelivery([target("https://a.example/h"), target("https://b.example/h")])


def assert_nothing_secret_logged(caplog: pytest.LogCaptureFixture) -> None:
    text = "\n".join(record.getMessage() for record in caplog.records)
    assert text  # something was logged, so the checks below mean something
    for secret in (QUERY_TOKEN, "tok-abc", "payload-value", "127.0.0.1", base64.b64encode(SECRET).decode()):
        assert secret not in text
