"""Reading the end of an audit log: where the complete records end and what a torn
write left after them (pure, no files)."""

from __future__ import annotations

import pytest

from portcullis.engine.audit_chain import GENESIS, TailError, read_tail, seal, verify


def chain(count: int) -> tuple[bytes, list[str]]:
    lines, hashes, prev = [], [], GENESIS
    for seq in range(1, count + 1):
        line, prev = seal({"event": "e", "n": seq}, seq, prev)
        lines.append(line)
        hashes.append(prev)
    return b"".join(lines), hashes


def test_an_empty_log_starts_at_genesis() -> None:
    tail = read_tail(b"", 0)
    assert tail is not None and tail.head.seq == 0 and tail.head.hash == GENESIS and tail.complete_bytes == 0 and tail.torn == b""


def test_an_intact_log_has_no_torn_bytes() -> None:
    log, hashes = chain(3)
    tail = read_tail(log, 0)
    assert tail is not None and (tail.head.seq, tail.head.hash, tail.complete_bytes, tail.torn) == (3, hashes[-1], len(log), b"")


@pytest.mark.parametrize("cut", [1, 17, -1], ids=["one-byte", "mid-record", "all-but-newline"])
def test_a_torn_last_write_is_separated_from_the_complete_records(cut: int) -> None:
    log, hashes = chain(3)
    fourth, _ = seal({"event": "e", "n": 4}, 4, hashes[-1])
    torn = fourth[:cut]
    tail = read_tail(log + torn, 0)
    assert tail is not None and tail.head.seq == 3 and tail.complete_bytes == len(log) and tail.torn == torn
    assert verify((log + torn).splitlines(keepends=True)).ok is False  # verify still reports the tear itself
    assert verify(log.splitlines(keepends=True)).ok


def test_only_a_torn_write_means_no_record_yet() -> None:
    tail = read_tail(b'{"event":"e","n"', 0)
    assert tail is not None and tail.head.seq == 0 and tail.complete_bytes == 0 and tail.torn == b'{"event":"e","n"'


def test_a_window_without_a_whole_record_asks_for_more() -> None:
    log, _ = chain(2)
    window = log[len(log) - 10 :]  # part of the last record only
    assert read_tail(window, len(log) - 10) is None
    second_start = log.index(b"\n") + 1
    tail = read_tail(log[second_start - 1 :], second_start - 1)  # starts on the newline before the last record
    assert tail is not None and tail.head.seq == 2


@pytest.mark.parametrize(
    ("ending", "problem"),
    [(b'{"seq": 3, "hash": "forged"}\n', "altered"), (b"not json\n", "damaged"), (b"\n", "damaged")],
    ids=["altered", "garbage", "empty-line"],
)
def test_a_complete_but_bad_last_line_is_damage_not_a_tear(ending: bytes, problem: str) -> None:
    log, _ = chain(2)
    with pytest.raises(TailError, match=problem):
        read_tail(log + ending, 0)
