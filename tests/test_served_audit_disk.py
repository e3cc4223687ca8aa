"""A full audit disk fails closed, on a real filesystem that really fills up.

The audit log lives on a small tmpfs of the test's own; filling it makes the kernel
refuse writes (short writes, then ENOSPC). Requests then get a 503 `audit_unavailable`
in their own protocol, nothing reaches a provider, their reservations are released,
the file never holds a partial record, and once space returns the same process
recovers: held records are written in order and `portcullis audit verify` passes."""

from __future__ import annotations

import contextlib
import errno
import json
import shutil
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from tests.conftest import Fakes
from tests.fakes import Reply
from tests.governance_helpers import METERED, METERED_UPSTREAM, budget_cap, metered_bundle

pytestmark = pytest.mark.served

DISK_BYTES = 256 * 1024
HI = [{"role": "user", "content": "x"}]


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount_point = tmp_path / "audit-disk"
    mount_point.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("no mount(8) on this machine: cannot make a small filesystem for the audit log")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK_BYTES}", "tmpfs", str(mount_point)], capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root with CAP_SYS_ADMIN): {mounted.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def fill(disk: Path) -> Path:
    """Take every free byte of the filesystem, so the next write that needs a new page fails."""
    filler = disk / f"filler-{uuid.uuid4().hex[:6]}"
    with filler.open("wb", buffering=0) as handle:
        for size in (65536, 4096, 512, 1):
            try:
                while True:
                    handle.write(b"\0" * size)
            except OSError as error:
                assert error.errno == errno.ENOSPC
    return filler


def verify(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "portcullis.adapters.cli", "audit", "verify", str(path)], capture_output=True, text=True)


def records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_bytes().splitlines()]


def reservation(state_db: Path, request_id: str) -> tuple[str, int, int]:
    with contextlib.closing(sqlite3.connect(state_db)) as db:
        return db.execute("SELECT state, tokens, cost_micro_usd FROM reservations WHERE request_id = ?", (request_id,)).fetchone()


def metered_gateway(fresh_gateway: Any, tmp_path: Path, disk: Path) -> tuple[Any, str, Path]:
    """A gateway whose team has a budget (so reservations are visible) and whose audit
    log lives on ``disk``; with a key for that team."""
    team = f"t{uuid.uuid4().hex[:10]}"
    audit_path = disk / "audit.jsonl"
    gateway = fresh_gateway(bundle=metered_bundle(tmp_path / "b", team, budget_cap(team, "1.00", "CalendarMonth")), audit={"path": str(audit_path)})
    return gateway, gateway.key(team), audit_path


def refused_until_full(claude: anthropic.Anthropic) -> anthropic.APIStatusError:
    """Requests until the gateway refuses one: the log's last page may still have room
    for a record or two after the filesystem is full."""
    for _ in range(6):
        try:
            claude.messages.create(model=METERED, max_tokens=1000, messages=HI)
        except anthropic.APIStatusError as error:
            return error
    raise AssertionError("the gateway kept answering with a full audit disk")


def test_full_audit_disk_refuses_releases_and_recovers(small_disk: Path, tmp_path: Path, fresh_gateway, fakes: Fakes) -> None:
    gateway, key, audit_path = metered_gateway(fresh_gateway, tmp_path, small_disk)
    state_db = gateway.directory / "state.db"
    claude = anthropic.Anthropic(base_url=gateway.url, api_key=key, max_retries=0)
    chat = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=key, max_retries=0)
    claude.messages.create(model=METERED, max_tokens=1000, messages=HI)  # the log works

    filler = fill(small_disk)
    first = refused_until_full(claude)
    assert first.status_code == 503
    dispatched = len(fakes.anthropic_us.received) + len(fakes.openai_main.received)
    size_when_full = audit_path.stat().st_size

    # Anthropic's shape: 503, {"type": "error", "error": {"type": "api_error", ...}}.
    with pytest.raises(anthropic.InternalServerError) as refused_claude:
        claude.messages.create(model=METERED, max_tokens=1000, messages=HI)
    assert refused_claude.value.status_code == 503
    body = refused_claude.value.body
    assert body["type"] == "error" and body["error"]["type"] == "api_error" and "audit log" in body["error"]["message"]
    assert refused_claude.value.response.headers["retry-after"] == "5"
    # OpenAI's shape: {"error": {"type": "server_error", "code": "audit_unavailable", ...}}.
    with pytest.raises(openai.InternalServerError) as refused_chat:
        chat.chat.completions.create(model="metered-chat", messages=HI)
    assert refused_chat.value.status_code == 503 and refused_chat.value.code == "audit_unavailable"
    with pytest.raises(anthropic.InternalServerError), claude.messages.stream(model=METERED, max_tokens=1000, messages=HI) as stream:
        stream.get_final_message()  # streams are refused before their first byte too

    assert len(fakes.anthropic_us.received) + len(fakes.openai_main.received) == dispatched  # nothing unaudited went upstream
    refused_ids = [first.response.headers["request-id"], refused_claude.value.response.headers["request-id"], refused_chat.value.response.headers["request-id"]]
    for request_id in refused_ids:
        assert reservation(state_db, request_id) == ("released", 0, 0)  # reserved in admission, released: never charged
    # Every refused write was cut back: the file still ends at its last complete record.
    assert audit_path.stat().st_size == size_when_full and audit_path.read_bytes().endswith(b"\n")
    assert verify(audit_path).returncode == 0

    filler.unlink()  # space returns; no restart
    answer = claude.messages.create(model=METERED, max_tokens=1000, messages=HI)
    assert answer.content[0].text
    written = records(audit_path)
    denied = {r["request_id"]: r for r in written if r["event"] == "request_denied"}
    for request_id in refused_ids:  # the held refusals reached the log, after the fact, in order
        assert denied[request_id]["stage"] == "audit" and denied[request_id]["error"]["code"] == "audit_unavailable"
    assert not any(r["event"] == "request_started" and r["request_id"] in refused_ids for r in written)
    assert [r["seq"] for r in written] == list(range(1, len(written) + 1))
    result = verify(audit_path)
    assert result.returncode == 0, result.stdout
    logs = gateway.logs()
    assert "cannot be written (ENOSPC" in logs and "writable again" in logs and "Traceback" not in logs


def test_outcome_of_a_stream_in_flight_is_held_then_written(small_disk: Path, tmp_path: Path, fresh_gateway, fakes: Fakes) -> None:
    """The disk fills while a stream is being relayed: the client still gets its whole
    answer, the money is settled in the ledger, and the outcome record waits in memory
    (never as a partial line) until the disk takes writes again, then lands without
    waiting for another request."""
    gateway, key, audit_path = metered_gateway(fresh_gateway, tmp_path, small_disk)
    state_db = gateway.directory / "state.db"
    claude = anthropic.Anthropic(base_url=gateway.url, api_key=key, max_retries=0)
    fakes.anthropic_us.script(METERED_UPSTREAM, Reply(text="one slow answer in several pieces", event_delay=0.25))
    result: dict[str, Any] = {}

    def stream() -> None:
        with claude.messages.stream(model=METERED, max_tokens=1000, messages=HI) as events:
            result["text"] = "".join(events.text_stream)
            result["request_id"] = events.response.headers["request-id"]

    worker = threading.Thread(target=stream)
    worker.start()
    deadline = time.monotonic() + 5
    while not fakes.anthropic_us.received and time.monotonic() < deadline:
        time.sleep(0.02)
    filler = fill(small_disk)
    refused_until_full(claude)  # also takes what room the log's last page had
    worker.join(timeout=15)
    assert result["text"] == "one slow answer in several pieces"
    request_id = result["request_id"]
    assert reservation(state_db, request_id)[0] == "settled"  # the ledger settled it, whatever the log could do
    time.sleep(0.3)
    on_disk = records(audit_path)  # every line parses: no partial record
    assert any(r["event"] == "request_started" and r["request_id"] == request_id for r in on_disk)
    assert not any(r["event"] == "request_finished" and r["request_id"] == request_id for r in on_disk)

    filler.unlink()  # no request follows: the gateway's own retry writes the held records
    deadline = time.monotonic() + 5
    while not any(r["event"] == "request_finished" and r["request_id"] == request_id for r in records(audit_path)):
        assert time.monotonic() < deadline, "the held outcome was not written after the disk recovered"
        time.sleep(0.1)
    written = records(audit_path)
    finished = [r for r in written if r["event"] == "request_finished" and r["request_id"] == request_id]
    assert len(finished) == 1 and finished[0]["settlement"] == "settled" and finished[0]["outcome"] == "ok"
    started_seq = next(r["seq"] for r in written if r["event"] == "request_started" and r["request_id"] == request_id)
    assert finished[0]["seq"] > started_seq
    assert verify(audit_path).returncode == 0


def test_a_short_write_is_cut_back_and_the_record_held(small_disk: Path) -> None:
    """The kernel's short write itself: the log's last page has 96 bytes free when the
    filesystem fills, so a record is partly written before ENOSPC. Nothing of it stays;
    the record that must be written now raises, the one that may wait is held."""
    from portcullis.adapters.audit_log import AuditLog, AuditUnavailable

    path = small_disk / "audit.jsonl"
    audit = AuditLog(path)
    audit.append("first")
    padding = 4000 - path.stat().st_size - len(b',"pad":""') - 150
    audit.append("padded", pad="p" * padding)
    slack = 4096 - path.stat().st_size
    assert 0 < slack < 400, slack  # the next ~500-byte record cannot fit in this page
    control = small_disk / "control"
    control.write_bytes(b"c" * (4096 - slack))
    fill(small_disk)
    with control.open("ab", buffering=0) as handle:  # this filesystem, now: a short write, not a refusal
        assert handle.write(b"x" * 500) == slack
    size = path.stat().st_size

    with pytest.raises(AuditUnavailable, match="ENOSPC"):
        audit.append_or_raise("must_be_written", pad="m" * 400)
    assert path.stat().st_size == size and path.read_bytes().endswith(b"\n")
    audit.append("may_wait", pad="w" * 400)  # held, not raised
    assert not audit.available and path.stat().st_size == size

    control.unlink()
    for filler in small_disk.glob("filler-*"):
        filler.unlink()
    audit.append_or_raise("after_recovery")
    audit.close()
    assert [r["event"] for r in records(path)] == ["first", "padded", "may_wait", "after_recovery"]
    assert verify(path).returncode == 0


def test_a_file_size_limit_fails_closed_instead_of_killing_the_gateway(tmp_path: Path, fresh_gateway, fakes: Fakes) -> None:
    """RLIMIT_FSIZE, the other kernel limit on writes: past it a write is cut short and
    then fails with EFBIG (Python ignores SIGXFSZ, which would otherwise kill the writer).
    The gateway refuses like on a full disk, stays up, and recovers when the limit is raised."""
    import resource

    from portcullis.engine.audit_chain import GENESIS, seal

    directory = tmp_path / "limited"
    directory.mkdir()
    audit_path = directory / "audit.jsonl"
    lines, prev = [], GENESIS
    for seq in range(1, 8001):  # a log bigger than every other file the gateway writes, so only it reaches the limit
        line, prev = seal({"event": "earlier", "n": seq, "pad": "p" * 600}, seq, prev)
        lines.append(line)
    audit_path.write_bytes(b"".join(lines))
    gateway = fresh_gateway(audit={"path": str(audit_path)})
    claude = anthropic.Anthropic(base_url=gateway.url, api_key=gateway.key("eng"), max_retries=0)
    claude.messages.create(model="haiku", max_tokens=8, messages=HI)
    assert gateway.process is not None
    size = audit_path.stat().st_size
    resource.prlimit(gateway.process.pid, resource.RLIMIT_FSIZE, (size + 200, resource.RLIM_INFINITY))  # room for a fragment, not a record
    dispatched = len(fakes.anthropic_eu.received)
    with pytest.raises(anthropic.InternalServerError) as refused:
        claude.messages.create(model="haiku", max_tokens=8, messages=HI)
    assert refused.value.status_code == 503 and gateway.process.poll() is None  # refused, and alive
    assert len(fakes.anthropic_eu.received) == dispatched
    assert audit_path.stat().st_size == size and audit_path.read_bytes().endswith(b"\n")  # the short write was cut back

    resource.prlimit(gateway.process.pid, resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    assert claude.messages.create(model="haiku", max_tokens=8, messages=HI).content
    assert "cannot be written (EFBIG" in gateway.logs() and "Traceback" not in gateway.logs()
    assert verify(audit_path).returncode == 0
