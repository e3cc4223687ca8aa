"""The token count's segments (engine/tokens.py ``joined_segments``): counted apart and
summed, they give exactly what tiktoken counts for the whole joined text, so caching
each segment's count never changes a reservation."""

from __future__ import annotations

import random

import pytest

from portcullis.engine.tokens import SEGMENT_CHARS, _cl100k, count_input_tokens, joined_segments

# Unicode's White_Space characters: what the regex's \s takes.
WHITE_SPACE = "\t\n\x0b\x0c\r \x85\xa0\u1680" + "".join(chr(c) for c in range(0x2000, 0x200B)) + "\u2028\u2029\u202f\u205f\u3000"
# Pieces that sit at the edges the regex cares about: newlines, spaces, contractions,
# digits, punctuation runs, letters of other scripts, characters near White_Space.
ATOMS = [
    "\n",
    "\r\n",
    "\r",
    " ",
    "  ",
    "\t",
    "'s",
    "'LL",
    "'ve",
    "’s",
    "123",
    "4567",
    ".",
    "...",
    "!?",
    "-",
    "—",
    "a",
    "word",
    "Hello",
    "über",
    "日本語",
    "한국어",
    "😀",
    "\u200b",
    "\x1c",
    "\x1f",
    "\u180e",
    "\ufeff",
    "{",
    "}\n",
    ":",
    '"',
    "x_y",
    "..\n\n",
    " \n ",
    "\n\n\n",
    *WHITE_SPACE,
]


def _text(rng: random.Random) -> str:
    if rng.random() < 0.08:
        return ""
    if rng.random() < 0.15:
        return "The quarterly report shows revenue up 12% on last year; costs flat. " * rng.randrange(1, 4)
    return "".join(rng.choice(ATOMS) for _ in range(rng.randrange(1, 12)))


def test_every_white_space_character_counts_as_space_to_python() -> None:
    # The cut rule reads str.isspace(); it must hold wherever the regex's \s does.
    assert all(character.isspace() for character in WHITE_SPACE)


def test_segments_join_back_to_the_text() -> None:
    rng = random.Random(7)
    for _ in range(2000):
        texts = [_text(rng) for _ in range(rng.randrange(0, 12))]
        assert "".join(joined_segments(texts)) == "\n".join(texts)


@pytest.mark.parametrize("seed", range(4))
def test_segment_counts_sum_to_the_whole_count(seed: int) -> None:
    count = _cl100k()
    rng = random.Random(seed)
    cut = 0
    for _ in range(3000):
        texts = [_text(rng) for _ in range(rng.randrange(1, 14))]
        segments = joined_segments(texts)
        cut += len(segments) > 1
        assert sum(map(count, segments)) == count("\n".join(texts)), texts
    assert cut > 500  # the property was tested on texts that were actually cut


def test_a_body_counts_the_same_with_segments_counted_apart() -> None:
    body = {
        "model": "m",
        "messages": [
            {"role": "system", "content": "You are terse.\n\n"},
            {"role": "user", "content": [{"type": "text", "text": "Summarise this: " + "x " * SEGMENT_CHARS}]},
            {"role": "assistant", "content": "  leading spaces and 'quotes'"},
            {"role": "user", "content": "\nstarts with a newline"},
        ],
        "tools": [{"type": "function", "function": {"name": "lookup", "description": "Looks a thing up. " * 8, "parameters": {"type": "object"}}}],
    }
    assert count_input_tokens(body, True, _cl100k()) == count_input_tokens(body, True)
