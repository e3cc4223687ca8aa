"""The audit log rotates with its chain continuing across files, `audit verify` walks
every file of it, and anchors catch what the chain alone cannot: a truncated or
rewritten tail."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from portcullis.adapters.audit_files import segments
from portcullis.adapters.audit_log import AuditLog, AuditLogError, AuditWriting
from portcullis.adapters.cli import main
from portcullis.engine.audit_anchors import Anchor, compare, parse_anchor
from portcullis.engine.audit_chain import verify
from tests.audit_helpers import all_records, forge_tail, write_records


def _rotated(tmp_path: Path, rotate_bytes: int, count: int) -> Path:
    path = tmp_path / "audit.jsonl"
    log = AuditLog(path, writing=AuditWriting(rotate_bytes=rotate_bytes, fsync="never"))
    write_records(log, count)
    log.close()
    return path


def test_rotation_by_size_keeps_one_chain_over_the_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _rotated(tmp_path, 2000, 40)
    rotated = segments(path)
    assert len(rotated) >= 3
    first, last = rotated[0].name.split(".")[1].split("-")
    assert int(first) == 1 and int(last) == len(rotated[0].read_bytes().splitlines())
    records = all_records(path)
    assert [r["seq"] for r in records] == list(range(1, 41))
    assert main(["audit", "verify", str(path)]) == 0
    assert "40 records in" in capsys.readouterr().out


def test_a_new_file_after_a_rotation_continues_the_chain_on_restart(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "audit.jsonl"
    log = AuditLog(path, writing=AuditWriting(rotate_bytes=300, fsync="never"))
    write_records(log, 1)  # one record fills the file: it rotates at once, the live file is empty
    log.close()
    assert path.read_bytes() == b"" and len(segments(path)) == 1
    log = AuditLog(path, writing=AuditWriting(rotate_bytes=0, fsync="always"))
    write_records(log, 2)
    log.close()
    assert [r["seq"] for r in all_records(path)] == [1, 2, 3]
    assert main(["audit", "verify", str(path)]) == 0


def test_verify_finds_a_rotated_file_removed_from_the_middle(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _rotated(tmp_path, 1500, 30)
    rotated = segments(path)
    rotated[1].unlink()
    assert main(["audit", "verify", str(path)]) == 1
    assert "was removed, reordered or inserted" in capsys.readouterr().out


def test_verify_starts_at_the_oldest_file_still_here(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _rotated(tmp_path, 1500, 30)
    segments(path)[0].unlink()  # shipped away
    assert main(["audit", "verify", str(path)]) == 0
    assert "the files before it are not here" in capsys.readouterr().out


def test_rotation_by_age_happens_without_traffic(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    log = AuditLog(path, writing=AuditWriting(rotate_bytes=0, rotate_seconds=0.2, fsync="interval", fsync_interval=0.01))
    write_records(log, 3)
    time.sleep(0.3)
    asyncio.run(log.tick())
    assert len(segments(path)) == 1 and path.read_bytes() == b""
    write_records(log, 1)
    log.close()
    assert [r["seq"] for r in all_records(path)] == [1, 2, 3, 4]


def test_a_second_process_cannot_take_a_rotating_log(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    log = AuditLog(path, writing=AuditWriting(rotate_bytes=300, fsync="never"))
    write_records(log, 2)
    with pytest.raises(AuditLogError, match="in use by another process"):
        AuditLog(path)
    log.close()


def test_synced_head_is_the_last_record_written(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit.jsonl")
    write_records(log, 5)
    head = asyncio.run(log.synced_head())
    assert head == log.head and head.seq == 5
    log.close()


def _chain(tmp_path: Path, count: int) -> tuple[Path, list[dict]]:
    path = tmp_path / "audit.jsonl"
    log = AuditLog(path, writing=AuditWriting(fsync="never"))
    write_records(log, count)
    log.close()
    return path, all_records(path)


def _anchor(record: dict) -> Anchor:
    return parse_anchor({"chain": "gw:audit.jsonl", "seq": record["seq"], "hash": record["hash"], "ts": record["ts"]})


def test_anchors_pass_an_intact_log_and_count_the_unanchored_tail(tmp_path: Path) -> None:
    path, records = _chain(tmp_path, 10)
    anchors = [_anchor(records[3]), _anchor(records[7])]
    result = verify(path.open("rb"), wanted={a.seq for a in anchors})
    report = compare(anchors, result.found, result.first_seq, result.head.seq)
    assert report.ok and report.checked == 2 and report.unanchored == 2


def test_anchors_catch_a_truncated_tail_the_chain_accepts(tmp_path: Path) -> None:
    path, records = _chain(tmp_path, 10)
    anchors = [_anchor(records[8])]
    path.write_bytes(b"".join(path.read_bytes().splitlines(keepends=True)[:6]))  # the last four records cut off
    result = verify(path.open("rb"), wanted={9})
    assert result.ok  # the chain alone cannot tell
    report = compare(anchors, result.found, result.first_seq, result.head.seq)
    assert not report.ok and "truncated" in report.problems[0] and "seq 9" in report.problems[0]


def test_anchors_catch_a_rewritten_tail(tmp_path: Path) -> None:
    path, records = _chain(tmp_path, 10)
    anchors = [_anchor(records[7])]
    forge_tail(path, keep=5, count=5)  # an attacker with the disk re-seals a tail of their own
    result = verify(path.open("rb"), wanted={8})
    assert result.ok
    report = compare(anchors, result.found, result.first_seq, result.head.seq)
    assert not report.ok and "rewritten: record seq 8" in report.problems[0]


def test_anchors_of_files_no_longer_here_are_counted_not_failed(tmp_path: Path) -> None:
    _, records = _chain(tmp_path, 10)
    report = compare([_anchor(records[1])], {}, first_seq=5, head_seq=10)
    assert report.ok and report.earlier == 1 and report.checked == 0


@pytest.mark.parametrize(
    "record",
    [[], {"seq": 0, "hash": "a" * 64, "ts": "t", "chain": "c"}, {"seq": 1, "hash": "xyz", "ts": "t", "chain": "c"}, {"seq": 1, "hash": "a" * 64}],
)
def test_a_damaged_anchor_is_refused(record: object) -> None:
    with pytest.raises(ValueError):
        parse_anchor(record)
