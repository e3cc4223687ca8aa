from __future__ import annotations

import json

import pytest

from portcullis.engine.rawjson import RawJsonError, set_member


def test_replaces_only_the_value_bytes() -> None:
    raw = b'{\n  "model" :  "sonnet",\n  "messages": [{"model": "nested"}]\n}'
    assert set_member(raw, "model", "claude-x") == b'{\n  "model" :  "claude-x",\n  "messages": [{"model": "nested"}]\n}'


def test_adds_a_missing_member_at_the_front() -> None:
    assert set_member(b'{"a": 1}', "stream_options", {"include_usage": True}) == b'{"stream_options":{"include_usage":true},"a": 1}'
    assert set_member(b" { } ", "k", 1) == b' {"k":1 } '


def test_every_duplicate_is_replaced_so_upstream_never_sees_an_undecided_value() -> None:
    edited = set_member(b'{"model": "a", "x": "\\"model\\"", "model": "b"}', "model", "z")
    assert edited == b'{"model": "z", "x": "\\"model\\"", "model": "z"}'
    assert json.loads(edited)["model"] == "z"


def test_unicode_and_escapes_survive() -> None:
    raw = '{"text": "héllo \\u00e9 ✓", "model": "m"}'.encode()
    assert set_member(raw, "model", "n") == '{"text": "héllo \\u00e9 ✓", "model": "n"}'.encode()


@pytest.mark.parametrize("raw", [b"[1]", b'{"a" 1}', b'{"a": }'])
def test_rejects_what_is_not_an_object(raw: bytes) -> None:
    with pytest.raises(RawJsonError):
        set_member(raw, "model", "x")
