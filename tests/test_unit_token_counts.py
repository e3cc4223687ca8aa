"""The token-count cache (adapters/token_counts.py): what it answers is tiktoken's count,
per team, within its capacity."""

from __future__ import annotations

from portcullis.adapters.token_counts import TokenCounts
from portcullis.engine.tokens import count_input_tokens, text_tokens

TURN_1 = {"messages": [{"role": "system", "content": "You review code. " * 10}, {"role": "user", "content": "Is this loop right? " * 6}]}
TURN_2 = {"messages": [*TURN_1["messages"], {"role": "assistant", "content": "Yes, apart from the bound. " * 4}, {"role": "user", "content": "Fix it."}]}


def test_counts_are_tiktokens_and_earlier_turns_come_from_the_cache() -> None:
    cache = TokenCounts()
    counter = cache.counter("team-a")
    assert count_input_tokens(TURN_1, True, counter) == count_input_tokens(TURN_1, True)
    seen = len(cache)
    assert count_input_tokens(TURN_2, True, counter) == count_input_tokens(TURN_2, True)
    assert 0 < len(cache) - seen < seen + 2  # the second turn added only its new segments


def test_teams_do_not_share_entries() -> None:
    cache = TokenCounts()
    cache.counter("team-a")("a segment of text")
    cache.counter("team-b")("a segment of text")
    assert len(cache) == 2


def test_capacity_bounds_the_cache() -> None:
    cache = TokenCounts(capacity=3)
    counter = cache.counter("team-a")
    for i in range(10):
        assert counter(f"text number {i}") == text_tokens(f"text number {i}")
    assert len(cache) == 3
