"""A regorus engine may only be dropped on the thread that built it. A policy released on
another thread — the garbage collector runs on whichever thread allocates — must leave
each engine for its own thread to drop, never drop it there (regorus then reports an
error and leaks the engine)."""

from __future__ import annotations

import gc
import sys
import threading
from typing import Any

import pytest

from portcullis.engine import rego
from portcullis.engine.rego import Policy


def test_a_policy_released_on_another_thread_leaves_its_engine_to_its_own_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    reported: list[Any] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda unraisable: reported.append(unraisable.exc_value))
    holder = {"policy": Policy({"a.rego": "package a\nx := 1"}, {})}
    assert holder["policy"].evaluate("data.a.x", {}) == 1  # built its engine on this thread

    def release() -> None:
        policy = holder.pop("policy")
        assert policy.evaluate("data.a.x", {}) == 1  # and one on this thread, dropped here
        del policy  # the last reference goes on this thread

    worker = threading.Thread(target=release)
    worker.start()
    worker.join()
    gc.collect()
    assert reported == []
    assert len(rego._orphans.get(threading.get_ident(), [])) == 1  # waits for its own thread
    assert Policy({"b.rego": "package b\ny := 2"}, {}).evaluate("data.b.y", {}) == 2
    assert threading.get_ident() not in rego._orphans and reported == []
